/* alloc_impl.h: the core's caching allocator, which sits over a device's raw memory. */
#ifndef CACCEL_ALLOC_IMPL_H
#define CACCEL_ALLOC_IMPL_H

#include "base/base_impl.h"

/* The core's caching allocator over a device's raw mem_alloc/mem_free:
 * power-of-two-ish size classes, per-stream free lists, statistics. */
ca_status ca_caching_allocator_create(const ca_device_ops *ops, void *dev,
                                      const ca_allocator_ops **aops, void **actx);
void ca_caching_allocator_destroy(void *actx);
/* The block size the caching allocator gives a request of n bytes (its size classes). */
size_t ca_caching_size_class(size_t n);

#endif
