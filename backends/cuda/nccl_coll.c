/* The "nccl" collective backend: one rank per GPU, the unique id through the rendezvous store, non-blocking communicator setup with a deadline, ops on the device's stream with event-backed work handles. */
#include "backends/cuda/cuda_impl.h"

#include <caccel/device.h>

/* nccl.h declares some functions without prototypes */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ loading */

/* NCCL is opened on first use rather than linked: linked, a machine without libnccl.so.2 could not
 * load the plugin at all, and the cuda device disappeared with it. The functions are bound through
 * the header's own types; CACCEL_NCCL_LIBRARY names another file (a pip wheel's libnccl.so.2). */
#define NC_STR_(x) #x
#define NC_STR(x) NC_STR_(x)
#define NC_SONAME "libnccl.so." NC_STR(NCCL_MAJOR)

static struct {
    bool loaded;
    __typeof__(ncclGetVersion) *get_version;
    __typeof__(ncclGetErrorString) *get_error_string;
    __typeof__(ncclGetLastError) *get_last_error;
    __typeof__(ncclCommGetAsyncError) *comm_get_async_error;
    __typeof__(ncclGetUniqueId) *get_unique_id;
    __typeof__(ncclCommInitRankConfig) *comm_init_rank_config;
    __typeof__(ncclCommFinalize) *comm_finalize;
    __typeof__(ncclCommDestroy) *comm_destroy;
    __typeof__(ncclCommAbort) *comm_abort;
    __typeof__(ncclAllReduce) *all_reduce;
    __typeof__(ncclBroadcast) *broadcast;
    __typeof__(ncclAllGather) *all_gather;
    __typeof__(ncclReduceScatter) *reduce_scatter;
    __typeof__(ncclSend) *send;
    __typeof__(ncclRecv) *recv;
    __typeof__(ncclGroupStart) *group_start;
    __typeof__(ncclGroupEnd) *group_end;
} nc;
static pthread_once_t nc_once = PTHREAD_ONCE_INIT;
static char nc_why[512];   /* empty once loaded */

#define NC_BIND(field, fn)                                                                             \
    do {                                                                                               \
        void *p_ = dlsym(h, NC_STR(fn));                                                               \
        if (!p_) {                                                                                     \
            snprintf(nc_why, sizeof nc_why, "%s has no symbol %s (NCCL 2.14 or newer is needed)", name, \
                     NC_STR(fn));                                                                      \
            return;                                                                                    \
        }                                                                                              \
        memcpy(&nc.field, &p_, sizeof p_);                                                             \
    } while (0)

static void nc_load_once(void) {
    const char *name = getenv("CACCEL_NCCL_LIBRARY");
    if (!name || !*name) name = NC_SONAME;
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(nc_why, sizeof nc_why, "NCCL not found (%s: %s)", name, e ? e : "not found");
        return;
    }
    NC_BIND(get_version, ncclGetVersion);
    NC_BIND(get_error_string, ncclGetErrorString);
    NC_BIND(get_last_error, ncclGetLastError);
    NC_BIND(comm_get_async_error, ncclCommGetAsyncError);
    NC_BIND(get_unique_id, ncclGetUniqueId);
    NC_BIND(comm_init_rank_config, ncclCommInitRankConfig);
    NC_BIND(comm_finalize, ncclCommFinalize);
    NC_BIND(comm_destroy, ncclCommDestroy);
    NC_BIND(comm_abort, ncclCommAbort);
    NC_BIND(all_reduce, ncclAllReduce);
    NC_BIND(broadcast, ncclBroadcast);
    NC_BIND(all_gather, ncclAllGather);
    NC_BIND(reduce_scatter, ncclReduceScatter);
    NC_BIND(send, ncclSend);
    NC_BIND(recv, ncclRecv);
    NC_BIND(group_start, ncclGroupStart);
    NC_BIND(group_end, ncclGroupEnd);
    nc.loaded = true;
}

/* Opens NCCL once per process; CA_ERR_UNSUPPORTED with the loader's reason when it cannot (the
 * cuda device works without it; a communicator can use gloo, staged through the host). */
static ca_status nc_load(void) {
    pthread_once(&nc_once, nc_load_once);
    if (nc.loaded) return CA_OK;
    ca_error(CA_ERR_UNSUPPORTED, "nccl: %s", nc_why);
    ca_error_hint("install NCCL %d (libnccl2, or pip's nvidia-nccl), put the directory holding %s on "
                  "LD_LIBRARY_PATH or name the file in CACCEL_NCCL_LIBRARY; or use backend gloo",
                  NCCL_MAJOR, NC_SONAME);
    return CA_ERR_UNSUPPORTED;
}

