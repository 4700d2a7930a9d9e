/* The sharding stage from Accelerate's keys: distributed_type FSDP (fsdp_sharding_strategy, or FSDP2's
 * fsdp_reshard_after_forward) and DEEPSPEED (zero_stage, or DeepSpeed's JSON with its "auto" values
 * filled from the configuration, as Accelerate fills them). Fields caccel does not implement fail
 * together in one error naming each of them. */
#include "accelerator/accelerator_impl.h"
#include "core/json_impl.h"
#include "config/config_impl.h"
#include "accelerator/checkpoint_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static const char *cfg(const ca_accelerator *acc, const char *key) { return ca_config_get(acc->cfg, key); }
static bool is_set(const ca_accelerator *acc, const char *key) {
    return ca_config_source_of(acc->cfg, key) != CA_SRC_DEFAULT;
}

/* FSDP1 strategies by name or Accelerate's 1-based index. *hybrid: shard within a machine only. */
static int fsdp_stage(const char *v, bool *hybrid) {
    static const struct { const char *name, *index; int stage; bool hybrid; } map[] = {
        {"FULL_SHARD", "1", 3, false}, {"SHARD_GRAD_OP", "2", 2, false}, {"NO_SHARD", "3", 0, false},
        {"HYBRID_SHARD", "4", 3, true}, {"HYBRID_SHARD_ZERO2", "5", 2, true},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(v, map[i].name) || !strcmp(v, map[i].index)) {
            *hybrid = map[i].hybrid;
            return map[i].stage;
        }
    return -1;
}

#define DP_SHARD "parallelism_config.parallelism_config_dp_shard_size"
#define DP_REPLICATE "parallelism_config.parallelism_config_dp_replicate_size"

/* The processes the shards spread over: every process, or under tensor parallelism those of one tp
 * coordinate, world / tp (each shards its own slices); the cp ranks among them (dp_shard x cp, Accelerate's
 * "dp_shard_cp": they hold the same parameters). *cp: the mesh's cp size, which each shard group spans. */
static int dp_world(const ca_accelerator *acc, int *cp) {
    ca_mesh_shape m;
    *cp = 1;
    if (ca_config_mesh(acc->cfg, acc->world, &m) != CA_OK) {
        ca_clear_error();   /* a size that does not fit: the mesh refuses it, with every origin */
        return acc->world;
    }
    *cp = m.size[CA_MESH_CP];
    int tp = m.size[CA_MESH_TP];
    return tp > 1 && acc->world % tp == 0 ? acc->world / tp : acc->world;
}

/* HYBRID_SHARD (or parallelism_config's dp_replicate_size > 1, Accelerate's HSDP): shard within
 * groups of consecutive (data-parallel) ranks, replicate across them. The group is dp_shard_size where set (or the
 * world over dp_replicate_size), else the processes of a machine. Without either, dp_shard_size
 * (Accelerate's FSDP over dp_shard_size processes) must be every process. */
static ca_status hybrid_groups(ca_accelerator *acc, bool hybrid, const char *key, const char *v) {
    ca_zero *z = &acc->zero;
    int64_t shard = 1, rep = 1;
    int cp, world = dp_world(acc, &cp);
    ca_config_get_int(acc->cfg, DP_SHARD, &shard);
    ca_config_get_int(acc->cfg, DP_REPLICATE, &rep);
    if (!hybrid && rep <= 1) {
        if (shard > 1 && shard * cp != world)
            return ca_error(CA_ERR_CONFIG, "%s: %s = %lld: %d %sprocesses are not one shard group of %lld; with "
                            "parallelism_config_dp_replicate_size 1 the shard group is every process (Accelerate "
                            "requires dp_replicate_size x dp_shard_size = the number of processes)",
                            ca_config_origin(acc->cfg, DP_SHARD), DP_SHARD, (long long)shard, world,
                            world < acc->world ? "data-parallel " : "", (long long)shard);
        return CA_OK;
    }
    const char *how = "the processes of one machine (the launcher's local world size)";
    int64_t g = acc->local_world > 0 && world == acc->world ? acc->local_world : world;
    if (shard > 1) {
        g = shard * cp;   /* a group spans its cp ranks: they share a batch and hold one set of parameters */
        how = ca_config_origin(acc->cfg, DP_SHARD);
    } else if (rep > 1) {
        g = world / rep;
        how = ca_config_origin(acc->cfg, DP_REPLICATE);
    }
    if (g < 1 || world % g || (rep > 1 && g * rep != world))
        return ca_error(CA_ERR_CONFIG, "%s: %s = %s: %d %sprocesses do not split into shard groups of %lld (from %s)%s",
                        z->origin, key, v, world, world < acc->world ? "data-parallel " : "", (long long)g, how,
                        rep > 1 ? "; dp_shard_size x dp_replicate_size must be the number of processes" : "");
    z->group_size = g < world ? (int)g : 0;   /* one group: plain sharding */
    return CA_OK;
}

