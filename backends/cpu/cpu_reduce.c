/* CPU reductions: reduce over the middle of (outer, len, inner) with sum/mean/min/max, and argmax. */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"

#include <stdlib.h>

#define LANES 16
/* Rows summed in f32 before they are added to the f64 total. */
#define SUM_BLOCK 256

/* NaN wins, as in torch.max/min. */
CPU_INLINE float max_nan(float m, float v) { return (v > m || v != v) ? v : m; }
CPU_INLINE float min_nan(float m, float v) { return (v < m || v != v) ? v : m; }

/* Sum of a contiguous run in independent lanes, which the
 * compiler turns into vector adds. */
CPU_CLONES float cpu_run_sum(const float *restrict x, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += x[i + j];
    float s = 0.0f;
    for (; i < n; i++) s += x[i];
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

/* The max and min of a run are taken on integer keys that order as the floats do (the sign bit
 * flips the other bits of negatives), with NaN as a separate flag: integer max/min reductions
 * vectorise at -O3, the float select (`v > m || v != v`) did not. -0 orders below +0. */
CPU_INLINE int32_t order_key(uint32_t b) { return (int32_t)(b ^ ((uint32_t)((int32_t)b >> 31) >> 1)); }
CPU_INLINE uint32_t is_nan_bits(uint32_t b) { return (b & 0x7fffffffu) > 0x7f800000u; }

CPU_CLONES float cpu_run_max(const float *restrict x, int64_t n, float m) {
    int32_t mk = order_key(ca_f32_bits(m));
    uint32_t nan = m != m;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b = ca_f32_bits(x[i]);
        int32_t k = order_key(b);
        mk = k > mk ? k : mk;
        nan |= is_nan_bits(b);
    }
    return nan ? NAN : ca_bits_f32((uint32_t)order_key((uint32_t)mk));
}

CPU_CLONES static float run_min(const float *restrict x, int64_t n, float m) {
    int32_t mk = order_key(ca_f32_bits(m));
    uint32_t nan = m != m;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b = ca_f32_bits(x[i]);
        int32_t k = order_key(b);
        mk = k < mk ? k : mk;
        nan |= is_nan_bits(b);
    }
    return nan ? NAN : ca_bits_f32((uint32_t)order_key((uint32_t)mk));
}

/* acc[i] op= x[i] over a column chunk. */
CPU_CLONES static void cols_add(float *restrict acc, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}
CPU_CLONES static void cols_max(float *restrict acc, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) acc[i] = max_nan(acc[i], x[i]);
}
CPU_CLONES static void cols_min(float *restrict acc, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) acc[i] = min_nan(acc[i], x[i]);
}

/* out[i] = beta * out[i] + r[i] */
CPU_CLONES static void finish(float *restrict out, const float *restrict r, int64_t n, float beta) {
    if (beta == 0.0f)
        for (int64_t i = 0; i < n; i++) out[i] = r[i];
    else
        for (int64_t i = 0; i < n; i++) out[i] = beta * out[i] + r[i];
}

/* The partial of one chunk of a row: its f32 sum (cpu_run_sum), max or min. A row's result is
 * its chunks' partials combined in chunk order (sum_partials, cpu_run_max, run_min), however the
 * chunks were shared among threads: so a reduction is bit-identical at every thread count. */
static float chunk_partial(ca_reduce_op op, ca_dtype dt, const void *x, int64_t off, int64_t c, float *buf) {
    const float *v = cpu_view_f32(dt, x, off, c, buf);
    if (op == CA_OP_SUM || op == CA_OP_AVG) return cpu_run_sum(v, c);
    return op == CA_OP_MAX ? cpu_run_max(v, c, -INFINITY) : run_min(v, c, INFINITY);
}

/* Folds k chunk partials into a row's running value (sum: the f64 total, in order). */
static void fold_partials(ca_reduce_op op, const float *p, int64_t k, double *s, float *m) {
    if (op == CA_OP_SUM || op == CA_OP_AVG) {
        for (int64_t i = 0; i < k; i++) *s += p[i];
    } else {
        *m = op == CA_OP_MAX ? cpu_run_max(p, k, *m) : run_min(p, k, *m);
    }
}

static float row_result(ca_reduce_op op, double s, float m, int64_t len) {
    if (op == CA_OP_AVG) return len ? (float)(s / (double)len) : NAN;
    return op == CA_OP_SUM ? (float)s : m;
}

