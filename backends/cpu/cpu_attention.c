/* CPU scaled dot-product attention (forward, and a backward that recomputes the probabilities), where and gather. */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"

#include <cblas.h>
#include <stdlib.h>

/* Query rows per block: the scratch is a few [QBLOCK, Tk] f32 buffers, never [Tq, Tk]. */
#define QBLOCK 64
#define TWO_M24 (1.0f / 16777216.0f)
#define LANES 16

/* A BLAS leading dimension: at least 1, also for empty operands. */
static int ld(int64_t n) { return n > 0 ? (int)n : 1; }

/* The core has checked the call's contract (base/kernel_check_impl.h); f32 is this backend's limit. */
static ca_status att_dtype(const char *k, ca_dtype dt) {
    return dt == CA_F32 ? CA_OK : cpu_bad_dtype(k, "tensor", dt);
}
/* Last key a query row may see plus one: causal rows stop at the diagonal. */
static int64_t row_cols(const ca_attention_params *a, int64_t i) {
    return a->causal ? (i + 1 < a->tk ? i + 1 : a->tk) : a->tk;
}

/* The strides of one call's tensors over [b, h, t, e]: the args' ca_attention_layout (ABI 3.10) where it gives
 * them, contiguous where it does not; in the backward also dq, dk, dv and dout. A head's rows are then a
 * matrix of leading dimension stride[2] (the core has checked that e's stride is 1). */
typedef struct att_strides {
    int64_t q[4], k[4], v[4], o[4], dq[4], dk[4], dv[4], dout[4];
} att_strides;

static void stride_of(const int64_t *given, int64_t heads, int64_t t, int64_t e, int64_t *st) {
    if (given[0] | given[1] | given[2] | given[3]) {
        memcpy(st, given, 4 * sizeof *st);
        return;
    }
    st[3] = 1; st[2] = e; st[1] = t * e; st[0] = heads * t * e;
}

/* q, k, v and out of a call with H query and hkv kv heads; then, given, the gradients' (dq, dk, dv, dout). */
static void strides_of(const ca_attention_params *a, int64_t hkv, const ca_attention_layout *l,
                       const ca_attention_layout *dl, att_strides *s) {
    stride_of(l->q, a->heads, a->tq, a->d, s->q);
    stride_of(l->k, hkv, a->tk, a->d, s->k);
    stride_of(l->v, hkv, a->tk, a->dv, s->v);
    stride_of(l->o, a->heads, a->tq, a->dv, s->o);
    if (!dl) return;
    stride_of(dl->q, a->heads, a->tq, a->d, s->dq);
    stride_of(dl->k, hkv, a->tk, a->d, s->dk);
    stride_of(dl->v, hkv, a->tk, a->dv, s->dv);
    stride_of(dl->o, a->heads, a->tq, a->dv, s->dout);
}

/* Row i of head h of batch b of a tensor with strides st. */
static float *row_at(const void *p, const int64_t *st, int64_t b, int64_t h, int64_t i) {
    return (float *)p + b * st[0] + h * st[1] + i * st[2];
}

/* Rows [0, rows) x [0, cols) of a matrix of leading dimension ld set to 0. */
static void zero_rows(float *y, int64_t ld, int64_t rows, int64_t cols) {
    if (ld == cols) {
        memset(y, 0, (size_t)(rows * cols) * sizeof(float));
        return;
    }
    for (int64_t r = 0; r < rows; r++) memset(y + r * ld, 0, (size_t)cols * sizeof(float));
}

/* Every head's rows of a [B, heads, T, E] tensor with strides st set to 0 (an empty call's outputs). */
static void zero_tensor(void *p, const int64_t *st, int64_t batch, int64_t heads, int64_t t, int64_t e) {
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) zero_rows(row_at(p, st, b, h, 0), st[2], t, e);
}

/* ------------------------------------------------ row loops (vectorised) */

/* The dropout factor of one Philox word: keep/(1-p), as the dropout kernel decides. */
CPU_INLINE float drop_factor(uint32_t w, float p, float scale) {
    return (float)(w >> 8) * TWO_M24 >= p ? scale : 0.0f;
}

