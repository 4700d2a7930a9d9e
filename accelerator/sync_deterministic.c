/* Deterministic mode: gradients kept per virtual shard and summed in one fixed order, so the
 * parameters after training do not depend on the number of processes or threads
 * (docs/DETERMINISM.md). */
#include "accelerator/sync_impl.h"

#include <stdlib.h>
#include <string.h>

/* Checks deterministic_shards against the world size and puts the device into deterministic mode. */
static ca_status det_configure(ca_accelerator *acc) {
    ca_det *d = &acc->det;
    int v = acc->st.deterministic_shards;
    if (v < 1 || v % acc->world != 0)
        return ca_error(CA_ERR_INVALID,
                        "deterministic mode: deterministic_shards %d (from %s) is not a multiple of the %d "
                        "processes; choose a multiple of every process count the results must agree for "
                        "(e.g. 4 for 1, 2 and 4 processes)",
                        v, ca_config_origin(acc->cfg, "deterministic_shards"), acc->world);
    d->shards = v;
    d->parts = v / acc->world;
    ca_device_set_deterministic(acc->device, true);
    d->device_set = true;
    if (acc->rank <= 0)
        ca_log_printf(CA_LOG_INFO, "deterministic mode: %d virtual shards per global batch, %d per process; "
                      "one BLAS thread", d->shards, d->parts);
    return CA_OK;
}

static ca_tensor *persistent_zeros(ca_device *dev, int64_t numel) {
    return ca_tensor_keep(ca_zeros(dev, CA_F32, 1, &numel));
}

/* Every parameter's .grad becomes a view into one flat buffer, so a shard's
 * gradient moves with one copy and the sum runs over flat rows. */
static ca_status det_build(ca_accelerator *acc, ca_module *m) {
    ca_det *d = &acc->det;
    int n = ca_module_num_params(m);
    d->params = calloc((size_t)(n ? n : 1), sizeof *d->params);
    d->written = calloc((size_t)d->parts, sizeof *d->written);
    if (!d->params || !d->written) return ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int i = 0; i < n; i++) {   /* the trainable parameters only: a frozen one has no gradient row */
        ca_tensor *p = m->flat[i];
        if (!p->requires_grad) continue;
        if (p->dtype != CA_F32 || ca_tdev(p) != acc->device)
            return ca_error(CA_ERR_INVALID, "deterministic mode: parameters must be f32 on the training device (%s); "
                            "a frozen one (requires_grad false) may be of any dtype", m->flat_names[i]);
        d->numel += p->numel;
    }
    d->flat = persistent_zeros(acc->device, d->numel);
    d->local = d->flat ? persistent_zeros(acc->device, d->numel * d->parts) : NULL;
    d->all = d->local && acc->world > 1 ? persistent_zeros(acc->device, d->numel * d->shards) : d->local;
    if (!d->all) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_NOMEM, "out of device memory");
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        ca_tensor *p = m->flat[i];
        if (!p->requires_grad) continue;
        int64_t st[CA_MAX_DIMS], s = 1;
        for (int k = p->ndim - 1; k >= 0; k--) { st[k] = s; s *= p->shape[k]; }
        ca_tensor *g = ca_tensor_view(d->flat, p->ndim, p->shape, st, off);
        if (!g) return ca_last_status();
        ca_tensor_free(p->grad);
        p->grad = ca_tensor_keep(g);
        p->grad_defined = false;
        d->params[d->nparams++] = p;
        off += p->numel;
    }
    return CA_OK;
}

static float *row(ca_tensor *t, int64_t numel, int r) { return (float *)ca_tptr(t) + (int64_t)r * numel; }

/* After the backward of micro-batch `part`: its gradient (zeros where no op
 * wrote one) is added to this rank's row for the shard, and .grad is free for
 * the next micro-batch. The first write of a row in an accumulation window
 * copies, so each row is the sum of its own micro-steps in time order. */
static ca_status det_collect(ca_accelerator *acc, int part) {
    ca_det *d = &acc->det;
    ca_device *dev = acc->device;
    for (int i = 0; i < d->nparams; i++) {
        ca_tensor *p = d->params[i];
        if (p->grad_defined) continue;
        ca_status s = CA_KCALL(dev, fill, .dt = CA_F32, .n = p->numel, .value = 0.0, .y = ca_tptr(p->grad));
        if (s != CA_OK) return s;
    }
    float *dst = row(d->local, d->numel, part);
    ca_status s = d->written[part]
                      ? CA_KCALL(dev, axpby, .dt = CA_F32, .n = d->numel, .alpha = 1.0f,
                                 .x = ca_tptr(d->flat), .beta = 1.0f, .y = dst)
                      : ca_device_copy(dev, dst, ca_tptr(d->flat), (size_t)d->numel * sizeof(float));
    d->written[part] = true;
    for (int i = 0; i < d->nparams; i++) d->params[i]->grad_defined = false;
    return s;
}

/* The synchronising step: every rank gathers all shard rows (all_gather puts
 * rank r's rows r * parts .. at their shard index) and sums them in shard order
 * 0 .. V-1, then scales by 1/V. No all-reduce, whose summation order depends on
 * the backend and the world size. */