/* Reduction of x[o, :, 0] (inner == 1): one contiguous row per output. */
static float reduce_row(ca_reduce_op op, ca_dtype dt, const void *x, int64_t off, int64_t len,
                        float *buf) {
    double s = 0.0;
    float m = op == CA_OP_MAX ? -INFINITY : INFINITY;
    for (int64_t l = 0; l < len; l += CPU_CHUNK) {
        int64_t c = len - l < CPU_CHUNK ? len - l : CPU_CHUNK;
        float p = chunk_partial(op, dt, x, off + l, c, buf);
        fold_partials(op, &p, 1, &s, &m);
    }
    return row_result(op, s, m, len);
}

/* y[o0, o0 + c) = beta * y + res, in y's dtype. */
static void store_out(const ca_reduce_args *a, int64_t o0, int64_t c, const float *res) {
    if (a->dt == CA_F32) {
        finish((float *)a->y + o0, res, c, a->beta);
        return;
    }
    float ob[CPU_CHUNK];
    if (a->beta != 0.0f) cpu_to_f32(a->dt, a->y, o0, c, ob);
    finish(ob, res, c, a->beta);
    cpu_from_f32(a->dt, ob, c, a->y, o0);
}

/* Rows [lo, hi) of an inner == 1 reduction, each row on this thread. */
static void rows_range(void *ctx, int64_t lo, int64_t hi) {
    const ca_reduce_args *a = ctx;
    float buf[CPU_CHUNK], res[CPU_CHUNK];
    for (int64_t o0 = lo; o0 < hi; o0 += CPU_CHUNK) {
        int64_t c = hi - o0 < CPU_CHUNK ? hi - o0 : CPU_CHUNK;
        for (int64_t o = 0; o < c; o++) res[o] = reduce_row(a->op, a->dt, a->x, (o0 + o) * a->len, a->len, buf);
        store_out(a, o0, c, res);
    }
}

/* Chunk partials computed at once (a stack buffer), per fork of the long-row path. */
#define PARTIALS 4096

typedef struct chunks_ctx {
    const ca_reduce_args *a;
    int64_t row_off, k0, len;  /* the row's first element; the batch's first chunk in it; row length */
    float *part;
} chunks_ctx;

static void chunk_block(void *ctx, int64_t b) {
    const chunks_ctx *cc = ctx;
    float buf[CPU_CHUNK];
    int64_t l = (cc->k0 + b) * CPU_CHUNK, c = cc->len - l < CPU_CHUNK ? cc->len - l : CPU_CHUNK;
    cc->part[b] = chunk_partial(cc->a->op, cc->a->dt, cc->a->x, cc->row_off + l, c, buf);
}

/* Few long rows (a full reduction): each row's chunks in parallel, the partials folded in order on
 * this thread, so the result is the serial one. */
static void long_rows(const ca_reduce_args *a) {
    float part[PARTIALS], res[CPU_CHUNK];
    int64_t nchunk = (a->len + CPU_CHUNK - 1) / CPU_CHUNK;
    for (int64_t o0 = 0; o0 < a->outer; o0 += CPU_CHUNK) {
        int64_t c = a->outer - o0 < CPU_CHUNK ? a->outer - o0 : CPU_CHUNK;
        for (int64_t o = 0; o < c; o++) {
            chunks_ctx cc = {.a = a, .row_off = (o0 + o) * a->len, .len = a->len, .part = part};
            double s = 0.0;
            float m = a->op == CA_OP_MAX ? -INFINITY : INFINITY;
            for (cc.k0 = 0; cc.k0 < nchunk; cc.k0 += PARTIALS) {
                int64_t k = nchunk - cc.k0 < PARTIALS ? nchunk - cc.k0 : PARTIALS;
                cpu_parallel_blocks(k, CPU_CHUNK, chunk_block, &cc);
                fold_partials(a->op, part, k, &s, &m);
            }
            res[o] = row_result(a->op, s, m, a->len);
        }
        store_out(a, o0, c, res);
    }
}

/* Outputs [o * inner + i0, + c) of a reduction over a middle dim: each column summed down len in
 * f32 blocks of SUM_BLOCK rows, totals in f64. A column's result depends on that column alone. */