typedef struct nccl_comm {
    ncclComm_t comm;
    cuda_device *d;
    int rank, world;
    int64_t timeout_ms;
    void *one;                 /* a device f32 for barrier */
    /* NCCL's own stream, so that a collective overlaps the compute stream's kernels: it waits for
     * `ready` (recorded on the compute stream when the op is issued, so it sees the data written
     * so far), and the compute stream waits for the op's event before it uses the result (at
     * once for an op without a work handle, else when the handle is tested or waited on). The
     * buffers are recorded with the allocator (cu_alloc_record_stream), so that a tensor freed on
     * the compute stream is not reused while NCCL's stream still reads or writes it. */
    cudaStream_t stream;
    cudaEvent_t ready;
    /* The communicator is used by the thread issuing ops and the one testing work: mu orders
     * them. abort (the watchdog's) must not wait for mu, since the holder may be the very enqueue
     * that is stuck; see nccl_abort. `aborted` is set first and checked by everyone before they
     * touch `comm`; an issuer polling a non-blocking enqueue checks it at each poll. */
    atomic_bool aborted;
    pthread_mutex_t mu;
    cudaEvent_t *events;       /* recycled events */
    int nevents, cap_events;
    /* Several ranks on one GPU (NCCL refuses that): every op goes through a gloo communicator on
     * host copies instead (gloo_*), in `host`, pinned, grown as needed. */
    const ca_collective_ops *gloo;
    void *gc;
    char *host;
    size_t host_cap;
} nccl_comm;

struct ca_work_impl {
    nccl_comm *c;
    cudaEvent_t ev;
    char what[96];
};

/* The headers' version: asking the library would load it with the plugin. */
const char *cu_nccl_version_string(void) {
    static char buf[48];
    int v = 0;
    if (nc.loaded && nc.get_version(&v) == ncclSuccess && v > 0)
        snprintf(buf, sizeof buf, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    else
        snprintf(buf, sizeof buf, "NCCL %d.%d.%d", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    return buf;
}

static void sleep_us(long us) {
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static ca_status nccl_fail(nccl_comm *c, ncclResult_t r, const char *fmt, ...) CA_PRINTF(3, 4);

static ca_status nccl_fail(nccl_comm *c, ncclResult_t r, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *detail = c && c->comm ? nc.get_last_error(c->comm) : nc.get_last_error(NULL);
    ca_error(r == ncclInvalidArgument || r == ncclInvalidUsage ? CA_ERR_INVALID : CA_ERR_BACKEND,
             "nccl %s (rank %d of %d): %s%s%s", what, c ? c->rank : -1, c ? c->world : -1, nc.get_error_string(r),
             detail && *detail ? ": " : "", detail ? detail : "");
    if (r == ncclRemoteError) ca_error_hint("another rank failed or left; its own message says why");
    else if (r == ncclSystemError) ca_error_hint("NCCL_DEBUG=INFO shows which network or system call failed");
    return ca_last_status();
}

/* Waits until a non-blocking call's result is known: ncclSuccess or an error; ncclInProgress at
 * the deadline or when `stop` is raised (abort: comm must not be touched again). */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t r, int64_t deadline_ms, atomic_bool *stop) {
    long us = 1;
    while (r == ncclInProgress) {
        if (stop && atomic_load(stop)) return ncclInProgress;
        if (nc.comm_get_async_error(comm, &r) != ncclSuccess) return ncclInternalError;
        if (r != ncclInProgress) break;
        if (deadline_ms >= 0 && ca_now_ms() >= deadline_ms) return ncclInProgress;
        sleep_us(us);
        if (us < 1000) us *= 2;
    }
    return r;
}

/* ------------------------------------------- several ranks on one GPU */

/* Whether two ranks of the job use the same GPU (same host and PCI bus id): rank 0 gathers every
 * rank's through the store and publishes the answer, so that every rank decides alike. */
static ca_status gpu_shared(const ca_comm_init_args *a, nccl_comm *c, bool *shared, char *note, size_t note_len) {
    *shared = false;
    char mine[160], host[100] = "?", bus[48] = "?", key[300];
    gethostname(host, sizeof host - 1);
    if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, c->d->ordinal) != cudaSuccess) cudaGetLastError();
    snprintf(mine, sizeof mine, "%s %s", host, bus);
    const char *prefix = a->prefix ? a->prefix : "caccel/nccl";
    snprintf(key, sizeof key, "%s/gpu/%d", prefix, c->rank);
    ca_status st = a->store.ops->set(a->store.store, key, mine, strlen(mine) + 1);
    char answer[256] = "";
    if (st == CA_OK && c->rank == 0) {
        char (*all)[160] = calloc((size_t)c->world, sizeof *all);
        if (!all) return ca_error(CA_ERR_NOMEM, "nccl init: out of host memory");
        for (int r = 0; r < c->world && st == CA_OK; r++) {
            size_t len = sizeof all[r] - 1;
            snprintf(key, sizeof key, "%s/gpu/%d", prefix, r);
            st = a->store.ops->get(a->store.store, key, all[r], &len, c->timeout_ms);
            for (int q = 0; st == CA_OK && q < r && !answer[0]; q++)
                if (strcmp(all[q], all[r]) == 0)
                    snprintf(answer, sizeof answer, "ranks %d and %d share GPU %s", q, r, all[r]);
        }
        free(all);
        snprintf(key, sizeof key, "%s/gpu_shared", prefix);
        if (st == CA_OK) st = a->store.ops->set(a->store.store, key, answer, strlen(answer) + 1);
    } else if (st == CA_OK) {
        size_t len = sizeof answer - 1;
        snprintf(key, sizeof key, "%s/gpu_shared", prefix);
        st = a->store.ops->get(a->store.store, key, answer, &len, c->timeout_ms);
    }
    if (st != CA_OK) return ca_error_context("nccl init (rank %d of %d): sharing which GPU each rank uses", c->rank,
                                             c->world);
    *shared = answer[0] != '\0';
    snprintf(note, note_len, "%s", answer);
    return CA_OK;
}

