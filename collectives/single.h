/* single.h: the single-process collective backend as the registry sees it: its plugin
 * descriptor, built into libcaccel (a world of one needs no plugin). */
#ifndef CACCEL_SINGLE_H
#define CACCEL_SINGLE_H

#include <caccel/backend.h>

/* The descriptor of the built-in "single" collective backend; static storage, never freed. */
const ca_plugin *ca_single_collective_plugin(void);

#endif
