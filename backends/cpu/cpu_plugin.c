/* The CPU backend's plugin descriptor: one device backend, built into libcaccel. */
#include "base/base_impl.h"
#include "backends/cpu/cpu_plugin.h"
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>

static char cpu_version[64] = "OpenBLAS";
static pthread_once_t cpu_version_once = PTHREAD_ONCE_INIT;

/* "OpenBLAS 0.3.21" from the loaded library's configuration string. */
static void cpu_version_init(void) {
    const char *cfg = openblas_get_config();
    if (!cfg) return;
    const char *p = strstr(cfg, "OpenBLAS");
    if (!p) return;
    p += strlen("OpenBLAS");
    while (*p == ' ') p++;
    size_t l = strcspn(p, " ");
    if (l > 0) snprintf(cpu_version, sizeof cpu_version, "OpenBLAS %.*s", (int)l, p);
}

static int cpu_score(char *reason, size_t reason_len) {
    if (reason && reason_len) reason[0] = '\0';
    return 1;  /* runs everywhere; any accelerator is preferred */
}

static const ca_device_ops *const cpu_devices[] = {&cpu_device_ops};

static const ca_plugin cpu_plugin = {
    .struct_size = sizeof(ca_plugin),
    .abi_version = CA_ABI_VERSION,
    .name = "cpu",
    .version = cpu_version,
    .num_devices = 1,
    .devices = cpu_devices,
    .num_collectives = 0,
    .collectives = NULL,
    .score = cpu_score,
};

const char *ca_cpu_coretype_hint(void) { return cpu_openblas_coretype_hint(); }

void ca_cpu_parallel_for(int64_t n, int64_t cost, void (*fn)(void *ctx, int64_t lo, int64_t hi), void *ctx) {
    cpu_parallel_for(n, cpu_grain_for(cost), fn, ctx);
}

const ca_plugin *ca_cpu_plugin(void) {
    pthread_once(&cpu_version_once, cpu_version_init);
    return &cpu_plugin;
}
