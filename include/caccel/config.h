/* caccel/config.h: Accelerate-compatible configuration: keys, merge order, provenance. */
#ifndef CACCEL_CONFIG_H
#define CACCEL_CONFIG_H

#include <caccel/status.h>
#include <caccel/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * One rule for every key: default < program (ca_options) < file < environment
 * < command line. Keys, values and file format are Accelerate's own
 * (default_config.yaml); see docs/CONFIGURATION.md for the key list, the
 * ACCELERATE_* variables, the flags, and where Accelerate itself differs.
 * Nested keys are addressed with a dot: "fsdp_config.fsdp_sharding_strategy".
 */
typedef struct ca_config ca_config;

typedef enum ca_config_source {
    CA_SRC_DEFAULT = 0,   /* Accelerate's default */
    CA_SRC_PROGRAM = 1,   /* set by the program (ca_options / ca_config_set) */
    CA_SRC_FILE = 2,      /* a YAML/JSON config file */
    CA_SRC_ENV = 3,       /* an environment variable */
    CA_SRC_CLI = 4        /* a command-line flag */
} ca_config_source;

/* A configuration holding every known key at its default. Free with
 * ca_config_destroy. Not thread-safe: build it on one thread, then share it
 * read-only. */
CA_API ca_status ca_config_create(ca_config **out);
CA_API void ca_config_destroy(ca_config *c);          /* accepts NULL */

/* Sets `key` from `source`; `origin` says where ("cfg.yaml:12", "env
 * ACCELERATE_MIXED_PRECISION", "--use_cpu"); NULL origin = a default text for
 * the source. A value from a lower source than the key's current one is
 * ignored (returns CA_OK). The value is validated: CA_ERR_CONFIG names the
 * origin, the key and the allowed values; an unknown key names the closest
 * known key. */
CA_API ca_status ca_config_set(ca_config *c, const char *key, const char *value,
                               ca_config_source source, const char *origin);

/* Loads an Accelerate config file (YAML, or JSON by content). Unknown
 * top-level keys fail together in one error naming each of them and the file
 * (with a suggestion for each), unless unknown keys are allowed (see below),
 * in which case each is a warning. Bad values fail with file:line. */
CA_API ca_status ca_config_load_file(ca_config *c, const char *path);

/* Applies the ACCELERATE_* (and CACCEL_*) environment variables found in
 * envp (NULL: the process environment). */
CA_API ca_status ca_config_apply_env(ca_config *c, char *const *envp);

/* Applies the configuration flags found in argv[1..argc-1] (launcher names:
 * --cpu, --use_cpu, --mixed_precision bf16, --mixed_precision=bf16, ...).
 * Arguments it does not know are left for the program and ignored here. */
CA_API ca_status ca_config_apply_args(ca_config *c, int argc, char *const *argv);

/* For programs with flags of their own: how many values the configuration
 * flag `arg` takes (0 or 1; 0 also for "--flag=value"), or -1 when `arg` is
 * not a configuration flag. */
CA_API int ca_config_flag_arity(const char *arg);

/* Everything a program needs in one call: `settings` ("key=value" pairs,
 * NULL-terminated, may be NULL) at program level, then the config file
 * (--config_file, else ACCELERATE_CONFIG_FILE, else the setting
 * "config_file=PATH" if the program gave one, else
 * $XDG_CONFIG_HOME/caccel/default_config.yaml, else
 * $HF_HOME/accelerate/default_config.yaml; none is fine), then the
 * environment, then argv. Finally validates combinations and logs, once, the
 * keys that kept their defaults (at INFO). */
CA_API ca_status ca_config_load(ca_config *c, const char *const *settings,
                                int argc, char *const *argv);

/* The file ca_config_load/ca_config_load_file read, or NULL. */
CA_API const char *ca_config_file(const ca_config *c);

/* Logs one warning for each key that is set but has no effect in this build
 * (a plugin's section, torch.compile, TPU or SageMaker keys, ...), naming the
 * key, its origin and why; *nwarned (may be NULL) gets their number. The
 * accelerator calls it once, on rank 0; so does `caccel env`. */
CA_API ca_status ca_config_warn_ignored(const ca_config *c, int *nwarned);

/* Value of `key` as text ("bf16", "true", "2", "null"); NULL for an unknown
 * key. Valid until the key is set again or the config destroyed. */
CA_API const char *ca_config_get(const ca_config *c, const char *key);
CA_API ca_status ca_config_get_bool(const ca_config *c, const char *key, bool *out);
CA_API ca_status ca_config_get_int(const ca_config *c, const char *key, int64_t *out);
CA_API ca_status ca_config_get_double(const ca_config *c, const char *key, double *out);
/* Where the key's value came from ("cfg.yaml:12", "env ACCELERATE_USE_CPU",
 * "--use_cpu", "program", "default"); NULL for an unknown key. */
CA_API const char *ca_config_origin(const ca_config *c, const char *key);
CA_API ca_config_source ca_config_source_of(const ca_config *c, const char *key);

/* Iteration over every key with a value, in a stable order (for `caccel env`). */
typedef struct ca_config_entry {
    const char *key;
    const char *value;
    const char *origin;
    ca_config_source source;
    bool supported;            /* false: accepted and reported, not acted on by caccel */
} ca_config_entry;
CA_API int ca_config_count(const ca_config *c);
CA_API ca_status ca_config_entry_at(const ca_config *c, int i, ca_config_entry *out);

