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
 * (masked entries 0): with lse_in from the saved lse, else by softmax, writing lse_out. Row r spans
 * ld = tk floats; ncols is the widest row. */
static void block_probs(const ca_attention_params *a, int64_t b, int64_t h, int64_t i0, int64_t rows,
                        int64_t ncols, const float *q, const float *k, const float *lse_in, float *lse_out,
                        att_scratch *w) {
    int64_t tk = a->tk;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)ncols, (int)a->d, a->scale, q,
                ld(a->d), k, ld(a->d), 0.0f, w->s, ld(tk));
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
static void fwd_unit(const void *ctx, att_scratch *w, int64_t u) {
    const ca_attention_args *g = ctx;
    const ca_attention_params *a = &g->p;
    int64_t nqb = query_blocks(a), bh = u / nqb, j = u % nqb, kvh = bh / ca_attention_group(a->heads, g->kv_heads);
    int64_t qb = !a->causal ? j : j % 2 == 0 ? j / 2 : nqb - 1 - j / 2;
    int64_t i0 = qb * QBLOCK, rows = block_rows(a, qb), ncols = row_cols(a, i0 + rows - 1);
    const float *q = (const float *)g->q + (bh * a->tq + i0) * a->d, *k = (const float *)g->k + kvh * a->tk * a->d;
    const float *v = (const float *)g->v + kvh * a->tk * a->dv;
    block_probs(a, bh / a->heads, bh % a->heads, i0, rows, ncols, q, k, NULL, g->lse + bh * a->tq + i0, w);
    const uint32_t *wd = block_words(a, ca_attention_stream_bh(bh, a->heads, g->stream_heads, g->stream_head0), i0,
                                     rows, w->words);
    if (wd)   /* P D in place: the forward needs no P of its own */
        for (int64_t r = 0; r < rows; r++)
            scale_drop(w->s + r * a->tk, ncols, 1.0f, wd + r * a->tk, a->dropout_p, 1.0f / (1.0f - a->dropout_p),
                       w->s + r * a->tk);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)a->dv, (int)ncols, 1.0f, w->s,
                ld(a->tk), v, ld(a->dv), 0.0f, (float *)g->out + (bh * a->tq + i0) * a->dv, ld(a->dv));
}

/* Every query block of every (b, h) is independent: the threads share them out. Query problem bh = b H + h
 * reads kv problem bh / g (g = H / Hkv query heads per kv head): b Hkv + h / g. */
ca_status cpu_attention(void *dev, const ca_attention_args *args) {
    const ca_attention_params *a = &args->p;
    (void)dev;
    ca_status st = att_dtype("attention", args->dt);
    if (st != CA_OK) return st;
    int64_t nq = a->batch * a->heads * a->tq;
    if (nq == 0) return CA_OK;
    if (a->tk == 0 || a->dv == 0) {
        memset(args->out, 0, (size_t)(nq * a->dv) * sizeof(float));
        for (int64_t i = 0; i < nq; i++) args->lse[i] = -INFINITY;
        return CA_OK;
    }
    int64_t units = a->batch * a->heads * query_blocks(a);
    att_slots *sl = slots_alloc(a, units, false, "attention");
    if (!sl) return CA_ERR_NOMEM;
    run_units(fwd_unit, args, sl, 0, units, block_cost(a, 2));
    slots_free(sl);
    return CA_OK;
}

/* ------------------------------------------------------------ backward */

/* Query heads per kv head of a backward call. */
static int64_t bwd_group(const ca_attention_backward_args *g) { return ca_attention_group(g->p.heads, g->kv_heads); }

/* With P the probabilities, D the dropout factors and Pd = P*D (out = Pd V):
 *   dV = Pd^T dO,  dPd = dO V^T,  dS = P * (dPd * D - rowsum(dO * O)),
 *   dQ = scale dS K,  dK = scale dS^T Q.
 * Query block qb of problem bh: writes its rows of dQ, and its terms of dK and dV (keys [0, returned)) into
 * w->dk and w->dv. A kv head's dK and dV sum the terms of its g query heads: adding them in the order
 * (block, query head), whichever thread computed them, makes dK and dV the same at every thread count. */
static int64_t bwd_block(const ca_attention_backward_args *g, att_scratch *w, int64_t bh, int64_t qb) {
    const ca_attention_params *a = &g->p;
    int64_t tq = a->tq, tk = a->tk, d = a->d, dvn = a->dv;
    int64_t i0 = qb * QBLOCK, rows = block_rows(a, qb), nc = row_cols(a, i0 + rows - 1);
    int64_t kvh = bh / bwd_group(g);
    const float *qi = (const float *)g->q + (bh * tq + i0) * d, *kb = (const float *)g->k + kvh * tk * d;
    const float *vb = (const float *)g->v + kvh * tk * dvn, *oi = (const float *)g->out + (bh * tq + i0) * dvn;
    const float *gi = (const float *)g->dout + (bh * tq + i0) * dvn;
    float p = a->dropout_p, keep_scale = 1.0f / (1.0f - p);
    block_probs(a, bh / a->heads, bh % a->heads, i0, rows, nc, qi, kb, g->lse + bh * tq + i0, NULL, w);
    const uint32_t *wd = block_words(a, ca_attention_stream_bh(bh, a->heads, g->stream_heads, g->stream_head0), i0,
                                     rows, w->words);
    const float *pd = w->s;
    if (wd) {
        for (int64_t r = 0; r < rows; r++)
            scale_drop(w->s + r * tk, nc, 1.0f, wd + r * tk, p, keep_scale, w->p + r * tk);
        pd = w->p;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nc, (int)dvn, (int)rows, 1.0f, pd, ld(tk), gi,
                ld(dvn), 0.0f, w->dv, ld(dvn));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)nc, (int)dvn, 1.0f, gi, ld(dvn), vb,
                ld(dvn), 0.0f, w->p, ld(tk));
    for (int64_t r = 0; r < rows; r++)
        score_grad(w->s + r * tk, w->p + r * tk, nc, dot(gi + r * dvn, oi + r * dvn, dvn), wd ? wd + r * tk : NULL,
                   p, keep_scale);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)d, (int)nc, a->scale, w->s, ld(tk), kb,
                ld(d), 0.0f, (float *)g->dq + (bh * tq + i0) * d, ld(d));
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nc, (int)d, (int)rows, a->scale, w->s, ld(tk), qi,
                ld(d), 0.0f, w->dk, ld(d));
    return nc;
}

