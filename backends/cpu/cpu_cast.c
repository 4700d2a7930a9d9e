/* CPU kernels that move and convert data: fill, cast, copy_strided, and the f16/bf16 <-> f32 helpers. */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"

#include <stdlib.h>

ca_status cpu_bad_dtype(const char *kernel, const char *what, ca_dtype dt) {
    return ca_kernel_bad_dtype("cpu", kernel, what, dt);
}

/* ------------------------------------------------------ f32 conversions */

CPU_CLONES static void f16_to_f32(const uint16_t *restrict x, int64_t n, float *restrict y) {
    for (int64_t i = 0; i < n; i++) y[i] = ca_f16_to_f32(x[i]);
}

CPU_CLONES static void bf16_to_f32(const uint16_t *restrict x, int64_t n, float *restrict y) {
    for (int64_t i = 0; i < n; i++) y[i] = ca_bf16_to_f32(x[i]);
}

CPU_CLONES static void f32_to_f16(const float *restrict x, int64_t n, uint16_t *restrict y) {
    for (int64_t i = 0; i < n; i++) y[i] = ca_f32_to_f16(x[i]);
}

CPU_CLONES static void f32_to_bf16(const float *restrict x, int64_t n, uint16_t *restrict y) {
    for (int64_t i = 0; i < n; i++) y[i] = ca_f32_to_bf16(x[i]);
}

void cpu_to_f32(ca_dtype dt, const void *x, int64_t off, int64_t n, float *out) {
    switch (dt) {
    case CA_F16: f16_to_f32((const uint16_t *)x + off, n, out); break;
    case CA_BF16: bf16_to_f32((const uint16_t *)x + off, n, out); break;
    default: memcpy(out, (const float *)x + off, (size_t)n * sizeof(float)); break;
    }
}

void cpu_from_f32(ca_dtype dt, const float *x, int64_t n, void *y, int64_t off) {
    switch (dt) {
    case CA_F16: f32_to_f16(x, n, (uint16_t *)y + off); break;
    case CA_BF16: f32_to_bf16(x, n, (uint16_t *)y + off); break;
    default: memmove((float *)y + off, x, (size_t)n * sizeof(float)); break;
    }
}

void cpu_to_f32_strided(ca_dtype dt, const void *x, int64_t off, int64_t stride, int64_t n,
                        float *out) {
    if (stride == 1) {
        cpu_to_f32(dt, x, off, n, out);
        return;
    }
    switch (dt) {
    case CA_F16: {
        const uint16_t *p = (const uint16_t *)x + off;
        for (int64_t i = 0; i < n; i++) out[i] = ca_f16_to_f32(p[i * stride]);
        break;
    }
    case CA_BF16: {
        const uint16_t *p = (const uint16_t *)x + off;
        for (int64_t i = 0; i < n; i++) out[i] = ca_bf16_to_f32(p[i * stride]);
        break;
    }
    default: {
        const float *p = (const float *)x + off;
        for (int64_t i = 0; i < n; i++) out[i] = p[i * stride];
        break;
    }
    }
}

/* ----------------------------------------------------------------- fill */

/* Float -> integer as the kernels define it: round to nearest (ties to even),
 * NaN -> 0, saturate at the type's range. */
static inline int64_t round_sat(double v, double lo, double hi) {
    if (v != v) return 0;
    if (v <= lo) return (int64_t)lo;
    if (v >= hi) return (int64_t)hi;
    return (int64_t)nearbyint(v);
}

static inline int64_t round_sat_i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)nearbyint(v);
}

CPU_CLONES static void fill_f32(float *restrict y, int64_t n, float v) {
    for (int64_t i = 0; i < n; i++) y[i] = v;
}

CPU_CLONES static void fill_u16(uint16_t *restrict y, int64_t n, uint16_t v) {
    for (int64_t i = 0; i < n; i++) y[i] = v;
}