static ca_status configure_fsdp(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    const char *key;
    const char *v = ca_config_fsdp_strategy(acc->cfg, &key);   /* FSDP2 names the strategy by resharding */
    bool hybrid = false;
    z->asked = fsdp_stage(v, &hybrid);
    z->origin = ca_config_origin(acc->cfg, key);
    if (z->asked < 0)
        return ca_error(CA_ERR_CONFIG, "%s: %s = %s is not a sharding strategy (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
                        "HYBRID_SHARD, HYBRID_SHARD_ZERO2, or true/false for FSDP2)", z->origin, key, v);
    ca_status hs = hybrid_groups(acc, hybrid, key, v);
    if (hs != CA_OK) return hs;
    bool off = false;
    ca_config_get_bool(acc->cfg, "fsdp_config.fsdp_offload_params", &off);
    z->offload = off;
    bool fwd = false;
    ca_config_get_bool(acc->cfg, "fsdp_config.fsdp_forward_prefetch", &fwd);
    z->fwd_prefetch = fwd;
    const char *bp = cfg(acc, "fsdp_config.fsdp_backward_prefetch");   /* validated: one of three, or null */
    z->bwd_prefetch = !bp ? 0 : !strcasecmp(bp, "BACKWARD_PRE") ? 1 : !strcasecmp(bp, "BACKWARD_POST") ? 2 : 0;
    return CA_OK;
}

/* ------------------------------------------------------------------ DeepSpeed JSON */

typedef struct ds_ctx {
    ca_accelerator *acc;
    const char *file;
    char bad[1024];              /* fields caccel does not implement, comma-separated */
    int nbad;
} ds_ctx;

static void ds_bad(ds_ctx *c, const char *field, const char *why) {
    size_t n = strlen(c->bad);
    snprintf(c->bad + n, sizeof c->bad - n, "%s%s (%s)", c->nbad++ ? "; " : "", field, why);
}

static bool is_auto(json_object *v) {
    return json_object_is_type(v, json_type_string) && !strcmp(json_object_get_string(v), "auto");
}

static bool in_list(const char *k, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(k, *list)) return true;
    return false;
}

/* A section that must be an object: anything else is one of the fields reported, never walked. */
static bool ds_object(ds_ctx *c, const char *field, json_object *v) {
    if (json_object_is_type(v, json_type_object)) return true;
    ds_bad(c, field, "must be an object");
    return false;
}

static const char *offload_device(ds_ctx *c, const char *section, json_object *o) {
    const char *dev = "none";
    char f[128];
    snprintf(f, sizeof f, "zero_optimization.%s", section);
    if (!ds_object(c, f, o)) return dev;
    json_object_object_foreach(o, k, v) {
        snprintf(f, sizeof f, "zero_optimization.%s.%s", section, k);
        if (!strcmp(k, "device") && json_object_is_type(v, json_type_string)) dev = json_object_get_string(v);
        else if (!strcmp(k, "device")) ds_bad(c, f, "must be \"none\", \"cpu\" or \"nvme\"");
        else if (!in_list(k, (const char *const[]){"pin_memory", "buffer_count", "fast_init", "nvme_path", NULL}))
            ds_bad(c, f, "unknown field");
    }
    if (!strcmp(dev, "nvme")) ds_bad(c, section, "offload to NVMe is not implemented");
    return dev;
}

