/* cpu_plugin.h: the CPU backend as the registry sees it: its plugin descriptor, built into
 * libcaccel (the registry registers it before any plugin is loaded). */
#ifndef CACCEL_CPU_PLUGIN_H
#define CACCEL_CPU_PLUGIN_H

#include <caccel/backend.h>

/* The descriptor of the built-in "cpu" device backend; static storage, never freed. */
const ca_plugin *ca_cpu_plugin(void);

/* Deterministic mode (docs/DETERMINISM.md): on, GEMMs run on one thread, because OpenBLAS's
 * threaded sgemm rounds differently from its one-thread sgemm for some shapes; off restores the
 * thread count from before. Process-wide. */
void ca_cpu_set_deterministic(bool on);

/* The kernels' loop splitter (cpu_parallel.h) as the registry hands it to the lazy device, whose own
 * loops run on the same threads as these kernels: fn(ctx, lo, hi) over [0, n) in contiguous ranges,
 * each element costing about `cost` streaming elements (serial below the grain that makes). */
void ca_cpu_parallel_for(int64_t n, int64_t cost, void (*fn)(void *ctx, int64_t lo, int64_t hi), void *ctx);

/* cpu_openblas_coretype_hint for the registry's ca_cpu_openblas_coretype_hint (caccel/device.h). */
const char *ca_cpu_coretype_hint(void);

/* Subnormal flushing inside the backend's arithmetic kernels (docs/ARCHITECTURE.md, "Subnormal
 * numbers"): FTZ and DAZ are set for the duration of each kernel call and the caller's mode is
 * restored. On by default; CACCEL_CPU_FLUSH_DENORMAL=0 turns it off. Process-wide. */
void ca_cpu_set_flush_denormal(bool on);
/* Whether kernels flush (false where the CPU has no such mode, i.e. off x86). */
bool ca_cpu_flush_denormal(void);

#endif