/* The gloo communicator that replaces NCCL's when ranks share a GPU. */
static ca_status gloo_start(const ca_comm_init_args *a, nccl_comm *c, const char *note) {
    /* the host backend comes from the core (older cores hand none over) */
    bool has = a->struct_size >= offsetof(ca_comm_init_args, host_device) + sizeof a->host_device;
    c->gloo = has ? a->host_collective : NULL;
    if (!c->gloo || !a->host_device_ops) {
        c->gloo = NULL;
        ca_error_context("nccl init: %s, which NCCL refuses, and gloo (to stage through the host) is not available",
                         note);
        return ca_last_status();
    }
    if (c->rank == 0)
        CA_LOG_W("nccl: %s; NCCL needs one GPU per rank, so collectives use gloo, staged through host memory "
                 "(set gpu_ids to give each rank its own GPU)", note);
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s/gloo", a->prefix ? a->prefix : "caccel/nccl");
    ca_comm_init_args ga = *a;
    ga.device_ops = a->host_device_ops;
    ga.device = a->host_device;
    ga.prefix = prefix;
    ca_status st = c->gloo->init(&ga, &c->gc);
    if (st != CA_OK) {
        c->gloo = NULL;
        return ca_error_context("nccl init: the gloo communicator for ranks sharing a GPU");
    }
    return CA_OK;
}

typedef enum { GL_ALL_REDUCE, GL_BROADCAST, GL_ALL_GATHER, GL_REDUCE_SCATTER, GL_BARRIER, GL_SENDRECV } gl_kind;

/* A point-to-point exchange over gloo: its peers and its received count (the sent one is count). */
typedef struct gl_p2p {
    int dst, src;
    size_t rcount;
} gl_p2p;

/* One op over gloo: the device data to pinned host memory, the op, and back. Synchronous: the
 * host copy is reused by the next op (the core takes a NULL handle as done). */
static ca_status gloo_op(nccl_comm *c, gl_kind k, const void *send, void *recv, size_t count, ca_dtype dt,
                         ca_reduce_op op, int root, const char *what, const gl_p2p *p2p) {
    size_t es = ca_dtype_size(dt), w = (size_t)c->world;
    size_t sn = count * es * (k == GL_REDUCE_SCATTER ? w : 1), rn = count * es * (k == GL_ALL_GATHER ? w : 1);
    if (p2p) rn = p2p->rcount * es;
    ca_work_impl *wk = NULL;
    pthread_mutex_lock(&c->mu);
    ca_status st = cu_enter(c->d, "nccl (gloo)");
    if (st == CA_OK && k != GL_BARRIER && sn + rn > c->host_cap) {
        if (c->host) cudaFreeHost(c->host);
        c->host = NULL;
        c->host_cap = 0;
        CA_CUDA_TRY_GOTO(cudaHostAlloc((void **)&c->host, sn + rn, cudaHostAllocPortable), st, out,
                         "nccl %s: %zu bytes of pinned memory to stage through", what, sn + rn);
        c->host_cap = sn + rn;
    }
    if (st != CA_OK) goto out;
    char *hs = c->host, *hr = k == GL_BROADCAST ? c->host : c->host + sn;
    if (k != GL_BARRIER) {
        CA_CUDA_TRY_GOTO(cudaMemcpyAsync(hs, send, sn, cudaMemcpyDeviceToHost, c->d->stream), st, out, "nccl %s", what);
        CA_CUDA_TRY_GOTO(cudaStreamSynchronize(c->d->stream), st, out, "nccl %s: copying to the host", what);
    }
    switch (k) {
    case GL_ALL_REDUCE: st = c->gloo->all_reduce(c->gc, hs, hr, count, dt, op, &wk); break;
    case GL_BROADCAST: st = c->gloo->broadcast(c->gc, hs, count, dt, root, &wk); break;
    case GL_ALL_GATHER: st = c->gloo->all_gather(c->gc, hs, hr, count, dt, &wk); break;
    case GL_REDUCE_SCATTER: st = c->gloo->reduce_scatter(c->gc, hs, hr, count, dt, op, &wk); break;
    case GL_BARRIER: st = c->gloo->barrier(c->gc, &wk); break;
    case GL_SENDRECV:
        st = c->gloo->sendrecv ? c->gloo->sendrecv(c->gc, hs, count, p2p->dst, hr, p2p->rcount, p2p->src, dt, &wk)
                               : ca_error(CA_ERR_UNSUPPORTED, "the host backend has no point-to-point operations");
        break;
    }
    if (st == CA_OK && wk) st = c->gloo->work_wait(wk, c->timeout_ms);
    if (wk) c->gloo->work_free(wk);
    if (st != CA_OK || k == GL_BARRIER) goto out;
    CA_CUDA_TRY_GOTO(cudaMemcpyAsync(recv, hr, rn, cudaMemcpyHostToDevice, c->d->stream), st, out, "nccl %s", what);
    CA_CUDA_TRY_GOTO(cudaStreamSynchronize(c->d->stream), st, out, "nccl %s: copying back to the GPU", what);
out:
    pthread_mutex_unlock(&c->mu);
    if (st != CA_OK) ca_error_context("nccl %s (rank %d of %d, through gloo)", what, c->rank, c->world);
    return st;
}

