/* `caccel env`: the version, the backends and devices found, and the merged configuration with each value's origin. */
#include "tools/cli_impl.h"
#include "config/config_impl.h"
#include "comm/affinity_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void env_usage(FILE *f) {
    fprintf(f, "usage: caccel env [--config_file FILE] [configuration flags...]\n\n"
               "Prints caccel's version and plugin ABI, the backends compiled in and the plugins found\n"
               "(with their device counts, or why they cannot run here), the CPU device, and the\n"
               "configuration merged from defaults < file < environment < flags, with the origin\n"
               "of every value. Takes every flag of `accelerate launch` that caccel maps\n"
               "(--mixed_precision, --num_processes, --cpu, ...), see docs/CONFIGURATION.md.\n");
}

static const char *kind_name(ca_backend_kind k) {
    return k == CA_BACKEND_DEVICE ? "device" : k == CA_BACKEND_COLLECTIVE ? "collective" : "?";
}

static int width(const char *s) { return s ? (int)strlen(s) : 0; }

static void print_backends(void) {
    ca_status s = ca_registry_load_plugins();
    if (s != CA_OK) {
        printf("  (loading plugins failed: %s)\n", ca_last_error());
        ca_clear_error();
    }
    int n = ca_registry_count();
    int wn = 4, wk = 4, wo = 6, wv = 7;
    for (int i = 0; i < n; i++) {
        ca_backend_info b;
        if (ca_registry_get(i, &b) != CA_OK) continue;
        if (width(b.name) > wn) wn = width(b.name);
        if (width(kind_name(b.kind)) > wk) wk = width(kind_name(b.kind));
        if (width(b.origin) > wo) wo = width(b.origin);
        if (width(b.version) > wv) wv = width(b.version);
    }
    if (wv > 40) wv = 40;
    printf("  %-*s  %-*s  %-7s  %-*s  %-*s  %s\n", wn, "NAME", wk, "KIND", "DEVICES", wo, "ORIGIN", wv, "VERSION",
           "STATUS");
    for (int i = 0; i < n; i++) {
        ca_backend_info b;
        if (ca_registry_get(i, &b) != CA_OK) {
            printf("  (backend %d: %s)\n", i, ca_last_error());
            continue;
        }
        char devices[16];
        if (b.kind == CA_BACKEND_DEVICE && b.device_count >= 0)
            snprintf(devices, sizeof devices, "%d", b.device_count);
        else
            snprintf(devices, sizeof devices, "-");
        char status[320];
        if (!b.usable)
            snprintf(status, sizeof status, "unusable: %s", b.reason && b.reason[0] ? b.reason : "no reason given");
        else if (b.kind == CA_BACKEND_DEVICE && b.device_count == 0)
            snprintf(status, sizeof status, "no devices: %s", b.reason && b.reason[0] ? b.reason : "none found");
        else
            snprintf(status, sizeof status, "ok");
        printf("  %-*s  %-*s  %-7s  %-*s  %-*s  %s\n", wn, b.name ? b.name : "?", wk, kind_name(b.kind), devices,
               wo, b.origin ? b.origin : "", wv, b.version ? b.version : "", status);
    }
    if (n == 0) printf("  (none)\n");
}

/* Whether the configuration shards parameters (ZeRO stages 1 to 3, FSDP other than NO_SHARD). */
static bool shards_params(const ca_config *c, const ca_settings *st) {
    if (st->distributed_type == CA_DIST_DEEPSPEED) {
        const char *v = ca_config_get(c, "deepspeed_config.zero_stage");
        return !v || strcmp(v, "0") != 0;
    }
    if (st->distributed_type != CA_DIST_FSDP) return false;
    const char *key, *v = ca_config_fsdp_strategy(c, &key);
    return !v || (strcmp(v, "NO_SHARD") != 0 && strcmp(v, "3") != 0 && strcmp(v, "false") != 0);
}

/* ParallelismConfig's device mesh beyond plain data parallelism: its sizes and each rank's coordinates,
 * the group ZeRO / FSDP shards over (sharded: Accelerate's flattened "dp_shard_cp" under context
 * parallelism), or why a run would refuse it. */
