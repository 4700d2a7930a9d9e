/* Keys that are accepted but have no effect: one warning each, naming the key, its origin and why. */
#include "config/config_impl.h"
#include "base/base_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* When a key caccel only reports deserves a warning. */
typedef enum effect_rule {
    WARN_IF_SET,      /* any value asks for something (a plugin's section) */
    WARN_IF_CHANGED,  /* only a value other than the default asks for something */
    NEVER_WARN,       /* describes the setup; nothing to act on */
    REFUSED           /* a value other than the default is refused by a run (ca_config_check_parallelism) */
} effect_rule;

typedef struct effect {
    const char *prefix;   /* a key, or a section with its dot */
    effect_rule rule;
    const char *why;      /* NULL: why_plugin() decides from distributed_type */
    const char *plugin;   /* distributed_type the section belongs to */
} effect;

/* Every key the schema accepts without acting on it (CA_KF_SUPPORTED unset),
 * first match wins. A key missing here warns with a generic reason. */
static const effect effects[] = {
    {"deepspeed_config.", WARN_IF_SET, NULL, "DEEPSPEED"},
    {"fsdp_config.", WARN_IF_SET, NULL, "FSDP"},
    {"megatron_lm_config.", WARN_IF_SET, NULL, "MEGATRON_LM"},
    {"tp_config.", WARN_IF_SET, "tensor parallelism is not implemented; training is plain data parallel", NULL},
    /* HSDP's groups (accelerator/zero_config.c); a size of 1 asks for nothing */
    {"parallelism_config.parallelism_config_dp_", WARN_IF_CHANGED, NULL, "FSDP"},
    /* the device mesh (accelerator/mesh.c) acts on them, and with it above 1 on the dp_ sizes */
    {"parallelism_config.parallelism_config_tp_size", NEVER_WARN, NULL, NULL},
    {"parallelism_config.parallelism_config_cp_size", NEVER_WARN, NULL, NULL},
    {"parallelism_config.parallelism_config_sp_size", REFUSED, "sequence parallelism", NULL},
    {"parallelism_config.", WARN_IF_CHANGED,
     "it tunes sequence parallelism (parallelism_config_sp_size above 1) or a context-parallel option caccel does "
     "not read (context parallelism runs the allgather form)", NULL},
    {"fp8_config.", WARN_IF_SET, "fp8 training is not supported by this build (mixed_precision fp8 is refused)",
     NULL},
    {"dynamo_config.", WARN_IF_CHANGED, "torch.compile has no counterpart in caccel; nothing is compiled", NULL},
    {"ipex_config.", WARN_IF_CHANGED, "Intel Extension for PyTorch and XPUs are not supported", NULL},
    {"mpirun_config.mpirun_ccl", WARN_IF_CHANGED, "caccel does not use oneCCL", NULL},
    {"compute_environment", WARN_IF_CHANGED,
     "caccel does not start SageMaker jobs; the program runs where it is started", NULL},
    {"rdzv_backend", WARN_IF_CHANGED,
     "caccel launch uses its own rendezvous at main_process_ip:main_process_port", NULL},
    {"same_network", NEVER_WARN, NULL, NULL},
    {"non_blocking", WARN_IF_CHANGED,
     "the loader copies each batch from a page-locked staging buffer synchronously; there is no separate "
     "asynchronous copy to enable", NULL},
    {"main_training_function", WARN_IF_CHANGED, "it names a Python function for TPU launches", NULL},
    {"downcast_bf16", WARN_IF_CHANGED,
     "it differs from mixed_precision bf16 alone only for float64 tensors, which caccel has not: on xla, bf16 "
     "stores every f32 value as bf16 either way (backends/xla_stub/README.md)", NULL},
    {"tpu_", WARN_IF_CHANGED, "TPU pod setup (accelerate tpu-config) is not part of caccel", NULL},
    {"command", WARN_IF_CHANGED, "TPU pod setup (accelerate tpu-config) is not part of caccel", NULL},
    {"commands", WARN_IF_CHANGED, "TPU pod setup (accelerate tpu-config) is not part of caccel", NULL},
    {"command_file", WARN_IF_CHANGED, "TPU pod setup (accelerate tpu-config) is not part of caccel", NULL},
};

/* Keys the sharded data parallelism acts on (accelerator/zero_config.c) under their own distributed_type. */
static const char *const sharding_keys[] = {
    "deepspeed_config.deepspeed_config_file", "deepspeed_config.zero_stage", "deepspeed_config.offload_optimizer_device",
    "deepspeed_config.offload_param_device", "deepspeed_config.gradient_accumulation_steps",
    "deepspeed_config.gradient_clipping", "fsdp_config.fsdp_version", "fsdp_config.fsdp_offload_params",
    "fsdp_config.fsdp_sharding_strategy", "fsdp_config.fsdp_reshard_after_forward", "fsdp_config.fsdp_state_dict_type",
    "fsdp_config.fsdp_use_orig_params", "fsdp_config.fsdp_activation_checkpointing",
    "fsdp_config.fsdp_auto_wrap_policy", "fsdp_config.fsdp_transformer_layer_cls_to_wrap",
    "fsdp_config.fsdp_min_num_params", "fsdp_config.fsdp_forward_prefetch", "fsdp_config.fsdp_backward_prefetch",
    "fsdp_config.fsdp_cpu_ram_efficient_loading",
    "deepspeed_config.zero3_init_flag",
    "parallelism_config.parallelism_config_dp_shard_size", "parallelism_config.parallelism_config_dp_replicate_size",
    NULL};

