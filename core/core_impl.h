/* core_impl.h: private definitions shared by the core: the opened device and the kernel-call wrapper. */
#ifndef CACCEL_CORE_IMPL_H
#define CACCEL_CORE_IMPL_H

#include "base/base_impl.h"
#include <caccel/config.h>
#include <caccel/device.h>
#include <caccel/collective.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#ifndef CA_PLUGIN_DIR
#define CA_PLUGIN_DIR "/usr/local/lib/caccel"
#endif


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

/* The core's caching allocator over a device's raw mem_alloc/mem_free:
 * power-of-two-ish size classes, per-stream free lists, statistics. */
ca_status ca_caching_allocator_create(const ca_device_ops *ops, void *dev,
                                      const ca_allocator_ops **aops, void **actx);
void ca_caching_allocator_destroy(void *actx);

/* Forgets every backend (ca_shutdown). */
void ca_registry_shutdown(void);

/* Copies min(src_size, dst_size) bytes of a vtable and zeroes the rest. */
void ca_copy_vtable(void *dst, size_t dst_size, const void *src, size_t src_size);

#endif
