/* xla_plugin.h: the lazy "xla" device as the registry and the core see it: its plugin descriptor
 * (built into libcaccel). Its metrics, step boundary and bf16 storage are slots and get_proc
 * extras of its device table (caccel/xla.h names them). */
#ifndef CACCEL_XLA_PLUGIN_H
#define CACCEL_XLA_PLUGIN_H

#include <caccel/backend.h>
#include <caccel/xla.h>

/* The descriptor of the built-in "xla" device backend. `executor` is the device backend whose
 * kernels run the compiled graphs on the host (the registry passes the cpu backend's ops: this
 * backend sits beside the cpu backend, not above it). Static storage, never freed. */
const ca_plugin *ca_xla_plugin(const ca_device_ops *executor);

#endif
