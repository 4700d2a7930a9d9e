/* Shape ops: reshape, flatten, transpose, narrow, contiguous, cast, detach. */
#include "tensor/ops_impl.h"

#include <string.h>

/* ------------------------------------------------------------------ contiguous */

/* The output's gradient is read by this node alone: the input takes it over (no copy). */
static ca_status contiguous_backward(ca_node *n, ca_tensor *g) {
    return ca_op_accumulate_owned(n->in[0], g, 1.0f);
}
static const ca_node_vt contiguous_vt = {"contiguous", contiguous_backward};

ca_tensor *ca_contiguous(ca_tensor *x) {
    CA_OP_NULLCHECK1(x);
    if (ca_tensor_is_contiguous(x)) return x;
    ca_tensor *y = ca_op_new_like(x);
    if (!y) return NULL;
    int64_t ys[CA_MAX_DIMS];
    memcpy(ys, y->stride, sizeof ys);
    if (CA_KCALL(ca_tdev(x), copy_strided, .dt = x->dtype, .ndim = x->ndim, .shape = x->shape,
                 .x = ca_tptr(x), .x_stride = x->stride, .y = ca_tptr(y), .y_stride = ys) != CA_OK)
        return NULL;
    if (ca_needs_grad(1, &x) && !ca_record(&contiguous_vt, y, 1, &x)) return NULL;
    return y;
}

/* ------------------------------------------------------------------ reshape */

static ca_status reshape_backward(ca_node *n, ca_tensor *g) {
    return ca_op_accumulate_owned(n->in[0], g, 1.0f);     /* same elements, same order */
}
static const ca_node_vt reshape_vt = {"reshape", reshape_backward};

/* Strides st that view x's elements, in x's logical order, as shape s without a copy; false when x's
 * strides do not allow it. Why: splitting the last dimension of a strided slice (the GPT's q, k and v,
 * narrowed out of one [B, T, 3C] projection, seen as [B, T, H, D]) would otherwise copy it, only for
 * the attention to copy it again. x's dimensions are taken in runs that are contiguous among
 * themselves (each stride the next one's times its size); a run's elements have one base stride, and
 * the new dimensions that cover exactly a run's element count take strides from that base. */
static bool view_strides(const ca_tensor *x, int ndim, const int64_t *s, int64_t *st) {
    int v = ndim - 1;
    int64_t base = x->stride[x->ndim - 1], run = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
        run *= x->shape[d];
        bool run_ends = d == 0 || (x->shape[d - 1] != 1 && x->stride[d - 1] != run * base);
        if (!run_ends) continue;
        int64_t covered = 1;
        while (v >= 0 && (covered < run || s[v] == 1)) {
            st[v] = covered * base;
            covered *= s[v--];
        }
        if (covered != run) return false;
        if (d > 0) {
            base = x->stride[d - 1];
            run = 1;
        }
    }
    return v < 0;
}

ca_tensor *ca_reshape(ca_tensor *x, int ndim, const int64_t *shape) {
    CA_OP_NULLCHECK1(x);
    if (ndim < 0 || ndim > CA_MAX_DIMS) {
        ca_error(CA_ERR_INVALID, "reshape: %d dimensions (0..%d allowed)", ndim, CA_MAX_DIMS);
        return NULL;
    }
    int64_t s[CA_MAX_DIMS], known = 1;
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (s[i] == -1 && infer < 0) infer = i;
        else if (s[i] < 0) { ca_error(CA_ERR_INVALID, "reshape: bad size %lld", (long long)s[i]); return NULL; }
        else known *= s[i];
    }
    if (infer >= 0) s[infer] = known ? x->numel / known : 0;
    char a[128], b[128];
    if (ca_shape_numel(ndim, s) != x->numel) {
        ca_error(CA_ERR_INVALID, "reshape: cannot view %s (%lld elements) as %s",
                 ca_shape_str(x->ndim, x->shape, a, sizeof a), (long long)x->numel,
                 ca_shape_str(ndim, shape, b, sizeof b));
        return NULL;
    }
    int64_t st[CA_MAX_DIMS], acc = 1;
    if (x->ndim > 0 && x->numel > 0 && !ca_tensor_is_contiguous(x) && view_strides(x, ndim, s, st)) {
        ca_tensor *y = ca_tensor_view(x, ndim, s, st, x->offset);
        if (y && ca_needs_grad(1, &x) && !ca_record(&reshape_vt, y, 1, &x)) return NULL;
        return y;
    }
    ca_tensor *c = ca_contiguous(x);
    if (!c) return NULL;
    for (int i = ndim - 1; i >= 0; i--) { st[i] = acc; acc *= s[i]; }
    ca_tensor *y = ca_tensor_view(c, ndim, s, st, c->offset);
    if (y && ca_needs_grad(1, &c) && !ca_record(&reshape_vt, y, 1, &c)) return NULL;
    return y;
}