static ca_status det_reduce(ca_accelerator *acc) {
    ca_det *d = &acc->det;
    ca_device *dev = acc->device;
    ca_status s = CA_OK;
    for (int r = 0; s == CA_OK && r < d->parts; r++)
        if (!d->written[r]) s = CA_KCALL(dev, fill, .dt = CA_F32, .n = d->numel, .value = 0.0,
                                         .y = row(d->local, d->numel, r));
    if (s == CA_OK && acc->world > 1)
        s = ca_comm_all_gather(acc->comm, ca_tptr(d->local), ca_tptr(d->all), (size_t)(d->numel * d->parts), CA_F32,
                               NULL);
    float *flat = ca_tptr(d->flat);
    if (s == CA_OK) s = ca_device_copy(dev, flat, row(d->all, d->numel, 0), (size_t)d->numel * sizeof(float));
    for (int v = 1; s == CA_OK && v < d->shards; v++)
        s = CA_KCALL(dev, axpby, .dt = CA_F32, .n = d->numel, .alpha = 1.0f, .x = row(d->all, d->numel, v),
                     .beta = 1.0f, .y = flat);
    if (s == CA_OK && d->shards > 1)
        s = CA_KCALL(dev, axpby, .dt = CA_F32, .n = d->numel, .alpha = (float)(1.0 / d->shards), .x = flat,
                     .beta = 0.0f, .y = flat);
    memset(d->written, 0, (size_t)d->parts * sizeof *d->written);
    for (int i = 0; i < d->nparams; i++) d->params[i]->grad_defined = true;
    return s == CA_OK ? CA_OK : ca_error_context("deterministic mode: summing the %d shard gradients", d->shards);
}

static void det_free(ca_accelerator *acc) {
    ca_det *d = &acc->det;
    if (d->device_set) ca_device_set_deterministic(acc->device, false);
    if (d->all != d->local) ca_tensor_free(d->all);
    ca_tensor_free(d->local);
    ca_tensor_free(d->flat);
    free(d->params);
    free(d->written);
    memset(d, 0, sizeof *d);
}

/* ------------------------------------------------------------------ the strategy */

static bool det_selected(const ca_accelerator *acc) { return acc->st.deterministic; }

/* The micro-batch (virtual shard of this rank) the active loader handed out. */
static void det_part(const ca_accelerator *acc, int *part, int *parts) {
    ca_dataloader_handed_part(ca_active_loader(acc), part, parts);
}

/* False on every micro-batch of a batch but its last. */
static bool det_batch_done(const ca_accelerator *acc) {
    int part, parts;
    det_part(acc, &part, &parts);
    return parts <= 1 || part == parts - 1;
}

/* A batch that is not a virtual shard: why. */
static ca_status det_refuse(const ca_accelerator *acc) {
    const ca_dataloader *dl = ca_active_loader(acc);
    if (dl && ca_dataloader_check_parts(dl, acc->det.parts) != CA_OK)
        return ca_error_context("ca_backward: this batch's dataloader cannot hand out virtual shards");
    return ca_error(CA_ERR_STATE, "deterministic mode: ca_backward needs a batch from a dataloader prepared by "
                    "this accelerator (it hands each process its %d virtual shards as micro-batches)",
                    acc->det.parts);
}

static ca_status det_before_backward(ca_accelerator *acc) {
    int part = 0, parts = 0;
    det_part(acc, &part, &parts);
    return acc->model && parts != acc->det.parts ? det_refuse(acc) : CA_OK;
}

/* The shard's gradient into its row; at the synchronising micro-batch, the fixed-order sum. */
static ca_status det_after_backward(ca_accelerator *acc, bool sync, bool failed) {
    if (failed || !acc->model) return CA_OK;
    int part = 0, parts = 0;
    det_part(acc, &part, &parts);
    ca_status s = det_collect(acc, part);
    if (s == CA_OK && sync) s = det_reduce(acc);
    return s;
}

/* A loader that cannot split (an evaluation loader, say) stays whole; ca_backward refuses its batches. */
static ca_status det_prepare_loader(ca_accelerator *acc, ca_dataloader *dl) {
    if (ca_dataloader_set_parts(dl, acc->det.parts) != CA_OK) ca_clear_error();
    return CA_OK;
}

static void det_release_loader(ca_accelerator *acc, ca_dataloader *dl) {
    (void)acc;
    ca_dataloader_set_parts(dl, 0);   /* whole batches again */
}

static void det_forget_model(ca_accelerator *acc, int g, bool last) {
    (void)g;
    (void)last;
    acc->det.nparams = 0;   /* the parameters go with the model */
}

const ca_sync_strategy ca_sync_deterministic = {
    .name = "deterministic",
    .key = "deterministic",
    .own_reduction = "deterministic mode",
    .selected = det_selected,
    .configure = det_configure,
    .prepare_model = det_build,
    .prepare_loader = det_prepare_loader,
    .release_loader = det_release_loader,
    .batch_done = det_batch_done,
    .before_backward = det_before_backward,
    .after_backward = det_after_backward,
    .forget_model = det_forget_model,
    .free = det_free,
};