CPU_CLONES static void add_mask_f32(float *restrict s, const float *restrict m, int64_t n) {
    for (int64_t j = 0; j < n; j++) s[j] += m[j];
}

CPU_CLONES static void cut_mask_u8(float *restrict s, const uint8_t *restrict m, int64_t n) {
    for (int64_t j = 0; j < n; j++) s[j] = m[j] ? s[j] : -INFINITY;
}

/* s[j] = exp(s[j] - m); returns the sum (in vector lanes). */
CPU_CLONES static float exp_sum(float *restrict s, int64_t n, float m) {
    float acc[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) {
            float e = ca_fast_expf(s[j + l] - m);
            s[j + l] = e;
            acc[l] += e;
        }
    float sum = 0.0f;
    for (; j < n; j++) { s[j] = ca_fast_expf(s[j] - m); sum += s[j]; }
    for (int l = 0; l < LANES; l++) sum += acc[l];
    return sum;
}

/* s[j] = exp(s[j] - l): the probabilities again from the saved log-sum-exp. */
CPU_CLONES static void exp_shift(float *restrict s, int64_t n, float l) {
    for (int64_t j = 0; j < n; j++) s[j] = ca_fast_expf(s[j] - l);
}

/* y[j] = x[j] c, times the dropout factor of words[j] when words is given (y may be x). */
CPU_CLONES static void scale_drop(const float *x, int64_t n, float c, const uint32_t *restrict words, float p,
                                  float scale, float *y) {
    if (!words) {
        for (int64_t j = 0; j < n; j++) y[j] = x[j] * c;
        return;
    }
    for (int64_t j = 0; j < n; j++) y[j] = x[j] * c * drop_factor(words[j], p, scale);
}

/* s[j] = s[j] (dp[j] D[j] - delta): the score gradient, P in s, dPd in dp. */
CPU_CLONES static void score_grad(float *restrict s, const float *restrict dp, int64_t n, float delta,
                                  const uint32_t *restrict words, float p, float scale) {
    if (!words) {
        for (int64_t j = 0; j < n; j++) s[j] = s[j] * (dp[j] - delta);
        return;
    }
    for (int64_t j = 0; j < n; j++) s[j] = s[j] * (dp[j] * drop_factor(words[j], p, scale) - delta);
}

