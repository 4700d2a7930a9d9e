/* registry_impl.h: the registry's private face: where plugins are installed, copying a plugin's
 * table into this library's layout, and forgetting every backend at shutdown. */
#ifndef CACCEL_REGISTRY_IMPL_H
#define CACCEL_REGISTRY_IMPL_H

#include "base/base_impl.h"

#include <stddef.h>

#ifndef CA_PLUGIN_DIR
#define CA_PLUGIN_DIR "/usr/local/lib/caccel"
#endif

/* Forgets every backend (ca_shutdown). */
void ca_registry_shutdown(void);

/* Copies min(src_size, dst_size) bytes of a vtable and zeroes the rest. */
void ca_copy_vtable(void *dst, size_t dst_size, const void *src, size_t src_size);

#endif
