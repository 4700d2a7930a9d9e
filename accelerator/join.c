/* Uneven inputs (Accelerate's join_uneven_inputs over PyTorch's Join with DDP): a rank whose
 * dataloader ran out shadows the collectives of the ranks still training until every rank is done,
 * then every rank takes the parameters of the last rank to finish. */
#include "accelerator/sync_impl.h"

#include <stdlib.h>

/* One round of the join protocol: {ranks still training, of them the ones that synchronise}. */
static ca_status join_round(ca_accelerator *acc, int64_t active, int64_t sync, int64_t out[2]) {
    int64_t v[2] = {active, sync}, n = 2;
    ca_tensor *t = ca_from_host(acc->device, CA_I64, 1, &n, v);
    ca_status s = t ? ca_reduce(acc, t, CA_OP_SUM) : ca_last_status();
    if (s == CA_OK) s = ca_tensor_to_host(t, out, 2 * sizeof *out);
    if (s != CA_OK) return ca_error_context("join_uneven_inputs: join round on rank %d", acc->rank);
    return CA_OK;
}

ca_status ca_join_notify(ca_accelerator *acc, bool sync) {
    int64_t r[2];
    return join_round(acc, 1, sync ? 1 : 0, r);
}

/* Every rank takes the parameters of the highest-numbered rank among the last to finish. */
static ca_status sync_final_model(ca_accelerator *acc, bool last) {
    int64_t n = 1, v = last ? acc->rank : -1;
    ca_tensor *t = ca_from_host(acc->device, CA_I64, 1, &n, &v);
    ca_status s = t ? ca_reduce(acc, t, CA_OP_MAX) : ca_last_status();
    if (s == CA_OK) s = ca_tensor_to_host(t, &v, sizeof v);
    for (int i = 0; s == CA_OK && acc->model && i < ca_module_num_params(acc->model); i++) {
        ca_tensor *p = acc->model->flat[i];
        s = ca_comm_broadcast(acc->comm, ca_tptr(p), (size_t)p->numel, p->dtype, (int)v, NULL);
    }
    if (s != CA_OK) return ca_error_context("join_uneven_inputs: final parameters from rank %lld", (long long)v);
    return CA_OK;
}

static bool joinable(const ca_accelerator *acc) {
    ca_distributed_type t = acc->st.distributed_type;
    return acc->world > 1 && (t == CA_DIST_MULTI_CPU || t == CA_DIST_MULTI_GPU);
}

/* even_batches for every map-style loader; Accelerate's warning when some loader is iterable. */
static ca_status set_even_batches(ca_accelerator *acc, bool even, bool warn) {
    bool iterable = false;
    for (int i = 0; i < acc->nloaders; i++) {
        if (ca_dataloader_num_batches(acc->loaders[i]) < 0) {
            iterable = true;
            continue;
        }
        ca_status s = ca_dataloader_shard(acc->loaders[i], acc->rank, acc->world, even);
        if (s != CA_OK) return s;
    }
    if (iterable && warn && acc->rank == 0)
        ca_log_printf(CA_LOG_WARNING, "join_uneven_inputs: overriding even_batches is only supported for "
                      "map-style datasets, yet some dataloaders given were iterable");
    return CA_OK;
}

ca_status ca_join_uneven_inputs_begin(ca_accelerator *acc, ca_tristate even_batches) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_join_uneven_inputs_begin: accelerator is NULL");
    if (acc->joining) return ca_error(CA_ERR_STATE, "join_uneven_inputs: already inside a join (rank %d)", acc->rank);
    if (!joinable(acc)) {
        if (acc->st.distributed_type != CA_DIST_NO && acc->rank <= 0)
            ca_log_printf(CA_LOG_WARNING, "join_uneven_inputs is only supported for multi-GPU and multi-CPU data "
                          "parallel training (distributed_type %s): it has no effect", acc->st.distributed_type_name);
        return CA_OK;
    }
    bool even = acc->st.even_batches;
    if (even_batches != CA_UNSET) {
        even = even_batches == CA_YES;
        ca_status s = set_even_batches(acc, even, true);
        if (s != CA_OK) return s;
    }
    if (even) return CA_OK;   /* every rank has the same batches: nothing to join */
    if (acc->nextra)
        return ca_error(CA_ERR_UNSUPPORTED, "join_uneven_inputs with uneven batches joins one prepared model; "
                        "%d more are prepared (rank %d)", acc->nextra, acc->rank);
    if (acc->st.mixed_precision == CA_MP_FP16 || acc->st.deterministic)
        return ca_error(CA_ERR_UNSUPPORTED, "join_uneven_inputs with uneven batches cannot shadow the %s of the "
                        "ranks still training (rank %d); use even_batches=true",
                        acc->st.deterministic ? "deterministic shard reduction" : "fp16 overflow check", acc->rank);
    acc->joining = true;
    return CA_OK;
}

ca_status ca_join_uneven_inputs_end(ca_accelerator *acc) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_join_uneven_inputs_end: accelerator is NULL");
    ca_status s = CA_OK;
    if (acc->joining) {
        acc->joining = false;
        bool last = true;
        for (;;) {
            int64_t r[2];
            s = join_round(acc, 0, 0, r);
            if (s != CA_OK || r[0] == 0) break;
            last = false;
            /* the collectives of a synchronising backward, with zero gradients (the average stays over
             * the whole world, as DDP's join with divide_by_initial_world_size) */
            if (r[1] > 0 && acc->sync_ops->shadow_backward) s = acc->sync_ops->shadow_backward(acc);
            if (s != CA_OK) break;
        }
        if (s == CA_OK) s = sync_final_model(acc, last);
    }
    /* the loaders go back to the configured even_batches */
    if (joinable(acc)) {
        ca_status r = set_even_batches(acc, acc->st.even_batches, false);
        if (s == CA_OK) s = r;
    }
    return s;
}