ca_tensor *ca_flatten(ca_tensor *x) {
    CA_OP_NULLCHECK1(x);
    if (x->ndim < 1) return ca_reshape(x, 1, (int64_t[]){1});
    int64_t shape[2] = {x->shape[0], x->shape[0] ? x->numel / x->shape[0] : 0};
    return ca_reshape(x, 2, shape);
}

/* ------------------------------------------------------------------ transpose */

static ca_status transpose_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0];
    int d0 = (int)n->i[0], d1 = (int)n->i[1];
    /* dx[.. i .. j ..] (+)= g[.. j .. i ..]: read g through swapped strides */
    int64_t gs[CA_MAX_DIMS];
    memcpy(gs, g->stride, sizeof gs);
    gs[d0] = g->stride[d1];
    gs[d1] = g->stride[d0];
    if (x->requires_grad && x->grad_fn && !x->bgrad && ca_node_takes_strided_grad(x->grad_fn)) {
        /* x's node reads its gradient through strides (attention): g itself, seen transposed, is that
         * gradient, with no copy; this node is g's last reader */
        ca_tensor *v = ca_tensor_view(g, x->ndim, x->shape, gs, g->offset);
        if (v && ca_grad_adopt_view(x, v)) return CA_OK;
    }
    float beta;
    ca_tensor *dx = ca_grad_target(x, &beta);
    if (!dx) return x->requires_grad ? ca_last_status() : CA_OK;
    ca_status s;
    if (beta == 0.0f) {
        s = CA_KCALL(ca_tdev(x), copy_strided, .dt = x->dtype, .ndim = x->ndim, .shape = x->shape,
                     .x = ca_tptr(g), .x_stride = gs, .y = ca_tptr(dx), .y_stride = dx->stride);
    } else {
        ca_bcast_args bc = {.ndim = x->ndim};
        memcpy(bc.shape, x->shape, sizeof bc.shape);
        memcpy(bc.a_stride, dx->stride, sizeof bc.a_stride);
        memcpy(bc.b_stride, gs, sizeof bc.b_stride);
        s = CA_KCALL(ca_tdev(x), binary, .op = CA_BINARY_ADD, .dt = x->dtype, .shape = bc, .a = ca_tptr(dx),
                     .b = ca_tptr(g), .y = ca_tptr(dx));
    }
    if (s == CA_OK) ca_grad_written(x);
    return s;
}
static const ca_node_vt transpose_vt = {"transpose", transpose_backward};

static bool norm_dim(int *d, int ndim, const char *op) {
    if (*d < 0) *d += ndim;
    if (*d >= 0 && *d < ndim) return true;
    ca_error(CA_ERR_INVALID, "%s: dimension out of range for a %d-D tensor", op, ndim);
    return false;
}

