/* Accelerate's LocalSGD: gradients stay local for local_sgd_steps optimizer steps (the model's DDP
 * synchronisation held back as in no_sync), then every parameter is averaged over the processes. */
#include "accelerator/accelerator_impl.h"

#include <stdlib.h>

struct ca_local_sgd {
    ca_accelerator *acc;
    ca_module *model;
    int every;                   /* local_sgd_steps */
    int64_t steps;               /* ca_local_sgd_step calls */
    bool enabled;
};

/* Accelerate's list: plain data parallelism on CPUs and GPUs. */
static ca_status check_supported(const ca_accelerator *acc) {
    ca_distributed_type t = acc->st.distributed_type;
    if (t != CA_DIST_NO && t != CA_DIST_MULTI_CPU && t != CA_DIST_MULTI_GPU)
        return ca_error(CA_ERR_UNSUPPORTED, "LocalSGD supports plain data parallelism on CPUs and GPUs "
                        "(distributed_type NO, MULTI_CPU, MULTI_GPU), not distributed_type %s (from %s)",
                        acc->st.distributed_type_name, ca_config_origin(acc->cfg, "distributed_type"));
    if (acc->st.deterministic)
        return ca_error(CA_ERR_UNSUPPORTED, "LocalSGD with deterministic (from %s): deterministic mode reduces "
                        "every step's gradients itself", ca_config_origin(acc->cfg, "deterministic"));
    return CA_OK;
}

ca_status ca_local_sgd_begin(ca_accelerator *acc, ca_module *model, int local_sgd_steps, bool enabled,
                             ca_local_sgd **out) {
    if (out) *out = NULL;
    if (!acc || !model || !out) return ca_error(CA_ERR_INVALID, "ca_local_sgd_begin: NULL argument");
    if (local_sgd_steps < 1)
        return ca_error(CA_ERR_INVALID, "ca_local_sgd_begin: local_sgd_steps must be >= 1 (got %d)", local_sgd_steps);
    ca_status s = check_supported(acc);
    if (s != CA_OK) return s;
    ca_local_sgd *ls = calloc(1, sizeof *ls);
    if (!ls) return ca_error(CA_ERR_NOMEM, "out of host memory");
    *ls = (ca_local_sgd){.acc = acc, .model = model, .every = local_sgd_steps, .enabled = enabled && acc->world > 1};
    if (ls->enabled) ca_no_sync_begin(acc, model);
    *out = ls;
    return CA_OK;
}

/* Every process's parameters replaced by their mean over the processes (after a barrier, as Accelerate). */
static ca_status average(ca_local_sgd *ls) {
    ca_accelerator *acc = ls->acc;
    ca_status s = ca_wait_for_everyone(acc);
    int n = ca_module_num_params(ls->model);
    for (int i = 0; i < n && s == CA_OK; i++) {
        ca_tensor *p = ls->model->flat[i];
        if (!p->requires_grad) continue;   /* frozen: equal on every process, and kept bit for bit */
        s = ca_comm_all_reduce(acc->comm, ca_tptr(p), ca_tptr(p), (size_t)p->numel, p->dtype, CA_OP_AVG, NULL);
        if (s != CA_OK)
            ca_error_context("LocalSGD averaging parameter %s after step %lld", ls->model->flat_names[i],
                             (long long)ls->steps);
    }
    return s;
}

ca_status ca_local_sgd_step(ca_local_sgd *ls) {
    if (!ls) return ca_error(CA_ERR_INVALID, "ca_local_sgd_step: NULL LocalSGD");
    ls->steps++;
    return ls->enabled && ls->steps % ls->every == 0 ? average(ls) : CA_OK;
}

ca_status ca_local_sgd_end(ca_local_sgd *ls) {
    if (!ls) return CA_OK;
    ca_status s = CA_OK;
    if (ls->enabled) {
        s = average(ls);
        ca_no_sync_end(ls->acc);
    }
    free(ls);
    return s;
}