static void print_mesh(const ca_config *c, int np, bool sharded) {
    ca_mesh_shape m;
    int world = np > 0 ? np : 1;
    if (ca_config_mesh(c, world, &m) != CA_OK) {
        printf("Device mesh: %s\n", ca_last_error());
        ca_clear_error();
        return;
    }
    if (m.size[CA_MESH_TP] == 1 && m.size[CA_MESH_CP] == 1) return;   /* plain data parallelism */
    printf("Device mesh: dp_replicate %d x dp_shard %d x cp %d x tp %d (tp innermost), %d process%s\n", m.size[0],
           m.size[1], m.size[2], m.size[3], world, world > 1 ? "es" : "");
    for (int r = 0; r < world && r < 64; r++) {
        int k[CA_MESH_NDIMS];
        ca_mesh_coords(&m, r, k);
        printf("  rank %d: dp_replicate %d, dp_shard %d, cp %d, tp %d\n", r, k[0], k[1], k[2], k[3]);
    }
    if (world > 64) printf("  ... (%d ranks more)\n", world - 64);
    if (m.size[CA_MESH_CP] > 1)   /* the cp ranks hold the same parameters, each part of every sequence */
        printf("  cp: groups of %d ranks split every sequence (they read the same batches); gradients averaged over "
               "dp_cp (%d ranks each)\n", m.size[CA_MESH_CP], world / m.size[CA_MESH_TP]);
    if (!sharded) return;
    int group = m.size[CA_MESH_DP_SHARD] * m.size[CA_MESH_CP];
    printf("  %s: ZeRO / FSDP shards parameters, gradients and optimizer state over dp_shard %d x cp %d = %d "
           "ranks%s", m.size[CA_MESH_CP] > 1 ? "dp_shard_cp" : "dp_shard", m.size[CA_MESH_DP_SHARD], m.size[CA_MESH_CP],
           group, m.size[CA_MESH_TP] > 1 ? " (each tp rank its own slices)" : "");
    if (m.size[CA_MESH_DP_REPLICATE] > 1) printf(", replicated %d times", m.size[CA_MESH_DP_REPLICATE]);
    printf("\n");
}

/* What sharded data parallelism runs under FSDP: the strategy from FSDP1's or FSDP2's keys (the
 * accelerator's own rule, ca_config_fsdp_strategy) and the state dict type. */
static void print_fsdp(const ca_config *c) {
    static const char *const by_index[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                           "HYBRID_SHARD_ZERO2"};
    const char *key, *v = ca_config_fsdp_strategy(c, &key);
    const char *name = v && v[0] >= '1' && v[0] <= '5' && !v[1] ? by_index[v[0] - '1'] : v;
    const char *sd = ca_config_get(c, "fsdp_config.fsdp_state_dict_type");
    bool sd_set = sd && strcmp(sd, "null") != 0;
    printf("Resolved FSDP: sharding strategy %s (%s = %s, %s), state dict type %s (%s)\n", name ? name : "?", key,
           ca_config_get(c, key), ca_config_origin(c, key), sd_set ? sd : "FULL_STATE_DICT",
           sd_set ? ca_config_origin(c, "fsdp_config.fsdp_state_dict_type") : "not set: full");
}

static void print_config(const ca_config *c) {
    const char *file = ca_config_file(c);
    if (file) {
        printf("Configuration file: %s\n", file);
    } else {
        char p1[2048], p2[2048];
        ca_cli_default_config_path(p1, sizeof p1);
        ca_cli_accelerate_config_path(p2, sizeof p2);
        printf("Configuration file: none (looked for %s and %s)\n", p1[0] ? p1 : "$XDG_CONFIG_HOME/caccel/...",
               p2[0] ? p2 : "$HF_HOME/accelerate/...");
    }
    printf("Precedence: default < program < file < environment < command line\n\n");
    int n = ca_config_count(c), wk = 3, wv = 5;
    bool any_reported = false;
    for (int i = 0; i < n; i++) {
        ca_config_entry e;
        if (ca_config_entry_at(c, i, &e) != CA_OK) continue;
        if (width(e.key) > wk) wk = width(e.key);
        if (width(e.value) > wv) wv = width(e.value);
    }
    if (wv > 32) wv = 32;
    printf("  %-*s  %-*s  %s\n", wk, "KEY", wv, "VALUE", "ORIGIN");
    for (int i = 0; i < n; i++) {
        ca_config_entry e;
        if (ca_config_entry_at(c, i, &e) != CA_OK) continue;
        printf("%c %-*s  %-*s  %s\n", e.supported ? ' ' : '*', wk, e.key, wv, e.value, e.origin);
        if (!e.supported) any_reported = true;
    }
    if (any_reported) printf("\n* accepted and reported: caccel does not act on this key\n");

    ca_settings st;
    if (ca_config_settings(c, &st) == CA_OK) {
        printf("\nResolved: distributed_type %s, mixed_precision %s, use_cpu %s, num_processes %d, "
               "backend %s, timeout %.10gs\n",
               st.distributed_type_name, ca_mixed_precision_name(st.mixed_precision), st.use_cpu ? "true" : "false",
               st.num_processes, st.backend ? st.backend : "auto", (double)st.timeout_ms / 1000.0);
        if (st.distributed_type == CA_DIST_FSDP) print_fsdp(c);
        print_mesh(c, st.num_processes, shards_params(c, &st));
    }
}