ca_tensor *ca_transpose(ca_tensor *x, int d0, int d1) {
    CA_OP_NULLCHECK1(x);
    if (!norm_dim(&d0, x->ndim, "transpose") || !norm_dim(&d1, x->ndim, "transpose")) return NULL;
    int64_t shape[CA_MAX_DIMS], stride[CA_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    memcpy(stride, x->stride, sizeof stride);
    shape[d0] = x->shape[d1]; shape[d1] = x->shape[d0];
    stride[d0] = x->stride[d1]; stride[d1] = x->stride[d0];
    ca_tensor *y = ca_tensor_view(x, x->ndim, shape, stride, x->offset);
    if (y && ca_needs_grad(1, &x)) {
        ca_node *n = ca_record(&transpose_vt, y, 1, &x);
        if (!n) return NULL;
        n->i[0] = d0;
        n->i[1] = d1;
    }
    return y;
}

/* ------------------------------------------------------------------ narrow */

/* Whether the region of x's gradient that split part n writes still holds the zeros its first part
 * filled: only parts of n's split have written since, and not this one. Non-leaves only: a leaf's
 * gradient lives across passes and may be changed in place (clipping, an all-reduce). */
static bool split_region_zero(const ca_node *n, const ca_tensor *x) {
    uint64_t id = (uint64_t)n->i[2];
    return id && x->grad_fn && x->bgrad_split == id && !(x->bgrad_split_parts >> n->i[3] & 1u);
}

/* After part n of a split wrote its region of x's gradient (zeros elsewhere, or other parts' regions). */
static void split_mark(const ca_node *n, ca_tensor *x, bool first) {
    uint64_t parts = first ? 0 : x->bgrad_split_parts;
    x->bgrad_split = (uint64_t)n->i[2];
    x->bgrad_split_parts = parts | (uint64_t)1 << n->i[3];
}

static ca_status narrow_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0];
    int dim = (int)n->i[0];
    int64_t start = n->i[1];
    float beta;
    ca_tensor *dx = ca_grad_target(x, &beta);
    if (!dx) return x->requires_grad ? ca_last_status() : CA_OK;
    ca_device *dev = ca_tdev(x);
    /* region of dx that the slice came from, as strided pointers */
    void *region = (char *)ca_tptr(dx) + (size_t)(start * dx->stride[dim]) * ca_dtype_size(dx->dtype);
    bool split = n->i[2] && x->grad_fn, zero = split && beta != 0.0f && split_region_zero(n, x);
    ca_status s = CA_OK;
    if (beta == 0.0f)   /* zeros, then g into its place */
        s = CA_KCALL(dev, fill, .dt = dx->dtype, .n = dx->numel, .value = 0.0, .y = ca_tptr(dx));
    if (s == CA_OK && (beta == 0.0f || zero)) {
        s = CA_KCALL(dev, copy_strided, .dt = g->dtype, .ndim = g->ndim, .shape = g->shape,
                     .x = ca_tptr(g), .x_stride = g->stride, .y = region, .y_stride = dx->stride);
    } else if (s == CA_OK) {   /* region + g into a contiguous temporary, then back into place */
        ca_tensor *tmp = ca_op_new_like(g);
        if (!tmp) return ca_last_status();
        ca_bcast_args bc = {.ndim = g->ndim};
        memcpy(bc.shape, g->shape, sizeof bc.shape);
        memcpy(bc.a_stride, dx->stride, sizeof bc.a_stride);
        memcpy(bc.b_stride, g->stride, sizeof bc.b_stride);
        s = CA_KCALL(dev, binary, .op = CA_BINARY_ADD, .dt = g->dtype, .shape = bc, .a = region,
                     .b = ca_tptr(g), .y = ca_tptr(tmp));
        if (s == CA_OK)
            s = CA_KCALL(dev, copy_strided, .dt = g->dtype, .ndim = g->ndim, .shape = g->shape,
                         .x = ca_tptr(tmp), .x_stride = tmp->stride, .y = region, .y_stride = dx->stride);
    }
    if (s != CA_OK) return s;
    ca_grad_written(x);
    if (split && (beta == 0.0f || zero)) split_mark(n, x, beta == 0.0f);
    return CA_OK;
}
static const ca_node_vt narrow_vt = {"narrow", narrow_backward};

/* A narrow; split_id nonzero: part `part` (< 64) of the ca_split numbered split_id, whose parts cover
 * disjoint regions of x, so that each part's backward finds its region zero after the first one filled
 * it, and copies rather than adds (GPT's q, k and v out of one projection: one pass each instead of a
 * sum into a temporary and a copy back). */