CPU_CLONES static float dot(const float *restrict x, const float *restrict y, int64_t n) {
    float acc[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += x[j + l] * y[j + l];
    float sum = 0.0f;
    for (; j < n; j++) sum += x[j] * y[j];
    for (int l = 0; l < LANES; l++) sum += acc[l];
    return sum;
}

/* s[j] = scale q.k_j is given; applies the mask and the causal cut (-inf). */
static void mask_row(const ca_attention_params *a, int64_t b, int64_t h, int64_t i, float *s) {
    int64_t n = row_cols(a, i);
    for (int64_t j = n; j < a->tk; j++) s[j] = -INFINITY;
    if (!a->mask) return;
    const int64_t *ms = a->mask_stride;
    int64_t base = b * ms[0] + h * ms[1] + i * ms[2];
    if (a->mask_dtype == CA_F32) {
        const float *m = (const float *)a->mask + base;
        if (ms[3] == 1) add_mask_f32(s, m, n);
        else for (int64_t j = 0; j < n; j++) s[j] += m[j * ms[3]];
    } else {
        const uint8_t *m = (const uint8_t *)a->mask + base;
        if (ms[3] == 1) cut_mask_u8(s, m, n);
        else for (int64_t j = 0; j < n; j++) if (!m[j * ms[3]]) s[j] = -INFINITY;
    }
}

/* Softmax of s[0, n) in place; returns the row's log-sum-exp (-inf: every key excluded). */
static float softmax_row(float *s, int64_t n) {
    float m = cpu_run_max(s, n, -INFINITY);
    if (m == -INFINITY) {                       /* every key excluded */
        memset(s, 0, (size_t)n * sizeof(float));
        return -INFINITY;
    }
    float sum = exp_sum(s, n, m);
    scale_drop(s, n, 1.0f / sum, NULL, 0.0f, 0.0f, s);
    return m + logf(sum);
}

/* One thread's scratch: a [QBLOCK, Tk] block of scores and one of probabilities (or score gradients), the
 * block's dropout words, and in the backward one query block's terms of dK [Tk, D] and dV [Tk, Dv]. */
typedef struct att_scratch {
    float *s, *p, *dk, *dv;
    uint32_t *words;
} att_scratch;

/* `n` scratches, one per thread that runs (cpu_threads(), at most one per unit of work), so that the memory
 * stays a few blocks per thread and never grows with Tq. */
typedef struct att_slots {
    int n;
    att_scratch w[];
} att_slots;

static att_slots *slots_alloc(const ca_attention_params *a, int64_t units, bool backward, const char *k) {
    int64_t n = cpu_threads() < units ? cpu_threads() : units;
    if (n < 1 || cpu_in_parallel()) n = 1;
    size_t tk = (size_t)(a->tk ? a->tk : 1), blk = (size_t)QBLOCK * tk;
    size_t terms = backward ? tk * (size_t)(a->d + a->dv) : 0, per = 2 * blk + terms;
    size_t nw = a->dropout_p > 0.0f ? blk + 8 : 0;
    att_slots *sl = malloc(sizeof *sl + (size_t)n * sizeof(att_scratch));
    float *f = malloc((size_t)n * per * sizeof(float));
    uint32_t *u = nw ? malloc((size_t)n * nw * sizeof(uint32_t)) : NULL;
    if (!sl || !f || (nw && !u)) {
        free(sl); free(f); free(u);
        ca_error(CA_ERR_NOMEM, "cpu kernel %s: no memory for %lld threads' %d x %lld blocks", k, (long long)n,
                 QBLOCK, (long long)a->tk);
        return NULL;
    }
    sl->n = (int)n;
    for (int64_t i = 0; i < n; i++) {
        float *base = f + (size_t)i * per;
        sl->w[i] = (att_scratch){.s = base, .p = base + blk, .dk = terms ? base + 2 * blk : NULL,
                                 .dv = terms ? base + 2 * blk + tk * (size_t)a->d : NULL,
                                 .words = u ? u + (size_t)i * nw : NULL};
    }
    return sl;
}

static void slots_free(att_slots *sl) {
    if (!sl) return;
    free(sl->w[0].s);
    free(sl->w[0].words);
    free(sl);
}

/* Units [base, base + units) of a kernel's work spread over the slots: slot s takes a contiguous share with
 * its own scratch. What a unit computes does not depend on the slot that runs it: its GEMMs run on the
 * calling thread inside the parallel region. A single unit on several threads therefore gets a region too
 * (with an idle second block): outside one, OpenBLAS would thread the GEMM, which may round differently. */
typedef void (*att_unit_fn)(const void *ctx, att_scratch *w, int64_t unit);
typedef struct att_run {
    att_unit_fn fn;
    const void *ctx;
    att_slots *sl;
    int64_t base, units;
    int n;
} att_run;

static void run_slot(void *ctx, int64_t s) {
    const att_run *r = ctx;
    if (s >= r->n) return;
    for (int64_t u = r->units * s / r->n; u < r->units * (s + 1) / r->n; u++)
        r->fn(r->ctx, &r->sl->w[s], r->base + u);
}

static void run_units(att_unit_fn fn, const void *ctx, att_slots *sl, int64_t base, int64_t units, int64_t cost) {
    att_run r = {.fn = fn, .ctx = ctx, .sl = sl, .base = base, .units = units,
                 .n = units < sl->n ? (int)units : sl->n};
    int blocks = r.n == 1 && cpu_threads() > 1 ? 2 : r.n;
    cpu_parallel_blocks(blocks, cost * units / blocks, run_slot, &r);
}

/* Streaming-element cost (cpu_parallel.h) of one query block: the block's GEMMs (at about 8 multiply-adds
 * per streamed element) and its exps; the backward runs 5 GEMMs where the forward runs 2. Work below the
 * grain stays on the caller, where its GEMMs (m n k < 2^18) are below OpenBLAS's own threshold for threads. */
static int64_t block_cost(const ca_attention_params *a, int gemms) {
    return (int64_t)QBLOCK * a->tk * ((a->d + a->dv) * gemms / 2 + 8) / 8;
}

/* The Philox words of the dropout stream for rows [i0, i0+rows) of problem bh: element
 * ((sbh Tq + i) Tk + j) of the stream, sbh the problem's number in the stream (the args' stream_heads,
 * ca_attention_stream_bh); returns where row i0's words start (NULL: no dropout). */
static const uint32_t *block_words(const ca_attention_params *a, uint64_t sbh, int64_t i0, int64_t rows,
                                   uint32_t *words) {
    if (a->dropout_p <= 0.0f) return NULL;
    uint64_t e0 = (sbh * (uint64_t)a->tq + (uint64_t)i0) * (uint64_t)a->tk;
    uint64_t c0 = e0 / 4, c1 = (e0 + (uint64_t)(rows * a->tk) + 3) / 4;
    cpu_philox_words(a->seed, a->offset + c0, (int64_t)(c1 - c0), words);
    return words + (e0 - 4 * c0);
}

/* Scores of query rows [i0, i0+rows) of problem (b, h) into w->s, masked; then the probabilities
 * (masked entries 0): with lse_in from the saved lse, else by softmax, writing lse_out. q's and k's rows
 * are ldq and ldk floats apart; score row r spans ld = tk floats; ncols is the widest row. */
static void block_probs(const ca_attention_params *a, int64_t b, int64_t h, int64_t i0, int64_t rows,
                        int64_t ncols, const float *q, int64_t ldq, const float *k, int64_t ldk,
                        const float *lse_in, float *lse_out, att_scratch *w) {
    int64_t tk = a->tk;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)ncols, (int)a->d, a->scale, q,
                ld(ldq), k, ld(ldk), 0.0f, w->s, ld(tk));
    for (int64_t r = 0; r < rows; r++) {
        float *s = w->s + r * tk;
        mask_row(a, b, h, i0 + r, s);
        if (!lse_in) {
            lse_out[r] = softmax_row(s, ncols);
        } else if (lse_in[r] == -INFINITY) {
            memset(s, 0, (size_t)ncols * sizeof(float));
        } else {
            exp_shift(s, ncols, lse_in[r]);
        }
    }
}

