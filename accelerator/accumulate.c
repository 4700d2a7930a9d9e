/* Accumulation and synchronisation control (Accelerate's GradientState): gradient accumulation
 * (CA_ACCUMULATE), which micro-step synchronises, no_sync, trigger_sync_in_backward, the
 * sync_gradients setters, set_trigger / check_trigger. */
#include "accelerator/accelerator_impl.h"
#include "accelerator/sync_impl.h"

/* End of the dataloader being iterated: of the prepared loaders with a pass in
 * flight, the one that handed out the newest batch (as Accelerate tracks the
 * active loader), so an inner loader run inside an outer loop's step neither
 * hides nor fakes the outer loader's end. */
const ca_dataloader *ca_active_loader(const ca_accelerator *acc) {
    const ca_dataloader *active = NULL;
    uint64_t newest = 0;
    for (int i = 0; i < acc->nloaders; i++) {
        uint64_t seq = ca_dataloader_handed_seq(acc->loaders[i]);
        if (seq > newest) newest = seq, active = acc->loaders[i];
    }
    return active;
}

static bool loader_at_end(const ca_accelerator *acc) {
    const ca_dataloader *active = ca_active_loader(acc);
    return active && ca_dataloader_handed_last(active);
}

/* The strategy's word on the batch (deterministic mode: false on every virtual shard of a batch but
 * its last, which alone synchronises and steps). */
static bool batch_done(const ca_accelerator *acc) {
    return !acc->sync_ops || !acc->sync_ops->batch_done || acc->sync_ops->batch_done(acc);
}

int ca_accumulate_begin(ca_accelerator *acc, ca_module *model) {
    (void)model;   /* one accumulation state per accelerator covers every prepared model */
    acc->in_accumulate = true;
    if (!batch_done(acc)) {   /* a virtual shard before the batch's last: accumulate only */
        acc->sync = false;
        return 1;
    }
    int64_t k = acc->st.gradient_accumulation_steps > 0 ? acc->st.gradient_accumulation_steps : 1;
    acc->micro_step++;
    acc->sync = acc->micro_step % k == 0 || loader_at_end(acc);
    if (acc->sync) acc->micro_step = 0;
    return 1;
}

void ca_accumulate_end(ca_accelerator *acc) { acc->in_accumulate = false; }

bool ca_sync_gradients(const ca_accelerator *acc) {
    return batch_done(acc) && (acc->in_accumulate ? acc->sync : acc->sync_set != CA_NO);
}


bool ca_backward_syncs(const ca_accelerator *acc) {
    if (acc->force_sync_depth > 0) return true;
    return acc->no_sync_depth == 0 && ca_sync_gradients(acc);
}

int ca_no_sync_begin(ca_accelerator *acc, ca_module *model) {
    (void)model;   /* one set of buckets per accelerator covers every prepared model */
    acc->no_sync_depth++;
    return 1;
}

void ca_no_sync_end(ca_accelerator *acc) {
    if (acc->no_sync_depth > 0) acc->no_sync_depth--;
}

int ca_trigger_sync_begin(ca_accelerator *acc, ca_module *model) {
    (void)model;
    acc->force_sync_depth++;
    return 1;
}

void ca_trigger_sync_end(ca_accelerator *acc) {
    if (acc->force_sync_depth > 0) acc->force_sync_depth--;
}

ca_status ca_set_sync_gradients(ca_accelerator *acc, bool sync) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_set_sync_gradients: accelerator is NULL");
    if (acc->in_accumulate) acc->sync = sync;
    else acc->sync_set = sync ? CA_UNSET : CA_NO;
    return CA_OK;
}

ca_status ca_set_gradient_accumulation_steps(ca_accelerator *acc, int k) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_set_gradient_accumulation_steps: accelerator is NULL");
    if (k < 1) return ca_error(CA_ERR_INVALID, "gradient_accumulation_steps must be >= 1 (got %d)", k);
    acc->st.gradient_accumulation_steps = k;
    return CA_OK;
}

int ca_gradient_accumulation_steps(const ca_accelerator *acc) {
    return acc->st.gradient_accumulation_steps > 0 ? acc->st.gradient_accumulation_steps : 1;
}

ca_status ca_set_trigger(ca_accelerator *acc) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_set_trigger: accelerator is NULL");
    acc->trigger = true;
    return CA_OK;
}

/* As Accelerate: the flags are summed over ranks; raised anywhere, every rank sees it and lowers it. */
ca_status ca_check_trigger(ca_accelerator *acc, bool *raised) {
    if (!acc || !raised) return ca_error(CA_ERR_INVALID, "ca_check_trigger: NULL argument");
    int64_t flag = acc->trigger ? 1 : 0, one = 1;
    ca_tensor *t = ca_from_host(acc->device, CA_I64, 1, &one, &flag);
    ca_status s = t ? ca_reduce(acc, t, CA_OP_SUM) : ca_last_status();
    if (s == CA_OK) s = ca_tensor_to_host(t, &flag, sizeof flag);
    if (s != CA_OK) return ca_error_context("check_trigger on rank %d", acc->rank);
    *raised = flag >= 1;
    if (*raised) acc->trigger = false;
    return CA_OK;
}
