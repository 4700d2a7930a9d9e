/* The autocast scope under the program's control (Accelerate's accelerator.autocast). */
#include "accelerator/accelerator_impl.h"
#include "tensor/tensor_impl.h"
#include <caccel/xla.h>

/* The low precision of mixed_precision (CA_F32: none; bf16 on xla is its storage, not autocast). */
static ca_dtype configured(const ca_accelerator *acc) {
    if (acc->st.mixed_precision == CA_MP_BF16) return ca_xla_bf16_storage(acc->device) ? CA_F32 : CA_BF16;
    return acc->st.mixed_precision == CA_MP_FP16 ? CA_F16 : CA_F32;
}

ca_status ca_autocast_begin(ca_accelerator *acc, const ca_autocast_opts *opts) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_autocast_begin: accelerator is NULL");
    ca_autocast_opts o = opts ? *opts : (ca_autocast_opts){0};
    if (o.dtype != CA_F32 && o.dtype != CA_F16 && o.dtype != CA_BF16)
        return ca_error(CA_ERR_INVALID, "autocast: dtype %s is not f16 or bf16 (f32: mixed_precision's)",
                        ca_dtype_name(o.dtype));
    int n = (int)(sizeof acc->autocast_saved / sizeof acc->autocast_saved[0]);
    if (acc->autocast_depth >= n)
        return ca_error(CA_ERR_STATE, "autocast: more than %d nested scopes", n);
    ca_dtype dt = o.dtype != CA_F32 ? o.dtype : configured(acc);
    ca_dtype now = ca_autocast_dtype();
    if (o.enabled == CA_NO) dt = CA_F32;
    else if (dt == CA_F32) dt = now;   /* mixed_precision "no": Accelerate's null context */
    acc->autocast_saved[acc->autocast_depth++] = ca_autocast_set(dt);
    return CA_OK;
}

void ca_autocast_end(ca_accelerator *acc) {
    if (acc && acc->autocast_depth > 0) ca_autocast_set(acc->autocast_saved[--acc->autocast_depth]);
}