/* The resolved, typed view the runtime acts on. */
typedef enum ca_distributed_type {
    CA_DIST_NO = 0, CA_DIST_MULTI_CPU, CA_DIST_MULTI_GPU, CA_DIST_XLA, CA_DIST_FSDP,
    CA_DIST_DEEPSPEED, CA_DIST_MEGATRON_LM, CA_DIST_OTHER   /* vendor MULTI_* types */
} ca_distributed_type;
/* Accelerate's DDPCommunicationHookType: how DDP all-reduces its gradient buckets. FP16/BF16 (PyTorch's
 * fp16_compress_hook/bf16_compress_hook): each bucket is divided by the process count, rounded to 16
 * bits, summed in 16 bits and widened back, halving the bytes sent. POWER_SGD/BATCHED_POWER_SGD
 * (powerSGD_hook/batched_powerSGD_hook): each gradient (or each whole bucket) is sent as rank-r factors,
 * with error feedback; their options are the keys comm_state_option.* (docs/DISTRIBUTED.md). */
typedef enum ca_comm_hook {
    CA_COMM_HOOK_NO = 0, CA_COMM_HOOK_FP16, CA_COMM_HOOK_BF16, CA_COMM_HOOK_POWER_SGD, CA_COMM_HOOK_BATCHED_POWER_SGD
} ca_comm_hook;

typedef enum ca_mixed_precision {
    CA_MP_NO = 0, CA_MP_FP16, CA_MP_BF16, CA_MP_FP8
} ca_mixed_precision;

typedef struct ca_settings {
    ca_distributed_type distributed_type;
    const char *distributed_type_name;  /* as written ("MULTI_CPU") */
    ca_mixed_precision mixed_precision;
    bool use_cpu;
    int num_processes;                  /* -1: not given */
    int num_machines;                   /* num_machines MIN:MAX (elastic, caccel launch): MAX */
    int machine_rank;
    const char *main_process_ip;        /* NULL: not given */
    int main_process_port;              /* 0: not given */
    const char *gpu_ids;                /* "all" or "0,1"; NULL: not given */
    int gradient_accumulation_steps;
    double gradient_clipping;           /* 0: off */
    bool debug;
    bool downcast_bf16;
    const char *rdzv_backend;
    bool same_network;
    bool enable_cpu_affinity;
    int num_cpu_threads_per_process;    /* 0: not given */
    const char *backend;                /* collective backend: "gloo", "mpi", "nccl", NULL = auto */
    int64_t timeout_ms;                 /* collective/rendezvous timeout */
    double bucket_cap_mb;               /* gradient bucket size */
    ca_comm_hook comm_hook;             /* DDP's gradient all-reduce: f32, or compressed to fp16/bf16 */
    bool even_batches;
    bool split_batches;                 /* a loader's batch_size is global; each process gets a slice */
    bool dispatch_batches;              /* rank 0 reads, the others receive their slice (docs/DATA.md) */
    bool use_seedable_sampler;          /* data_seed seeds the shuffles */
    int64_t data_seed;                  /* -1: not given */
    bool non_blocking;                  /* accepted; no effect */
    bool deterministic;                 /* bit-identical results for any process/thread count */
    int deterministic_shards;           /* virtual shards per global batch (deterministic mode) */
    bool allow_tf32;                    /* f32 GEMMs on TF32 tensor cores (GPU devices) */
    int min_machines;                   /* num_machines MIN:MAX: MIN; 0 when num_machines is one number */
} ca_settings;

/* Fills `out` from c (strings point into c). Never fails on a loaded config. */
CA_API ca_status ca_config_settings(const ca_config *c, ca_settings *out);

/* Accelerate's ParallelismConfig device mesh: the processes laid out as dp_replicate x dp_shard x cp x tp, in
 * that order, row-major (tp innermost: the ranks of one tensor-parallel group are adjacent, as
 * accelerate.parallelism_config lays them out). */
typedef enum ca_mesh_dim {
    CA_MESH_DP_REPLICATE = 0, CA_MESH_DP_SHARD, CA_MESH_CP, CA_MESH_TP, CA_MESH_NDIMS
} ca_mesh_dim;
typedef struct ca_mesh_shape {
    int size[CA_MESH_NDIMS];
} ca_mesh_shape;
/* The mesh the configuration asks of `world` processes. With tp_size and cp_size 1 it is plain data
 * parallelism: the dp sizes when their product is world (HSDP's groups), else dp_replicate = world. With
 * either above 1 the four sizes as written, whose product must be world: CA_ERR_CONFIG otherwise, naming
 * each key with its value and origin. Pure: opens nothing. */
CA_API ca_status ca_config_mesh(const ca_config *c, int world, ca_mesh_shape *out);
/* "dp_replicate", "dp_shard", "cp", "tp"; "dp" for CA_MESH_NDIMS (the data-parallel ranks of both dp
 * dimensions together); NULL beyond. */
CA_API const char *ca_mesh_dim_name(int dim);
/* The coordinates of `rank` in mesh m (rank = ((r * dp_shard + s) * cp + c) * tp + t). */
CA_API void ca_mesh_coords(const ca_mesh_shape *m, int rank, int coord[CA_MESH_NDIMS]);

CA_API const char *ca_distributed_type_name(ca_distributed_type t);
CA_API const char *ca_mixed_precision_name(ca_mixed_precision m);

#ifdef __cplusplus
}
#endif
#endif
