/* The single-process collective backend: exact semantics for a world of one, copies through the device. */
#include "base/base_impl.h"
#include "collectives/single.h"

#include <stdlib.h>
#include <string.h>

typedef struct single_comm {
    const ca_device_ops *dops;
    void *dev;
    bool aborted;
} single_comm;

static ca_status single_init(const ca_comm_init_args *args, void **out) {
    *out = NULL;
    if (args->world_size != 1 || args->rank != 0)
        return ca_error(CA_ERR_INVALID, "the 'single' collective backend serves a world of one process; "
                                        "asked for rank %d of %d", args->rank, args->world_size);
    if (!args->device_ops || !args->device_ops->memcpy)
        return ca_error(CA_ERR_INVALID, "the 'single' collective backend needs a device with memcpy");
    single_comm *c = calloc(1, sizeof *c);
    if (!c) return ca_error(CA_ERR_NOMEM, "out of memory creating a single-process communicator");
    c->dops = args->device_ops;
    c->dev = args->device;
    *out = c;
    return CA_OK;
}

static void single_destroy(void *comm) { free(comm); }

static ca_status alive(const single_comm *c, const char *op) {
    if (c->aborted) return ca_error(CA_ERR_STATE, "%s on an aborted communicator (backend single)", op);
    return CA_OK;
}

/* recv = send, on the device; nothing to do in place. */
static ca_status dcopy(single_comm *c, void *dst, const void *src, size_t count, ca_dtype dt, const char *op) {
    size_t es = ca_dtype_size(dt);
    if (!es) return ca_error(CA_ERR_INVALID, "%s: invalid dtype %d (backend single)", op, (int)dt);
    if (dst == src || count == 0) return CA_OK;
    if (count > SIZE_MAX / es) return ca_error(CA_ERR_INVALID, "%s: %zu elements overflow", op, count);
    ca_status s = c->dops->memcpy(c->dev, dst, src, count * es, CA_COPY_D2D, false);
    if (s != CA_OK) return ca_error_context("%s (backend single)", op);
    return CA_OK;
}

static ca_status single_all_reduce(void *comm, const void *send, void *recv, size_t count, ca_dtype dt,
                                   ca_reduce_op op, ca_work_impl **work) {
    single_comm *c = comm;
    *work = NULL;
    ca_status s = alive(c, "all_reduce");
    if (s != CA_OK) return s;
    if ((unsigned)op > CA_OP_MAX) return ca_error(CA_ERR_INVALID, "all_reduce: unknown reduce op %d", (int)op);
    /* sum, min and max of one value, and its average over one rank, are the value */
    return dcopy(c, recv, send, count, dt, "all_reduce");
}

static ca_status single_broadcast(void *comm, void *buf, size_t count, ca_dtype dt, int root,
                                  ca_work_impl **work) {
    single_comm *c = comm;
    *work = NULL;
    ca_status s = alive(c, "broadcast");
    if (s != CA_OK) return s;
    if (root != 0) return ca_error(CA_ERR_INVALID, "broadcast: root %d does not exist in a world of 1", root);
    if (!ca_dtype_size(dt)) return ca_error(CA_ERR_INVALID, "broadcast: invalid dtype %d", (int)dt);
    (void)buf;
    (void)count;
    return CA_OK;
}

static ca_status single_all_gather(void *comm, const void *send, void *recv, size_t count, ca_dtype dt,
                                   ca_work_impl **work) {
    single_comm *c = comm;
    *work = NULL;
    ca_status s = alive(c, "all_gather");
    if (s != CA_OK) return s;
    return dcopy(c, recv, send, count, dt, "all_gather");
}

static ca_status single_reduce_scatter(void *comm, const void *send, void *recv, size_t count, ca_dtype dt,
                                       ca_reduce_op op, ca_work_impl **work) {
    single_comm *c = comm;
    *work = NULL;
    ca_status s = alive(c, "reduce_scatter");
    if (s != CA_OK) return s;
    if ((unsigned)op > CA_OP_MAX) return ca_error(CA_ERR_INVALID, "reduce_scatter: unknown reduce op %d", (int)op);
    return dcopy(c, recv, send, count, dt, "reduce_scatter");
}

/* The only peer is this rank: an exchange with itself copies (the core refuses any other). */
static ca_status single_sendrecv(void *comm, const void *send, size_t send_count, int dst, void *recv,
                                 size_t recv_count, int src, ca_dtype dt, ca_work_impl **work) {
    single_comm *c = comm;
    *work = NULL;
    ca_status s = alive(c, "sendrecv");
    if (s != CA_OK) return s;
    if (dst != 0 || src != 0 || send_count != recv_count)
        return ca_error(CA_ERR_INVALID, "sendrecv: peers %d and %d (%zu and %zu elements) in a world of 1", dst, src,
                        send_count, recv_count);
    return dcopy(c, recv, send, send_count, dt, "sendrecv");
}

static ca_status single_barrier(void *comm, ca_work_impl **work) {
    *work = NULL;
    return alive(comm, "barrier");
}

/* Every operation completes before it returns, so no work handle is ever made. */
static ca_status single_work_test(ca_work_impl *work) { (void)work; return CA_OK; }
static ca_status single_work_wait(ca_work_impl *work, int64_t timeout_ms) {
    (void)work;
    (void)timeout_ms;
    return CA_OK;
}
static void single_work_free(ca_work_impl *work) { (void)work; }

static ca_status single_abort(void *comm) {
    ((single_comm *)comm)->aborted = true;
    return CA_OK;
}

static const ca_collective_ops single_ops = {
    .struct_size = sizeof(ca_collective_ops),
    .abi_version = CA_ABI_VERSION,
    .name = "single",
    .device_names = "*",
    .init = single_init,
    .destroy = single_destroy,
    .all_reduce = single_all_reduce,
    .broadcast = single_broadcast,
    .all_gather = single_all_gather,
    .reduce_scatter = single_reduce_scatter,
    .barrier = single_barrier,
    .work_test = single_work_test,
    .work_wait = single_work_wait,
    .work_free = single_work_free,
    .abort = single_abort,
    .sendrecv = single_sendrecv,
};

static const ca_collective_ops *const single_list[] = { &single_ops };

static const ca_plugin single_plugin = {
    .struct_size = sizeof(ca_plugin),
    .abi_version = CA_ABI_VERSION,
    .name = "single",
    .version = CA_VERSION,
    .num_devices = 0,
    .devices = NULL,
    .num_collectives = 1,
    .collectives = single_list,
    .score = NULL,
};

const ca_plugin *ca_single_collective_plugin(void) { return &single_plugin; }