/* The CPU device's description: its kernel threads (and their clamp), the BLAS's count and threading.
 * With OpenBLAS's pthreads build, its pool and the kernels' OpenMP team are two pools of threads. */
static void print_cpu_device(void) {
    ca_device *cpu = ca_cpu_device();
    const char *desc = cpu ? ca_device_description(cpu) : NULL;
    printf("\nCPU device: %s\n", desc ? desc : "(unavailable)");
    if (desc && strstr(desc, "BLAS threads (pthreads)"))
        printf("warning: OpenBLAS is its pthreads build: its thread pool and the CPU kernels' OpenMP team are two "
               "pools that spin against each other (the OpenMP build, Debian's libopenblas-openmp-dev, shares one)\n");
    printf("\n");
}

/* The machine as hwloc sees it and the CPUs enable_cpu_affinity gives each local rank of this configuration
 * (num_processes over num_machines), whether or not it is on: what a run would be bound to. */
static void print_cpu_binding(const ca_config *c) {
    ca_settings st;
    hwloc_topology_t topo;
    if (ca_config_settings(c, &st) != CA_OK || hwloc_topology_init(&topo) != 0) return;
    if (hwloc_topology_load(topo) == 0) {
        char line[512];
        ca_affinity_describe(topo, line, sizeof line);
        printf("\nCPU topology (hwloc %s): %s\n", HWLOC_VERSION, line);
        int machines = st.num_machines > 0 ? st.num_machines : 1, procs = st.num_processes > 0 ? st.num_processes : 1;
        int local = procs / machines > 0 ? procs / machines : 1;
        printf("enable_cpu_affinity %s (%s): %d local process%s\n", st.enable_cpu_affinity ? "true" : "false",
               ca_config_origin(c, "enable_cpu_affinity"), local, local == 1 ? "" : "es");
        for (int r = 0; r < local; r++) {
            if (ca_affinity_rank_line(topo, local, r, st.num_cpu_threads_per_process, line, sizeof line) != CA_OK)
                snprintf(line, sizeof line, "%s", ca_last_error());
            printf("  local rank %d: %s\n", r, line);
        }
    }
    hwloc_topology_destroy(topo);
}

int ca_cmd_env(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            env_usage(stdout);
            return 0;
        }
        /* everything here must be a configuration flag: `env` runs no program */
        int arity = ca_config_flag_arity(argv[i]);
        if (arity < 0) {
            fprintf(stderr, "caccel env: error: unknown argument '%s'\n", argv[i]);
            env_usage(stderr);
            return 2;
        }
        i += arity;
    }
    ca_config *c = NULL;
    if (ca_config_create(&c) != CA_OK) return ca_cli_fail("env");
    /* Explain which file would be read, even when loading then fails. */
    ca_status s = ca_config_load(c, NULL, argc, argv);
    if (s == CA_OK) s = ca_config_warn_ignored(c, NULL);

    printf("caccel %s (plugin ABI %d.%d)\n\n", CA_VERSION, CA_ABI_MAJOR, CA_ABI_MINOR);
    printf("Backends (built in, and plugins from the plugin directory and CACCEL_PLUGIN_PATH):\n");
    print_backends();
    print_cpu_device();
    if (s != CA_OK) {
        fflush(stdout);
        int rc = ca_cli_fail("env");
        ca_config_destroy(c);
        return rc;
    }
    print_config(c);
    print_cpu_binding(c);
    ca_config_destroy(c);
    return 0;
}