CPU_CLONES static void add_terms(float *restrict y, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* Adds keys [lo, hi) of one block's terms (w, computed for `nc` keys) of query problem bh into its kv
 * problem's dK and dV. */
static void add_block(const ca_attention_backward_args *g, const att_scratch *w, int64_t bh, int64_t nc,
                      int64_t lo, int64_t hi) {
    int64_t d = g->p.d, dvn = g->p.dv;
    if (hi > nc) hi = nc;
    if (hi <= lo) return;
    bh /= bwd_group(g);
    add_terms((float *)g->dk + (bh * g->p.tk + lo) * d, w->dk + lo * d, (hi - lo) * d);
    add_terms((float *)g->dv + (bh * g->p.tk + lo) * dvn, w->dv + lo * dvn, (hi - lo) * dvn);
}

/* A whole kv problem on one thread (so no two threads write one kv head): its query heads' blocks in the
 * order (block, query head), each block's terms added as they come. */
static void bwd_problem(const void *ctx, att_scratch *w, int64_t kvp) {
    const ca_attention_backward_args *g = ctx;
    int64_t tk = g->p.tk, grp = bwd_group(g);
    memset((float *)g->dk + kvp * tk * g->p.d, 0, (size_t)(tk * g->p.d) * sizeof(float));
    memset((float *)g->dv + kvp * tk * g->p.dv, 0, (size_t)(tk * g->p.dv) * sizeof(float));
    for (int64_t qb = 0; qb < query_blocks(&g->p); qb++)
        for (int64_t bh = kvp * grp; bh < (kvp + 1) * grp; bh++) add_block(g, w, bh, bwd_block(g, w, bh, qb), 0, tk);
}

/* Fewer problems than threads can share: the threads take blocks, a wave of one block per slot (unit u:
 * block u / nbh of query problem u % nbh, so that a wave's blocks cost alike), then add the wave's terms in
 * unit order, which is the order (block, query head) within each kv problem, in parallel over keys: one
 * thread adds every term of a key. */
typedef struct bwd_wave {
    const ca_attention_backward_args *g;
    att_slots *sl;
    int64_t base, units;
} bwd_wave;

static void wave_unit(const void *ctx, att_scratch *w, int64_t u) {
    const bwd_wave *c = ctx;
    int64_t nbh = c->g->p.batch * c->g->p.heads;
    bwd_block(c->g, w, u % nbh, u / nbh);
}

static void wave_add(void *ctx, int64_t lo, int64_t hi) {
    const bwd_wave *c = ctx;
    const ca_attention_params *a = &c->g->p;
    int64_t nbh = a->batch * a->heads;
    for (int64_t s = 0; s < c->units; s++) {
        int64_t u = c->base + s, qb = u / nbh;
        add_block(c->g, &c->sl->w[s], u % nbh, row_cols(a, qb * QBLOCK + block_rows(a, qb) - 1), lo, hi);
    }
}

static void zero_terms(void *ctx, int64_t lo, int64_t hi) {
    const ca_attention_backward_args *g = ctx;
    int64_t tk = g->p.tk;
    memset((float *)g->dk + lo * tk * g->p.d, 0, (size_t)((hi - lo) * tk * g->p.d) * sizeof(float));
    memset((float *)g->dv + lo * tk * g->p.dv, 0, (size_t)((hi - lo) * tk * g->p.dv) * sizeof(float));
}

static void bwd_waves(const ca_attention_backward_args *g, att_slots *sl) {
    const ca_attention_params *a = &g->p;
    int64_t nbh = a->batch * a->heads, units = nbh * query_blocks(a);
    cpu_parallel_for(nbh / bwd_group(g), cpu_grain_for(a->tk * (a->d + a->dv)), zero_terms, (void *)g);
    for (int64_t base = 0; base < units; base += sl->n) {
        bwd_wave c = {.g = g, .sl = sl, .base = base, .units = units - base < sl->n ? units - base : sl->n};
        run_units(wave_unit, &c, sl, base, c.units, block_cost(a, 5));
        cpu_parallel_for(a->tk, cpu_grain_for(c.units * (a->d + a->dv)), wave_add, &c);
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
    if (tq == 0 || tk == 0) {
        memset(args->dq, 0, (size_t)(nbh * tq * a->d) * sizeof(float));
        memset(args->dk, 0, (size_t)(nkv * tk * a->d) * sizeof(float));
        memset(args->dv, 0, (size_t)(nkv * tk * a->dv) * sizeof(float));
        return CA_OK;
    }
    bool waves = nkv < 2 * (int64_t)cpu_threads() && !cpu_in_parallel();
    att_slots *sl = slots_alloc(a, waves ? nbh * query_blocks(a) : nkv, true, "attention_backward");
    if (!sl) return CA_ERR_NOMEM;
    if (waves && sl->n > 1) bwd_waves(args, sl);
    else run_units(bwd_problem, args, sl, 0, nkv, block_cost(a, 5) * query_blocks(a) * grp);
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
