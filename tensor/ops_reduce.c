/* Reductions: sum, mean (all or along a dim), max along a dim, argmax. */
#include "tensor/ops_impl.h"

#include <string.h>

/* dx (+)= expand(g) * scale, where g has x's shape with dim `dim` (or all
 * dims, dim < 0) reduced to 1. */
static ca_status expand_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0];
    if (!x->requires_grad) return CA_OK;
    int dim = (int)n->i[0];
    float scale = (float)n->f[0];
    ca_device *dev = ca_tdev(x);
    ca_tensor *full = ca_op_new_like(x);
    if (!full) return ca_last_status();
    int64_t gs[CA_MAX_DIMS] = {0};
    if (dim >= 0) {               /* g is [outer, inner] laid over x's dims with dim removed */
        int64_t s = 1;
        for (int i = x->ndim - 1; i >= 0; i--) {
            if (i == dim) { gs[i] = 0; continue; }
            gs[i] = s;
            s *= x->shape[i];
        }
    }
    ca_status st = CA_KCALL(dev, copy_strided, .dt = x->dtype, .ndim = x->ndim, .shape = x->shape,
                            .x = ca_tptr(g), .x_stride = gs, .y = ca_tptr(full), .y_stride = full->stride);
    return st == CA_OK ? ca_op_accumulate_owned(x, full, scale) : st;
}
static const ca_node_vt sum_vt = {"sum", expand_backward};
static const ca_node_vt mean_vt = {"mean", expand_backward};

static bool norm_dim(int *d, int ndim, const char *op) {
    if (*d < 0) *d += ndim;
    if (*d >= 0 && *d < ndim) return true;
    ca_error(CA_ERR_INVALID, "%s: dimension out of range for a %d-D tensor", op, ndim);
    return false;
}

static ca_tensor *reduce_dim(ca_tensor *x, int dim, bool keepdim, ca_reduce_op op, const ca_node_vt *vt) {
    if (vt) x = ca_autocast_f32(x);      /* sum and mean accumulate in f32 under autocast */
    CA_OP_NULLCHECK1(x);
    const char *name = vt ? vt->name : ca_reduce_op_name(op);
    if (!ca_op_check_float(name, x)) return NULL;
    if (dim != -100 && !norm_dim(&dim, x->ndim, name)) return NULL;
    x = ca_contiguous(x);
    if (!x) return NULL;
    int64_t outer = 1, len, inner = 1, shape[CA_MAX_DIMS];
    int nd = 0;
    if (dim == -100) {            /* everything -> scalar */
        len = x->numel;
    } else {
        for (int i = 0; i < dim; i++) outer *= x->shape[i];
        len = x->shape[dim];
        for (int i = dim + 1; i < x->ndim; i++) inner *= x->shape[i];
        for (int i = 0; i < x->ndim; i++) {
            if (i == dim && !keepdim) continue;
            shape[nd++] = i == dim ? 1 : x->shape[i];
        }
    }
    if (len == 0 && (op == CA_OP_MAX || op == CA_OP_MIN)) {
        ca_error(CA_ERR_INVALID, "%s of an empty dimension", name);
        return NULL;
    }
    ca_tensor *y = ca_tensor_new(ca_tdev(x), x->dtype, nd, shape);
    if (!y) return NULL;
    if (y->numel && CA_KCALL(ca_tdev(x), reduce, .op = op, .dt = x->dtype, .outer = outer, .len = len,
                             .inner = inner, .x = ca_tptr(x), .y = ca_tptr(y), .beta = 0.0f) != CA_OK)
        return NULL;
    if (vt && ca_needs_grad(1, &x)) {
        ca_node *n = ca_record(vt, y, 1, &x);
        if (!n) return NULL;
        n->i[0] = dim == -100 ? -1 : dim;
        n->f[0] = op == CA_OP_AVG ? (len ? 1.0 / (double)len : 0.0) : 1.0;
    }
    return y;
}

ca_tensor *ca_sum(ca_tensor *x) { return reduce_dim(x, -100, false, CA_OP_SUM, &sum_vt); }
ca_tensor *ca_mean(ca_tensor *x) { return reduce_dim(x, -100, false, CA_OP_AVG, &mean_vt); }
ca_tensor *ca_sum_dim(ca_tensor *x, int dim, bool keepdim) { return reduce_dim(x, dim, keepdim, CA_OP_SUM, &sum_vt); }
ca_tensor *ca_mean_dim(ca_tensor *x, int dim, bool keepdim) { return reduce_dim(x, dim, keepdim, CA_OP_AVG, &mean_vt); }
/* Not differentiable (values only): documented in ops.h. */
ca_tensor *ca_max_dim(ca_tensor *x, int dim, bool keepdim) { return reduce_dim(x, dim, keepdim, CA_OP_MAX, NULL); }

ca_tensor *ca_argmax(ca_tensor *x) {
    CA_OP_NULLCHECK1(x);
    if (!ca_op_check_float("argmax", x)) return NULL;
    if (x->ndim < 1) {
        ca_error(CA_ERR_INVALID, "argmax needs at least one dimension");
        return NULL;
    }
    x = ca_contiguous(x);
    if (!x) return NULL;
    int64_t cols = x->shape[x->ndim - 1], rows = cols ? x->numel / cols : 0;
    ca_tensor *y = ca_tensor_new(ca_tdev(x), CA_I64, x->ndim - 1, x->shape);
    if (!y) return NULL;
    if (rows && CA_KCALL(ca_tdev(x), argmax, .dt = x->dtype, .rows = rows, .cols = cols, .x = ca_tptr(x),
                         .idx = ca_tptr(y)) != CA_OK) return NULL;
    return y;
}
