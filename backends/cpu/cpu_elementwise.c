/* CPU elementwise kernels: unary (+ backward), broadcasting binary, axpby. */
#include "backends/cpu/cpu_impl.h"


/* ---------------------------------------------------------------- unary */

/* The loop per op is ca_unary_f32_loop (base/unary_math_impl.h); it is inlined into an in-place and
 * a two-buffer variant so that the compiler knows exactly how x and y alias in each. */
CPU_CLONES static void unary_f32(ca_unary_op op, int64_t n, const float *restrict x,
                                 float *restrict y, float alpha) {
    ca_unary_f32_loop(op, n, x, y, alpha);
}

CPU_CLONES static void unary_f32_inplace(ca_unary_op op, int64_t n, float *y, float alpha) {
    ca_unary_f32_loop(op, n, y, y, alpha);
}

/* True when n floats at p and at q do not overlap. */
static bool apart(const void *p, const void *q, int64_t n) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q, len = (uintptr_t)n * sizeof(float);
    return a + len <= b || b + len <= a;
}

ca_status cpu_unary(void *dev, const ca_unary_args *args) {
    ca_unary_op op = args->op;
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    const void *x = args->x;
    void *y = args->y;
    float alpha = args->alpha;
    if (n == 0) return CA_OK;
    if (dt == CA_F32) {
        const float *xf = x;
        float *yf = y;
        if (xf == yf) {
            unary_f32_inplace(op, n, yf, alpha);
        } else if (apart(xf, yf, n)) {
            unary_f32(op, n, xf, yf, alpha);
        } else {
            return ca_error(CA_ERR_INVALID, "cpu kernel unary %s: y partly overlaps x",
                            ca_unary_op_name(op));
        }
        return CA_OK;
    }
    float buf[CPU_CHUNK];
    for (int64_t off = 0; off < n; off += CPU_CHUNK) {
        int64_t c = n - off < CPU_CHUNK ? n - off : CPU_CHUNK;
        cpu_to_f32(dt, x, off, c, buf);
        unary_f32_inplace(op, c, buf, alpha);
        cpu_from_f32(dt, buf, c, y, off);
    }
    return CA_OK;
}

/* g[i] = f'(.) * dy[i], reading x or y as the op needs. */
CPU_INLINE void unary_grad(ca_unary_op op, int64_t n, const float *x, const float *y,
                              const float *dy, float *g, float alpha) {
    switch (op) {
    case CA_UNARY_NEG: for (int64_t i = 0; i < n; i++) g[i] = -dy[i]; break;
    case CA_UNARY_RELU:
        for (int64_t i = 0; i < n; i++) {
            float d = dy[i];  /* loaded unconditionally, so the select vectorises */
            g[i] = y[i] > 0.0f ? d : 0.0f;
        }
        break;
    case CA_UNARY_GELU_TANH:
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            float u2 = 2.0f * CA_GELU_K * (v + CA_GELU_C * v * v * v);
            float s = 1.0f / (1.0f + ca_fast_expf(-u2));
            float du2 = 2.0f * CA_GELU_K * (1.0f + 3.0f * CA_GELU_C * v * v);
            g[i] = dy[i] * (s + v * s * (1.0f - s) * du2);
        }
        break;
    case CA_UNARY_TANH: for (int64_t i = 0; i < n; i++) g[i] = dy[i] * (1.0f - y[i] * y[i]); break;
    case CA_UNARY_SIGMOID: for (int64_t i = 0; i < n; i++) g[i] = dy[i] * y[i] * (1.0f - y[i]); break;
    case CA_UNARY_EXP: for (int64_t i = 0; i < n; i++) g[i] = dy[i] * y[i]; break;
    case CA_UNARY_LOG: for (int64_t i = 0; i < n; i++) g[i] = dy[i] / x[i]; break;
    case CA_UNARY_SQRT: for (int64_t i = 0; i < n; i++) g[i] = dy[i] * 0.5f / y[i]; break;
    case CA_UNARY_RSQRT:
        for (int64_t i = 0; i < n; i++) g[i] = dy[i] * -0.5f / (x[i] * sqrtf(x[i]));
        break;
    case CA_UNARY_ABS:
        for (int64_t i = 0; i < n; i++) {
            float d = dy[i], v = x[i];
            g[i] = v > 0.0f ? d : (v < 0.0f ? -d : 0.0f);
        }
        break;
    case CA_UNARY_SQUARE: for (int64_t i = 0; i < n; i++) g[i] = dy[i] * 2.0f * x[i]; break;
    case CA_UNARY_RECIP: for (int64_t i = 0; i < n; i++) g[i] = -dy[i] / (x[i] * x[i]); break;
    case CA_UNARY_SCALE: for (int64_t i = 0; i < n; i++) g[i] = dy[i] * alpha; break;
    case CA_UNARY_ADD_SCALAR: for (int64_t i = 0; i < n; i++) g[i] = dy[i]; break;
    case CA_UNARY_POW:
        if (alpha == 2.0f)
            for (int64_t i = 0; i < n; i++) g[i] = dy[i] * 2.0f * x[i];
        else if (alpha == 1.0f)
            for (int64_t i = 0; i < n; i++) g[i] = dy[i];
        else
            for (int64_t i = 0; i < n; i++) g[i] = dy[i] * alpha * powf(x[i], alpha - 1.0f);
        break;
    case CA_UNARY_GELU_ERF:     /* Phi(x) + x phi(x) */
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            float cdf = ca_phif(v);
            g[i] = dy[i] * (cdf + v * 0.3989422804014327f * ca_fast_expf(-0.5f * v * v));
        }
        break;
    case CA_UNARY_SILU:
        for (int64_t i = 0; i < n; i++) {
            float v = x[i], sg = 1.0f / (1.0f + ca_fast_expf(-v));
            g[i] = dy[i] * sg * (1.0f + v * (1.0f - sg));
        }
        break;
    case CA_UNARY_OP_COUNT: break;   /* not an op; no default, so -Wswitch wants a case per op */
    }
}

