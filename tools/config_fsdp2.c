/* `caccel config update --to-fsdp2`: an FSDP1 fsdp_config section in FSDP2's keys (`accelerate to-fsdp2`),
 * every other key kept, refused where FSDP2 would run something else than the file runs now. */
#include "tools/cli_impl.h"
#include "config/config_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What becomes of each FSDP1 key: Accelerate's commands/to_fsdp2.py (ARGUMENT_KEY_MAPPING). A key of the
 * section not listed here is carried over as it is. */
typedef enum fsdp2_rule {
    KEEP,          /* the same key and value in FSDP2 */
    RESHARD,       /* a strategy: becomes fsdp_reshard_after_forward true / false */
    STATE_DICT,    /* the same key; FSDP2 has no LOCAL_STATE_DICT, and its default is SHARDED */
    REMOVED,       /* FSDP2 has no such setting */
    NOT_YET        /* not yet in FSDP2 (Accelerate refuses it there) */
} fsdp2_rule;

static const struct {
    const char *key;   /* under fsdp_config. */
    fsdp2_rule rule;
    const char *why;   /* REMOVED, NOT_YET: what the line printed says */
} fsdp2_keys[] = {
    {"fsdp_version", KEEP, NULL},
    {"fsdp_reshard_after_forward", RESHARD, NULL},
    {"fsdp_sharding_strategy", RESHARD, NULL},
    {"fsdp_auto_wrap_policy", KEEP, NULL},
    {"fsdp_transformer_layer_cls_to_wrap", KEEP, NULL},
    {"fsdp_min_num_params", KEEP, NULL},
    {"fsdp_offload_params", KEEP, NULL},
    {"fsdp_cpu_ram_efficient_loading", KEEP, NULL},
    {"fsdp_activation_checkpointing", KEEP, NULL},
    {"fsdp_state_dict_type", STATE_DICT, NULL},
    {"fsdp_backward_prefetch", REMOVED,
     "FSDP2 prefetches by itself; caccel's stage 3 then gathers each unit as it runs: the same values, less "
     "overlap"},
    {"fsdp_forward_prefetch", NOT_YET, "not yet implemented in FSDP2"},
    {"fsdp_use_orig_params", REMOVED, "FSDP2 always uses the original parameters, as caccel does"},
    {"fsdp_sync_module_states", REMOVED, "not needed in FSDP2; caccel broadcasts rank 0's parameters at prepare"},
};

/* FSDP1's strategies (by name or Accelerate's 1-based index) as FSDP2's resharding after forward
 * (ARGUMENT_VALUE_MAPPING); NO_SHARD and the hybrid ones are judged apart (check_strategy). */
static const struct { const char *name, *index, *reshard; } strategies[] = {
    {"FULL_SHARD", "1", "true"},   {"SHARD_GRAD_OP", "2", "false"},      {"NO_SHARD", "3", "false"},
    {"HYBRID_SHARD", "4", "true"}, {"HYBRID_SHARD_ZERO2", "5", "false"},
};

static int strategy_of(const char *v) {
    for (int i = 0; v && i < (int)(sizeof strategies / sizeof strategies[0]); i++)
        if (strcasecmp(v, strategies[i].name) == 0 || strcmp(v, strategies[i].index) == 0) return i;
    return -1;
}

/* An fsdp_reshard_after_forward as FSDP2 reads it: a strategy's resharding, or a boolean as Accelerate's
 * str_to_bool reads it; NULL for anything else. */
static const char *as_reshard(const char *v) {
    static const char *const yes[] = {"true", "yes", "on", "y", "t", NULL};
    static const char *const no[] = {"false", "no", "off", "n", "f", NULL};
    int s = strategy_of(v);
    if (s >= 0) return strategies[s].reshard;
    for (int i = 0; v && yes[i]; i++) {
        if (strcasecmp(v, yes[i]) == 0) return "true";
        if (strcasecmp(v, no[i]) == 0) return "false";
    }
    return NULL;
}