/* Query blocks per problem, and the rows of block qb. */
static int64_t query_blocks(const ca_attention_params *a) { return (a->tq + QBLOCK - 1) / QBLOCK; }
static int64_t block_rows(const ca_attention_params *a, int64_t qb) {
    return a->tq - qb * QBLOCK < QBLOCK ? a->tq - qb * QBLOCK : QBLOCK;
}

/* ------------------------------------------------------------- forward */

/* Forward unit u: query block of problem u / nqb. Causal blocks cost in proportion to their index, so the
 * blocks of a problem are taken in the order 0, n-1, 1, n-2, ...: any contiguous share of the units then
 * holds about as much work as its length says. */
typedef struct att_fwd {
    const ca_attention_args *g;
    att_strides st;
} att_fwd;

static void fwd_unit(const void *ctx, att_scratch *w, int64_t u) {
    const att_fwd *c = ctx;
    const ca_attention_args *g = c->g;
    const ca_attention_params *a = &g->p;
    const att_strides *st = &c->st;
    int64_t nqb = query_blocks(a), bh = u / nqb, j = u % nqb, b = bh / a->heads, h = bh % a->heads;
    int64_t kvh = h / ca_attention_group(a->heads, g->kv_heads);
    int64_t qb = !a->causal ? j : j % 2 == 0 ? j / 2 : nqb - 1 - j / 2;
    int64_t i0 = qb * QBLOCK, rows = block_rows(a, qb), ncols = row_cols(a, i0 + rows - 1);
    const float *q = row_at(g->q, st->q, b, h, i0), *k = row_at(g->k, st->k, b, kvh, 0);
    const float *v = row_at(g->v, st->v, b, kvh, 0);
    block_probs(a, b, h, i0, rows, ncols, q, st->q[2], k, st->k[2], NULL, g->lse + bh * a->tq + i0, w);
    const uint32_t *wd = block_words(a, ca_attention_stream_bh(bh, a->heads, g->stream_heads, g->stream_head0), i0,
                                     rows, w->words);
    if (wd)   /* P D in place: the forward needs no P of its own */
        for (int64_t r = 0; r < rows; r++)
            scale_drop(w->s + r * a->tk, ncols, 1.0f, wd + r * a->tk, a->dropout_p, 1.0f / (1.0f - a->dropout_p),
                       w->s + r * a->tk);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)a->dv, (int)ncols, 1.0f, w->s,
                ld(a->tk), v, ld(st->v[2]), 0.0f, row_at(g->out, st->o, b, h, i0), ld(st->o[2]));
}