/* ------------------------------------------------------------ create */

static void nccl_destroy(void *comm);

/* NCCL's unique id: rank 0 makes it and publishes it in the store, the others read it from there. */
static ca_status exchange_id(const ca_comm_init_args *a, nccl_comm *c, ncclUniqueId *id) {
    char key[256];
    snprintf(key, sizeof key, "%s/nccl_unique_id", a->prefix ? a->prefix : "caccel/nccl");
    if (c->rank == 0) {
        ncclResult_t r = nc.get_unique_id(id);
        if (r != ncclSuccess) return nccl_fail(c, r, "init: ncclGetUniqueId");
        if (c->world > 1 && a->store.ops->set(a->store.store, key, id, sizeof *id) != CA_OK)
            return ca_error_context("nccl init: publishing the unique id");
        return CA_OK;
    }
    size_t len = sizeof *id;
    if (a->store.ops->get(a->store.store, key, id, &len, c->timeout_ms) != CA_OK)
        return ca_error_context("nccl init (rank %d of %d): waiting for rank 0's unique id", c->rank, c->world);
    if (len != sizeof *id)
        return ca_error(CA_ERR_PEER, "nccl init: the unique id in the store (key %s) has %zu bytes, not %zu", key,
                        len, sizeof *id);
    return CA_OK;
}

static ca_status nccl_init(const ca_comm_init_args *a, void **out) {
    if (!a || !out) return ca_error(CA_ERR_INVALID, "nccl init: arguments are NULL");
    *out = NULL;
    if (!a->device_ops || strcmp(a->device_ops->name, "cuda") != 0 || !a->device) {
        ca_error(CA_ERR_UNSUPPORTED, "nccl reduces on cuda devices only (the communicator's device is %s)",
                 a->device_ops ? a->device_ops->name : "none");
        ca_error_hint("use backend gloo or mpi for CPU tensors");
        return CA_ERR_UNSUPPORTED;
    }
    ca_status st = nc_load();
    if (st != CA_OK) return st;
    if (a->world_size > 1 && !a->store.ops)
        return ca_error(CA_ERR_CONFIG, "nccl: %d ranks need a rendezvous store to share NCCL's unique id",
                        a->world_size);
    nccl_comm *c = calloc(1, sizeof *c);
    if (!c) return ca_error(CA_ERR_NOMEM, "nccl init: out of host memory");
    c->d = a->device;
    c->rank = a->rank;
    c->world = a->world_size;
    c->timeout_ms = a->timeout_ms > 0 ? a->timeout_ms : 1800 * 1000;
    pthread_mutex_init(&c->mu, NULL);
    int64_t deadline = ca_now_ms() + c->timeout_ms;
    st = cu_enter(c->d, "nccl init");
    if (st != CA_OK) goto fail;
    bool shared = false;
    char note[256];
    if (c->world > 1 && (st = gpu_shared(a, c, &shared, note, sizeof note)) != CA_OK) goto fail;
    if (shared) {
        if ((st = gloo_start(a, c, note)) != CA_OK) goto fail;
        *out = c;
        return CA_OK;
    }

    ncclUniqueId id;
    if ((st = exchange_id(a, c, &id)) != CA_OK) goto fail;

    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;   /* so that a rank that never arrives cannot hang us past the deadline */
    ncclResult_t r = nc.comm_init_rank_config(&c->comm, c->world, id, c->rank, &cfg);
    if (r == ncclInProgress || r == ncclSuccess) r = settle(c->comm, r, deadline, NULL);
    if (r == ncclInProgress) {
        nc.comm_abort(c->comm);
        c->comm = NULL;
        st = ca_error(CA_ERR_TIMEOUT,
                      "nccl init (rank %d of %d on GPU %d) did not finish within %lld ms: not every rank arrived",
                      c->rank, c->world, c->d->ordinal, (long long)c->timeout_ms);
        ca_error_hint("a rank that failed before creating its communicator says why; raise the timeout with "
                      "CACCEL_TIMEOUT (seconds) if the job is just slow to start");
        goto fail;
    }
    if (r != ncclSuccess) {
        st = nccl_fail(c, r, "init: ncclCommInitRankConfig on GPU %d", c->d->ordinal);
        if (c->comm) nc.comm_abort(c->comm);
        c->comm = NULL;
        if (r == ncclInvalidUsage)
            ca_error_hint("two ranks on one GPU? NCCL needs one GPU per rank; set gpu_ids or use backend gloo "
                          "(which stages through host memory) to share a GPU");
        goto fail;
    }
    CA_CUDA_TRY_GOTO(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), st, fail,
                     "nccl init: NCCL's stream on GPU %d", c->d->ordinal);
    CA_CUDA_TRY_GOTO(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming), st, fail,
                     "nccl init: the compute stream's event");
    CA_CUDA_TRY_GOTO(cudaMalloc(&c->one, sizeof(float)), st, fail, "nccl init: barrier buffer");
    CA_CUDA_TRY_GOTO(cudaMemsetAsync(c->one, 0, sizeof(float), c->d->stream), st, fail,
                     "nccl init: barrier buffer");
    *out = c;
    return CA_OK;
