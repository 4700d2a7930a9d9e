/* Joining, cutting and selecting: concat, stack, split, index_select, gather, where, masked_fill, triu masks. */
#include "tensor/ops_impl.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static bool norm_dim(int *d, int ndim, const char *op) {
    if (*d < 0) *d += ndim;
    if (*d >= 0 && *d < ndim) return true;
    ca_error(CA_ERR_INVALID, "%s: dimension out of range for a %d-D tensor", op, ndim);
    return false;
}

/* Element `start` along dim of t, as a device pointer (arithmetic only). */
static void *at_dim(const ca_tensor *t, int dim, int64_t start) {
    return (char *)ca_tptr(t) + (size_t)(start * t->stride[dim]) * ca_dtype_size(t->dtype);
}

/* ------------------------------------------------------------------ concat */

/* i[0] = dim, i[1 + j] = where input j starts along dim. */
static ca_status concat_backward(ca_node *n, ca_tensor *g) {
    int dim = (int)n->i[0];
    for (int j = 0; j < n->nin; j++) {
        ca_tensor *x = n->in[j];
        if (!x->requires_grad) continue;
        ca_tensor *part = ca_op_new_like(x);
        if (!part) return ca_last_status();
        ca_status s = CA_KCALL(ca_tdev(x), copy_strided, .dt = g->dtype, .ndim = x->ndim, .shape = x->shape,
                               .x = at_dim(g, dim, n->i[1 + j]), .x_stride = g->stride, .y = ca_tptr(part),
                               .y_stride = part->stride);
        if (s == CA_OK) s = ca_op_accumulate_owned(x, part, 1.0f);
        if (s != CA_OK) return s;
    }
    return CA_OK;
}
static const ca_node_vt concat_vt = {"concat", concat_backward};

static bool concat_fits(int n, ca_tensor *const *xs, int dim) {
    const ca_tensor *x0 = xs[0];
    for (int j = 1; j < n; j++) {
        const ca_tensor *x = xs[j];
        bool ok = x->ndim == x0->ndim && x->dtype == x0->dtype && ca_tdev(x) == ca_tdev(x0);
        for (int d = 0; ok && d < x->ndim; d++) ok = d == dim || x->shape[d] == x0->shape[d];
        if (!ok) {
            char a[128], b[128];
            ca_error(CA_ERR_INVALID, "concat: input %d %s %s does not fit input 0 %s %s along dimension %d", j,
                     ca_shape_str(x->ndim, x->shape, a, sizeof a), ca_dtype_name(x->dtype),
                     ca_shape_str(x0->ndim, x0->shape, b, sizeof b), ca_dtype_name(x0->dtype), dim);
            return false;
        }
    }
    return true;
}

/* At most CA_NODE_MAX_IN inputs (one tape node). */
static ca_tensor *concat_few(int n, ca_tensor *const *xs, int dim) {
    int64_t shape[CA_MAX_DIMS], starts[CA_NODE_MAX_IN], total = 0;
    for (int j = 0; j < n; j++) { starts[j] = total; total += xs[j]->shape[dim]; }
    memcpy(shape, xs[0]->shape, sizeof shape);
    shape[dim] = total;
    ca_device *dev = ca_tdev(xs[0]);
    ca_tensor *y = ca_tensor_new(dev, xs[0]->dtype, xs[0]->ndim, shape);
    if (!y) return NULL;
    for (int j = 0; j < n; j++) {
        const ca_tensor *x = xs[j];
        if (x->numel && CA_KCALL(dev, copy_strided, .dt = x->dtype, .ndim = x->ndim, .shape = x->shape,
                                 .x = ca_tptr(x), .x_stride = x->stride, .y = at_dim(y, dim, starts[j]),
                                 .y_stride = y->stride) != CA_OK)
            return NULL;
    }
    if (ca_needs_grad(n, xs)) {
        ca_node *nd = ca_record(&concat_vt, y, n, xs);
        if (!nd) return NULL;
        nd->i[0] = dim;
        memcpy(&nd->i[1], starts, (size_t)n * sizeof *starts);
    }
    return y;
}

