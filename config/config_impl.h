/* config_impl.h: private definitions of the configuration: the key schema, the env and flag maps, the store. */
#ifndef CACCEL_CONFIG_IMPL_H
#define CACCEL_CONFIG_IMPL_H

#include <caccel/config.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

/* ------------------------------------------------------------------ schema */

typedef enum ca_key_type {
    CA_KT_BOOL = 0,   /* true/false/yes/no/on/off/y/n/t/f/1/0, any case */
    CA_KT_INT,        /* decimal integer within [min, max] */
    CA_KT_FLOAT,      /* finite decimal number within [min, max] */
    CA_KT_STRING,     /* any text */
    CA_KT_ENUM,       /* one of `allowed` */
    CA_KT_LIST,       /* a YAML sequence (stored as ["a", "b"]) or one scalar */
    CA_KT_MAP         /* a section: its entries are the dotted keys "<name>.<sub>" */
} ca_key_type;

/* Flags of a key. */
enum {
    CA_KF_SUPPORTED = 1u << 0,  /* caccel acts on it (else: accepted and reported) */
    CA_KF_CASEFOLD = 1u << 1,   /* enum compared without case (Accelerate lowercases/uppercases) */
    CA_KF_CLUSTER = 1u << 2,    /* a field of Accelerate's ClusterConfig (LOCAL_MACHINE files) */
    CA_KF_SAGEMAKER = 1u << 3,  /* a field of Accelerate's SageMakerConfig (AMAZON_SAGEMAKER files) */
    CA_KF_CACCEL = 1u << 4,     /* caccel's own extension, not an Accelerate key */
    CA_KF_LEGACY = 1u << 5,     /* an old Accelerate key that is migrated (fp16, dynamo_backend) */
    CA_KF_FREEFORM = 1u << 6,   /* a section whose sub-keys are free (SageMaker additional_args) */
    CA_KF_RANGE = 1u << 7       /* CA_KT_INT that also takes MIN:MAX (num_machines: elastic), read as MAX */
};
#define CA_KF_BASE (CA_KF_CLUSTER | CA_KF_SAGEMAKER)

typedef struct ca_key_def {
    const char *name;            /* "mixed_precision", "fsdp_config.fsdp_sharding_strategy" */
    ca_key_type type;
    const char *def;             /* default as text; NULL = null (not given) */
    const char *const *allowed;  /* CA_KT_ENUM: NULL-terminated list */
    unsigned flags;
    double min, max;             /* CA_KT_INT / CA_KT_FLOAT range (min > max: unbounded) */
    const char *doc;             /* one line for docs and `caccel env --help` */
} ca_key_def;

extern const ca_key_def ca_config_keys[];
extern const size_t ca_config_nkeys;

/* The key definition called `name`, or NULL. Another spelling of a key
 * (parallelism_config.tp_size for parallelism_config.parallelism_config_tp_size)
 * finds the key: compare d->name with `name` to tell. */
const ca_key_def *ca_config_key_find(const char *name);
/* Index of `d` in ca_config_keys. */
size_t ca_config_key_index(const ca_key_def *d);
/* True for a key of a section ("fsdp_config.x"): *section gets the section's def. */
const ca_key_def *ca_config_section_of(const char *name);

/* An environment variable that sets a key. */
typedef enum ca_env_kind {
    CA_ENV_KEY = 0,        /* value goes to `key` */
    CA_ENV_DIST_TYPE,      /* a true value sets distributed_type to `key` (ACCELERATE_USE_FSDP) */
    CA_ENV_CONFIG_FILE,    /* names the config file (read by ca_config_load only) */
    CA_ENV_ENDPOINT        /* HOST[:PORT]: main_process_ip and main_process_port (PET_RDZV_ENDPOINT) */
} ca_env_kind;
typedef struct ca_env_def {
    const char *var;
    ca_env_kind kind;
    const char *key;
} ca_env_def;
extern const ca_env_def ca_config_envs[];
extern const size_t ca_config_nenvs;

/* A command-line flag. */
typedef enum ca_flag_kind {
    CA_FLAG_VALUE = 0,     /* --flag VALUE or --flag=VALUE: sets `key` */
    CA_FLAG_TRUE,          /* --flag (or --flag=BOOL): sets `key` to true */
    CA_FLAG_DIST_TYPE,     /* --flag: sets distributed_type to `key` */
    CA_FLAG_CONFIG_FILE,   /* --config_file F (read by ca_config_load only) */
    CA_FLAG_IMPLIED,       /* --flag (or --flag=BOOL): accepted; caccel always does what it asks */
    CA_FLAG_ENDPOINT       /* --flag HOST[:PORT]: main_process_ip and main_process_port (--rdzv_endpoint) */
} ca_flag_kind;
typedef struct ca_flag_def {
    const char *flag;      /* without the leading "--", underscores */
    ca_flag_kind kind;
    const char *key;
} ca_flag_def;
extern const ca_flag_def ca_config_flags[];
extern const size_t ca_config_nflags;

/* The flag definition for `arg` ("--num-processes=2" finds num_processes);
 * *value gets the text after '=' or NULL. */
const ca_flag_def *ca_config_flag_find(const char *arg, const char **value);

/* Edit distance (optimal string alignment, case-insensitive). */
size_t ca_config_edit_distance(const char *a, const char *b);
/* The known key closest to `name`: among top-level keys, or among the known
 * sub-keys of `section` (a section's def) when not NULL; NULL when none is
 * within max(2, len/3) edits. */
const char *ca_config_closest_key(const char *name, const ca_key_def *section);

