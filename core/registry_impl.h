/* registry_impl.h: the registry's private face: where plugins are installed, copying a plugin's
 * table into this library's layout, and forgetting every backend at shutdown. */
#ifndef CACCEL_REGISTRY_IMPL_H
#define CACCEL_REGISTRY_IMPL_H

#include "base/base_impl.h"

#include <caccel/device.h>
#include <stddef.h>

#ifndef CA_PLUGIN_DIR
#define CA_PLUGIN_DIR "/usr/local/lib/caccel"
#endif

/* The first registered usable collective backend whose device_names names device_name, or NULL. */
const char *ca_registry_collective_serving(const char *device_name);
/* True when a collective's device_names ("cpu", "cpu,cuda") names the device backend device_name
 * ("*", reducing on any device because it moves nothing, names none). */
bool ca_registry_names_device(const char *names, const char *device_name);
/* True when device_names names a registered device backend of kind host: the collective reduces
 * host memory, so a communicator can stage another device's buffers through host copies for it. */
bool ca_registry_names_host(const char *names);

/* What to install for a missing backend: a collective by name, or a device by kind (name NULL). */
typedef struct ca_plugin_hint {
    ca_backend_kind kind;
    const char *name;
    ca_device_kind device_kind;
    const char *file;          /* the plugin file, "caccel_gloo.so" */
    const char *package;       /* the Debian package(s) it builds from */
    const char *more;          /* appended to the hint, "" or "; ..." */
    bool needs_mpi_launcher;   /* the collective's needs_mpi_launcher, known before loading it */
} ca_plugin_hint;
const ca_plugin_hint *ca_registry_hint(ca_backend_kind kind, const char *name, ca_device_kind dev_kind);

/* Forgets every backend (ca_shutdown). */
void ca_registry_shutdown(void);

/* Copies min(src_size, dst_size) bytes of a vtable and zeroes the rest. */
void ca_copy_vtable(void *dst, size_t dst_size, const void *src, size_t src_size);

#endif