ca_tensor *ca_concat(int n, ca_tensor *const *xs, int dim) {
    if (n < 1 || !xs) {
        ca_error(CA_ERR_INVALID, "concat: no inputs");
        return NULL;
    }
    for (int j = 0; j < n; j++) CA_OP_NULLCHECK1(xs[j]);
    if (!norm_dim(&dim, xs[0]->ndim, "concat") || !concat_fits(n, xs, dim)) return NULL;
    if (n <= CA_NODE_MAX_IN) return concat_few(n, xs, dim);
    /* a tape node takes at most CA_NODE_MAX_IN inputs: join the first ones, then the rest onto them */
    ca_tensor *acc = concat_few(CA_NODE_MAX_IN, xs, dim);
    for (int j = CA_NODE_MAX_IN; acc && j < n; j += CA_NODE_MAX_IN - 1) {
        ca_tensor *part[CA_NODE_MAX_IN] = {acc};
        int m = n - j < CA_NODE_MAX_IN - 1 ? n - j : CA_NODE_MAX_IN - 1;
        memcpy(part + 1, xs + j, (size_t)m * sizeof *part);
        acc = concat_few(m + 1, part, dim);
    }
    return acc;
}

ca_tensor *ca_stack(int n, ca_tensor *const *xs, int dim) {
    if (n < 1 || !xs || n > 4096) {
        ca_error(CA_ERR_INVALID, "stack: %d inputs (1..4096)", n);
        return NULL;
    }
    CA_OP_NULLCHECK1(xs[0]);
    int nd = xs[0]->ndim;
    if (dim < 0) dim += nd + 1;
    if (dim < 0 || dim > nd || nd + 1 > CA_MAX_DIMS) {
        ca_error(CA_ERR_INVALID, "stack: dimension out of range for %d-D inputs", nd);
        return NULL;
    }
    ca_tensor **v = malloc((size_t)n * sizeof *v);
    if (!v) { ca_error(CA_ERR_NOMEM, "stack: no memory for %d inputs", n); return NULL; }
    ca_tensor *y = NULL;
    int j = 0;
    for (; j < n; j++) {
        if (!xs[j]) break;
        int64_t shape[CA_MAX_DIMS];
        for (int d = 0, s = 0; d <= nd; d++) shape[d] = d == dim ? 1 : xs[j]->shape[s++];
        if (xs[j]->ndim != nd || !(v[j] = ca_reshape(xs[j], nd + 1, shape))) break;
    }
    if (j == n) y = ca_concat(n, v, dim);
    else if (xs[j] && xs[j]->ndim != nd) ca_error(CA_ERR_INVALID, "stack: input %d has %d dimensions, input 0 %d", j,
                                                  xs[j]->ndim, nd);
    free(v);
    return y;
}

ca_status ca_split(ca_tensor *x, int dim, int n, const int64_t *sizes, ca_tensor **out) {
    if (!x) return ca_last_status() != CA_OK ? ca_last_status() : ca_error(CA_ERR_INVALID, "split: x is NULL");
    if (n < 1 || !sizes || !out) return ca_error(CA_ERR_INVALID, "split: %d parts", n);
    if (!norm_dim(&dim, x->ndim, "split")) return ca_last_status();
    int64_t total = 0;
    for (int j = 0; j < n; j++) total += sizes[j] >= 0 ? sizes[j] : -1;
    if (total != x->shape[dim])
        return ca_error(CA_ERR_INVALID, "split: sizes sum to %lld, dimension %d has %lld", (long long)total, dim,
                        (long long)x->shape[dim]);
    static atomic_uint_fast64_t splits;
    uint64_t id = atomic_fetch_add_explicit(&splits, 1, memory_order_relaxed) + 1;
    int64_t start = 0;
    for (int j = 0; j < n; j++) {
        if (!(out[j] = ca_op_split_part(x, dim, start, sizes[j], id, j))) return ca_last_status();
        start += sizes[j];
    }
    return CA_OK;
}

/* ------------------------------------------------------------------ index_select */

