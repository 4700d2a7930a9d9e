/* `caccel config update`: rewrites an existing file in the current format (`accelerate config update`):
 * old keys renamed by the loader's migration rules, missing keys filled with their defaults, values kept. */
#include "tools/cli_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void update_usage(FILE *f) {
    fprintf(f, "usage: caccel config update [--config_file FILE] [--to-fsdp2]\n\n"
               "Loads FILE (default: $XDG_CONFIG_HOME/caccel/default_config.yaml, else Accelerate's\n"
               "$HF_HOME/accelerate/default_config.yaml) with the loader's checks, migrates the old keys\n"
               "and spellings (fp16: true -> mixed_precision: fp16, dynamo_backend ->\n"
               "dynamo_config.dynamo_backend, parallelism_config's tp_size -> parallelism_config_tp_size,\n"
               "...), fills the keys Accelerate always writes with their defaults, and rewrites the file\n"
               "in place (YAML, or JSON when FILE ends in .json), keeping every value it had. The new\n"
               "text replaces FILE only once it reads back with every key and value.\n\n"
               "--to-fsdp2 also converts an FSDP1 fsdp_config section to FSDP2's keys, as\n"
               "`accelerate to-fsdp2` does (fsdp_version: 2; fsdp_sharding_strategy becomes\n"
               "fsdp_reshard_after_forward; fsdp_backward_prefetch, fsdp_forward_prefetch,\n"
               "fsdp_use_orig_params and fsdp_sync_module_states are removed), keeping every other key.\n"
               "It refuses, changing nothing, where FSDP2 would run something else than the file\n"
               "runs now (NO_SHARD; a hybrid strategy over several machines without\n"
               "parallelism_config's sizes).\n");
}