CPU_CLONES static void unary_grad_f32(ca_unary_op op, int64_t n, const float *restrict x,
                                      const float *restrict y, const float *restrict dy,
                                      float *restrict g, float alpha) {
    unary_grad(op, n, x, y, dy, g, alpha);
}

CPU_CLONES static void accumulate_f32(int64_t n, const float *restrict g, float beta,
                                      float *restrict dx) {
    if (beta == 0.0f)
        for (int64_t i = 0; i < n; i++) dx[i] = g[i];
    else if (beta == 1.0f)
        for (int64_t i = 0; i < n; i++) dx[i] += g[i];
    else
        for (int64_t i = 0; i < n; i++) dx[i] = beta * dx[i] + g[i];
}

ca_status cpu_unary_backward(void *dev, const ca_unary_backward_args *args) {
    ca_unary_op op = args->op;
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    const void *x = args->x;
    const void *y = args->y;
    const void *dy = args->dy;
    void *dx = args->dx;
    float alpha = args->alpha;
    float beta = args->beta;
    if (n == 0) return CA_OK;
    bool need_y = ca_unary_grad_reads_y(op), need_x = !need_y && ca_unary_grad_reads_input(op);
    /* dx written directly unless it may alias an input (the loop's pointers are restrict) */
    bool direct = dt == CA_F32 && beta == 0.0f && apart(dx, dy, n) && (!need_x || apart(dx, x, n)) &&
                  (!need_y || apart(dx, y, n));
    float xb[CPU_CHUNK], yb[CPU_CHUNK], db[CPU_CHUNK], gb[CPU_CHUNK];
    for (int64_t off = 0; off < n; off += CPU_CHUNK) {
        int64_t c = n - off < CPU_CHUNK ? n - off : CPU_CHUNK;
        const float *xs = need_x ? cpu_view_f32(dt, x, off, c, xb) : NULL;
        const float *ys = need_y ? cpu_view_f32(dt, y, off, c, yb) : NULL;
        const float *ds = cpu_view_f32(dt, dy, off, c, db);
        if (direct) {   /* straight into dx: no staging copy */
            unary_grad_f32(op, c, xs, ys, ds, (float *)dx + off, alpha);
            continue;
        }
        unary_grad_f32(op, c, xs, ys, ds, gb, alpha);
        if (dt == CA_F32) {
            accumulate_f32(c, gb, beta, (float *)dx + off);
        } else {
            float ob[CPU_CHUNK];
            if (beta != 0.0f) cpu_to_f32(dt, dx, off, c, ob);
            accumulate_f32(c, gb, beta, ob);
            cpu_from_f32(dt, ob, c, dx, off);
        }
    }
    return CA_OK;
}

/* --------------------------------------------------------------- binary */

/* y[i] = EXPR(av, bv) over one row, with the row's two strides specialised:
 * both contiguous, one side a scalar, or general. */
#define BINARY_ROW(EXPR)                                                              \
    do {                                                                              \
        if (sa == 1 && sb == 1) {                                                     \
            for (int64_t i = 0; i < n; i++) { float av = a[i], bv = b[i]; y[i] = (EXPR); } \
        } else if (sa == 1 && sb == 0) {                                              \
            float bv = b[0];                                                          \
            for (int64_t i = 0; i < n; i++) { float av = a[i]; y[i] = (EXPR); }       \
        } else if (sa == 0 && sb == 1) {                                              \
            float av = a[0];                                                          \
            for (int64_t i = 0; i < n; i++) { float bv = b[i]; y[i] = (EXPR); }       \
        } else {                                                                      \
            for (int64_t i = 0; i < n; i++) {                                         \
                float av = a[i * sa], bv = b[i * sb];                                 \
                y[i] = (EXPR);                                                        \
            }                                                                         \
        }                                                                             \
    } while (0)

/* y may be a or b itself (in-place updates), so no restrict here; the
 * vectoriser checks the overlap at run time. */