/* x viewed [outer, len, inner]; every outer slice is an embedding lookup of its rows. */
static ca_status index_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0], *idx = n->saved[0];
    int64_t outer = n->i[0], len = n->i[1], inner = n->i[2];
    float beta;
    ca_tensor *dx = ca_grad_target(x, &beta);
    if (!dx) return x->requires_grad ? ca_last_status() : CA_OK;
    ca_device *dev = ca_tdev(x);
    size_t es = ca_dtype_size(dx->dtype);
    ca_status s = CA_OK;
    if (beta == 0.0f) s = CA_KCALL(dev, fill, .dt = dx->dtype, .n = dx->numel, .value = 0.0, .y = ca_tptr(dx));
    for (int64_t o = 0; s == CA_OK && o < outer; o++)
        s = CA_KCALL(dev, embedding_backward, .dt = dx->dtype, .n = idx->numel, .rows = len, .dim = inner,
                     .idx_dt = idx->dtype, .idx = ca_tptr(idx),
                     .dy = (char *)ca_tptr(g) + (size_t)(o * idx->numel * inner) * es,
                     .dtable = (char *)ca_tptr(dx) + (size_t)(o * len * inner) * es);
    if (s == CA_OK) ca_grad_written(x);
    return s;
}
static const ca_node_vt index_vt = {"index_select", index_backward};

ca_tensor *ca_index_select(ca_tensor *x, int dim, ca_tensor *idx) {
    CA_OP_NULLCHECK2(x, idx);
    if (!ca_op_check_float("index_select", x) || !ca_op_check_same_device("index_select", x, idx) ||
        !norm_dim(&dim, x->ndim, "index_select"))
        return NULL;
    if (idx->ndim > 1 || (idx->dtype != CA_I32 && idx->dtype != CA_I64)) {
        ca_error(CA_ERR_INVALID, "index_select: the index must be a 1-D i32 or i64 tensor, got %d-D %s", idx->ndim,
                 ca_dtype_name(idx->dtype));
        return NULL;
    }
    x = ca_contiguous(x);
    idx = ca_contiguous(idx);
    if (!x || !idx) return NULL;
    int64_t outer = 1, inner = 1, len = x->shape[dim];
    for (int d = 0; d < dim; d++) outer *= x->shape[d];
    for (int d = dim + 1; d < x->ndim; d++) inner *= x->shape[d];
    int64_t shape[CA_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[dim] = idx->numel;
    ca_tensor *y = ca_tensor_new(ca_tdev(x), x->dtype, x->ndim, shape);
    if (!y) return NULL;
    size_t es = ca_dtype_size(x->dtype);
    for (int64_t o = 0; y->numel && o < outer; o++)
        if (CA_KCALL(ca_tdev(x), embedding, .dt = x->dtype, .n = idx->numel, .rows = len, .dim = inner,
                     .table = (char *)ca_tptr(x) + (size_t)(o * len * inner) * es, .idx_dt = idx->dtype,
                     .idx = ca_tptr(idx), .y = (char *)ca_tptr(y) + (size_t)(o * idx->numel * inner) * es) != CA_OK)
            return NULL;
    if (ca_needs_grad(1, &x)) {
        ca_node *n = ca_record(&index_vt, y, 1, &x);
        if (!n) return NULL;
        n->saved[0] = idx;
        n->i[0] = outer; n->i[1] = len; n->i[2] = inner;
    }
    return y;
}

/* ------------------------------------------------------------------ gather */

/* i[0..3] = outer, len, inner, n (x viewed [outer, len, inner], idx [outer, n, inner]). */
static ca_status gather_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0], *idx = n->saved[0];
    float beta;
    ca_tensor *dx = ca_grad_target(x, &beta);
    if (!dx) return x->requires_grad ? ca_last_status() : CA_OK;
    ca_device *dev = ca_tdev(x);
    ca_status s = CA_OK;
    if (beta == 0.0f) s = CA_KCALL(dev, fill, .dt = dx->dtype, .n = dx->numel, .value = 0.0, .y = ca_tptr(dx));
    if (s == CA_OK)
        s = CA_KCALL(dev, gather_backward, .dt = dx->dtype, .outer = n->i[0], .len = n->i[1],
                     .inner = n->i[2], .n = n->i[3], .idx_dt = idx->dtype, .idx = ca_tptr(idx),
                     .dy = ca_tptr(g), .dx = ca_tptr(dx));
    if (s == CA_OK) ca_grad_written(x);
    return s;
}
static const ca_node_vt gather_vt = {"gather", gather_backward};