static bool acted_on(const char *key) {
    for (const char *const *k = sharding_keys; *k; k++)
        if (!strcmp(*k, key)) return true;
    return false;
}

static const effect *effect_of(const char *key) {
    for (size_t i = 0; i < sizeof effects / sizeof effects[0]; i++) {
        const char *p = effects[i].prefix;
        size_t n = strlen(p);
        bool section = p[n - 1] == '.' || p[n - 1] == '_';
        if (section ? strncmp(key, p, n) == 0 : strcmp(key, p) == 0) return &effects[i];
    }
    return NULL;
}

/* A value that asks for nothing: the default, or an empty list or section. */
static bool is_default(const ca_key_def *d, const char *value) {
    if (!value || strcmp(value, "null") == 0 || strcmp(value, "[]") == 0 || strcmp(value, "{}") == 0) return true;
    if (!d->def) return false;
    char *canon = NULL;
    bool null = false;
    if (ca_config_check_value(d, d->name, d->def, "default", &canon, &null) != CA_OK) {
        ca_clear_error();
        return false;
    }
    bool same = canon && strcmp(canon, value) == 0;
    free(canon);
    return same;
}

/* Why a plugin's key does nothing under the distributed_type in force. */
static void why_text(const ca_config *c, const effect *e, const char *key, char *buf, size_t size) {
    const char *dt = ca_config_get(c, "distributed_type");
    const char *dto = ca_config_origin(c, "distributed_type");
    if (e->why) {
        snprintf(buf, size, "%s", e->why);
    } else if (!e->plugin) {
        snprintf(buf, size, "caccel does not act on this key");
    } else if (strcmp(dt, e->plugin) == 0 && (!strcmp(dt, "FSDP") || !strcmp(dt, "DEEPSPEED"))) {
        snprintf(buf, size, "caccel's sharded data parallelism under distributed_type %s (%s) does not act on it: "
                 "stages 1 to 3 with wrap units and prefetch (docs/DISTRIBUTED.md)", dt, dto);
    } else if (strcmp(dt, e->plugin) == 0) {
        snprintf(buf, size, "distributed_type %s (%s) is not supported by this build, which runs NO, MULTI_CPU, "
                 "MULTI_GPU, FSDP and DEEPSPEED", dt, dto);
    } else if (strcmp(dt, "NO") == 0) {
        snprintf(buf, size, "no effect with distributed_type NO (%s)", dto);
    } else if (strcmp(e->plugin, "MEGATRON_LM") == 0) {
        snprintf(buf, size, "Megatron-LM parallelism is not implemented; with distributed_type %s (%s) training is "
                 "plain data parallel", dt, dto);
    } else {
        snprintf(buf, size, "%s acts only under distributed_type %s; with distributed_type %s (%s) training is plain "
                 "data parallel", strcmp(e->plugin, "FSDP") == 0 ? "sharded data parallelism (FSDP)" : "DeepSpeed (ZeRO)",
                 e->plugin, dt, dto);
    }
}

/* With tensor or context parallelism (tp_size or cp_size above 1) the device mesh lays the ranks out by the
 * data-parallel sizes too (accelerator/mesh.c), whatever the distributed_type. */
static bool mesh_acts_on(const ca_config *c, const char *key) {
    if (strncmp(key, "parallelism_config.parallelism_config_dp_", 41) != 0) return false;
    const char *tp = ca_config_get(c, "parallelism_config.parallelism_config_tp_size");
    const char *cp = ca_config_get(c, "parallelism_config.parallelism_config_cp_size");
    return (tp && atoll(tp) > 1) || (cp && atoll(cp) > 1);
}

ca_status ca_config_warn_ignored(const ca_config *c, int *nwarned) {
    if (nwarned) *nwarned = 0;
    if (!c) return ca_error(CA_ERR_INVALID, "ca_config_warn_ignored: config is NULL");
    char why[512];
    for (size_t i = 0; i < ca_config_nkeys; i++) {
        const ca_key_def *d = &ca_config_keys[i];
        if (d->flags & (CA_KF_SUPPORTED | CA_KF_LEGACY) || d->type == CA_KT_MAP) continue;
        if (ca_config_source_of(c, d->name) == CA_SRC_DEFAULT) continue;
        if (mesh_acts_on(c, d->name)) continue;
        const effect *e = effect_of(d->name);
        if (!e && !(d->flags & CA_KF_CLUSTER)) e = effect_of("compute_environment");   /* SageMaker's keys */
        const char *value = ca_config_get(c, d->name);
        if (e && e->rule == NEVER_WARN) continue;
        /* under its own distributed_type a section's default asks for what caccel does */
        bool own = e && e->plugin && !strcmp(e->plugin, ca_config_get(c, "distributed_type"));
        if (own && acted_on(d->name)) continue;
        bool asks = e && e->rule == WARN_IF_SET && !own ? !(value && strcmp(value, "null") == 0) : !is_default(d, value);
        if (!asks) continue;
        if (e && e->rule == REFUSED) {
            CA_LOG_W("%s: %s = %s is not supported yet: %s is not implemented; ca_accelerator_create refuses it",
                     ca_config_origin(c, d->name), d->name, value, e->why);
            if (nwarned) (*nwarned)++;
            continue;
        }
        why_text(c, e ? e : &(effect){d->name, WARN_IF_CHANGED, NULL, NULL}, d->name, why, sizeof why);
        CA_LOG_W("%s: %s = %s has no effect: %s", ca_config_origin(c, d->name), d->name, value, why);
        if (nwarned) (*nwarned)++;
    }
    return CA_OK;
}