/* Elements [lo, hi) of a fill. */
static void fill_range(void *ctx, int64_t lo, int64_t hi) {
    const ca_fill_args *a = ctx;
    int64_t n = hi - lo;
    switch (a->dt) {
    case CA_F32: fill_f32((float *)a->y + lo, n, (float)a->value); break;
    case CA_F16: fill_u16((uint16_t *)a->y + lo, n, ca_f32_to_f16((float)a->value)); break;
    case CA_BF16: fill_u16((uint16_t *)a->y + lo, n, ca_f32_to_bf16((float)a->value)); break;
    case CA_I32: {
        int32_t v = (int32_t)round_sat(a->value, (double)INT32_MIN, (double)INT32_MAX);
        int32_t *p = (int32_t *)a->y + lo;
        for (int64_t i = 0; i < n; i++) p[i] = v;
        break;
    }
    case CA_I64: {
        int64_t v = round_sat_i64(a->value);
        int64_t *p = (int64_t *)a->y + lo;
        for (int64_t i = 0; i < n; i++) p[i] = v;
        break;
    }
    default: memset((uint8_t *)a->y + lo, (int)round_sat(a->value, 0.0, 255.0), (size_t)n); break;
    }
}

ca_status cpu_fill(void *dev, const ca_fill_args *args) {
    switch (args->dt) {
    case CA_F32: case CA_F16: case CA_BF16: case CA_I32: case CA_I64: case CA_U8: break;
    default: return cpu_bad_dtype("fill", "output", args->dt);
    }
    /* a store only: half a streaming element's traffic */
    cpu_parallel_for(args->n, 2 * CPU_GRAIN, fill_range, (void *)args);
    return CA_OK;
}

/* ----------------------------------------------------------------- cast */

/* The dataloader's hot path: u8 pixels * (1/255) -> f32. */
CPU_CLONES static void u8_to_f32(const uint8_t *restrict x, int64_t n, float alpha,
                                 float *restrict y) {
    for (int64_t i = 0; i < n; i++) y[i] = alpha * (float)x[i];
}

CPU_CLONES static void i32_to_f32(const int32_t *restrict x, int64_t n, float alpha,
                                  float *restrict y) {
    for (int64_t i = 0; i < n; i++) y[i] = alpha * (float)x[i];
}

static void i64_to_f32(const int64_t *restrict x, int64_t n, float alpha, float *restrict y) {
    for (int64_t i = 0; i < n; i++) y[i] = alpha * (float)x[i];
}

CPU_CLONES static void scale_f32(float *restrict y, int64_t n, float alpha) {
    for (int64_t i = 0; i < n; i++) y[i] *= alpha;
}

/* Reads n elements of any dtype as float into buf (alpha applied). */
static void load_scaled(ca_dtype dt, const void *x, int64_t off, int64_t n, float alpha,
                        float *buf) {
    switch (dt) {
    case CA_U8: u8_to_f32((const uint8_t *)x + off, n, alpha, buf); return;
    case CA_I32: i32_to_f32((const int32_t *)x + off, n, alpha, buf); return;
    case CA_I64: i64_to_f32((const int64_t *)x + off, n, alpha, buf); return;
    default:
        cpu_to_f32(dt, x, off, n, buf);
        if (alpha != 1.0f) scale_f32(buf, n, alpha);
        return;
    }
}

CPU_CLONES static void f32_to_u8(const float *restrict x, int64_t n, uint8_t *restrict y) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        v = v != v ? 0.0f : (v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v));
        y[i] = (uint8_t)nearbyintf(v);
    }
}

static void f32_to_i32(const float *restrict x, int64_t n, int32_t *restrict y) {
    for (int64_t i = 0; i < n; i++)
        y[i] = (int32_t)round_sat(x[i], (double)INT32_MIN, (double)INT32_MAX);
}

static void f32_to_i64(const float *restrict x, int64_t n, int64_t *restrict y) {
    for (int64_t i = 0; i < n; i++) y[i] = round_sat_i64(x[i]);
}

static void store_float(ca_dtype dt, const float *buf, int64_t n, void *y, int64_t off) {
    switch (dt) {
    case CA_U8: f32_to_u8(buf, n, (uint8_t *)y + off); return;
    case CA_I32: f32_to_i32(buf, n, (int32_t *)y + off); return;
    case CA_I64: f32_to_i64(buf, n, (int64_t *)y + off); return;
    default: cpu_from_f32(dt, buf, n, y, off); return;
    }
}

static inline int64_t int_at(ca_dtype dt, const void *x, int64_t i) {
    switch (dt) {
    case CA_U8: return ((const uint8_t *)x)[i];
    case CA_I32: return ((const int32_t *)x)[i];
    default: return ((const int64_t *)x)[i];
    }
}