ca_tensor *ca_gather_dim(ca_tensor *x, int dim, ca_tensor *idx) {
    CA_OP_NULLCHECK2(x, idx);
    if (!ca_op_check_same_device("gather", x, idx) || !norm_dim(&dim, x->ndim, "gather")) return NULL;
    bool ok = idx->ndim == x->ndim && (idx->dtype == CA_I32 || idx->dtype == CA_I64);
    for (int d = 0; ok && d < x->ndim; d++) ok = d == dim || idx->shape[d] == x->shape[d];
    if (!ok) {
        char a[128], b[128];
        ca_error(CA_ERR_INVALID, "gather: index %s %s does not fit x %s along dimension %d (same shape but there, "
                 "i32 or i64)", ca_shape_str(idx->ndim, idx->shape, a, sizeof a), ca_dtype_name(idx->dtype),
                 ca_shape_str(x->ndim, x->shape, b, sizeof b), dim);
        return NULL;
    }
    x = ca_contiguous(x);
    idx = ca_contiguous(idx);
    ca_tensor *y = x && idx ? ca_tensor_new(ca_tdev(x), x->dtype, idx->ndim, idx->shape) : NULL;
    if (!y) return NULL;
    int64_t outer = 1, inner = 1, len = x->shape[dim], cnt = idx->shape[dim];
    for (int d = 0; d < dim; d++) outer *= x->shape[d];
    for (int d = dim + 1; d < x->ndim; d++) inner *= x->shape[d];
    if (y->numel && CA_KCALL(ca_tdev(x), gather, .dt = x->dtype, .outer = outer, .len = len, .inner = inner,
                             .n = cnt, .x = ca_tptr(x), .idx_dt = idx->dtype, .idx = ca_tptr(idx),
                             .y = ca_tptr(y)) != CA_OK)
        return NULL;
    if (ca_dtype_is_float(x->dtype) && ca_needs_grad(1, &x)) {
        ca_node *n = ca_record(&gather_vt, y, 1, &x);
        if (!n) return NULL;
        n->saved[0] = idx;
        n->i[0] = outer; n->i[1] = len; n->i[2] = inner; n->i[3] = cnt;
    }
    return y;
}

/* ------------------------------------------------------------------ where */

typedef struct where_shape {
    ca_bcast_args ab;
    int64_t cs[CA_MAX_DIMS];
} where_shape;

/* y's shape from broadcasting cond, a and b, and the strides of each in it. */
static bool where_broadcast(const ca_tensor *c, const ca_tensor *a, const ca_tensor *b, where_shape *w) {
    int nd = c->ndim > a->ndim ? c->ndim : a->ndim;
    nd = b->ndim > nd ? b->ndim : nd;
    memset(w, 0, sizeof *w);
    w->ab.ndim = nd ? nd : 1;
    w->ab.shape[0] = 1;
    const ca_tensor *t[3] = {c, a, b};
    int64_t *st[3] = {w->cs, w->ab.a_stride, w->ab.b_stride};
    for (int i = 0; i < nd; i++) {
        int64_t size = 1;
        for (int j = 0; j < 3; j++) {
            int it = i - (nd - t[j]->ndim);
            int64_t s = it >= 0 ? t[j]->shape[it] : 1;
            if (s != 1 && size != 1 && s != size) {
                char x[128], y[128], z[128];
                ca_error(CA_ERR_INVALID, "where: shapes %s, %s and %s cannot be broadcast (dimension %d)",
                         ca_shape_str(c->ndim, c->shape, x, sizeof x), ca_shape_str(a->ndim, a->shape, y, sizeof y),
                         ca_shape_str(b->ndim, b->shape, z, sizeof z), i);
                return false;
            }
            if (s != 1) size = s;
        }
        w->ab.shape[i] = size;
        for (int j = 0; j < 3; j++) {
            int it = i - (nd - t[j]->ndim);
            st[j][i] = it >= 0 && t[j]->shape[it] != 1 ? t[j]->stride[it] : 0;
        }
    }
    return true;
}