/* Every query block of every (b, h) is independent: the threads share them out. Query problem bh = b H + h
 * reads kv problem bh / g (g = H / Hkv query heads per kv head): b Hkv + h / g. Each tensor is read or
 * written through its strides, so that q, k and v may be views of one projection (no copy first). */
ca_status cpu_attention(void *dev, const ca_attention_args *args) {
    const ca_attention_params *a = &args->p;
    (void)dev;
    ca_status st = att_dtype("attention", args->dt);
    if (st != CA_OK) return st;
    int64_t nq = a->batch * a->heads * a->tq;
    if (nq == 0) return CA_OK;
    att_fwd c = {.g = args};
    strides_of(a, a->heads / ca_attention_group(a->heads, args->kv_heads), &args->st, NULL, &c.st);
    if (a->tk == 0 || a->dv == 0) {
        zero_tensor(args->out, c.st.o, a->batch, a->heads, a->tq, a->dv);
        for (int64_t i = 0; i < nq; i++) args->lse[i] = -INFINITY;
        return CA_OK;
    }
    int64_t units = a->batch * a->heads * query_blocks(a);
    att_slots *sl = slots_alloc(a, units, false, "attention");
    if (!sl) return CA_ERR_NOMEM;
    run_units(fwd_unit, &c, sl, 0, units, block_cost(a, 2));
    slots_free(sl);
    return CA_OK;
}

/* ------------------------------------------------------------ backward */

/* A backward call and its tensors' strides. */
typedef struct att_bwd {
    const ca_attention_backward_args *g;
    att_strides st;
} att_bwd;

/* Query heads per kv head of a backward call. */
static int64_t bwd_group(const ca_attention_backward_args *g) { return ca_attention_group(g->p.heads, g->kv_heads); }

/* With P the probabilities, D the dropout factors and Pd = P*D (out = Pd V):
 *   dV = Pd^T dO,  dPd = dO V^T,  dS = P * (dPd * D - rowsum(dO * O)),
 *   dQ = scale dS K,  dK = scale dS^T Q.
 * Query block qb of problem bh: writes its rows of dQ, and its terms of dK and dV (keys [0, returned)) into
 * w->dk and w->dv. A kv head's dK and dV sum the terms of its g query heads: adding them in the order
 * (block, query head), whichever thread computed them, makes dK and dV the same at every thread count. */
