/* kernel_check_impl.h: argument checks every device backend's kernels share (header-only, so a
 * plugin gets them without the library exporting more): unsupported dtypes and multi-tensor lists. */
#ifndef CACCEL_KERNEL_CHECK_IMPL_H
#define CACCEL_KERNEL_CHECK_IMPL_H

#include <caccel/backend.h>
#include <caccel/status.h>
#include <caccel/types.h>

#include <stdbool.h>

/* "<backend> kernel <kernel>: <what> dtype bf16 is not supported here" (CA_ERR_UNSUPPORTED), or
 * CA_ERR_INVALID for a value outside the enum. */
static inline ca_status ca_kernel_bad_dtype(const char *backend, const char *kernel, const char *what,
                                            ca_dtype dt) {
    if ((unsigned)dt >= CA_DTYPE_COUNT)
        return ca_error(CA_ERR_INVALID, "%s kernel %s: %s has invalid dtype value %d", backend, kernel,
                        what, (int)dt);
    return ca_error(CA_ERR_UNSUPPORTED, "%s kernel %s: %s dtype %s is not supported here", backend,
                    kernel, what, ca_dtype_name(dt));
}

static inline const char *ca_kernel_missing_array(const ca_tensor_list *t, bool grad, bool s1) {
    return !t->numel ? "numel" : !t->param ? "param" : grad && !t->grad ? "grad" : s1 && !t->state1 ? "state1"
                                                                                                  : "state2";
}

/* Checks a multi-tensor list: arrays present, sizes non-negative, pointers present for non-empty
 * tensors, a float grad_dtype. grad/s1/s2: whether the kernel reads grad, state1, state2. */
static inline ca_status ca_kernel_check_list(const char *backend, const char *k, const ca_tensor_list *t,
                                             bool grad, bool s1, bool s2) {
    if (!t) return ca_error(CA_ERR_INVALID, "%s kernel %s: tensor list is NULL", backend, k);
    if (t->count < 0) return ca_error(CA_ERR_INVALID, "%s kernel %s: negative count %d", backend, k, t->count);
    if (t->count == 0) return CA_OK;
    if (!ca_dtype_is_float(t->grad_dtype)) return ca_kernel_bad_dtype(backend, k, "grad_dtype", t->grad_dtype);
    if (!t->numel || !t->param || (grad && !t->grad) || (s1 && !t->state1) || (s2 && !t->state2))
        return ca_error(CA_ERR_INVALID, "%s kernel %s: the list's %s array is NULL", backend, k,
                        ca_kernel_missing_array(t, grad, s1));
    for (int i = 0; i < t->count; i++) {
        if (t->numel[i] < 0)
            return ca_error(CA_ERR_INVALID, "%s kernel %s: tensor %d has negative numel %lld", backend, k, i,
                            (long long)t->numel[i]);
        if (t->numel[i] == 0) continue;
        if (!t->param[i] || (grad && !t->grad[i]) || (s1 && !t->state1[i]) || (s2 && !t->state2[i]))
            return ca_error(CA_ERR_INVALID, "%s kernel %s: tensor %d has a NULL %s", backend, k, i,
                            !t->param[i] ? "param" : grad && !t->grad[i] ? "grad" : s1 && !t->state1[i] ? "state1"
                                                                                                    : "state2");
    }
    return CA_OK;
}

#endif