/* cond ? g : 0 (first) or cond ? 0 : g, shaped like g (contiguous). */
static ca_tensor *where_grad(ca_tensor *cond, ca_tensor *g, bool first) {
    ca_tensor *zero = ca_full(ca_tdev(g), g->dtype, 0, NULL, 0.0);
    where_shape w;
    if (!zero || !where_broadcast(cond, g, zero, &w)) return NULL;
    ca_tensor *r = ca_op_new_like(g);
    if (!r) return NULL;
    if (!first) {   /* swap the branches */
        int64_t tmp[CA_MAX_DIMS];
        memcpy(tmp, w.ab.a_stride, sizeof tmp);
        memcpy(w.ab.a_stride, w.ab.b_stride, sizeof tmp);
        memcpy(w.ab.b_stride, tmp, sizeof tmp);
    }
    const void *a = first ? ca_tptr(g) : ca_tptr(zero), *b = first ? ca_tptr(zero) : ca_tptr(g);
    if (CA_KCALL(ca_tdev(g), where, .dt = g->dtype, .shape = w.ab, .cond_stride = w.cs, .cond = ca_tptr(cond),
                 .a = a, .b = b, .y = ca_tptr(r)) != CA_OK) return NULL;
    return r;
}

static ca_status where_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *a = n->in[0], *b = n->in[1], *cond = n->saved[0];
    ca_status s = CA_OK;
    if (a->requires_grad) {
        ca_tensor *ga = where_grad(cond, g, true);
        s = ga ? ca_op_accumulate_owned(a, ga, 1.0f) : ca_last_status();
    }
    if (s == CA_OK && b->requires_grad) {
        ca_tensor *gb = where_grad(cond, g, false);
        s = gb ? ca_op_accumulate_owned(b, gb, 1.0f) : ca_last_status();
    }
    return s;
}
static const ca_node_vt where_vt = {"where", where_backward};

ca_tensor *ca_where(ca_tensor *cond, ca_tensor *a, ca_tensor *b) {
    CA_OP_NULLCHECK2(cond, a);
    CA_OP_NULLCHECK1(b);
    if (!ca_op_check_same_device("where", cond, a) || !ca_op_check_same_device("where", a, b)) return NULL;
    if (cond->dtype != CA_U8) {
        ca_error(CA_ERR_INVALID, "where: the condition must be u8, got %s", ca_dtype_name(cond->dtype));
        return NULL;
    }
    if (a->dtype != b->dtype) {     /* promote as the binary ops do */
        a = ca_cast(a, CA_F32);
        b = ca_cast(b, CA_F32);
        CA_OP_NULLCHECK2(a, b);
    }
    where_shape w;
    if (!where_broadcast(cond, a, b, &w)) return NULL;
    int nd = w.ab.ndim;
    if (cond->ndim == 0 && a->ndim == 0 && b->ndim == 0) nd = 0;
    ca_tensor *y = ca_tensor_new(ca_tdev(a), a->dtype, nd, w.ab.shape);
    if (!y) return NULL;
    if (y->numel && CA_KCALL(ca_tdev(a), where, .dt = a->dtype, .shape = w.ab, .cond_stride = w.cs,
                             .cond = ca_tptr(cond), .a = ca_tptr(a), .b = ca_tptr(b), .y = ca_tptr(y)) != CA_OK)
        return NULL;
    ca_tensor *in[2] = {a, b};
    if (ca_needs_grad(2, in)) {
        ca_node *n = ca_record(&where_vt, y, 2, in);
        if (!n) return NULL;
        n->saved[0] = cond;
    }
    return y;
}

ca_tensor *ca_masked_fill(ca_tensor *x, ca_tensor *mask, double value) {
    CA_OP_NULLCHECK2(x, mask);
    return ca_where(mask, ca_full(ca_tdev(x), x->dtype, 0, NULL, value), x);
}

ca_tensor *ca_triu_mask(ca_device *dev, int64_t rows, int64_t cols, int64_t diagonal) {
    if (rows < 0 || cols < 0) {
        ca_error(CA_ERR_INVALID, "triu_mask: negative size %lld x %lld", (long long)rows, (long long)cols);
        return NULL;
    }
    uint8_t *h = malloc((size_t)(rows * cols) + 1);
    if (!h) { ca_error(CA_ERR_NOMEM, "triu_mask: no memory for %lld x %lld", (long long)rows, (long long)cols); return NULL; }
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) h[i * cols + j] = j - i >= diagonal;
    int64_t shape[2] = {rows, cols};
    ca_tensor *t = ca_from_host(dev, CA_U8, 2, shape, h);
    free(h);
    return t;
}
