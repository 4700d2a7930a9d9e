/* cpu_plugin.h: the CPU backend as the registry sees it: its plugin descriptor, built into
 * libcaccel (the registry registers it before any plugin is loaded). */
#ifndef CACCEL_CPU_PLUGIN_H
#define CACCEL_CPU_PLUGIN_H

#include <caccel/backend.h>

/* The descriptor of the built-in "cpu" device backend; static storage, never freed. */
const ca_plugin *ca_cpu_plugin(void);

#endif
