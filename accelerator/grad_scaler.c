/* fp16 loss scaling's settings and state (GradScalerKwargs; the scale saved with a checkpoint). The
 * unscaling itself runs in the step (accelerator.c), which owns the order unscale -> clip -> step. */
#include "accelerator/accelerator_impl.h"

ca_status ca_grad_scaler_get(const ca_accelerator *acc, ca_grad_scaler_state *out) {
    if (!acc || !out) return ca_error(CA_ERR_INVALID, "ca_grad_scaler_get: NULL argument");
    *out = acc->scaler;
    return CA_OK;
}

ca_status ca_grad_scaler_set(ca_accelerator *acc, const ca_grad_scaler_state *st) {
    if (!acc || !st || !(st->scale > 0) || st->growth_tracker < 0)
        return ca_error(CA_ERR_INVALID, "grad scaler state: the scale must be > 0 and the tracker >= 0");
    acc->scaler = *st;
    return CA_OK;
}

ca_status ca_grad_scaler_configure(ca_accelerator *acc, const ca_grad_scaler_opts *opts) {
    if (!acc || !opts) return ca_error(CA_ERR_INVALID, "ca_grad_scaler_configure: NULL argument");
    /* a field left 0 keeps Accelerate's default (GradScalerKwargs) */
    ca_grad_scaler_opts o = *opts;
    if (o.init_scale == 0) o.init_scale = 65536.0;
    if (o.growth_factor == 0) o.growth_factor = 2.0;
    if (o.backoff_factor == 0) o.backoff_factor = 0.5;
    if (o.growth_interval == 0) o.growth_interval = 2000;
    if (!(o.init_scale > 0) || !(o.growth_factor > 1) || !(o.backoff_factor > 0) || !(o.backoff_factor < 1) ||
        o.growth_interval < 1)
        return ca_error(CA_ERR_INVALID, "grad scaler options: init_scale > 0, growth_factor > 1, "
                        "0 < backoff_factor < 1, growth_interval >= 1 (0: the default)");
    acc->scaler_opts = o;
    acc->scaler = (ca_grad_scaler_state){.scale = o.init_scale};
    return CA_OK;
}
