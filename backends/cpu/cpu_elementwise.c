/* CPU elementwise kernels: unary (+ backward), broadcasting binary, axpby. */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"


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

/* Streaming elements one element of the op costs: the ops that call exp/log/erf/pow do several
 * times the work of a load and a store, so their loops go parallel at a smaller size. */
static int64_t unary_cost(ca_unary_op op) {
    switch (op) {
    case CA_UNARY_NEG: case CA_UNARY_RELU: case CA_UNARY_ABS: case CA_UNARY_SQUARE:
    case CA_UNARY_SCALE: case CA_UNARY_ADD_SCALAR: case CA_UNARY_RECIP: case CA_UNARY_SQRT:
    case CA_UNARY_RSQRT:
        return 1;
    default: return 4;
    }
}

/* Elements [lo, hi) of a unary call; f16/bf16 through a chunk buffer of the range's own. */
static void unary_range(void *ctx, int64_t lo, int64_t hi) {
    const ca_unary_args *a = ctx;
    if (a->dt == CA_F32) {
        const float *x = (const float *)a->x + lo;
        float *y = (float *)a->y + lo;
        if (x == y)
            unary_f32_inplace(a->op, hi - lo, y, a->alpha);
        else
            unary_f32(a->op, hi - lo, x, y, a->alpha);
        return;
    }
    float buf[CPU_CHUNK];
    for (int64_t off = lo; off < hi; off += CPU_CHUNK) {
        int64_t c = hi - off < CPU_CHUNK ? hi - off : CPU_CHUNK;
        cpu_to_f32(a->dt, a->x, off, c, buf);
        unary_f32_inplace(a->op, c, buf, a->alpha);
        cpu_from_f32(a->dt, buf, c, a->y, off);
    }
}

