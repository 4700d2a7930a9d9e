/* Argument checks and gradient accumulation shared by every op. */
#include "tensor/ops_impl.h"

#include <string.h>

bool ca_op_check_float(const char *op, const ca_tensor *t) {
    if (ca_dtype_is_float(t->dtype)) return true;
    ca_error(CA_ERR_INVALID, "%s: expected a float tensor, got %s", op, ca_dtype_name(t->dtype));
    return false;
}

bool ca_op_check_same_device(const char *op, const ca_tensor *a, const ca_tensor *b) {
    if (ca_tdev(a) == ca_tdev(b)) return true;
    ca_error(CA_ERR_INVALID, "%s: tensors are on different devices (%s:%d and %s:%d); "
             "move them with ca_prepare or ca_tensor_to_device",
             op, ca_device_name(ca_tdev(a)), ca_device_index(ca_tdev(a)),
             ca_device_name(ca_tdev(b)), ca_device_index(ca_tdev(b)));
    return false;
}

ca_tensor *ca_op_new_like(const ca_tensor *t) {
    return ca_tensor_new(ca_tdev(t), t->dtype, t->ndim, t->shape);
}

ca_tensor *ca_op_scalar(ca_device *dev, float v) {
    return ca_full(dev, CA_F32, 0, NULL, v);
}

ca_status ca_op_accumulate(ca_tensor *t, ca_tensor *g, float alpha) {
    float beta;
    ca_tensor *dst = ca_grad_target(t, &beta);
    if (!dst) return t->requires_grad ? ca_last_status() : CA_OK;
    ca_status s = CA_KCALL(ca_tdev(t), axpby, .dt = dst->dtype, .n = dst->numel, .alpha = alpha,
                           .x = ca_tptr(g), .beta = beta, .y = ca_tptr(dst));
    if (s == CA_OK) ca_grad_written(t);
    return s;
}

/* One reduction over the run of dims [d0, d1) of `shape` (others kept). */
static ca_status reduce_run(ca_device *dev, ca_dtype dt, const int64_t *shape, int ndim, int d0, int d1,
                            const void *x, void *y, float beta) {
    int64_t outer = 1, len = 1, inner = 1;
    for (int i = 0; i < d0; i++) outer *= shape[i];
    for (int i = d0; i < d1; i++) len *= shape[i];
    for (int i = d1; i < ndim; i++) inner *= shape[i];
    return CA_KCALL(dev, reduce, .op = CA_OP_SUM, .dt = dt, .outer = outer, .len = len, .inner = inner,
                    .x = x, .y = y, .beta = beta);
}

ca_status ca_op_accumulate_reduced(ca_tensor *t, ca_tensor *g, float alpha) {
    if (!t->requires_grad) return CA_OK;
    if (g->numel == t->numel && alpha == 1.0f) return ca_op_accumulate(t, g, 1.0f);
    if (g->numel == t->numel) return ca_op_accumulate(t, g, alpha);
    /* t's shape aligned to g's rank; dims where t is 1 and g is not are summed */
    int nd = g->ndim;
    int64_t tshape[CA_MAX_DIMS], cur[CA_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        int ti = i - (nd - t->ndim);
        tshape[i] = ti >= 0 ? t->shape[ti] : 1;
        cur[i] = g->shape[i];
    }
    ca_device *dev = ca_tdev(t);
    ca_tensor *src = g;
    for (int d = 0; d < nd;) {
        if (!(tshape[d] == 1 && cur[d] != 1)) { d++; continue; }
        int e = d;
        while (e < nd && tshape[e] == 1) e++;      /* merge a run of reduced dims */
        int64_t next[CA_MAX_DIMS];
        memcpy(next, cur, sizeof next);
        for (int i = d; i < e; i++) next[i] = 1;
        bool last = true;
        for (int i = e; i < nd; i++) if (tshape[i] == 1 && next[i] != 1) last = false;
        if (last && alpha == 1.0f) {
            float beta;
            ca_tensor *dst = ca_grad_target(t, &beta);
            if (!dst) return ca_last_status();
            ca_status s = reduce_run(dev, g->dtype, cur, nd, d, e, ca_tptr(src), ca_tptr(dst), beta);
            if (s == CA_OK) ca_grad_written(t);
            return s;
        }
        ca_tensor *r = ca_tensor_new(dev, g->dtype, nd, next);
        if (!r) return ca_last_status();
        ca_status s = reduce_run(dev, g->dtype, cur, nd, d, e, ca_tptr(src), ca_tptr(r), 0.0f);
        if (s != CA_OK) return s;
        memcpy(cur, next, sizeof cur);
        src = r;
        d = e;
    }
    return ca_op_accumulate(t, src, alpha);
}

ca_status ca_op_accumulate_owned(ca_tensor *t, ca_tensor *g, float alpha) {
    return alpha == 1.0f && ca_grad_adopt(t, g) ? CA_OK : ca_op_accumulate_reduced(t, g, alpha);
}
