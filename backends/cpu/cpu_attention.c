/* CPU scaled dot-product attention (forward, and a backward that recomputes the probabilities), where and gather. */
#include "backends/cpu/cpu_impl.h"

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

typedef struct att_scratch {
    float *s, *p;
    uint32_t *words;
} att_scratch;

static ca_status scratch_alloc(const ca_attention_params *a, att_scratch *w, const char *k) {
    size_t n = (size_t)QBLOCK * (size_t)(a->tk ? a->tk : 1);
    w->s = malloc(n * sizeof(float));
    w->p = malloc(n * sizeof(float));
    w->words = a->dropout_p > 0.0f ? malloc((n + 8) * sizeof(uint32_t)) : NULL;
    if (!w->s || !w->p || (a->dropout_p > 0.0f && !w->words)) {
        free(w->s); free(w->p); free(w->words);
        return ca_error(CA_ERR_NOMEM, "cpu kernel %s: no memory for a %d x %lld block", k, QBLOCK,
                        (long long)a->tk);
    }
    return CA_OK;
}

static void scratch_free(att_scratch *w) { free(w->s); free(w->p); free(w->words); }

/* The Philox words of the dropout stream for rows [i0, i0+rows) of problem bh: element
 * ((bh Tq + i) Tk + j) of the stream; returns where row i0's words start (NULL: no dropout). */
static const uint32_t *block_words(const ca_attention_params *a, uint64_t bh, int64_t i0, int64_t rows,
                                   uint32_t *words) {
    if (a->dropout_p <= 0.0f) return NULL;
    uint64_t e0 = (bh * (uint64_t)a->tq + (uint64_t)i0) * (uint64_t)a->tk;
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

ca_status cpu_attention(void *dev, const ca_attention_args *args) {
    ca_dtype dt = args->dt;
    const ca_attention_params *a = &args->p;
    const void *q = args->q;
    const void *k = args->k;
    const void *v = args->v;
    void *out = args->out;
    float *lse = args->lse;
    (void)dev;
    ca_status st = att_dtype("attention", dt);
    if (st != CA_OK) return st;
    int64_t nq = a->batch * a->heads * a->tq;
    if (nq == 0) return CA_OK;
    if (a->tk == 0 || a->dv == 0) {
        memset(out, 0, (size_t)(nq * a->dv) * sizeof(float));
        for (int64_t i = 0; i < nq; i++) lse[i] = -INFINITY;
        return CA_OK;
    }
    att_scratch w;
    if ((st = scratch_alloc(a, &w, "attention")) != CA_OK) return st;
    float keep_scale = 1.0f / (1.0f - a->dropout_p);
    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t h = 0; h < a->heads; h++) {
            int64_t bh = b * a->heads + h;
            const float *qb = (const float *)q + bh * a->tq * a->d, *kb = (const float *)k + bh * a->tk * a->d;
            const float *vb = (const float *)v + bh * a->tk * a->dv;
            float *ob = (float *)out + bh * a->tq * a->dv, *lb = lse + bh * a->tq;
            for (int64_t i0 = 0; i0 < a->tq; i0 += QBLOCK) {
                int64_t rows = a->tq - i0 < QBLOCK ? a->tq - i0 : QBLOCK;
                int64_t ncols = row_cols(a, i0 + rows - 1);
                block_probs(a, b, h, i0, rows, ncols, qb + i0 * a->d, kb, NULL, lb + i0, &w);
                const uint32_t *wd = block_words(a, (uint64_t)bh, i0, rows, w.words);
                if (wd)   /* P D in place: the forward needs no P of its own */
                    for (int64_t r = 0; r < rows; r++)
                        scale_drop(w.s + r * a->tk, ncols, 1.0f, wd + r * a->tk, a->dropout_p, keep_scale,
                                   w.s + r * a->tk);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)a->dv, (int)ncols, 1.0f,
                            w.s, ld(a->tk), vb, ld(a->dv), 0.0f, ob + i0 * a->dv, ld(a->dv));
            }
        }
    scratch_free(&w);
    return CA_OK;
}