ca_status cpu_unary(void *dev, const ca_unary_args *args) {
    if (args->n == 0) return CA_OK;
    if (args->dt == CA_F32 && args->x != args->y && !apart(args->x, args->y, args->n))
        return ca_error(CA_ERR_INVALID, "cpu kernel unary %s: y partly overlaps x", ca_unary_op_name(args->op));
    int64_t cost = unary_cost(args->op) + (args->dt != CA_F32);
    cpu_parallel_for(args->n, cpu_grain_for(cost), unary_range, (void *)args);
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

/* What the ranges of one unary_backward call share. */
typedef struct unary_bwd_ctx {
    const ca_unary_backward_args *a;
    bool need_x, need_y;
    bool direct;               /* dx written by the grad loop itself (f32, beta 0, no aliasing) */
} unary_bwd_ctx;

static void unary_backward_range(void *ctx, int64_t lo, int64_t hi) {
    const unary_bwd_ctx *u = ctx;
    const ca_unary_backward_args *a = u->a;
    ca_dtype dt = a->dt;
    float xb[CPU_CHUNK], yb[CPU_CHUNK], db[CPU_CHUNK], gb[CPU_CHUNK];
    for (int64_t off = lo; off < hi; off += CPU_CHUNK) {
        int64_t c = hi - off < CPU_CHUNK ? hi - off : CPU_CHUNK;
        const float *xs = u->need_x ? cpu_view_f32(dt, a->x, off, c, xb) : NULL;
        const float *ys = u->need_y ? cpu_view_f32(dt, a->y, off, c, yb) : NULL;
        const float *ds = cpu_view_f32(dt, a->dy, off, c, db);
        if (u->direct) {   /* straight into dx: no staging copy */
            unary_grad_f32(a->op, c, xs, ys, ds, (float *)a->dx + off, a->alpha);
            continue;
        }
        unary_grad_f32(a->op, c, xs, ys, ds, gb, a->alpha);
        if (dt == CA_F32) {
            accumulate_f32(c, gb, a->beta, (float *)a->dx + off);
        } else {
            float ob[CPU_CHUNK];
            if (a->beta != 0.0f) cpu_to_f32(dt, a->dx, off, c, ob);
            accumulate_f32(c, gb, a->beta, ob);
            cpu_from_f32(dt, ob, c, a->dx, off);
        }
    }
}

ca_status cpu_unary_backward(void *dev, const ca_unary_backward_args *args) {
    int64_t n = args->n;
    if (n == 0) return CA_OK;
    unary_bwd_ctx u = {.a = args, .need_y = ca_unary_grad_reads_y(args->op)};
    u.need_x = !u.need_y && ca_unary_grad_reads_input(args->op);
    /* dx written directly unless it may alias an input (the loop's pointers are restrict) */
    u.direct = args->dt == CA_F32 && args->beta == 0.0f && apart(args->dx, args->dy, n) &&
               (!u.need_x || apart(args->dx, args->x, n)) && (!u.need_y || apart(args->dx, args->y, n));
    int64_t cost = unary_cost(args->op) + 1 + (args->dt != CA_F32);
    cpu_parallel_for(n, cpu_grain_for(cost), unary_backward_range, &u);
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

/* A binary call's shape with size-1 dims dropped and dims contiguous in a, b and y alike merged:
 * rows of `inner` contiguous outputs, the row index running over sh[0..nd-1). */
typedef struct binary_ctx {
    const ca_binary_args *a;
    int nd;
    int64_t sh[CA_MAX_DIMS], as[CA_MAX_DIMS], bs[CA_MAX_DIMS];
} binary_ctx;

/* n outputs of one row from y[yo], its operands at a[ao] and b[bo]: one row call, or chunks through
 * f32 buffers (the range's own) for f16/bf16. */
static void binary_piece(const binary_ctx *bc, int64_t ao, int64_t bo, int64_t yo, int64_t n) {
    const ca_binary_args *a = bc->a;
    int64_t sa = bc->as[bc->nd - 1], sb = bc->bs[bc->nd - 1];
    if (a->dt == CA_F32) {
        binary_row(a->op, n, (const float *)a->a + ao, sa, (const float *)a->b + bo, sb, (float *)a->y + yo);
        return;
    }
    float abuf[CPU_CHUNK], bbuf[CPU_CHUNK], ybuf[CPU_CHUNK];
    for (int64_t off = 0; off < n; off += CPU_CHUNK) {
        int64_t c = n - off < CPU_CHUNK ? n - off : CPU_CHUNK;
        /* a scalar side stays a single converted element */
        cpu_to_f32_strided(a->dt, a->a, ao + off * sa, sa, sa ? c : 1, abuf);
        cpu_to_f32_strided(a->dt, a->b, bo + off * sb, sb, sb ? c : 1, bbuf);
        binary_row(a->op, c, abuf, sa ? 1 : 0, bbuf, sb ? 1 : 0, ybuf);
        cpu_from_f32(a->dt, ybuf, c, a->y, yo + off);
    }
}

/* Output elements [lo, hi) in row-major order: a partial row at either end, whole rows between. */
static void binary_range(void *ctx, int64_t lo, int64_t hi) {
    const binary_ctx *bc = ctx;
    int nd = bc->nd;
    int64_t inner = bc->sh[nd - 1], sa = bc->as[nd - 1], sb = bc->bs[nd - 1];
    int64_t idx[CA_MAX_DIMS] = {0}, ao = 0, bo = 0, r = lo / inner, col = lo % inner;
    for (int d = nd - 2; d >= 0; d--) {
        idx[d] = r % bc->sh[d];
        r /= bc->sh[d];
        ao += idx[d] * bc->as[d];
        bo += idx[d] * bc->bs[d];
    }
    for (int64_t yo = lo; yo < hi;) {
        int64_t n = inner - col < hi - yo ? inner - col : hi - yo;
        binary_piece(bc, ao + col * sa, bo + col * sb, yo, n);
        yo += n;
        col = 0;
        for (int d = nd - 2; d >= 0; d--) {
            ao += bc->as[d];
            bo += bc->bs[d];
            if (++idx[d] < bc->sh[d]) break;
            ao -= bc->as[d] * bc->sh[d];
            bo -= bc->bs[d] * bc->sh[d];
            idx[d] = 0;
        }
    }
}

ca_status cpu_binary(void *dev, const ca_binary_args *args) {
    const ca_bcast_args *shape = &args->shape;
    binary_ctx bc = {.a = args};
    int64_t *sh = bc.sh, *as = bc.as, *bs = bc.bs;
    /* Drop size-1 dims, merge dims that are contiguous in a, b and y alike. */
    int nd = 0;
    int64_t total = 1;
    for (int d = 0; d < shape->ndim; d++) {
        int64_t s = shape->shape[d];
        if (s == 0) return CA_OK;
        total *= s;
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
    bc.nd = nd;
    /* y may be a or b itself, read at y's own element: each element is read before it is written,
     * whichever thread runs it */
    cpu_parallel_for(total, cpu_grain_for(args->dt == CA_F32 ? 1 : 2), binary_range, &bc);
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

static void axpby_range(void *ctx, int64_t lo, int64_t hi) {
    const ca_axpby_args *a = ctx;
    if (a->dt == CA_F32) {
        axpby_f32(hi - lo, a->alpha, (const float *)a->x + lo, a->beta, (float *)a->y + lo);
        return;
    }
    float xb[CPU_CHUNK], yb[CPU_CHUNK];
    for (int64_t off = lo; off < hi; off += CPU_CHUNK) {
        int64_t c = hi - off < CPU_CHUNK ? hi - off : CPU_CHUNK;
        cpu_to_f32(a->dt, a->x, off, c, xb);
        if (a->beta != 0.0f) cpu_to_f32(a->dt, a->y, off, c, yb);
        axpby_f32(c, a->alpha, xb, a->beta, yb);
        cpu_from_f32(a->dt, yb, c, a->y, off);
    }
}

ca_status cpu_axpby(void *dev, const ca_axpby_args *args) {
    cpu_parallel_for(args->n, cpu_grain_for(args->dt == CA_F32 ? 1 : 2), axpby_range, (void *)args);
    return CA_OK;
}

/* ---------------------------------------------------------------- swiglu */

/* y = silu(g) u, silu as the unary op computes it (g / (1 + exp(-g))), so that y equals
 * ca_mul(ca_silu(g), u) bit for bit in f32. */
CPU_CLONES static void swiglu_f32(int64_t n, const float *restrict g, const float *restrict u, float *restrict y) {
    for (int64_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + ca_fast_expf(-g[i])) * u[i];
}

static void swiglu_range(void *ctx, int64_t lo, int64_t hi) {
    const ca_swiglu_args *a = ctx;
    if (a->dt == CA_F32) {
        swiglu_f32(hi - lo, (const float *)a->gate + lo, (const float *)a->up + lo, (float *)a->y + lo);
        return;
    }
    float gb[CPU_CHUNK], ub[CPU_CHUNK], yb[CPU_CHUNK];
    for (int64_t off = lo; off < hi; off += CPU_CHUNK) {
        int64_t c = hi - off < CPU_CHUNK ? hi - off : CPU_CHUNK;
        cpu_to_f32(a->dt, a->gate, off, c, gb);
        cpu_to_f32(a->dt, a->up, off, c, ub);
        swiglu_f32(c, gb, ub, yb);
        cpu_from_f32(a->dt, yb, c, a->y, off);
    }
}

ca_status cpu_swiglu(void *dev, const ca_swiglu_args *args) {
    if (args->n == 0) return CA_OK;
    cpu_parallel_for(args->n, cpu_grain_for(4 + (args->dt != CA_F32)), swiglu_range, (void *)args);
    return CA_OK;
}

/* Both gradients of one chunk, the expressions the composite's backward evaluates (the mul's, then
 * silu's unary_grad), so that they match it bit for bit in f32. */
CPU_CLONES static void swiglu_grad_f32(int64_t n, const float *restrict g, const float *restrict u,
                                       const float *restrict dy, float *restrict dg, float *restrict du) {
    for (int64_t i = 0; i < n; i++) {
        float v = g[i], den = 1.0f + ca_fast_expf(-v), sg = 1.0f / den;
        dg[i] = dy[i] * u[i] * sg * (1.0f + v * (1.0f - sg));
        du[i] = dy[i] * (v / den);
    }
}

/* out[off, off + n) = beta out + g, in the output's dtype. */
static void swiglu_store(ca_dtype dt, const float *g, int64_t n, float beta, void *out, int64_t off) {
    if (dt == CA_F32) {
        accumulate_f32(n, g, beta, (float *)out + off);
        return;
    }
    float ob[CPU_CHUNK];
    if (beta != 0.0f) cpu_to_f32(dt, out, off, n, ob);
    accumulate_f32(n, g, beta, ob);
    cpu_from_f32(dt, ob, n, out, off);
}

static void swiglu_backward_range(void *ctx, int64_t lo, int64_t hi) {
    const ca_swiglu_backward_args *a = ctx;
    ca_dtype dt = a->dt;
    float gb[CPU_CHUNK], ub[CPU_CHUNK], db[CPU_CHUNK], dgb[CPU_CHUNK], dub[CPU_CHUNK];
    for (int64_t off = lo; off < hi; off += CPU_CHUNK) {
        int64_t c = hi - off < CPU_CHUNK ? hi - off : CPU_CHUNK;
        swiglu_grad_f32(c, cpu_view_f32(dt, a->gate, off, c, gb), cpu_view_f32(dt, a->up, off, c, ub),
                        cpu_view_f32(dt, a->dy, off, c, db), dgb, dub);
        if (a->dgate) swiglu_store(dt, dgb, c, a->beta_gate, a->dgate, off);
        if (a->dup) swiglu_store(dt, dub, c, a->beta_up, a->dup, off);
    }
}

ca_status cpu_swiglu_backward(void *dev, const ca_swiglu_backward_args *args) {
    if (args->n == 0) return CA_OK;
    cpu_parallel_for(args->n, cpu_grain_for(6 + (args->dt != CA_F32)), swiglu_backward_range, (void *)args);
    return CA_OK;
}