/* Integer -> integer with alpha == 1 is exact (saturating), not through f32. */
static void cast_int_int(ca_dtype sdt, const void *x, ca_dtype ddt, void *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int64_t v = int_at(sdt, x, i);
        switch (ddt) {
        case CA_U8: ((uint8_t *)y)[i] = (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v)); break;
        case CA_I32:
            ((int32_t *)y)[i] = (int32_t)(v < INT32_MIN ? INT32_MIN : (v > INT32_MAX ? INT32_MAX : v));
            break;
        default: ((int64_t *)y)[i] = v; break;
        }
    }
}

static bool is_int(ca_dtype dt) { return dt == CA_I32 || dt == CA_I64 || dt == CA_U8; }

/* Elements [lo, hi) of a cast. */
static void cast_range(void *ctx, int64_t lo, int64_t hi) {
    const ca_cast_args *a = ctx;
    size_t ssz = ca_dtype_size(a->src_dt), dsz = ca_dtype_size(a->dst_dt);
    const void *x = (const char *)a->x + (size_t)lo * ssz;
    void *y = (char *)a->y + (size_t)lo * dsz;
    int64_t n = hi - lo;
    if (a->alpha == 1.0f) {
        if (a->src_dt == a->dst_dt) {
            if (x != y) memmove(y, x, (size_t)n * ssz);
            return;
        }
        if (is_int(a->src_dt) && is_int(a->dst_dt)) {
            cast_int_int(a->src_dt, x, a->dst_dt, y, n);
            return;
        }
    }
    if (a->src_dt == CA_U8 && a->dst_dt == CA_F32) {
        u8_to_f32(x, n, a->alpha, y);
        return;
    }
    float buf[CPU_CHUNK];
    for (int64_t off = 0; off < n; off += CPU_CHUNK) {
        int64_t c = n - off < CPU_CHUNK ? n - off : CPU_CHUNK;
        load_scaled(a->src_dt, x, off, c, a->alpha, buf);
        store_float(a->dst_dt, buf, c, y, off);
    }
}

ca_status cpu_cast(void *dev, const ca_cast_args *args) {
    ca_dtype src_dt = args->src_dt, dst_dt = args->dst_dt;
    int64_t n = args->n;
    if (n == 0) return CA_OK;
    /* Chunks of x are read completely before they are written, so y may be x
     * itself when its elements are no larger; other overlaps are refused. */
    size_t ssz = ca_dtype_size(src_dt), dsz = ca_dtype_size(dst_dt);
    uintptr_t xb = (uintptr_t)args->x, yb = (uintptr_t)args->y;
    bool overlap = yb < xb + (size_t)n * ssz && xb < yb + (size_t)n * dsz;
    if (overlap && !(src_dt == dst_dt && args->alpha == 1.0f) && !(xb == yb && dsz <= ssz))
        return ca_error(CA_ERR_INVALID, "cpu kernel cast: output overlaps the input (%s -> %s)",
                        ca_dtype_name(src_dt), ca_dtype_name(dst_dt));
    /* An overlap other than element i on element i (a narrowing cast in place, an overlapping
     * move) writes bytes that another range still has to read: such a call runs in order, serial. */
    if (overlap && !(xb == yb && dsz == ssz)) {
        cast_range((void *)args, 0, n);
        return CA_OK;
    }
    cpu_parallel_for(n, cpu_grain_for(ssz + dsz > 8 ? 2 : 1), cast_range, (void *)args);
    return CA_OK;
}

/* --------------------------------------------------------- copy_strided */

/* A copy's shape with size-1 dims dropped and dims contiguous in both x and y merged. */
typedef struct copy_ctx {
    const ca_copy_strided_args *a;
    int nd;
    int64_t sh[CA_MAX_DIMS], xs[CA_MAX_DIMS], ys[CA_MAX_DIMS];
} copy_ctx;

/* n elements of one row, strides xi and yi (in elements of es bytes). */
static void copy_run(const char *xp, int64_t xi, char *yp, int64_t yi, int64_t n, size_t es) {
    if (xi == 1 && yi == 1) {
        memmove(yp, xp, (size_t)n * es);
        return;
    }
    switch (es) {
    case 1: for (int64_t i = 0; i < n; i++) yp[i * yi] = xp[i * xi]; break;
    case 2:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)yp)[i * yi] = ((const uint16_t *)xp)[i * xi];
        break;
    case 4:
        for (int64_t i = 0; i < n; i++) ((uint32_t *)yp)[i * yi] = ((const uint32_t *)xp)[i * xi];
        break;
    default:
        for (int64_t i = 0; i < n; i++) ((uint64_t *)yp)[i * yi] = ((const uint64_t *)xp)[i * xi];
        break;
    }
}