CPU_CLONES static void binary_row(ca_binary_op op, int64_t n, const float *a, int64_t sa,
                                  const float *b, int64_t sb, float *y) {
    switch (op) {
    case CA_BINARY_ADD: BINARY_ROW(av + bv); break;
    case CA_BINARY_SUB: BINARY_ROW(av - bv); break;
    case CA_BINARY_MUL: BINARY_ROW(av * bv); break;
    case CA_BINARY_DIV: BINARY_ROW(av / bv); break;
    /* NaN propagates, as torch.maximum/minimum */
    case CA_BINARY_MAX: BINARY_ROW((av > bv || av != av) ? av : bv); break;
    case CA_BINARY_MIN: BINARY_ROW((av < bv || av != av) ? av : bv); break;
    case CA_BINARY_OP_COUNT: break;   /* not an op; no default, so -Wswitch wants a case per op */
    }
}

ca_status cpu_binary(void *dev, const ca_binary_args *args) {
    ca_binary_op op = args->op;
    ca_dtype dt = args->dt;
    const ca_bcast_args *shape = &args->shape;
    const void *a = args->a;
    const void *b = args->b;
    void *y = args->y;
    /* Drop size-1 dims, merge dims that are contiguous in a, b and y alike. */
    int64_t sh[CA_MAX_DIMS], as[CA_MAX_DIMS], bs[CA_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < shape->ndim; d++) {
        int64_t s = shape->shape[d];
        if (s == 0) return CA_OK;
        if (s == 1) continue;
        if (nd > 0 && as[nd - 1] == shape->a_stride[d] * s && bs[nd - 1] == shape->b_stride[d] * s) {
            sh[nd - 1] *= s;
            as[nd - 1] = shape->a_stride[d];
            bs[nd - 1] = shape->b_stride[d];
            continue;
        }
        sh[nd] = s;
        as[nd] = shape->a_stride[d];
        bs[nd] = shape->b_stride[d];
        nd++;
    }
    if (nd == 0) {
        sh[0] = 1;
        as[0] = bs[0] = 0;
        nd = 1;
    }
    int64_t inner = sh[nd - 1], sa = as[nd - 1], sb = bs[nd - 1];
    int64_t idx[CA_MAX_DIMS] = {0};
    int64_t ao = 0, bo = 0, yo = 0;
    float abuf[CPU_CHUNK], bbuf[CPU_CHUNK], ybuf[CPU_CHUNK];
    for (;;) {
        if (dt == CA_F32) {
            binary_row(op, inner, (const float *)a + ao, sa, (const float *)b + bo, sb,
                       (float *)y + yo);
        } else {
            for (int64_t off = 0; off < inner; off += CPU_CHUNK) {
                int64_t c = inner - off < CPU_CHUNK ? inner - off : CPU_CHUNK;
                /* a scalar side stays a single converted element */
                cpu_to_f32_strided(dt, a, ao + off * sa, sa, sa ? c : 1, abuf);
                cpu_to_f32_strided(dt, b, bo + off * sb, sb, sb ? c : 1, bbuf);
                binary_row(op, c, abuf, sa ? 1 : 0, bbuf, sb ? 1 : 0, ybuf);
                cpu_from_f32(dt, ybuf, c, y, yo + off);
            }
        }
        yo += inner;
        int d = nd - 2;
        for (; d >= 0; d--) {
            ao += as[d];
            bo += bs[d];
            if (++idx[d] < sh[d]) break;
            ao -= as[d] * sh[d];
            bo -= bs[d] * sh[d];
            idx[d] = 0;
        }
        if (d < 0) break;
    }
    return CA_OK;
}

/* ---------------------------------------------------------------- axpby */

CPU_CLONES static void axpby_f32(int64_t n, float alpha, const float *x, float beta, float *y) {
    if (beta == 0.0f) {
        if (alpha == 1.0f)
            for (int64_t i = 0; i < n; i++) y[i] = x[i];
        else
            for (int64_t i = 0; i < n; i++) y[i] = alpha * x[i];
    } else if (alpha == 1.0f && beta == 1.0f) {
        for (int64_t i = 0; i < n; i++) y[i] += x[i];
    } else {
        for (int64_t i = 0; i < n; i++) y[i] = alpha * x[i] + beta * y[i];
    }
}

ca_status cpu_axpby(void *dev, const ca_axpby_args *args) {
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    float alpha = args->alpha;
    const void *x = args->x;
    float beta = args->beta;
    void *y = args->y;
    if (n == 0) return CA_OK;
    if (dt == CA_F32) {
        axpby_f32(n, alpha, x, beta, y);
        return CA_OK;
    }
    float xb[CPU_CHUNK], yb[CPU_CHUNK];
    for (int64_t off = 0; off < n; off += CPU_CHUNK) {
        int64_t c = n - off < CPU_CHUNK ? n - off : CPU_CHUNK;
        cpu_to_f32(dt, x, off, c, xb);
        if (beta != 0.0f) cpu_to_f32(dt, y, off, c, yb);
        axpby_f32(c, alpha, xb, beta, yb);
        cpu_from_f32(dt, yb, c, y, off);
    }
    return CA_OK;
}
