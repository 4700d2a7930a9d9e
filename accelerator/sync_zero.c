/* Sharded data parallelism (ZeRO stages 1 to 3, with or without offload) as a synchronisation
 * strategy: the slots of sync_impl.h over zero.c (layout, reduce-scatter, the shard's update),
 * zero3.c (stage 3's parameter shards), zero_offload.c and zero_state.c (sharded checkpoints). The
 * stage itself was read from the configuration by zero_config.c. */
#include "accelerator/sync_impl.h"

#include <string.h>

static bool zero_selected(const ca_accelerator *acc) { return acc->zero.stage > 0; }

/* fsdp_state_dict_type SHARDED_STATE_DICT (or LOCAL): each rank saves its shard, no full files. */
static bool zero_sharded_dict(const ca_accelerator *acc) {
    const char *v = ca_config_get(acc->cfg, "fsdp_config.fsdp_state_dict_type");
    return v && (!strcmp(v, "SHARDED_STATE_DICT") || !strcmp(v, "LOCAL_STATE_DICT") || !strcmp(v, "2") ||
                 !strcmp(v, "3"));
}

/* DeepSpeed's JSON may give the fp16 loss scaler its options. (Under tensor parallelism each tp rank's
 * shard files are of its own slices, zero_state.c.) */
static ca_status zero_configure(ca_accelerator *acc) {
    return acc->zero.scaler_set ? ca_grad_scaler_configure(acc, &acc->zero.scaler) : CA_OK;
}

static ca_status zero_before_backward(ca_accelerator *acc) {
    return acc->model ? ca_zero_before_backward(acc) : CA_OK;
}

static ca_status zero_after_backward(ca_accelerator *acc, bool sync, bool failed) {
    return !failed && acc->model && sync ? ca_zero_reduce(acc) : CA_OK;
}

/* Once reduced, the gradient of every optimizer is this rank's shard; its norm sums over the group. */
static ca_tensor *zero_shard_grads(const ca_accelerator *acc, ca_comm **group) {
    if (!acc->zero.reduced) return NULL;
    *group = acc->zero.world > 1 ? acc->zero.comm : NULL;
    return acc->zero.view;
}

static bool zero_saves_shards(const ca_accelerator *acc) { return acc->model && zero_sharded_dict(acc); }

/* The shard files a load reads: those the checked checkpoint was saved as (any number). */
static int zero_shard_count(const ca_accelerator *acc) { return ca_zero_load_shards(acc); }

/* Stage 3 keeps shards of the parameters between steps. */
static bool zero_params_sharded(const ca_accelerator *acc) {
    return acc->zero.stage == 3 && acc->model && !acc->zero.summoned;
}

static ca_status zero_summon(ca_accelerator *acc, bool on) {
    return acc->zero.stage == 3 && acc->model ? ca_zero3_summon(acc, on) : CA_OK;
}

/* The flat buffers (zero.c) and what a sharded load read for them (zero_state.c): freed here, above
 * both files, so that neither calls the other back. */
static void zero_free(ca_accelerator *acc) {
    ca_zero_load_free(acc);
    ca_zero_free(acc);
}

static void zero_forget_model(ca_accelerator *acc, int g, bool last) {
    (void)g;   /* one model per accelerator */
    if (!last) return;
    acc->zero.nparams = 0;   /* the parameters go with the model */
    zero_free(acc);
}

const ca_sync_strategy ca_sync_zero = {
    .name = "zero",
    .replicated = true,
    .key = "distributed_type",
    .own_reduction = "ZeRO/FSDP",
    .selected = zero_selected,
    .configure = zero_configure,
    .prepare_model = ca_zero_build,
    .prepare_optimizer = ca_zero_add_optimizer,
    .before_backward = zero_before_backward,
    .after_backward = zero_after_backward,
    .step = ca_zero_step,
    .shard_grads = zero_shard_grads,
    .shard_split_sumsq = ca_zero_split_sumsq,
    .gather_state = ca_zero_gather_state,
    .scatter_state = ca_zero_scatter_state,
    .drop_state = ca_zero_drop_state,
    .state_slice = ca_zero_state_slice,
    .state_lean = ca_zero_loads_state_lean,
    .read_state_slices = ca_zero_read_state_slices,
    .load_state_slices = ca_zero_load_state_slices,
    .saves_shards = zero_saves_shards,
    .shard_count = zero_shard_count,
    .save_shard = ca_zero_save_shard,
    .check_shard = ca_zero_check_shard,
    .load_shard = ca_zero_load_shard,
    .params_sharded = zero_params_sharded,
    .summon = zero_summon,
    .forget_model = zero_forget_model,
    .free = zero_free,
};