/* Communication tuning knobs: the result does not depend on them; caccel reduces once per step. */
static const char *const ds_zero_knobs[] = {
    "allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter", "reduce_bucket_size",
    "contiguous_gradients", "round_robin_gradients", "sub_group_size", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save", NULL};

static void ds_zero(ds_ctx *c, json_object *o) {
    ca_zero *z = &c->acc->zero;
    json_object_object_foreach(o, k, v) {
        char f[128];
        snprintf(f, sizeof f, "zero_optimization.%s", k);
        if (!strcmp(k, "stage")) {
            if (is_auto(v)) continue;
            int st = json_object_get_int(v);
            if (!json_object_is_type(v, json_type_int) || st < 0 || st > 3) ds_bad(c, f, "must be 0 to 3 or \"auto\"");
            else z->asked = st;
        } else if (!strcmp(k, "offload_optimizer") || !strcmp(k, "offload_param")) {
            if (strcmp(offload_device(c, k, v), "none") != 0) z->offload = true;
        } else if (!in_list(k, ds_zero_knobs)) {
            ds_bad(c, f, "not implemented");
        }
    }
}

/* A number fills the setting unless the configuration set it to something else; "auto" keeps it. */
/* A number field of the JSON, or "auto"; within [lo, hi], whole when `whole`, as the key it sets. */
static void ds_number(ds_ctx *c, const char *field, json_object *v, double *target, const char *key, double lo,
                      double hi, bool whole) {
    if (is_auto(v)) return;
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double)) {
        ds_bad(c, field, "must be a number or \"auto\"");
        return;
    }
    double x = json_object_get_double(v);
    if (!(x >= lo && x <= hi) || (whole && x != floor(x))) {
        char why[160];
        snprintf(why, sizeof why, "%g is not %s from %g to %g", x, whole ? "a whole number" : "a number", lo, hi);
        ds_bad(c, field, why);
        return;
    }
    if (key && is_set(c->acc, key) && *target != x) {
        char why[160];
        snprintf(why, sizeof why, "%g here, %g from %s: write \"auto\" or make them agree", x, *target,
                 ca_config_origin(c->acc->cfg, key));
        ds_bad(c, field, why);
        return;
    }
    *target = x;
}

static void ds_fp16(ds_ctx *c, json_object *o, bool bf16) {
    ca_accelerator *acc = c->acc;
    ca_zero *z = &acc->zero;
    if (!ds_object(c, bf16 ? "bf16" : "fp16", o)) return;
    json_object_object_foreach(o, k, v) {
        char f[128];
        snprintf(f, sizeof f, "%s.%s", bf16 ? "bf16" : "fp16", k);
        if (!strcmp(k, "enabled")) {
            if (is_auto(v) || !json_object_get_boolean(v)) continue;
            ca_mixed_precision want = bf16 ? CA_MP_BF16 : CA_MP_FP16;
            if (is_set(acc, "mixed_precision") && acc->st.mixed_precision != want && acc->st.mixed_precision != CA_MP_NO)
                ds_bad(c, f, "conflicts with mixed_precision from the configuration");
            acc->st.mixed_precision = want;
        } else if (bf16) {
            ds_bad(c, f, "unknown field");
        } else if (!strcmp(k, "initial_scale_power")) {
            if (!is_auto(v)) z->scaler.init_scale = ldexp(1.0, json_object_get_int(v)), z->scaler_set = true;
        } else if (!strcmp(k, "loss_scale_window")) {
            if (!is_auto(v)) z->scaler.growth_interval = json_object_get_int64(v), z->scaler_set = true;
        } else if (!strcmp(k, "loss_scale")) {
            if (!is_auto(v) && json_object_get_double(v) != 0) ds_bad(c, f, "a static loss scale is not implemented; use 0");
        } else if (!strcmp(k, "hysteresis") || !strcmp(k, "min_loss_scale") || !strcmp(k, "auto_cast")) {
            if (acc->rank <= 0)
                ca_log_printf(CA_LOG_WARNING, "%s: %s is not implemented: the loss scale halves at every overflow, "
                              "as torch.cuda.amp.GradScaler does", c->file, f);
        } else {
            ds_bad(c, f, "unknown field");
        }
    }
}

