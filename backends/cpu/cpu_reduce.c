/* CPU reductions: reduce over the middle of (outer, len, inner) with sum/mean/min/max, and argmax. */
#include "backends/cpu/cpu_impl.h"

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

/* Reduction of x[o, :, 0] (inner == 1): one contiguous row per output. */
static float reduce_row(ca_reduce_op op, ca_dtype dt, const void *x, int64_t off, int64_t len,
                        float *buf) {
    if (op == CA_OP_SUM || op == CA_OP_AVG) {
        double s = 0.0;
        for (int64_t l = 0; l < len; l += CPU_CHUNK) {
            int64_t c = len - l < CPU_CHUNK ? len - l : CPU_CHUNK;
            s += cpu_run_sum(cpu_view_f32(dt, x, off + l, c, buf), c);
        }
        if (op == CA_OP_AVG) return len ? (float)(s / (double)len) : NAN;
        return (float)s;
    }
    float m = op == CA_OP_MAX ? -INFINITY : INFINITY;
    for (int64_t l = 0; l < len; l += CPU_CHUNK) {
        int64_t c = len - l < CPU_CHUNK ? len - l : CPU_CHUNK;
        const float *v = cpu_view_f32(dt, x, off + l, c, buf);
        m = op == CA_OP_MAX ? cpu_run_max(v, c, m) : run_min(v, c, m);
    }
    return m;
}

ca_status cpu_reduce(void *dev, const ca_reduce_args *args) {
    ca_reduce_op op = args->op;
    ca_dtype dt = args->dt;
    int64_t outer = args->outer;
    int64_t len = args->len;
    int64_t inner = args->inner;
    const void *x = args->x;
    void *y = args->y;
    float beta = args->beta;
    if (outer == 0 || inner == 0) return CA_OK;
    float buf[CPU_CHUNK], acc[CPU_CHUNK], res[CPU_CHUNK], ob[CPU_CHUNK];
    double dacc[CPU_CHUNK];
    bool sum = op == CA_OP_SUM || op == CA_OP_AVG;

    if (inner == 1) {
        for (int64_t o0 = 0; o0 < outer; o0 += CPU_CHUNK) {
            int64_t c = outer - o0 < CPU_CHUNK ? outer - o0 : CPU_CHUNK;
            for (int64_t o = 0; o < c; o++) res[o] = reduce_row(op, dt, x, (o0 + o) * len, len, buf);
            float *out = dt == CA_F32 ? (float *)y + o0 : ob;
            if (dt != CA_F32 && beta != 0.0f) cpu_to_f32(dt, y, o0, c, ob);
            finish(out, res, c, beta);
            if (dt != CA_F32) cpu_from_f32(dt, ob, c, y, o0);
        }
        return CA_OK;
    }

    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i0 = 0; i0 < inner; i0 += CPU_CHUNK) {
            int64_t c = inner - i0 < CPU_CHUNK ? inner - i0 : CPU_CHUNK;
            int64_t base = o * len * inner + i0;
            if (sum) {
                /* f32 blocks of SUM_BLOCK rows, totals in f64 */
                for (int64_t i = 0; i < c; i++) dacc[i] = 0.0;
                for (int64_t l0 = 0; l0 < len; l0 += SUM_BLOCK) {
                    int64_t le = len - l0 < SUM_BLOCK ? len : l0 + SUM_BLOCK;
                    memcpy(acc, cpu_view_f32(dt, x, base + l0 * inner, c, buf), (size_t)c * sizeof(float));
                    for (int64_t l = l0 + 1; l < le; l++)
                        cols_add(acc, cpu_view_f32(dt, x, base + l * inner, c, buf), c);
                    for (int64_t i = 0; i < c; i++) dacc[i] += acc[i];
                }
                double scale = op == CA_OP_AVG ? 1.0 / (double)len : 1.0;
                for (int64_t i = 0; i < c; i++)
                    res[i] = len ? (float)(dacc[i] * scale) : (op == CA_OP_AVG ? NAN : 0.0f);
            } else {
                memcpy(res, cpu_view_f32(dt, x, base, c, buf), (size_t)c * sizeof(float));
                for (int64_t l = 1; l < len; l++) {
                    const float *v = cpu_view_f32(dt, x, base + l * inner, c, buf);
                    if (op == CA_OP_MAX)
                        cols_max(res, v, c);
                    else
                        cols_min(res, v, c);
                }
            }
            float *out = dt == CA_F32 ? (float *)y + o * inner + i0 : ob;
            if (dt != CA_F32 && beta != 0.0f) cpu_to_f32(dt, y, o * inner + i0, c, ob);
            finish(out, res, c, beta);
            if (dt != CA_F32) cpu_from_f32(dt, ob, c, y, o * inner + i0);
        }
    }
    return CA_OK;
}

ca_status cpu_argmax(void *dev, const ca_argmax_args *args) {
    ca_dtype dt = args->dt;
    int64_t rows = args->rows;
    int64_t cols = args->cols;
    const void *x = args->x;
    int64_t *idx = args->idx;
    if (rows == 0) return CA_OK;
    float buf[CPU_CHUNK];
    for (int64_t r = 0; r < rows; r++) {
        /* the first maximum; a NaN counts as the largest value */
        float best = 0.0f;
        int64_t bi = -1;
        for (int64_t c0 = 0; c0 < cols; c0 += CPU_CHUNK) {
            int64_t c = cols - c0 < CPU_CHUNK ? cols - c0 : CPU_CHUNK;
            const float *v = cpu_view_f32(dt, x, r * cols + c0, c, buf);
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
        idx[r] = bi;
    }
    return CA_OK;
}