static ca_tensor *narrow_part(ca_tensor *x, int dim, int64_t start, int64_t len, uint64_t split_id, int part) {
    CA_OP_NULLCHECK1(x);
    if (!norm_dim(&dim, x->ndim, "narrow")) return NULL;
    if (start < 0 || len < 0 || start + len > x->shape[dim]) {
        ca_error(CA_ERR_INVALID, "narrow: [%lld, %lld) is outside dimension %d of size %lld",
                 (long long)start, (long long)(start + len), dim, (long long)x->shape[dim]);
        return NULL;
    }
    int64_t shape[CA_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[dim] = len;
    ca_tensor *y = ca_tensor_view(x, x->ndim, shape, x->stride, x->offset + start * x->stride[dim]);
    if (y && ca_needs_grad(1, &x)) {
        ca_node *n = ca_record(&narrow_vt, y, 1, &x);
        if (!n) return NULL;
        n->i[0] = dim;
        n->i[1] = start;
        n->i[2] = part >= 0 && part < 64 ? (int64_t)split_id : 0;
        n->i[3] = part;
    }
    return y;
}

ca_tensor *ca_narrow(ca_tensor *x, int dim, int64_t start, int64_t len) {
    return narrow_part(x, dim, start, len, 0, 0);
}

ca_tensor *ca_op_split_part(ca_tensor *x, int dim, int64_t start, int64_t len, uint64_t split_id, int part) {
    return narrow_part(x, dim, start, len, split_id, part);
}

bool ca_node_is_view(const ca_node *n) {
    return n->vt == &transpose_vt || n->vt == &narrow_vt || n->vt == &reshape_vt;
}

/* ------------------------------------------------------------------ cast */

static ca_status cast_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0];
    float beta;
    ca_tensor *dx = ca_grad_target(x, &beta);
    if (!dx) return x->requires_grad ? ca_last_status() : CA_OK;
    ca_device *dev = ca_tdev(x);
    ca_status s;
    if (beta == 0.0f) {
        s = CA_KCALL(dev, cast, .src_dt = g->dtype, .x = ca_tptr(g), .dst_dt = dx->dtype, .y = ca_tptr(dx),
                     .n = g->numel, .alpha = 1.0f);
    } else {
        ca_tensor *t = ca_op_new_like(x);
        if (!t) return ca_last_status();
        s = CA_KCALL(dev, cast, .src_dt = g->dtype, .x = ca_tptr(g), .dst_dt = t->dtype, .y = ca_tptr(t),
                     .n = g->numel, .alpha = 1.0f);
        if (s == CA_OK) s = CA_KCALL(dev, axpby, .dt = dx->dtype, .n = dx->numel, .alpha = 1.0f,
                                     .x = ca_tptr(t), .beta = 1.0f, .y = ca_tptr(dx));
    }
    if (s == CA_OK) ca_grad_written(x);
    return s;
}
static const ca_node_vt cast_vt = {"cast", cast_backward};

ca_tensor *ca_cast(ca_tensor *x, ca_dtype dt) {
    CA_OP_NULLCHECK1(x);
    if (x->dtype == dt) return x;
    x = ca_contiguous(x);
    ca_tensor *y = x ? ca_tensor_new(ca_tdev(x), dt, x->ndim, x->shape) : NULL;
    if (!y) return NULL;
    if (x->numel && CA_KCALL(ca_tdev(x), cast, .src_dt = x->dtype, .x = ca_tptr(x), .dst_dt = dt,
                             .y = ca_tptr(y), .n = x->numel, .alpha = 1.0f) != CA_OK)
        return NULL;
    if (ca_dtype_is_float(x->dtype) && ca_dtype_is_float(dt) && ca_needs_grad(1, &x) &&
        !ca_record(&cast_vt, y, 1, &x))
        return NULL;
    return y;
}

/* ------------------------------------------------------------------ detach */

ca_tensor *ca_detach(ca_tensor *t) {
    CA_OP_NULLCHECK1(t);
    return ca_tensor_view(t, t->ndim, t->shape, t->stride, t->offset);
}

/* ------------------------------------------------------------------ expand */

static ca_status expand_backward(ca_node *n, ca_tensor *g) {   /* g's only reader */
    return ca_op_accumulate_owned(n->in[0], g, 1.0f);
}
static const ca_node_vt expand_vt = {"expand", expand_backward};

ca_tensor *ca_expand(ca_tensor *x, int ndim, const int64_t *shape) {
    CA_OP_NULLCHECK1(x);
    char a[128], b[128];
    if (ndim < x->ndim || ndim > CA_MAX_DIMS) {
        ca_error(CA_ERR_INVALID, "expand: cannot broadcast %s to %d dimensions",
                 ca_shape_str(x->ndim, x->shape, a, sizeof a), ndim);
        return NULL;
    }
    int64_t xs[CA_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        int ix = i - (ndim - x->ndim);
        int64_t sz = ix >= 0 ? x->shape[ix] : 1;
        if (sz != shape[i] && sz != 1) {
            ca_error(CA_ERR_INVALID, "expand: cannot broadcast %s to %s (dimension %d)",
                     ca_shape_str(x->ndim, x->shape, a, sizeof a), ca_shape_str(ndim, shape, b, sizeof b), i);
            return NULL;
        }
        xs[i] = ix >= 0 && sz != 1 ? x->stride[ix] : 0;
    }
    ca_tensor *y = ca_tensor_new(ca_tdev(x), x->dtype, ndim, shape);
    if (!y) return NULL;
    if (y->numel && CA_KCALL(ca_tdev(x), copy_strided, .dt = x->dtype, .ndim = ndim, .shape = shape,
                             .x = ca_tptr(x), .x_stride = xs, .y = ca_tptr(y), .y_stride = y->stride) != CA_OK)
        return NULL;
    if (ca_needs_grad(1, &x) && !ca_record(&expand_vt, y, 1, &x)) return NULL;
    return y;
}
