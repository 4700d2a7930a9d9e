/* xla_plugin.h: the lazy "xla" device as the registry and the core see it: its plugin descriptor
 * (built into libcaccel). Its metrics, step boundary and bf16 storage are slots and get_proc
 * extras of its device table (caccel/xla.h names them). */
#ifndef CACCEL_XLA_PLUGIN_H
#define CACCEL_XLA_PLUGIN_H

#include <caccel/backend.h>
#include <caccel/xla.h>

/* How the executor shares a loop among its threads: fn(ctx, lo, hi) over [0, n) in contiguous
 * ranges, each element costing about `cost` streaming elements (a load and a store of a float);
 * serial when that is too little work to share. */
typedef void (*ca_xla_range_fn)(void *ctx, int64_t lo, int64_t hi);
typedef void (*ca_xla_parallel_for_fn)(int64_t n, int64_t cost, ca_xla_range_fn fn, void *ctx);

/* The descriptor of the built-in "xla" device backend. `executor` is the device backend whose
 * kernels run the compiled graphs on the host (the registry passes the cpu backend's ops: this
 * backend sits beside the cpu backend, not above it), `parallel_for` the loop splitter of that
 * backend, on which the device's own loops (fused chains, bf16 rounding, copies) run, on the
 * kernels' threads (NULL: on the calling thread). Static storage, never freed. */
const ca_plugin *ca_xla_plugin(const ca_device_ops *executor, ca_xla_parallel_for_fn parallel_for);

#endif