static const char *origin(const ca_config *c, const char *key) {
    return ca_config_source_of(c, key) == CA_SRC_DEFAULT ? "not set: the default" : ca_config_origin(c, key);
}

static int refuse(const char *path, const char *why, const char *hint) {
    fprintf(stderr, "caccel config update: error: %s: cannot convert fsdp_config to FSDP2: %s\n  hint: %s\n", path, why,
            hint);
    return 1;
}

/* The strategy FSDP1 runs (fsdp_sharding_strategy, ca_config_fsdp_strategy) as true / false, or a refusal
 * where FSDP2's resharding would run something else: NO_SHARD (FSDP2 always shards), a hybrid strategy
 * over several machines without parallelism_config's sizes (FSDP2's HSDP is those sizes), an
 * fsdp_reshard_after_forward that names another strategy than the one FSDP1 runs. */
static int check_strategy(const ca_config *c, const char *path, const char **reshard) {
    const char *key;
    const char *v = ca_config_fsdp_strategy(c, &key);
    int s = strategy_of(v);
    char why[1024], hint[512];
    if (s < 0) return refuse(path, "the sharding strategy is not one FSDP1 knows", "fix fsdp_sharding_strategy");
    *reshard = strategies[s].reshard;
    const char *raf = ca_config_get(c, "fsdp_config.fsdp_reshard_after_forward");
    const char *raf_reshard = as_reshard(raf);
    if (ca_config_source_of(c, "fsdp_config.fsdp_reshard_after_forward") == CA_SRC_FILE &&
        (!raf_reshard || strcmp(raf_reshard, *reshard) != 0)) {
        snprintf(why, sizeof why, "fsdp_config.fsdp_reshard_after_forward = %s (%s) and %s = %s (%s) disagree; FSDP1 "
                 "runs %s, FSDP2 would reshard as fsdp_reshard_after_forward says", raf,
                 origin(c, "fsdp_config.fsdp_reshard_after_forward"), key, v, origin(c, key), strategies[s].name);
        return refuse(path, why, "set fsdp_sharding_strategy to the strategy you mean (or remove "
                                 "fsdp_reshard_after_forward), then convert");
    }
    if (s == 2) {
        snprintf(why, sizeof why, "%s = %s (%s): FSDP2 always shards (Accelerate's to-fsdp2 writes false, which "
                 "shards the gradients and optimizer state: SHARD_GRAD_OP)", key, v, origin(c, key));
        return refuse(path, why, "for plain data parallelism use distributed_type MULTI_GPU or MULTI_CPU; to shard, "
                                 "set fsdp_sharding_strategy SHARD_GRAD_OP or FULL_SHARD first");
    }
    int64_t machines = 1, rep = 1, shard = 1, np = -1;
    ca_config_get_int(c, "num_machines", &machines);
    ca_config_get_int(c, "num_processes", &np);
    ca_config_get_int(c, "parallelism_config.parallelism_config_dp_replicate_size", &rep);
    ca_config_get_int(c, "parallelism_config.parallelism_config_dp_shard_size", &shard);
    ca_clear_error();
    bool hybrid = s >= 3;
    /* one group over the whole job is plain sharding; sizes given say the groups in FSDP2 too */
    if (hybrid && rep <= 1 && (machines > 1 || shard > 1)) {
        snprintf(why, sizeof why, "%s = %s (%s) shards within each %s and replicates across them; FSDP2 says that "
                 "with parallelism_config's sizes", key, v, origin(c, key), shard > 1 ? "group of dp_shard_size" :
                 "machine");
        if (np > 0 && machines > 1)
            snprintf(hint, sizeof hint, "add parallelism_config: {parallelism_config_dp_replicate_size: %lld, "
                     "parallelism_config_dp_shard_size: %lld} (Accelerate's HSDP), then convert",
                     (long long)(shard > 1 ? np / shard : machines), (long long)(shard > 1 ? shard : np / machines));
        else
            snprintf(hint, sizeof hint, "add parallelism_config_dp_replicate_size and parallelism_config_dp_shard_size "
                     "(their product the number of processes) to parallelism_config, then convert");
        return refuse(path, why, hint);
    }
    return 0;
}