/* optimizer / scheduler: the program creates them (ca_adamw_create, ca_optimizer_set_schedule); the
 * JSON may only say "auto", which Accelerate fills from those objects. */
static void ds_program_object(ds_ctx *c, const char *section, json_object *o) {
    if (!ds_object(c, section, o)) return;
    json_object_object_foreach(o, k, v) {
        char f[128];
        snprintf(f, sizeof f, "%s.%s", section, k);
        if (!strcmp(k, "type")) continue;
        if (strcmp(k, "params") != 0 || !json_object_is_type(v, json_type_object)) {
            ds_bad(c, f, "unknown field");
            continue;
        }
        json_object_object_foreach(v, pk, pv) {
            snprintf(f, sizeof f, "%s.params.%s", section, pk);
            if (!is_auto(pv) && !json_object_is_type(pv, json_type_boolean))
                ds_bad(c, f, "caccel takes it from the program's optimizer and schedule: write \"auto\"");
        }
    }
}

static const char *const ds_noops[] = {"steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer",
                                       "train_batch_size", "train_micro_batch_size_per_gpu", NULL};

static void ds_top(ds_ctx *c, json_object *root) {
    ca_accelerator *acc = c->acc;
    json_object_object_foreach(root, k, v) {
        if (!strcmp(k, "zero_optimization")) {
            if (ds_object(c, k, v)) ds_zero(c, v);
        } else if (!strcmp(k, "fp16") || !strcmp(k, "bf16")) ds_fp16(c, v, !strcmp(k, "bf16"));
        else if (!strcmp(k, "optimizer") || !strcmp(k, "scheduler")) ds_program_object(c, k, v);
        else if (!strcmp(k, "gradient_accumulation_steps")) {
            double ga = acc->st.gradient_accumulation_steps;
            ds_number(c, k, v, &ga, "gradient_accumulation_steps", 1, 1e9, true);
            acc->st.gradient_accumulation_steps = (int)ga;
        } else if (!strcmp(k, "gradient_clipping")) {
            ds_number(c, k, v, &acc->st.gradient_clipping, "gradient_clipping", 0, 1e15, false);
        } else if (!in_list(k, ds_noops)) {
            ds_bad(c, k, "not implemented");
        }
    }
}

/* A relative path is tried from the working directory, then from the config file's directory. */
static void ds_resolve(const ca_accelerator *acc, const char *path, char *out, size_t size) {
    snprintf(out, size, "%s", path);
    const char *cf = ca_config_file(acc->cfg);
    if (path[0] == '/' || access(path, R_OK) == 0 || !cf) return;
    const char *slash = strrchr(cf, '/');
    if (slash) snprintf(out, size, "%.*s/%s", (int)(slash - cf), cf, path);
}

static ca_status configure_ds_json(ca_accelerator *acc, const char *path) {
    const char *key = "deepspeed_config.deepspeed_config_file";
    ds_resolve(acc, path, acc->zero.json, sizeof acc->zero.json);
    char why[256];
    ca_status rs;
    json_object *root = ca_json_load(acc->zero.json, CA_FILE_DEEPSPEED, why, sizeof why, &rs);
    if (!root && !why[0]) {   /* the reader's message names the file and what is wrong with it */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ca_last_error());
        return ca_error(CA_ERR_CONFIG, "%s: %s: %s", ca_config_origin(acc->cfg, key), key, msg);
    }
    if (root && !json_object_is_type(root, json_type_object))
        snprintf(why, sizeof why, "a JSON %s, not an object", json_type_to_name(json_object_get_type(root)));
    if (!root || !json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return ca_error(CA_ERR_CONFIG, "%s: %s = %s: cannot read it as a JSON object (%s)",
                        ca_config_origin(acc->cfg, key), key, acc->zero.json, why);
    }
    ds_ctx c = {.acc = acc, .file = acc->zero.json};
    ds_top(&c, root);
    json_object_put(root);
    if (c.nbad)
        return ca_error(CA_ERR_CONFIG, "%s (%s from %s): %d field(s) caccel does not implement: %s", acc->zero.json, key,
                        ca_config_origin(acc->cfg, key), c.nbad, c.bad);
    return CA_OK;
}

