/* test_kcall.h: kernel calls from tests that hold a backend's raw table, made as the core makes them
 * (core/device_impl.h): the contract's checks of base/kernel_check_impl.h, then the slot. */
#ifndef CACCEL_TEST_KCALL_H
#define CACCEL_TEST_KCALL_H

#include "base/kernel_check_impl.h"

/* TKC(backend name, table, context, slot, .field = value, ...) */
#define TKC(be, tbl, ctx, slot, ...) \
    ca_kernel_checked_##slot(be, tbl, ctx, &(const ca_##slot##_args){.struct_size = 0, __VA_ARGS__})
/* ... with an args struct built beforehand */
#define TKC_ARGS(be, tbl, ctx, slot, a) ca_kernel_checked_##slot(be, tbl, ctx, (a))
/* ... for adamw and sgd, with the tensor list apart from the hyperparameters */
#define TKC_LIST(be, tbl, ctx, slot, tl, a) tkc_##slot(be, tbl, ctx, tl, a)

static inline ca_status tkc_adamw(const char *be, const ca_kernels *k, void *ctx, const ca_tensor_list *t,
                                  const ca_adamw_args *a) {
    ca_adamw_args c = *a;
    c.t = t;
    return ca_kernel_checked_adamw(be, k, ctx, &c);
}

static inline ca_status tkc_sgd(const char *be, const ca_kernels *k, void *ctx, const ca_tensor_list *t,
                                const ca_sgd_args *a) {
    ca_sgd_args c = *a;
    c.t = t;
    return ca_kernel_checked_sgd(be, k, ctx, &c);
}

#endif
