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

#endif