/* FSDP2 has no LOCAL_STATE_DICT (caccel saves it as a sharded one), names the types by name, and defaults
 * to SHARDED_STATE_DICT where FSDP1 defaults to FULL_STATE_DICT: the type FSDP1 ran is written out. */
static const char *state_dict_fsdp2(const char *v) {
    if (!v || strcmp(v, "null") == 0 || strcmp(v, "1") == 0 || strcasecmp(v, "FULL_STATE_DICT") == 0)
        return "FULL_STATE_DICT";
    return "SHARDED_STATE_DICT";   /* SHARDED_STATE_DICT, LOCAL_STATE_DICT, 2, 3 */
}

static fsdp2_rule rule_of(const char *sub, const char **why) {
    for (size_t i = 0; i < sizeof fsdp2_keys / sizeof fsdp2_keys[0]; i++)
        if (strcmp(fsdp2_keys[i].key, sub) == 0) {
            *why = fsdp2_keys[i].why;
            return fsdp2_keys[i].rule;
        }
    *why = NULL;
    return KEEP;
}

/* Rewrites the document's fsdp_config keys by the table; prints each change. */
static void convert(ca_cli_doc *d, const char *reshard, const char *state_dict) {
    size_t i = 0;
    while (i < d->n) {
        const char *key = d->items[i].key, *why;
        if (strncmp(key, "fsdp_config.", 12) != 0) {
            i++;
            continue;
        }
        fsdp2_rule r = rule_of(key + 12, &why);
        if (r != REMOVED && r != NOT_YET && r != RESHARD) {
            i++;
            continue;
        }
        if (r == RESHARD)
            printf("  converted %s: %s to fsdp_config.fsdp_reshard_after_forward: %s\n", key, d->items[i].value,
                   reshard);
        else
            printf("  removed %s: %s (%s)\n", key, d->items[i].value, why);
        ca_cli_doc_drop(d, key);   /* the last item takes its place: look at i again */
    }
    ca_cli_doc_put(d, "fsdp_config.fsdp_reshard_after_forward", reshard, true);
    const ca_cli_doc_item *sd = ca_cli_doc_find(d, "fsdp_config.fsdp_state_dict_type");
    if (!sd)
        printf("  set fsdp_config.fsdp_state_dict_type: %s (what FSDP1 saves when it is not set; FSDP2's default "
               "is SHARDED_STATE_DICT)\n", state_dict);
    else if (strcmp(sd->value, state_dict) != 0)
        printf("  converted fsdp_config.fsdp_state_dict_type: %s to %s (FSDP2 takes FULL_STATE_DICT or "
               "SHARDED_STATE_DICT by name; caccel saves LOCAL_STATE_DICT as a sharded one)\n", sd->value, state_dict);
    ca_cli_doc_put(d, "fsdp_config.fsdp_state_dict_type", state_dict, false);
    ca_cli_doc_put(d, "fsdp_config.fsdp_version", "2", true);
    printf("  set fsdp_config.fsdp_version: 2\n");
}

int ca_cli_to_fsdp2(ca_cli_doc *d, const ca_config *c, const char *path) {
    bool any = false;
    for (size_t i = 0; i < d->n && !any; i++) any = strncmp(d->items[i].key, "fsdp_config.", 12) == 0;
    if (!any) {
        printf("  no fsdp_config in %s: nothing to convert to FSDP2\n", path);
        return 0;
    }
    int64_t version = 1;
    ca_config_get_int(c, "fsdp_config.fsdp_version", &version);
    ca_clear_error();
    if (version == 2) {
        printf("  fsdp_config is FSDP2 already (fsdp_version: 2, %s): nothing to convert\n",
               ca_config_origin(c, "fsdp_config.fsdp_version"));
        return 0;
    }
    const char *reshard = NULL;
    if (check_strategy(c, path, &reshard) != 0) return 1;
    convert(d, reshard, state_dict_fsdp2(ca_config_get(c, "fsdp_config.fsdp_state_dict_type")));
    return 0;
}
