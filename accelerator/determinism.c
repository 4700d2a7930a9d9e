/* Deterministic mode: gradients kept per virtual shard and summed in one fixed order, so the
 * parameters after training do not depend on the number of processes or threads
 * (docs/DETERMINISM.md). */
#include "accelerator/accelerator_impl.h"

#include <stdlib.h>
#include <string.h>

ca_status ca_det_configure(ca_accelerator *acc) {
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
ca_status ca_det_build(ca_accelerator *acc, ca_module *m) {
    ca_det *d = &acc->det;
    int n = ca_module_num_params(m);
    d->params = calloc((size_t)(n ? n : 1), sizeof *d->params);
    d->written = calloc((size_t)d->parts, sizeof *d->written);
    if (!d->params || !d->written) return ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int i = 0; i < n; i++) {
        ca_tensor *p = m->flat[i];
        if (p->dtype != CA_F32 || ca_tdev(p) != acc->device)
            return ca_error(CA_ERR_INVALID, "deterministic mode: parameters must be f32 on the training device (%s)",
                            m->flat_names[i]);
        d->numel += p->numel;
    }
    d->flat = persistent_zeros(acc->device, d->numel);
    d->local = d->flat ? persistent_zeros(acc->device, d->numel * d->parts) : NULL;
    d->all = d->local && acc->world > 1 ? persistent_zeros(acc->device, d->numel * d->shards) : d->local;
    if (!d->all) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_NOMEM, "out of device memory");
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        ca_tensor *p = m->flat[i];
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
ca_status ca_det_collect(ca_accelerator *acc, int part) {
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
ca_status ca_det_reduce(ca_accelerator *acc) {
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

void ca_det_free(ca_accelerator *acc) {
    ca_det *d = &acc->det;
    if (d->device_set) ca_device_set_deterministic(acc->device, false);
    if (d->all != d->local) ca_tensor_free(d->all);
    ca_tensor_free(d->local);
    ca_tensor_free(d->flat);
    free(d->params);
    free(d->written);
    memset(d, 0, sizeof *d);
}