static bool exists(const char *p) {
    struct stat st;
    return p[0] && stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool is_number(const char *v) {
    char *end;
    (void)strtod(v, &end);
    return *v && *end == '\0';
}

typedef struct update {
    ca_cli_doc doc;     /* what will be written */
    ca_config *fresh;   /* a configuration at its defaults: asked what each key takes */
} update;

/* What a key takes, asked of a fresh configuration (the schema is the library's). */
typedef enum key_kind { K_OUTSIDE, K_SECTION, K_TEXT, K_VALUE } key_kind;
static key_kind kind_of(ca_config *fresh, const char *key) {
    const char *def = ca_config_get(fresh, key);
    if (!def) return K_OUTSIDE;
    if (!strchr(key, '.') && strcmp(def, "{}") == 0) return K_SECTION;
    bool text = ca_config_set(fresh, key, "caccel-type-probe", CA_SRC_PROGRAM, "probe") == CA_OK;
    ca_clear_error();
    return text ? K_TEXT : K_VALUE;
}

/* A list as the loader stores it: [] or ["a", "b"] (null items: [null, "b"]). */
static bool is_list_text(const char *v) {
    size_t n = strlen(v);
    return strcmp(v, "[]") == 0 ||
           (n >= 4 && v[0] == '[' && v[n - 1] == ']' && (v[1] == '"' || strncmp(v, "[null", 5) == 0));
}

/* Numbers and lists are written plain where the key takes them, text quoted where a YAML reader would
 * take it for something else. true and false are always plain: fsdp_reshard_after_forward, a text key,
 * is a boolean in FSDP2. A key outside the schema keeps no trace of the file's quoting: its numbers and
 * lists are written plain, as Accelerate's files write them. */
static void put_value(update *u, const char *key, const char *value) {
    bool boolean = strcmp(value, "true") == 0 || strcmp(value, "false") == 0;
    key_kind k = kind_of(u->fresh, key);
    bool plain = boolean || (k == K_OUTSIDE ? is_number(value) || is_list_text(value)
                                            : k == K_TEXT ? is_list_text(value) : is_number(value));
    ca_cli_doc_put(&u->doc, key, value, plain);
}

/* The keys Accelerate writes in every file of each kind (BaseConfig,
 * ClusterConfig or SageMakerConfig fields with a default). */
static const char *const base_keys[] = {"compute_environment", "distributed_type", "mixed_precision", "use_cpu",
                                        "debug", "enable_cpu_affinity", NULL};
static const char *const cluster_keys[] = {"num_processes", "machine_rank", "num_machines", "rdzv_backend",
                                           "same_network", "main_training_function", "downcast_bf16",
                                           "tpu_use_cluster", "tpu_use_sudo", NULL};
static const char *const sagemaker_keys[] = {"region", "num_machines", "base_job_name", "pytorch_version",
                                             "transformers_version", "py_version", NULL};

/* Fills the keys the file lacks; prints each. */
static void fill(update *u, const ca_config *c, const char *const *keys) {
    for (int i = 0; keys[i]; i++) {
        if (ca_config_source_of(c, keys[i]) == CA_SRC_FILE) continue;
        const char *v = ca_config_get(c, keys[i]);
        /* Accelerate: a single-process file without num_processes runs one process */
        if (strcmp(keys[i], "num_processes") == 0 && strcmp(ca_config_get(c, "distributed_type"), "NO") == 0) v = "1";
        if (!v || strcmp(v, "null") == 0) continue;
        put_value(u, keys[i], v);
        printf("  added %s: %s (default)\n", keys[i], v);
    }
}

/* The loader names the old key in the origin: "file:3 (fp16: true)", "file:4 (dynamo_backend)", or
 * another spelling of the key, "file:9 (parallelism_config.tp_size)" (which a fresh configuration
 * knows; "(distributed_type: NO)", the reason for a value the loader implied, it does not). */
static bool old_name(update *u, const ca_config_entry *e, char *buf, size_t n) {
    const char *open = strrchr(e->origin, '(');
    size_t len = strlen(e->origin);
    if (!open || e->origin[len - 1] != ')') return false;
    snprintf(buf, n, "%.*s", (int)(e->origin + len - 1 - (open + 1)), open + 1);
    if (strcmp(buf, "fp16: true") == 0) snprintf(buf, n, "fp16");
    else if (strcmp(buf, "dynamo_backend") != 0 && (strcmp(buf, e->key) == 0 || !ca_config_get(u->fresh, buf)))
        return false;
    return true;
}

/* The file's own values, as the loader understood them (old keys migrated). */
static void collect(update *u, const ca_config *c) {
    for (int i = 0; i < ca_config_count(c); i++) {
        ca_config_entry e;
        if (ca_config_entry_at(c, i, &e) != CA_OK || e.source != CA_SRC_FILE) continue;
        /* sections come from their keys */
        if (strcmp(e.value, "null") == 0 || kind_of(u->fresh, e.key) == K_SECTION) continue;
        put_value(u, e.key, e.value);
        char old[512];
        if (old_name(u, &e, old, sizeof old)) printf("  migrated %s to %s: %s\n", old, e.key, e.value);
    }
    bool sm = strcmp(ca_config_get(c, "compute_environment"), "AMAZON_SAGEMAKER") == 0;
    fill(u, c, base_keys);
    fill(u, c, sm ? sagemaker_keys : cluster_keys);
    if (sm && ca_config_source_of(c, "gpu_ids") != CA_SRC_FILE) put_value(u, "gpu_ids", "all");
}

static int find_path(const char *arg, char *path, size_t n) {
    if (arg) {
        snprintf(path, n, "%s", arg);
        if (exists(path)) return 0;
        fprintf(stderr, "caccel config update: error: no configuration file at %s\n", path);
        return 1;
    }
    ca_cli_default_config_path(path, n);
    if (exists(path)) return 0;
    char hf[4096];
    ca_cli_accelerate_config_path(hf, sizeof hf);
    if (exists(hf)) {
        snprintf(path, n, "%s", hf);
        return 0;
    }
    fprintf(stderr, "caccel config update: error: no configuration file at %s%s%s\n"
                    "  hint: pass --config_file FILE, or write one with `caccel config`\n",
            path[0] ? path : "$XDG_CONFIG_HOME/caccel/default_config.yaml", hf[0] ? " nor at " : "", hf);
    return 1;
}

/* The new text replaces the file only once it reads back with every key and value (ca_cli_doc_save);
 * the file keeps its permissions. */
static int rewrite(const char *path, ca_cli_doc *d) {
    char header[128];
    snprintf(header, sizeof header, "Updated by `caccel config update` (caccel %s). Accelerate reads this file too.",
             CA_VERSION);
    struct stat st;
    unsigned mode = stat(path, &st) == 0 ? (unsigned)(st.st_mode & 07777) : 0644;
    if (ca_cli_doc_save(d, path, header, mode, true, "config update") != 0) return 1;
    printf("Successfully updated the configuration file at %s.\n", path);
    return 0;
}

int ca_cmd_config_update(int argc, char **argv) {
    const char *arg = NULL;
    bool fsdp2 = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            update_usage(stdout);
            return 0;
        }
        if (ca_cli_match_flag(argv[i], "to_fsdp2", &v) && !v) {
            fsdp2 = true;
            continue;
        }
        if (!ca_cli_match_flag(argv[i], "config_file", &v) || (!v && i + 1 >= argc)) {
            fprintf(stderr, "caccel config update: error: %s '%s'\n",
                    ca_cli_match_flag(argv[i], "config_file", &v) ? "a value is needed after" : "unknown argument",
                    argv[i]);
            update_usage(stderr);
            return 2;
        }
        arg = v ? v : argv[++i];
    }
    char path[4096];
    if (find_path(arg, path, sizeof path) != 0) return 1;
    ca_config *c = NULL;
    if (ca_config_create(&c) != CA_OK) return ca_cli_fail("config update");
    if (ca_config_load_file(c, path) != CA_OK) {
        ca_config_destroy(c);
        return ca_cli_fail("config update");
    }
    update u = {0};
    if (ca_config_create(&u.fresh) != CA_OK) {
        ca_config_destroy(c);
        return ca_cli_fail("config update");
    }
    collect(&u, c);
    int rc = fsdp2 ? ca_cli_to_fsdp2(&u.doc, c, path) : 0;
    ca_config_destroy(c);
    ca_config_destroy(u.fresh);
    if (rc == 0) rc = rewrite(path, &u.doc);
    ca_cli_doc_free(&u.doc);
    return rc;
}