/* Elements [lo, hi) of the copy in row-major order of its shape: a partial row at either end. */
static void copy_range(void *ctx, int64_t lo, int64_t hi) {
    const copy_ctx *cc = ctx;
    int nd = cc->nd;
    size_t es = ca_dtype_size(cc->a->dt);
    int64_t inner = cc->sh[nd - 1], xi = cc->xs[nd - 1], yi = cc->ys[nd - 1];
    int64_t idx[CA_MAX_DIMS] = {0}, xo = 0, yo = 0, r = lo / inner, col = lo % inner;
    for (int d = nd - 2; d >= 0; d--) {
        idx[d] = r % cc->sh[d];
        r /= cc->sh[d];
        xo += idx[d] * cc->xs[d];
        yo += idx[d] * cc->ys[d];
    }
    for (int64_t e = lo; e < hi;) {
        int64_t n = inner - col < hi - e ? inner - col : hi - e;
        copy_run((const char *)cc->a->x + (xo + col * xi) * (int64_t)es, xi,
                 (char *)cc->a->y + (yo + col * yi) * (int64_t)es, yi, n, es);
        e += n;
        col = 0;
        for (int d = nd - 2; d >= 0; d--) {
            xo += cc->xs[d];
            yo += cc->ys[d];
            if (++idx[d] < cc->sh[d]) break;
            xo -= cc->xs[d] * cc->sh[d];
            yo -= cc->ys[d] * cc->sh[d];
            idx[d] = 0;
        }
    }
}

/* The bytes [lo, hi) the strided elements of a copy's side span. */
static void span(const copy_ctx *cc, const int64_t *st, const void *base, uintptr_t *lo, uintptr_t *hi) {
    int64_t es = (int64_t)ca_dtype_size(cc->a->dt), neg = 0, pos = 0;
    for (int d = 0; d < cc->nd; d++) {
        int64_t reach = (cc->sh[d] - 1) * st[d];
        if (reach < 0) neg += reach; else pos += reach;
    }
    *lo = (uintptr_t)base + (uintptr_t)(neg * es);
    *hi = (uintptr_t)base + (uintptr_t)((pos + 1) * es);
}

ca_status cpu_copy_strided(void *dev, const ca_copy_strided_args *args) {
    copy_ctx cc = {.a = args};
    int64_t *sh = cc.sh, *xs = cc.xs, *ys = cc.ys;
    /* Drop size-1 dims and merge dims that are contiguous in both x and y. */
    int nd = 0;
    int64_t total = 1;
    for (int d = 0; d < args->ndim; d++) {
        int64_t s = args->shape[d];
        if (s == 0) return CA_OK;
        total *= s;
        if (s == 1) continue;
        if (nd > 0 && xs[nd - 1] == args->x_stride[d] * s && ys[nd - 1] == args->y_stride[d] * s) {
            sh[nd - 1] *= s;
            xs[nd - 1] = args->x_stride[d];
            ys[nd - 1] = args->y_stride[d];
            continue;
        }
        sh[nd] = s;
        xs[nd] = args->x_stride[d];
        ys[nd] = args->y_stride[d];
        nd++;
    }
    if (nd == 0) {
        memmove(args->y, args->x, ca_dtype_size(args->dt));
        return CA_OK;
    }
    cc.nd = nd;
    /* x and y overlapping: the serial order of rows is what the caller gets, so it stays serial */
    uintptr_t xl, xh, yl, yh;
    span(&cc, xs, args->x, &xl, &xh);
    span(&cc, ys, args->y, &yl, &yh);
    if (xl < yh && yl < xh) {
        copy_range(&cc, 0, total);
        return CA_OK;
    }
    bool contig = xs[nd - 1] == 1 && ys[nd - 1] == 1;
    cpu_parallel_for(total, cpu_grain_for(contig ? 1 : 2), copy_range, &cc);
    return CA_OK;
}