static int64_t bwd_block(const att_bwd *c, att_scratch *w, int64_t bh, int64_t qb) {
    const ca_attention_backward_args *g = c->g;
    const ca_attention_params *a = &g->p;
    const att_strides *st = &c->st;
    int64_t tq = a->tq, tk = a->tk, d = a->d, dvn = a->dv, b = bh / a->heads, h = bh % a->heads;
    int64_t i0 = qb * QBLOCK, rows = block_rows(a, qb), nc = row_cols(a, i0 + rows - 1);
    int64_t kvh = h / bwd_group(g), ldg = st->dout[2], ldo = st->o[2];
    const float *qi = row_at(g->q, st->q, b, h, i0), *kb = row_at(g->k, st->k, b, kvh, 0);
    const float *vb = row_at(g->v, st->v, b, kvh, 0), *oi = row_at(g->out, st->o, b, h, i0);
    const float *gi = row_at(g->dout, st->dout, b, h, i0);
    float p = a->dropout_p, keep_scale = 1.0f / (1.0f - p);
    block_probs(a, b, h, i0, rows, nc, qi, st->q[2], kb, st->k[2], g->lse + bh * tq + i0, NULL, w);
    const uint32_t *wd = block_words(a, ca_attention_stream_bh(bh, a->heads, g->stream_heads, g->stream_head0), i0,
                                     rows, w->words);
    const float *pd = w->s;
    if (wd) {
        for (int64_t r = 0; r < rows; r++)
            scale_drop(w->s + r * tk, nc, 1.0f, wd + r * tk, p, keep_scale, w->p + r * tk);
        pd = w->p;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nc, (int)dvn, (int)rows, 1.0f, pd, ld(tk), gi,
                ld(ldg), 0.0f, w->dv, ld(dvn));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)nc, (int)dvn, 1.0f, gi, ld(ldg), vb,
                ld(st->v[2]), 0.0f, w->p, ld(tk));
    for (int64_t r = 0; r < rows; r++)
        score_grad(w->s + r * tk, w->p + r * tk, nc, dot(gi + r * ldg, oi + r * ldo, dvn), wd ? wd + r * tk : NULL,
                   p, keep_scale);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)d, (int)nc, a->scale, w->s, ld(tk), kb,
                ld(st->k[2]), 0.0f, row_at(g->dq, st->dq, b, h, i0), ld(st->dq[2]));
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nc, (int)d, (int)rows, a->scale, w->s, ld(tk), qi,
                ld(st->q[2]), 0.0f, w->dk, ld(d));
    return nc;
}

