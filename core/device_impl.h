/* device_impl.h: an opened device as the rooms above the registry see it, and the kernel-call
 * wrapper every op uses. */
#ifndef CACCEL_DEVICE_IMPL_H
#define CACCEL_DEVICE_IMPL_H

#include "base/base_impl.h"
#include <caccel/device.h>

/* An opened device. The registry owns it; it lives until ca_shutdown(). The
 * vtables are copies normalised to this library's struct sizes, so slots a
 * plugin's older ABI lacks read as NULL. */
struct ca_device {
    const char *name;               /* backend name */
    int index;
    ca_device_ops ops;              /* normalised copy */
    ca_kernels k;                   /* normalised copy */
    void *ctx;                      /* backend context (the `dev` of kernels) */
    const ca_allocator_ops *aops;   /* the allocator tensors use */
    void *actx;
    char description[256];
    struct ca_device *next;
};

/* Error for a NULL kernel slot: "<backend> has no kernel '<slot>'". */
ca_status ca_kernel_missing(const ca_device *d, const char *slot);

/* Calls kernel `slot` of device d with the device context prepended. */
#define CA_KCALL(d, slot, ...)                                                  \
    ((d)->k.slot ? (d)->k.slot((d)->ctx, __VA_ARGS__) : ca_kernel_missing((d), #slot))

#endif
