/* Autocast: which ops run in low precision under mixed precision, and the per-step weight copies. */
#include "tensor/ops_impl.h"

/*
 * The policy (docs/MIXED_PRECISION.md), like torch.autocast's lists:
 *  - low precision: linear, matmul (inputs cast to f16/bf16, f32 accumulation,
 *    low-precision output); weights are cast once per optimizer step;
 *  - f32: softmax, log_softmax, cross_entropy, mse_loss, layer_norm, sum, mean,
 *    exp, log, pow (low-precision inputs are cast up first);
 *  - everything else runs in its input's dtype; mixed float inputs promote to f32.
 * Master weights, gradients reaching the optimizer and optimizer math stay f32.
 */

static _Thread_local ca_dtype tl_autocast = CA_F32;

ca_dtype ca_autocast_dtype(void) { return tl_autocast; }

ca_dtype ca_autocast_set(ca_dtype dt) {
    ca_dtype old = tl_autocast;
    tl_autocast = dt;
    return old;
}

ca_tensor *ca_autocast_weight(ca_tensor *w, ca_dtype dt) {
    if (!w || w->dtype == dt) return w;
    if (!w->persistent || !ca_tensor_is_contiguous(w)) {        /* not a parameter: a plain cast */
        ca_tensor *c;
        CA_NO_GRAD { c = ca_cast(w, dt); }
        return c;
    }
    ca_device *dev = ca_tdev(w);
    if (w->lowp && (w->lowp->dtype != dt || ca_tdev(w->lowp) != dev)) {
        ca_tensor_free(w->lowp);
        w->lowp = NULL;
    }
    if (!w->lowp) {
        ca_tensor *c = ca_tensor_new(dev, dt, w->ndim, w->shape);
        if (!c) return NULL;
        w->lowp = ca_tensor_keep(c);
        w->lowp_version = w->version - 1;
    }
    if (w->lowp_version != w->version) {
        if (w->numel && CA_KCALL(dev, cast, .src_dt = w->dtype, .x = ca_tptr(w), .dst_dt = dt,
                                 .y = ca_tptr(w->lowp), .n = w->numel, .alpha = 1.0f) != CA_OK)
            return NULL;
        w->lowp_version = w->version;
    }
    return w->lowp;
}

ca_tensor *ca_autocast_f32(ca_tensor *x) {
    if (!x || tl_autocast == CA_F32 || x->dtype == CA_F32 || !ca_dtype_is_float(x->dtype)) return x;
    return ca_cast(x, CA_F32);
}
