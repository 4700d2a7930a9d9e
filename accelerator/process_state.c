/* Process state (Accelerate's PartialState): which process this is among how many, printing from
 * the main process, the collectives a training loop calls directly (reduce, broadcast, gather,
 * gather_for_metrics), splitting work between processes and main_process_first. It calls nothing
 * else of the accelerator: every other file of accelerator/ may use it. */
#include "accelerator/accelerator_impl.h"
#include "accelerator/mesh_impl.h"
#include "comm/comm_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

ca_device *ca_accelerator_device(const ca_accelerator *acc) { return acc->device; }
const ca_config *ca_accelerator_config(const ca_accelerator *acc) { return acc->cfg; }
const ca_settings *ca_accelerator_settings(const ca_accelerator *acc) { return &acc->st; }
ca_mixed_precision ca_accelerator_mixed_precision(const ca_accelerator *acc) { return acc->st.mixed_precision; }
ca_distributed_type ca_accelerator_distributed_type(const ca_accelerator *acc) { return acc->st.distributed_type; }
int ca_process_index(const ca_accelerator *acc) { return acc->rank; }
int ca_local_process_index(const ca_accelerator *acc) { return acc->local_rank; }
int ca_num_processes(const ca_accelerator *acc) { return acc->world; }
bool ca_is_main_process(const ca_accelerator *acc) { return acc->rank == 0; }
bool ca_is_local_main_process(const ca_accelerator *acc) { return acc->local_rank == 0; }
bool ca_is_last_process(const ca_accelerator *acc) { return acc->rank == acc->world - 1; }
ca_comm *ca_accelerator_comm(const ca_accelerator *acc) { return acc->comm; }

void ca_print(const ca_accelerator *acc, const char *fmt, ...) {
    if (acc && acc->rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fflush(stdout);
}

ca_status ca_wait_for_everyone(ca_accelerator *acc) { return ca_comm_barrier(acc->comm, NULL); }

ca_status ca_mark_step(ca_accelerator *acc) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_mark_step: accelerator is NULL");
    return ca_device_mark_step(acc->device);
}

static ca_status need_contiguous(const ca_tensor *t, const char *op) {
    if (!t) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_INVALID, "%s: tensor is NULL", op);
    if (!ca_tensor_is_contiguous(t)) return ca_error(CA_ERR_INVALID, "%s: tensor must be contiguous", op);
    return CA_OK;
}

ca_status ca_reduce(ca_accelerator *acc, ca_tensor *t, ca_reduce_op op) {
    ca_status s = need_contiguous(t, "reduce");
    if (s != CA_OK) return s;
    return ca_comm_all_reduce(acc->comm, ca_tptr(t), ca_tptr(t), (size_t)t->numel, t->dtype, op, NULL);
}

ca_status ca_broadcast(ca_accelerator *acc, ca_tensor *t, int root) {
    ca_status s = need_contiguous(t, "broadcast");
    if (s != CA_OK) return s;
    return ca_comm_broadcast(acc->comm, ca_tptr(t), (size_t)t->numel, t->dtype, root, NULL);
}

/* t from every rank of comm c, stacked along dim 0 in rank order. */
static ca_tensor *gather_over(ca_comm *c, ca_tensor *t) {
    if (need_contiguous(t, "gather") != CA_OK) return NULL;
    int64_t shape[CA_MAX_DIMS];
    int nd = t->ndim ? t->ndim : 1;
    memcpy(shape, t->shape, sizeof shape);
    if (!t->ndim) shape[0] = 1;
    shape[0] *= c ? ca_comm_size(c) : 1;
    ca_tensor *out = ca_tensor_new(ca_tdev(t), t->dtype, nd, shape);
    if (!out) return NULL;
    if (ca_comm_all_gather(c, ca_tptr(t), ca_tptr(out), (size_t)t->numel, t->dtype, NULL) != CA_OK)
        return NULL;
    return out;
}

ca_tensor *ca_gather(ca_accelerator *acc, ca_tensor *t) { return gather_over(acc->comm, t); }

/* Over the data-parallel ranks: under tensor parallelism the ranks of a tp group hold the same batch,
 * and the metrics count each sample once (mesh.c's dp communicator; the whole group without a mesh). */
ca_tensor *ca_gather_for_metrics(ca_accelerator *acc, ca_tensor *t, const ca_batch *b) {
    ca_comm *dp = ca_mesh_data_comm(acc);
    ca_tensor *all = gather_over(dp, t);
    if (!all || !b) return all;
    /* padding repeats samples at the end of the global order, which is rank order */
    ca_tensor *pad = ca_full(acc->device, CA_I64, 0, NULL, (double)b->num_padded);
    if (!pad || ca_comm_all_reduce(dp, ca_tptr(pad), ca_tptr(pad), 1, CA_I64, CA_OP_SUM, NULL) != CA_OK) return NULL;
    double total;
    if (ca_tensor_item(pad, &total) != CA_OK) return NULL;
    int64_t rows = all->shape[0], keep = rows - (int64_t)total;
    if (keep <= 0) keep = 0;
    return keep == rows ? all : ca_narrow(all, 0, 0, keep);
}

void ca_split_between_processes(const ca_accelerator *acc, int64_t n, int64_t *begin, int64_t *end) {
    int64_t w = acc->world, r = acc->rank, base = n / w, extra = n % w;
    *begin = r * base + (r < extra ? r : extra);
    *end = *begin + base + (r < extra ? 1 : 0);
}

ca_status ca_main_process_first_begin(ca_accelerator *acc) {
    return acc->rank == 0 ? CA_OK : ca_comm_barrier(acc->comm, NULL);
}

ca_status ca_main_process_first_end(ca_accelerator *acc) {
    return acc->rank == 0 ? ca_comm_barrier(acc->comm, NULL) : CA_OK;
}