/* Text describing what a key accepts ("a boolean (true, false, yes, no, ...)",
 * "one of: no, fp16, bf16, fp8"), into buf. */
void ca_config_describe_allowed(const ca_key_def *d, char *buf, size_t size);

/* Checks (and for CA_KT_LIST, normalises) `value` for key d. Returns a
 * malloc'd text to store (NULL value = null) in *out, or CA_ERR_CONFIG with
 * "<origin>: invalid value ..." recorded. */
ca_status ca_config_check_value(const ca_key_def *d, const char *name, const char *value,
                                const char *origin, char **out, bool *is_null);

/* Value parsers shared by the store and the typed view. */
bool ca_config_parse_bool(const char *s, bool *out);
bool ca_config_parse_int(const char *s, int64_t *out);
bool ca_config_parse_double(const char *s, double *out);
/* True for YAML's plain nulls: "null", "Null", "NULL", "~", "". */
bool ca_config_is_null_text(const char *s);

/* A string -> index map (open addressing) that keeps loading linear: the
 * keys outside the schema, the anchors of a file. Keys are not copied: they
 * must outlive the map. */
typedef struct ca_strmap {
    const char **keys;
    size_t *vals;
    size_t cap, n;
} ca_strmap;
/* Adds or replaces; CA_ERR_NOMEM when it cannot grow. */
ca_status ca_strmap_put(ca_strmap *m, const char *key, size_t val);
bool ca_strmap_get(const ca_strmap *m, const char *key, size_t *val);
void ca_strmap_free(ca_strmap *m);

/* ------------------------------------------------------------------ store */

/* ca_config_set without the warning for a kept unknown key (the caller
 * already reported it). */
ca_status ca_config_set_quiet(ca_config *c, const char *key, const char *value,
                              ca_config_source source, const char *origin);
/* What ca_config_set would answer for `key` = `value`, without setting it. */
ca_status ca_config_check(const ca_config *c, const char *key, const char *value, const char *origin);

/* True when unknown top-level keys are warnings (allow_unknown_keys). */
bool ca_config_unknown_allowed(const ca_config *c);

/* Remembers the path of the loaded file. */
ca_status ca_config_set_file(ca_config *c, const char *path);

/* Rebuilds the iteration order after a change. */
ca_status ca_config_reorder(ca_config *c);

/* Between begin and end, setting a key does not rebuild the sections' text
 * and the iteration order (done once at the end), so that a file with n keys
 * loads in time linear in n. */
void ca_config_batch_begin(ca_config *c);
ca_status ca_config_batch_end(ca_config *c);

/* False when distributed_type `dist` belongs to the other compute
 * environment (SageMaker's DATA_PARALLEL in a LOCAL_MACHINE file). */
bool ca_config_dist_allowed(const char *compute_env, const char *dist);

/* CA_ERR_UNSUPPORTED naming each parallelism_config size above 1 that caccel
 * does not implement yet (context, sequence parallelism), with its key, value
 * and origin; CA_OK otherwise. Tensor parallelism is the device mesh's
 * (ca_config_mesh, accelerator/mesh.c). */
ca_status ca_config_check_parallelism(const ca_config *c);

/* The FSDP1 sharding strategy fsdp_config asks for (FULL_SHARD, SHARD_GRAD_OP,
 * NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2, or Accelerate's index 1-5 as
 * written), and in *key the key that says so: under fsdp_version 2,
 * fsdp_reshard_after_forward when set (a boolean as Accelerate's str_to_bool
 * reads it: true FULL_SHARD, false SHARD_GRAD_OP; or a strategy), otherwise
 * fsdp_sharding_strategy. Inline and on public calls only, so that the caccel
 * command (env, config update --to-fsdp2) states what the accelerator runs. */
static inline const char *ca_config_fsdp_strategy(const ca_config *c, const char **key) {
    static const char *const yes[] = {"true", "yes", "on", "y", "t", "1", NULL};
    static const char *const no[] = {"false", "no", "off", "n", "f", "0", NULL};
    int64_t version = 1;
    if (ca_config_get_int(c, "fsdp_config.fsdp_version", &version) != CA_OK) ca_clear_error();
    const char *raf = ca_config_get(c, "fsdp_config.fsdp_reshard_after_forward");
    *key = "fsdp_config.fsdp_sharding_strategy";
    if (version != 2 || !raf || strcmp(raf, "null") == 0) return ca_config_get(c, *key);
    *key = "fsdp_config.fsdp_reshard_after_forward";
    for (int i = 0; yes[i]; i++) {
        if (strcasecmp(raf, yes[i]) == 0) return "FULL_SHARD";
        if (strcasecmp(raf, no[i]) == 0) return "SHARD_GRAD_OP";
    }
    return raf;
}

/* caccel's default file ($XDG_CONFIG_HOME/caccel/default_config.yaml) and
 * Accelerate's ($HF_HOME/accelerate/default_config.yaml); "" when HOME and
 * the variables are all unset. */
void ca_config_default_paths(char *caccel_path, size_t n1, char *hf_path, size_t n2);

/* ------------------------------------------------------------------ file */

/* Limits of a config file (Accelerate's files are a few hundred bytes; its size is bounded by
 * CA_FILE_MAX_CONFIG, base/file_impl.h); beyond them the file is refused naming the file, the line
 * and the limit. */
#define CA_CONFIG_MAX_DEPTH 32            /* nested mappings and lists */
#define CA_CONFIG_MAX_ALIAS_VALUES 10000  /* values copied by aliases, in all */

/* Parses a YAML/JSON file into the config at CA_SRC_FILE. */
ca_status ca_config_file_load(ca_config *c, const char *path);

#endif