CPU_CLONES static void add_terms(float *restrict y, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* y's rows [0, rows) (ldy apart) += x's (cols apart), cols each. */
static void add_rows(float *y, int64_t ldy, const float *x, int64_t rows, int64_t cols) {
    if (ldy == cols) {
        add_terms(y, x, rows * cols);
        return;
    }
    for (int64_t r = 0; r < rows; r++) add_terms(y + r * ldy, x + r * cols, cols);
}

/* Row 0 of dK and of dV of kv problem kvp (b Hkv + kv head). */
static float *kv_grad(const att_bwd *c, const void *p, const int64_t *st, int64_t kvp) {
    int64_t hkv = c->g->p.heads / bwd_group(c->g);
    return row_at(p, st, kvp / hkv, kvp % hkv, 0);
}

/* Adds keys [lo, hi) of one block's terms (w, computed for `nc` keys) of query problem bh into its kv
 * problem's dK and dV. */
static void add_block(const att_bwd *c, const att_scratch *w, int64_t bh, int64_t nc, int64_t lo, int64_t hi) {
    const ca_attention_backward_args *g = c->g;
    int64_t d = g->p.d, dvn = g->p.dv, kvp = bh / bwd_group(g);
    if (hi > nc) hi = nc;
    if (hi <= lo) return;
    add_rows(kv_grad(c, g->dk, c->st.dk, kvp) + lo * c->st.dk[2], c->st.dk[2], w->dk + lo * d, hi - lo, d);
    add_rows(kv_grad(c, g->dv, c->st.dv, kvp) + lo * c->st.dv[2], c->st.dv[2], w->dv + lo * dvn, hi - lo, dvn);
}

/* dK and dV of kv problem kvp set to 0. */
static void zero_kv(const att_bwd *c, int64_t kvp) {
    const ca_attention_params *a = &c->g->p;
    zero_rows(kv_grad(c, c->g->dk, c->st.dk, kvp), c->st.dk[2], a->tk, a->d);
    zero_rows(kv_grad(c, c->g->dv, c->st.dv, kvp), c->st.dv[2], a->tk, a->dv);
}

/* A whole kv problem on one thread (so no two threads write one kv head): its query heads' blocks in the
 * order (block, query head), each block's terms added as they come. */
static void bwd_problem(const void *ctx, att_scratch *w, int64_t kvp) {
    const att_bwd *c = ctx;
    int64_t tk = c->g->p.tk, grp = bwd_group(c->g);
    zero_kv(c, kvp);
    for (int64_t qb = 0; qb < query_blocks(&c->g->p); qb++)
        for (int64_t bh = kvp * grp; bh < (kvp + 1) * grp; bh++) add_block(c, w, bh, bwd_block(c, w, bh, qb), 0, tk);
}

/* Fewer problems than threads can share: the threads take blocks, a wave of one block per slot (unit u:
 * block u / nbh of query problem u % nbh, so that a wave's blocks cost alike), then add the wave's terms in
 * unit order, which is the order (block, query head) within each kv problem, in parallel over keys: one
 * thread adds every term of a key. */
typedef struct bwd_wave {
    const att_bwd *c;
    att_slots *sl;
    int64_t base, units;
} bwd_wave;

static void wave_unit(const void *ctx, att_scratch *w, int64_t u) {
    const bwd_wave *v = ctx;
    int64_t nbh = v->c->g->p.batch * v->c->g->p.heads;
    bwd_block(v->c, w, u % nbh, u / nbh);
}

static void wave_add(void *ctx, int64_t lo, int64_t hi) {
    const bwd_wave *v = ctx;
    const ca_attention_params *a = &v->c->g->p;
    int64_t nbh = a->batch * a->heads;
    for (int64_t s = 0; s < v->units; s++) {
        int64_t u = v->base + s, qb = u / nbh;
        add_block(v->c, &v->sl->w[s], u % nbh, row_cols(a, qb * QBLOCK + block_rows(a, qb) - 1), lo, hi);
    }
}

static void zero_terms(void *ctx, int64_t lo, int64_t hi) {
    for (int64_t kvp = lo; kvp < hi; kvp++) zero_kv(ctx, kvp);
}

static void bwd_waves(const att_bwd *c, att_slots *sl) {
    const ca_attention_params *a = &c->g->p;
    int64_t nbh = a->batch * a->heads, units = nbh * query_blocks(a);
    cpu_parallel_for(nbh / bwd_group(c->g), cpu_grain_for(a->tk * (a->d + a->dv)), zero_terms, (void *)c);
    for (int64_t base = 0; base < units; base += sl->n) {
        bwd_wave v = {.c = c, .sl = sl, .base = base, .units = units - base < sl->n ? units - base : sl->n};
        run_units(wave_unit, &v, sl, base, v.units, block_cost(a, 5));
        cpu_parallel_for(a->tk, cpu_grain_for(v.units * (a->d + a->dv)), wave_add, &v);
    }
}

/* Parallel over kv problems (b, kv head) when there are at least two per thread; else over query blocks
 * too. */
ca_status cpu_attention_backward(void *dev, const ca_attention_backward_args *args) {
    const ca_attention_params *a = &args->p;
    (void)dev;
    ca_status st = att_dtype("attention_backward", args->dt);
    if (st != CA_OK) return st;
    int64_t nbh = a->batch * a->heads, grp = bwd_group(args), nkv = nbh / grp, tq = a->tq, tk = a->tk;
    if (nbh == 0) return CA_OK;
    att_bwd c = {.g = args};
    strides_of(a, a->heads / grp, &args->st, &args->dst, &c.st);
    if (tq == 0 || tk == 0) {
        zero_tensor(args->dq, c.st.dq, a->batch, a->heads, tq, a->d);
        zero_tensor(args->dk, c.st.dk, a->batch, a->heads / grp, tk, a->d);
        zero_tensor(args->dv, c.st.dv, a->batch, a->heads / grp, tk, a->dv);
        return CA_OK;
    }
    bool waves = nkv < 2 * (int64_t)cpu_threads() && !cpu_in_parallel();
    att_slots *sl = slots_alloc(a, waves ? nbh * query_blocks(a) : nkv, true, "attention_backward");
    if (!sl) return CA_ERR_NOMEM;
    if (waves && sl->n > 1) bwd_waves(&c, sl);
    else run_units(bwd_problem, &c, sl, 0, nkv, block_cost(a, 5) * query_blocks(a) * grp);
    slots_free(sl);
    return CA_OK;
}

/* ---------------------------------------------------------------- where */

/* y = cond ? a : b: a selection, so any dtype is copied by its element size. */
ca_status cpu_where(void *dev, const ca_where_args *args) {
    ca_dtype dt = args->dt;
    const ca_bcast_args *s = &args->shape;
    const int64_t *cs = args->cond_stride;
    const uint8_t *cond = args->cond;
    const void *a = args->a;
    const void *b = args->b;
    void *y = args->y;
    (void)dev;
    size_t es = ca_dtype_size(dt);
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
    if (n <= 0) return CA_OK;
    int64_t idx[CA_MAX_DIMS] = {0}, oc = 0, oa = 0, ob = 0;
    int nd = s->ndim;
    for (int64_t i = 0; i < n; i++) {
        const char *src = cond[oc] ? (const char *)a + (size_t)oa * es : (const char *)b + (size_t)ob * es;
        memcpy((char *)y + (size_t)i * es, src, es);
        for (int d = nd - 1; d >= 0; d--) {     /* odometer over the output index */
            oc += cs[d]; oa += s->a_stride[d]; ob += s->b_stride[d];
            if (++idx[d] < s->shape[d]) break;
            oc -= cs[d] * s->shape[d]; oa -= s->a_stride[d] * s->shape[d]; ob -= s->b_stride[d] * s->shape[d];
            idx[d] = 0;
        }
    }
    return CA_OK;
}

/* ---------------------------------------------------------------- gather */

/* Every index in [0, len) (the data; the core has checked the rest). */
static ca_status gather_check(const char *k, ca_dtype idx_dt, int64_t outer, int64_t len, int64_t inner, int64_t n,
                              const void *idx) {
    int64_t total = outer * n * inner;
    for (int64_t p = 0; p < total; p++) {
        int64_t v = cpu_index_at(idx_dt, idx, p);
        if (v < 0 || v >= len)
            return ca_error(CA_ERR_INVALID, "cpu kernel %s: index %lld at position %lld is outside [0, %lld)", k,
                            (long long)v, (long long)p, (long long)len);
    }
    return CA_OK;
}

ca_status cpu_gather(void *dev, const ca_gather_args *args) {
    ca_dtype dt = args->dt;
    int64_t outer = args->outer;
    int64_t len = args->len;
    int64_t inner = args->inner;
    int64_t n = args->n;
    const void *x = args->x;
    ca_dtype idx_dt = args->idx_dt;
    const void *idx = args->idx;
    void *y = args->y;
    size_t es = ca_dtype_size(dt);
    ca_status st = gather_check("gather", idx_dt, outer, len, inner, n, idx);
    if (st != CA_OK || outer * n * inner == 0) return st;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t p = (o * n + j) * inner + i, src = (o * len + cpu_index_at(idx_dt, idx, p)) * inner + i;
                memcpy((char *)y + (size_t)p * es, (const char *)x + (size_t)src * es, es);
            }
    return CA_OK;
}

ca_status cpu_gather_backward(void *dev, const ca_gather_backward_args *args) {
    ca_dtype dt = args->dt;
    int64_t outer = args->outer;
    int64_t len = args->len;
    int64_t inner = args->inner;
    int64_t n = args->n;
    ca_dtype idx_dt = args->idx_dt;
    const void *idx = args->idx;
    const void *dy = args->dy;
    void *dx = args->dx;
    if (dt != CA_F32) return cpu_bad_dtype("gather_backward", "tensor", dt);
    ca_status st = gather_check("gather_backward", idx_dt, outer, len, inner, n, idx);
    if (st != CA_OK || outer * n * inner == 0) return st;
    const float *g = dy;
    float *out = dx;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t p = (o * n + j) * inner + i;
                out[(o * len + cpu_index_at(idx_dt, idx, p)) * inner + i] += g[p];
            }
    return CA_OK;
}