/* With P the probabilities, D the dropout factors and Pd = P*D (out = Pd V):
 *   dV = Pd^T dO,  dPd = dO V^T,  dS = P * (dPd * D - rowsum(dO * O)),
 *   dQ = scale dS K,  dK = scale dS^T Q. */
ca_status cpu_attention_backward(void *dev, const ca_attention_backward_args *args) {
    ca_dtype dt = args->dt;
    const ca_attention_params *a = &args->p;
    const void *q = args->q;
    const void *k = args->k;
    const void *v = args->v;
    const void *out = args->out;
    const void *dout = args->dout;
    const float *lse = args->lse;
    void *dq = args->dq;
    void *dk = args->dk;
    void *dv = args->dv;
    (void)dev;
    ca_status st = att_dtype("attention_backward", dt);
    if (st != CA_OK) return st;
    int64_t nbh = a->batch * a->heads, tq = a->tq, tk = a->tk, d = a->d, dvn = a->dv;
    if (nbh == 0) return CA_OK;
    memset(dq, 0, (size_t)(nbh * tq * d) * sizeof(float));
    memset(dk, 0, (size_t)(nbh * tk * d) * sizeof(float));
    memset(dv, 0, (size_t)(nbh * tk * dvn) * sizeof(float));
    if (tq == 0 || tk == 0) return CA_OK;
    att_scratch w;
    if ((st = scratch_alloc(a, &w, "attention_backward")) != CA_OK) return st;
    float p = a->dropout_p, keep_scale = 1.0f / (1.0f - p);
    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t h = 0; h < a->heads; h++) {
            int64_t bh = b * a->heads + h;
            const float *qb = (const float *)q + bh * tq * d, *kb = (const float *)k + bh * tk * d;
            const float *vb = (const float *)v + bh * tk * dvn, *ob = (const float *)out + bh * tq * dvn;
            const float *gb = (const float *)dout + bh * tq * dvn;
            float *dqb = (float *)dq + bh * tq * d, *dkb = (float *)dk + bh * tk * d;
            float *dvb = (float *)dv + bh * tk * dvn;
            for (int64_t i0 = 0; i0 < tq; i0 += QBLOCK) {
                int64_t rows = tq - i0 < QBLOCK ? tq - i0 : QBLOCK;
                int64_t nc = row_cols(a, i0 + rows - 1);
                const float *qi = qb + i0 * d, *gi = gb + i0 * dvn, *oi = ob + i0 * dvn;
                block_probs(a, b, h, i0, rows, nc, qi, kb, lse + bh * tq + i0, NULL, &w);
                const uint32_t *wd = block_words(a, (uint64_t)bh, i0, rows, w.words);
                const float *pd = w.s;
                if (wd) {
                    for (int64_t r = 0; r < rows; r++)
                        scale_drop(w.s + r * tk, nc, 1.0f, wd + r * tk, p, keep_scale, w.p + r * tk);
                    pd = w.p;
                }
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nc, (int)dvn, (int)rows, 1.0f, pd, ld(tk),
                            gi, ld(dvn), 1.0f, dvb, ld(dvn));
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)nc, (int)dvn, 1.0f, gi,
                            ld(dvn), vb, ld(dvn), 0.0f, w.p, ld(tk));
                for (int64_t r = 0; r < rows; r++)
                    score_grad(w.s + r * tk, w.p + r * tk, nc, dot(gi + r * dvn, oi + r * dvn, dvn),
                               wd ? wd + r * tk : NULL, p, keep_scale);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)d, (int)nc, a->scale, w.s,
                            ld(tk), kb, ld(d), 0.0f, dqb + i0 * d, ld(d));
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nc, (int)d, (int)rows, a->scale, w.s,
                            ld(tk), qi, ld(d), 1.0f, dkb, ld(d));
            }
        }
    scratch_free(&w);
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
