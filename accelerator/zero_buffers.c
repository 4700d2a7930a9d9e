/* The flat f32 buffers of sharded data parallelism (zero.c, zero3.c, zero_offload.c): a float
 * pointer into a device tensor, a device copy of n floats, zeroed buffers kept past scopes, views of
 * a flat buffer. The bottom of the zero files: it calls none of them. */
#include "accelerator/accelerator_impl.h"

float *ca_zero_fptr(const ca_tensor *t, int64_t off) { return (float *)ca_tptr(t) + off; }

ca_status ca_zero_copy_f32(ca_device *d, const float *x, float *y, int64_t n) {
    int64_t shape[1] = {n}, st[1] = {1};
    return n ? CA_KCALL(d, copy_strided, .dt = CA_F32, .ndim = 1, .shape = shape, .x = x, .x_stride = st,
                        .y = y, .y_stride = st) : CA_OK;
}

ca_tensor *ca_zero_kept_zeros(ca_device *d, ca_dtype dt, int64_t n) {
    ca_tensor *t = ca_zeros(d, dt, 1, &n);
    return t ? ca_tensor_keep(t) : NULL;
}

ca_tensor *ca_zero_persistent_zeros(ca_device *d, int64_t n) { return ca_zero_kept_zeros(d, CA_F32, n); }

ca_tensor *ca_zero_flat_view(ca_tensor *base, int ndim, const int64_t *shape, int64_t off) {
    int64_t st[CA_MAX_DIMS], s = 1;
    for (int d = ndim - 1; d >= 0; d--) { st[d] = s; s *= shape[d]; }
    ca_tensor *v = ca_tensor_view(base, ndim, shape, st, base->offset + off);   /* the offset is in storage */
    return v ? ca_tensor_keep(v) : NULL;
}