fail:
    nccl_destroy(c);
    return st;
}

static void nccl_destroy(void *comm) {
    nccl_comm *c = comm;
    if (!c) return;
    cudaSetDevice(c->d->ordinal);
    pthread_mutex_lock(&c->mu);
    if (c->comm && !atomic_load(&c->aborted)) {
        /* flush what was issued; a peer that is gone must not hang us: abort then */
        ncclResult_t r = settle(c->comm, nc.comm_finalize(c->comm), ca_now_ms() + c->timeout_ms, &c->aborted);
        if (r == ncclSuccess) nc.comm_destroy(c->comm);
        else nc.comm_abort(c->comm);
    }
    c->comm = NULL;
    pthread_mutex_unlock(&c->mu);
    if (c->gloo) c->gloo->destroy(c->gc);
    if (c->host) cudaFreeHost(c->host);
    if (c->one) cudaFree(c->one);
    if (c->ready) cudaEventDestroy(c->ready);
    if (c->stream) cudaStreamDestroy(c->stream);   /* released once its queued work is done */
    for (int i = 0; i < c->nevents; i++) cudaEventDestroy(c->events[i]);
    cudaGetLastError();
    free(c->events);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* --------------------------------------------------------------- ops */

static bool nccl_type(ca_dtype dt, ncclDataType_t *out) {
    switch (dt) {
    case CA_F32: *out = ncclFloat32; return true;
    case CA_F16: *out = ncclFloat16; return true;
    case CA_BF16: *out = ncclBfloat16; return true;
    case CA_I32: *out = ncclInt32; return true;
    case CA_I64: *out = ncclInt64; return true;
    case CA_U8: *out = ncclUint8; return true;
    default: return false;
    }
}

static bool nccl_op(ca_reduce_op op, ncclRedOp_t *out) {
    switch (op) {
    case CA_OP_SUM: *out = ncclSum; return true;
    case CA_OP_AVG: *out = ncclAvg; return true;   /* integers: the sum divided, truncated */
    case CA_OP_MIN: *out = ncclMin; return true;
    case CA_OP_MAX: *out = ncclMax; return true;
    default: return false;
    }
}

/* Checks a call's arguments and the communicator's state, and orders NCCL's stream after the
 * compute stream's work so far; the buffers (send, recv, either may be NULL) are recorded as used
 * on NCCL's stream. Holds mu on success. */
static ca_status begin(nccl_comm *c, const char *what, ca_dtype dt, ncclDataType_t *t, const void *send,
                       const void *recv) {
    if (!c) return ca_error(CA_ERR_INVALID, "nccl %s: communicator is NULL", what);
    if (t && !nccl_type(dt, t))
        return ca_error(CA_ERR_INVALID, "nccl %s: dtype %s (%d) is not supported", what, ca_dtype_name(dt), (int)dt);
    pthread_mutex_lock(&c->mu);
    if (atomic_load(&c->aborted) || !c->comm) {
        pthread_mutex_unlock(&c->mu);
        return ca_error(CA_ERR_STATE, "nccl %s (rank %d of %d): the communicator was aborted", what, c->rank, c->world);
    }
    ca_status st = cu_enter(c->d, "nccl");
    if (st != CA_OK) goto fail;
    CA_CUDA_TRY_GOTO(cudaEventRecord(c->ready, c->d->stream), st, fail, "nccl %s: recording the compute stream", what);
    CA_CUDA_TRY_GOTO(cudaStreamWaitEvent(c->stream, c->ready, 0), st, fail,
                     "nccl %s: ordering NCCL's stream after the compute stream", what);
    if (send) cu_alloc_record_stream(c->d->alloc, send, c->stream);
    if (recv && recv != send) cu_alloc_record_stream(c->d->alloc, recv, c->stream);
    return CA_OK;
fail:
    pthread_mutex_unlock(&c->mu);
    return st;
}

static void work_free_locked(ca_work_impl *w);

/* After an op was issued (mu held): its result, then an event on the stream as its work handle. */
static ca_status finish_issue(nccl_comm *c, ncclResult_t r, const char *what, ca_work_impl **work) {
    ca_status st = CA_OK;
    if (r == ncclInProgress) r = settle(c->comm, r, ca_now_ms() + c->timeout_ms, &c->aborted);
    if (atomic_load(&c->aborted)) {
        st = ca_error(CA_ERR_STATE, "nccl %s (rank %d of %d): the communicator was aborted", what, c->rank, c->world);
        goto out;
    }
    if (r == ncclInProgress) {
        st = ca_error(CA_ERR_TIMEOUT, "nccl %s (rank %d of %d): not even enqueued within %lld ms", what, c->rank,
                      c->world, (long long)c->timeout_ms);
        goto out;
    }
    if (r != ncclSuccess) {
        st = nccl_fail(c, r, "%s", what);
        goto out;
    }
    ca_work_impl *w = calloc(1, sizeof *w);
    if (!w) {
        st = ca_error(CA_ERR_NOMEM, "nccl %s: out of host memory for a work handle", what);
        goto out;
    }
    w->c = c;
    snprintf(w->what, sizeof w->what, "%s", what);
    if (c->nevents > 0) {
        w->ev = c->events[--c->nevents];
    } else {
        cudaError_t e = cudaEventCreateWithFlags(&w->ev, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            free(w);
            st = cu_error_at(e, __FILE__, __LINE__, "nccl %s: creating its completion event", what);
            goto out;
        }
    }
    cudaError_t e = cudaEventRecord(w->ev, c->stream);
    if (e != cudaSuccess) {
        cudaEventDestroy(w->ev);
        free(w);
        st = cu_error_at(e, __FILE__, __LINE__, "nccl %s: recording its completion event", what);
        goto out;
    }
    if (work) {
        *work = w;
        goto out;
    }
    /* no handle: the caller may use the result at once, in stream order */
    e = cudaStreamWaitEvent(c->d->stream, w->ev, 0);
    work_free_locked(w);
    if (e != cudaSuccess) st = cu_error_at(e, __FILE__, __LINE__, "nccl %s: ordering the compute stream after it", what);
out:
    pthread_mutex_unlock(&c->mu);
    return st;
}

static ca_status nccl_all_reduce(void *comm, const void *send, void *recv, size_t count, ca_dtype dt,
                                 ca_reduce_op op, ca_work_impl **work) {
    nccl_comm *c = comm;
    ncclDataType_t t;
    ncclRedOp_t o;
    if (!nccl_op(op, &o)) return ca_error(CA_ERR_INVALID, "nccl all_reduce: unknown reduce op %d", (int)op);
    char what[96];
    snprintf(what, sizeof what, "all_reduce(%s, %zu elements, %s)", ca_dtype_name(dt), count, ca_reduce_op_name(op));
    if (c && c->gloo) return gloo_op(c, GL_ALL_REDUCE, send, recv, count, dt, op, 0, what, NULL);
    ca_status st = begin(c, what, dt, &t, send, recv);
    if (st != CA_OK) return st;
    return finish_issue(c, nc.all_reduce(send, recv, count, t, o, c->comm, c->stream), what, work);
}

static ca_status nccl_broadcast(void *comm, void *buf, size_t count, ca_dtype dt, int root, ca_work_impl **work) {
    nccl_comm *c = comm;
    ncclDataType_t t;
    char what[96];
    snprintf(what, sizeof what, "broadcast(%s, %zu elements, root %d)", ca_dtype_name(dt), count, root);
    if (c && c->gloo) return gloo_op(c, GL_BROADCAST, buf, buf, count, dt, CA_OP_SUM, root, what, NULL);
    ca_status st = begin(c, what, dt, &t, buf, NULL);
    if (st != CA_OK) return st;
    return finish_issue(c, nc.broadcast(buf, buf, count, t, root, c->comm, c->stream), what, work);
}

static ca_status nccl_all_gather(void *comm, const void *send, void *recv, size_t count, ca_dtype dt,
                                 ca_work_impl **work) {
    nccl_comm *c = comm;
    ncclDataType_t t;
    char what[96];
    snprintf(what, sizeof what, "all_gather(%s, %zu elements per rank)", ca_dtype_name(dt), count);
    if (c && c->gloo) return gloo_op(c, GL_ALL_GATHER, send, recv, count, dt, CA_OP_SUM, 0, what, NULL);
    ca_status st = begin(c, what, dt, &t, send, recv);
    if (st != CA_OK) return st;
    return finish_issue(c, nc.all_gather(send, recv, count, t, c->comm, c->stream), what, work);
}

static ca_status nccl_reduce_scatter(void *comm, const void *send, void *recv, size_t count, ca_dtype dt,
                                     ca_reduce_op op, ca_work_impl **work) {
    nccl_comm *c = comm;
    ncclDataType_t t;
    ncclRedOp_t o;
    if (!nccl_op(op, &o)) return ca_error(CA_ERR_INVALID, "nccl reduce_scatter: unknown reduce op %d", (int)op);
    char what[96];
    snprintf(what, sizeof what, "reduce_scatter(%s, %zu elements per rank, %s)", ca_dtype_name(dt), count,
             ca_reduce_op_name(op));
    if (c && c->gloo) return gloo_op(c, GL_REDUCE_SCATTER, send, recv, count, dt, op, 0, what, NULL);
    ca_status st = begin(c, what, dt, &t, send, recv);
    if (st != CA_OK) return st;
    return finish_issue(c, nc.reduce_scatter(send, recv, count, t, o, c->comm, c->stream), what, work);
}

/* NCCL has no barrier: an all-reduce of one float that every rank must join. */
static ca_status nccl_barrier(void *comm, ca_work_impl **work) {
    nccl_comm *c = comm;
    ncclDataType_t t;
    if (c && c->gloo) return gloo_op(c, GL_BARRIER, NULL, NULL, 0, CA_F32, CA_OP_SUM, 0, "barrier", NULL);
    ca_status st = begin(c, "barrier", CA_F32, &t, NULL, NULL);
    if (st != CA_OK) return st;
    return finish_issue(c, nc.all_reduce(c->one, c->one, 1, t, ncclSum, c->comm, c->stream), "barrier", work);
}

/* ncclSend and ncclRecv in one group, so that a ring of ranks each sending right and receiving left
 * runs them together without deadlock; dst / src < 0: that side is absent. */
static ca_status nccl_sendrecv(void *comm, const void *send, size_t send_count, int dst, void *recv, size_t recv_count,
                               int src, ca_dtype dt, ca_work_impl **work) {
    nccl_comm *c = comm;
    ncclDataType_t t;
    char what[128];
    snprintf(what, sizeof what, "sendrecv(%s, %zu elements to rank %d, %zu from rank %d)", ca_dtype_name(dt),
             send_count, dst, recv_count, src);
    if (c && c->gloo) {
        gl_p2p p = {dst, src, recv_count};
        return gloo_op(c, GL_SENDRECV, send, recv, send_count, dt, CA_OP_SUM, 0, what, &p);
    }
    ca_status st = begin(c, what, dt, &t, dst >= 0 ? send : NULL, src >= 0 ? recv : NULL);
    if (st != CA_OK) return st;
    ncclResult_t r = nc.group_start();
    if (r == ncclSuccess && src >= 0) r = nc.recv(recv, recv_count, t, src, c->comm, c->stream);
    if (r == ncclSuccess && dst >= 0) r = nc.send(send, send_count, t, dst, c->comm, c->stream);
    /* a group once started is always ended, also after a failed call inside it */
    ncclResult_t e = nc.group_end();
    return finish_issue(c, r != ncclSuccess ? r : e, what, work);
}

/* ---------------------------------------------------------------- work */

static ca_status nccl_work_test(ca_work_impl *w) {
    if (!w) return CA_OK;
    nccl_comm *c = w->c;
    cudaSetDevice(c->d->ordinal);
    cudaError_t e = cudaEventQuery(w->ev);
    if (e == cudaSuccess) {
        /* done: a no-op for the GPU, but it keeps the compute stream's order explicit (the stream
         * current now, which may not be the one current at issue) */
        e = cudaStreamWaitEvent(c->d->stream, w->ev, 0);
        return e == cudaSuccess ? CA_OK : cu_error_at(e, __FILE__, __LINE__, "nccl %s: ordering the compute stream", w->what);
    }
    if (e != cudaErrorNotReady) return cu_error_at(e, __FILE__, __LINE__, "nccl %s", w->what);
    cudaGetLastError();
    /* not finished: has NCCL given up (a peer died, the network failed)? */
    pthread_mutex_lock(&c->mu);
    ca_status st = CA_IN_PROGRESS;
    if (atomic_load(&c->aborted) || !c->comm) {
        st = ca_error(CA_ERR_STATE, "nccl %s (rank %d of %d): the communicator was aborted", w->what, c->rank, c->world);
    } else {
        ncclResult_t ae = ncclSuccess;
        ncclResult_t r = nc.comm_get_async_error(c->comm, &ae);
        if (r != ncclSuccess) st = nccl_fail(c, r, "%s: ncclCommGetAsyncError", w->what);
        else if (ae != ncclSuccess && ae != ncclInProgress) st = nccl_fail(c, ae, "%s", w->what);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

static ca_status nccl_work_wait(ca_work_impl *w, int64_t timeout_ms) {
    if (!w) return CA_OK;
    int64_t deadline = timeout_ms < 0 ? -1 : ca_now_ms() + timeout_ms;
    long us = 2;
    for (;;) {
        ca_status st = nccl_work_test(w);
        if (st != CA_IN_PROGRESS) return st;
        if (deadline >= 0 && ca_now_ms() >= deadline)
            return ca_error(CA_ERR_TIMEOUT, "nccl %s (rank %d of %d) not finished within %lld ms", w->what,
                            w->c->rank, w->c->world, (long long)timeout_ms);
        sleep_us(us);
        if (us < 500) us *= 2;
    }
}

/* Frees w, keeping its event for reuse when its work is done. Caller holds mu. */
static void work_free_locked(ca_work_impl *w) {
    nccl_comm *c = w->c;
    bool kept = false;
    /* an event may be re-recorded once its work is done; an unfinished one is dropped */
    if (cudaEventQuery(w->ev) == cudaSuccess) {
        if (c->nevents == c->cap_events) {
            int cap = c->cap_events ? c->cap_events * 2 : 16;
            cudaEvent_t *ne = realloc(c->events, (size_t)cap * sizeof *ne);
            if (ne) {
                c->events = ne;
                c->cap_events = cap;
            }
        }
        if (c->nevents < c->cap_events) {
            c->events[c->nevents++] = w->ev;
            kept = true;
        }
    }
    if (!kept) cudaEventDestroy(w->ev);   /* a pending event is released once it completes */
    cudaGetLastError();
    free(w);
}

static void nccl_work_free(ca_work_impl *w) {
    if (!w) return;
    nccl_comm *c = w->c;
    pthread_mutex_lock(&c->mu);
    work_free_locked(w);
    pthread_mutex_unlock(&c->mu);
}

/* How long abort waits for an issuer to leave mu before it aborts NCCL's communicator under it. */
#define NC_ABORT_GRACE_MS 2000

/* Called by the core (its watchdog thread) when a collective timed out or a peer failed: NCCL's
 * kernels are stopped so that the stream (and every wait on it) finishes.
 *
 * It must not simply lock mu: the thread holding mu may be the issuer of an op whose enqueue is
 * stuck (a peer that never joins), and aborting is how that ends. So `aborted` is raised first:
 * an issuer settling a non-blocking enqueue sees it at its next poll (within a millisecond),
 * stops touching the communicator and releases mu, and so does everyone who takes mu later. Abort
 * then takes mu with trylock for up to NC_ABORT_GRACE_MS and aborts with it held. If an issuer is
 * still inside an NCCL call after that, abort calls ncclCommAbort without mu: that is NCCL's way
 * to end calls blocked on a communicator from another thread (its fault-tolerance section); the
 * issuer, back from NCCL, sees `aborted` and never touches the communicator again. */
static ca_status nccl_abort(void *comm) {
    nccl_comm *c = comm;
    if (!c) return CA_OK;
    if (atomic_exchange(&c->aborted, true)) return CA_OK;
    if (c->gloo) return c->gloo->abort ? c->gloo->abort(c->gc) : CA_OK;   /* gloo's is for another thread */
    cudaSetDevice(c->d->ordinal);
    int64_t until = ca_now_ms() + NC_ABORT_GRACE_MS;
    bool locked;
    while (!(locked = pthread_mutex_trylock(&c->mu) == 0) && ca_now_ms() < until) sleep_us(200);
    if (!locked)
        CA_LOG_W("nccl abort (rank %d of %d): an operation is still inside NCCL after %d ms; aborting the "
                 "communicator under it", c->rank, c->world, NC_ABORT_GRACE_MS);
    /* comm is written only by init (before the communicator is shared) and by destroy */
    ncclComm_t nccl = c->comm;
    ncclResult_t r = nccl ? nc.comm_abort(nccl) : ncclSuccess;
    if (locked) {
        c->comm = NULL;
        pthread_mutex_unlock(&c->mu);
    }
    if (r != ncclSuccess)   /* not nccl_fail: the communicator is gone, ncclGetLastError cannot name it */
        return ca_error(CA_ERR_BACKEND, "nccl abort (rank %d of %d): ncclCommAbort: %s", c->rank, c->world,
                        nc.get_error_string(r));
    return CA_OK;
}

const ca_collective_ops cu_nccl_ops = {
    .struct_size = sizeof(ca_collective_ops),
    .abi_version = CA_ABI_VERSION,
    .name = "nccl",
    .device_names = "cuda",
    .init = nccl_init,
    .destroy = nccl_destroy,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .barrier = nccl_barrier,
    .work_test = nccl_work_test,
    .work_wait = nccl_work_wait,
    .work_free = nccl_work_free,
    .abort = nccl_abort,
    .sendrecv = nccl_sendrecv,
};