static void cols_tile(const ca_reduce_args *a, int64_t o, int64_t i0, int64_t c) {
    float buf[CPU_CHUNK], acc[CPU_CHUNK], res[CPU_CHUNK];
    double dacc[CPU_CHUNK];
    ca_dtype dt = a->dt;
    int64_t len = a->len, inner = a->inner, base = o * len * inner + i0;
    if (a->op == CA_OP_SUM || a->op == CA_OP_AVG) {
        for (int64_t i = 0; i < c; i++) dacc[i] = 0.0;
        for (int64_t l0 = 0; l0 < len; l0 += SUM_BLOCK) {
            int64_t le = len - l0 < SUM_BLOCK ? len : l0 + SUM_BLOCK;
            memcpy(acc, cpu_view_f32(dt, a->x, base + l0 * inner, c, buf), (size_t)c * sizeof(float));
            for (int64_t l = l0 + 1; l < le; l++)
                cols_add(acc, cpu_view_f32(dt, a->x, base + l * inner, c, buf), c);
            for (int64_t i = 0; i < c; i++) dacc[i] += acc[i];
        }
        double scale = a->op == CA_OP_AVG ? 1.0 / (double)len : 1.0;
        for (int64_t i = 0; i < c; i++)
            res[i] = len ? (float)(dacc[i] * scale) : (a->op == CA_OP_AVG ? NAN : 0.0f);
    } else {
        memcpy(res, cpu_view_f32(dt, a->x, base, c, buf), (size_t)c * sizeof(float));
        for (int64_t l = 1; l < len; l++) {
            const float *v = cpu_view_f32(dt, a->x, base + l * inner, c, buf);
            if (a->op == CA_OP_MAX)
                cols_max(res, v, c);
            else
                cols_min(res, v, c);
        }
    }
    store_out(a, o * inner + i0, c, res);
}

/* Output columns [lo, hi) of the (outer, inner) outputs, in tiles of up to CPU_CHUNK columns. */
static void cols_range(void *ctx, int64_t lo, int64_t hi) {
    const ca_reduce_args *a = ctx;
    for (int64_t e = lo; e < hi;) {
        int64_t o = e / a->inner, i0 = e % a->inner;
        int64_t c = a->inner - i0 < hi - e ? a->inner - i0 : hi - e;
        if (c > CPU_CHUNK) c = CPU_CHUNK;
        cols_tile(a, o, i0, c);
        e += c;
    }
}

ca_status cpu_reduce(void *dev, const ca_reduce_args *args) {
    if (args->outer == 0 || args->inner == 0) return CA_OK;
    if (args->inner > 1) {   /* columns apart (a bias grad): split among threads by output column */
        cpu_parallel_for(args->outer * args->inner, cpu_grain_for(args->len), cols_range, (void *)args);
        return CA_OK;
    }
    /* Rows apart when there are enough of them; else each row's chunks apart. Both compute the
     * serial order's bits, so the choice (which counts threads) changes speed only. */
    if (args->len <= CPU_CHUNK || args->outer >= 4 * (int64_t)cpu_threads())
        cpu_parallel_for(args->outer, cpu_grain_for(args->len), rows_range, (void *)args);
    else
        long_rows(args);
    return CA_OK;
}

/* Rows [lo, hi) of an argmax. */
static void argmax_range(void *ctx, int64_t lo, int64_t hi) {
    const ca_argmax_args *a = ctx;
    int64_t cols = a->cols;
    float buf[CPU_CHUNK];
    for (int64_t r = lo; r < hi; r++) {
        /* the first maximum; a NaN counts as the largest value */
        float best = 0.0f;
        int64_t bi = -1;
        for (int64_t c0 = 0; c0 < cols; c0 += CPU_CHUNK) {
            int64_t c = cols - c0 < CPU_CHUNK ? cols - c0 : CPU_CHUNK;
            const float *v = cpu_view_f32(a->dt, a->x, r * cols + c0, c, buf);
            int64_t i = 0;
            if (bi < 0) {
                best = v[0];
                bi = c0;
                i = 1;
            }
            if (best != best) break;
            for (; i < c; i++) {
                if (v[i] > best || v[i] != v[i]) {
                    best = v[i];
                    bi = c0 + i;
                    if (best != best) break;
                }
            }
            if (best != best) break;
        }
        a->idx[r] = bi;
    }
}

ca_status cpu_argmax(void *dev, const ca_argmax_args *args) {
    cpu_parallel_for(args->rows, cpu_grain_for(args->cols), argmax_range, (void *)args);
    return CA_OK;
}