static ca_status configure_deepspeed(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    int64_t stage = 2;
    ca_config_get_int(acc->cfg, "deepspeed_config.zero_stage", &stage);
    z->asked = (int)stage;
    z->origin = ca_config_origin(acc->cfg, "deepspeed_config.zero_stage");
    const char *dev = cfg(acc, "deepspeed_config.offload_optimizer_device");
    const char *pdev = cfg(acc, "deepspeed_config.offload_param_device");
    if ((dev && !strcmp(dev, "nvme")) || (pdev && !strcmp(pdev, "nvme")))
        return ca_error(CA_ERR_UNSUPPORTED, "%s: offload to NVMe is not implemented (offload_optimizer_device / "
                        "offload_param_device: none or cpu)", ca_config_origin(acc->cfg, dev && !strcmp(dev, "nvme")
                        ? "deepspeed_config.offload_optimizer_device" : "deepspeed_config.offload_param_device"));
    z->offload = (dev && !strcmp(dev, "cpu")) || (pdev && !strcmp(pdev, "cpu"));
    if (ca_config_get_bool(acc->cfg, "deepspeed_config.zero3_init_flag", &z->init_empty) != CA_OK) {
        ca_clear_error();   /* null: DeepSpeed's zero.Init is off */
        z->init_empty = false;
    }
    /* deepspeed_config.gradient_accumulation_steps / .gradient_clipping: ca_config_settings applied them */
    const char *file = cfg(acc, "deepspeed_config.deepspeed_config_file");
    if (file && strcmp(file, "null") != 0) {
        z->origin = ca_config_origin(acc->cfg, "deepspeed_config.deepspeed_config_file");
        return configure_ds_json(acc, file);
    }
    return CA_OK;
}

ca_status ca_zero_configure(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    ca_status s = CA_OK;
    if (acc->st.distributed_type == CA_DIST_FSDP) s = configure_fsdp(acc);
    else if (acc->st.distributed_type == CA_DIST_DEEPSPEED) s = configure_deepspeed(acc);
    else return CA_OK;
    if (s != CA_OK) return s;
    z->stage = z->asked;
    if (z->stage != 3 && (z->fwd_prefetch || z->bwd_prefetch) && acc->rank <= 0)
        ca_log_printf(CA_LOG_WARNING, "%s: fsdp_forward_prefetch / fsdp_backward_prefetch have no effect at stage %d: "
                      "only stage 3 (FULL_SHARD) gathers parameters", z->origin, z->stage);
    if (z->stage && acc->st.deterministic)
        return ca_error(CA_ERR_UNSUPPORTED, "deterministic mode with sharded data parallelism (stage %d from %s) is "
                        "not implemented", z->asked, z->origin);
    if (acc->rank > 0 || !z->offload) return CA_OK;
    if (ca_zero_offload_wanted(acc))
        ca_log_printf(CA_LOG_INFO, "offload to the CPU (%s): the optimizer state of each rank's shard and its "
                      "update in host memory, the parameters and gradients on %s", z->origin,
                      ca_device_name(acc->device));
    else if (z->stage == 0)
        ca_log_printf(CA_LOG_WARNING, "offload to the CPU (%s) has no effect without sharding (stage 0)", z->origin);
    else
        ca_log_printf(CA_LOG_INFO, "offload to the CPU (%s): a no-op on the CPU backend, where parameters and "
                      "optimizer state already live in host memory", z->origin);
    return CA_OK;
}
