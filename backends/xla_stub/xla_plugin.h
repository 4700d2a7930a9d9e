/* xla_plugin.h: the lazy "xla" device as the registry and the core see it: its plugin descriptor
 * (built into libcaccel) and its metrics. */
#ifndef CACCEL_XLA_PLUGIN_H
#define CACCEL_XLA_PLUGIN_H

#include <caccel/backend.h>
#include <caccel/device.h>

/* The descriptor of the built-in "xla" device backend. `executor` is the device backend whose
 * kernels run the compiled graphs on the host (the registry passes the cpu backend's ops: this
 * backend sits beside the cpu backend, not above it). Static storage, never freed. */
const ca_plugin *ca_xla_plugin(const ca_device_ops *executor);

/* Metrics of an open xla device context (the `dev` of its vtable). */
void ca_xla_ctx_metrics(void *dev, ca_xla_metrics *out);
void ca_xla_ctx_metrics_reset(void *dev);
/* A step boundary (torch_xla's mark_step): counted, and the pending graph runs. */
ca_status ca_xla_ctx_mark_step(void *dev);
/* bf16 storage of an open xla device context (ca_xla_set_bf16_storage). */
ca_status ca_xla_ctx_set_bf16_storage(void *dev, bool on);
bool ca_xla_ctx_bf16_storage(void *dev);
/* "name: value" lines of m. */
void ca_xla_format_metrics(const ca_xla_metrics *m, char *buf, size_t len);

#endif
