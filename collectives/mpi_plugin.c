/* The MPI collective plugin: nonblocking MPI collectives with deadline polling, 16-bit floats reduced in f32. */
#include <caccel/backend.h>
#include <caccel/log.h>

#include "base/avg_impl.h"
#include "collectives/half_reduce_impl.h"

#include <mpi.h>

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * Threading: caccel may wait on a work handle from another thread than the
 * one that issued it, so every MPI call here is made under one lock, which
 * MPI_THREAD_SERIALIZED allows. caccel asks for MPI_THREAD_MULTIPLE all the
 * same: then two communicators may run collectives on two threads at once
 * (an asynchronous save_state's writer), each call still under the lock,
 * which keeps the calls of one operation together. Progress: Open MPI advances a nonblocking
 * collective only inside MPI calls, so a wait polls MPI_Testall, yielding the
 * CPU between polls and sleeping briefly once it has waited long.
 */

/* Largest element count handed to one MPI call (MPI counts are int). */
#define CHUNK_MAX (1 << 30)
#define P2P_TAG 0x6361     /* every point-to-point message (matched in order between two ranks) */
#define SPIN_MS 1000       /* then poll with short sleeps */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static bool g_ready;           /* MPI initialised (by us or the program) and checked */
static bool g_we_init;
static atomic_bool g_any_aborted;
static MPI_Op g_ops16[2][3];   /* [f16, bf16][sum, min, max] */
static char g_version[256] = "MPI";
static int g_provided = MPI_THREAD_SINGLE;   /* the thread level MPI gave (set once g_ready) */

typedef struct mpi_comm {
    MPI_Comm comm;
    int rank, size;
    bool oversubscribed;       /* more local ranks than cores: never spin without yielding */
    atomic_bool aborted;
} mpi_comm;

struct ca_work_impl {
    mpi_comm *c;
    int nreq;
    MPI_Request *reqs;
    MPI_Request one;
    bool done;
    const char *what;
    /* after completion: divide recv by the world size (AVG) */
    void *avg_buf;
    size_t avg_count;
    ca_dtype dt;
    void *tmp;                 /* a staging copy of the input, freed at the end */
};

/* MPI user operations for fp16/bf16 (inout = in op inout), on the plugins' shared reductions. */
#define RED16(name, dt, op)                                                          \
    static void name(void *in, void *inout, int *len, MPI_Datatype *t) {            \
        (void)t;                                                                     \
        ca_half_reducer(dt, op)(inout, in, inout, (size_t)*len);                     \
    }
RED16(sum_f16, CA_F16, 0)
RED16(min_f16, CA_F16, 1)
RED16(max_f16, CA_F16, 2)
RED16(sum_bf16, CA_BF16, 0)
RED16(min_bf16, CA_BF16, 1)
RED16(max_bf16, CA_BF16, 2)

/* ------------------------------------------------------------------ errors */

static ca_status mpi_fail(int rc, const char *what, const mpi_comm *c) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    else s[len] = '\0';
    if (c) return ca_error(CA_ERR_BACKEND, "%s failed on rank %d of %d (backend mpi): %s", what, c->rank, c->size, s);
    return ca_error(CA_ERR_BACKEND, "%s failed (backend mpi): %s", what, s);
}

#define CA_MPI_TRY(call, what, c)                                                    \
    do {                                                                             \
        int rc_ = (call);                                                            \
        if (rc_ != MPI_SUCCESS) {                                                    \
            st = mpi_fail(rc_, (what), (c));                                         \
            goto cleanup;                                                            \
        }                                                                            \
    } while (0)

/*
 * The end of the process. MPI_Finalize waits for every rank, so a rank that
 * exits while the others wait in a collective (a failed CA_CHECK calls exit(1))
 * would sit in it while they wait for the collective timeout, and mpirun would
 * then blame another rank. A failing exit therefore leaves at once with its
 * status and without MPI_Finalize, naming the rank, and mpirun stops the job
 * (a process exited non-zero); so does any exit after a communicator failed
 * (its operations may be in flight, which would hang MPI_Finalize). Not
 * MPI_Abort: several ranks calling it at once while one sat in MPI_Finalize
 * hung Open MPI 4.1's mpirun after every rank had exited (1 job in 7). The
 * communicators' exit announcement (comm/comm_diag.c) is registered later, so
 * it runs first. A clean exit finalises, when caccel initialised MPI; the
 * other ranks learn of it through the store, fail, and their exit ends the job.
 */
static void mpi_at_exit(int status, void *arg) {
    (void)arg;
    int fin = 0, init = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin) return;
    bool aborted = atomic_load(&g_any_aborted);
    if (status != 0 || aborted) {
        int rank = -1;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        fprintf(stderr, "caccel: rank %d exits with status %d%s: leaving without MPI_Finalize so that mpirun "
                "stops the other ranks now\n", rank, status, aborted ? " after a failed collective" : "");
        fflush(NULL);
        _exit(status != 0 ? status : 1);
    }
    if (g_we_init) MPI_Finalize();
}

static const char *level_name(int l) {
    switch (l) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "?";
    }
}

/* Initialises MPI if the program has not; checks the thread level. Caller holds g_mu. */
static ca_status ensure_mpi(void) {
    if (g_ready) return CA_OK;
    ca_status st = CA_OK;
    int init = 0, fin = 0, provided = MPI_THREAD_SINGLE;
    MPI_Finalized(&fin);
    if (fin) return ca_error(CA_ERR_STATE, "MPI was already finalised in this process (backend mpi)");
    MPI_Initialized(&init);
    if (!init) {
        /* Open MPI's nonblocking all-reduce picks a binomial tree below 4 ranks, which halves the
         * bandwidth of large reductions; Rabenseifner's algorithm (reduce-scatter + all-gather)
         * matches the blocking MPI_Allreduce. The user's own choice (env or mpirun --mca) wins. */
        setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
        CA_MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread", NULL);
        g_we_init = true;
    } else {
        CA_MPI_TRY(MPI_Query_thread(&provided), "MPI_Query_thread", NULL);
    }
    static bool hooked;
    if (!hooked) hooked = on_exit(mpi_at_exit, NULL) == 0;
    if (provided < MPI_THREAD_SERIALIZED) {
        ca_error(CA_ERR_UNSUPPORTED, "MPI runs at thread level %s; caccel needs MPI_THREAD_SERIALIZED or higher "
                 "(it may wait on an operation from another thread)", level_name(provided));
        ca_error_hint(g_we_init ? "this MPI library cannot provide it; rebuild MPI with thread support"
                                : "initialise MPI with MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...), or let "
                                  "caccel initialise it");
        return CA_ERR_UNSUPPORTED;
    }
    MPI_User_function *fns[2][3] = { { sum_f16, min_f16, max_f16 }, { sum_bf16, min_bf16, max_bf16 } };
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < 3; o++) CA_MPI_TRY(MPI_Op_create(fns[t][o], 1, &g_ops16[t][o]), "MPI_Op_create", NULL);
    g_provided = provided;
    g_ready = true;
cleanup:
    return st;
}

/* ------------------------------------------------------------ communicator */

static ca_status mpi_init(const ca_comm_init_args *args, void **out) {
    *out = NULL;
    ca_status st = CA_OK;
    mpi_comm *c = calloc(1, sizeof *c);
    if (!c) return ca_error(CA_ERR_NOMEM, "out of memory (backend mpi)");
    c->comm = MPI_COMM_NULL;
    pthread_mutex_lock(&g_mu);
    st = ensure_mpi();
    if (st != CA_OK) goto cleanup;
    CA_MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &c->comm), "MPI_Comm_dup", NULL);
    /* errors come back as codes, never abort the job from inside a library */
    CA_MPI_TRY(MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", NULL);
    CA_MPI_TRY(MPI_Comm_rank(c->comm, &c->rank), "MPI_Comm_rank", NULL);
    CA_MPI_TRY(MPI_Comm_size(c->comm, &c->size), "MPI_Comm_size", NULL);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    c->oversubscribed = cores > 0 && args->local_world_size > cores;
    if (c->rank != args->rank || c->size != args->world_size) {
        st = ca_error(CA_ERR_CONFIG, "MPI says this is rank %d of %d, but the communicator was asked for rank %d of "
                      "%d (backend mpi)", c->rank, c->size, args->rank, args->world_size);
        ca_error_hint("under mpirun, let caccel read rank and size from the MPI environment (world_size 0)");
        goto cleanup;
    }
cleanup:
    if (st != CA_OK && c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
    pthread_mutex_unlock(&g_mu);
    if (st != CA_OK) {
        free(c);
        return st;
    }
    *out = c;
    return CA_OK;
}

/* MPI_Comm_split of the parent: blocking, but the core calls it only once every rank of the parent
 * has reached the split (its colors were gathered with a deadline), so no peer is missing. */
static ca_status mpi_split(void *comm, int color, int key, const ca_comm_init_args *args, void **out) {
    mpi_comm *p = comm;
    *out = NULL;
    ca_status st = CA_OK;
    mpi_comm *c = calloc(1, sizeof *c);
    if (!c) return ca_error(CA_ERR_NOMEM, "out of memory (backend mpi)");
    c->comm = MPI_COMM_NULL;
    pthread_mutex_lock(&g_mu);
    CA_MPI_TRY(MPI_Comm_split(p->comm, color < 0 ? MPI_UNDEFINED : color, key, &c->comm), "MPI_Comm_split", NULL);
    if (c->comm == MPI_COMM_NULL) goto cleanup;   /* this rank joins no group */
    CA_MPI_TRY(MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", NULL);
    CA_MPI_TRY(MPI_Comm_rank(c->comm, &c->rank), "MPI_Comm_rank", NULL);
    CA_MPI_TRY(MPI_Comm_size(c->comm, &c->size), "MPI_Comm_size", NULL);
    c->oversubscribed = p->oversubscribed;
    if (c->rank != args->rank || c->size != args->world_size)
        st = ca_error(CA_ERR_STATE, "MPI_Comm_split made rank %d of %d, the core expected rank %d of %d (backend mpi, "
                      "color %d)", c->rank, c->size, args->rank, args->world_size, color);
cleanup:
    if ((st != CA_OK || color < 0) && c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
    pthread_mutex_unlock(&g_mu);
    if (st != CA_OK || color < 0) {
        free(c);
        return st;
    }
    *out = c;
    return CA_OK;
}

static void mpi_destroy(void *comm) {
    mpi_comm *c = comm;
    if (!c) return;
    /* An aborted communicator may still have operations in flight: leave it to the process's end. */
    if (!atomic_load(&c->aborted)) {
        pthread_mutex_lock(&g_mu);
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin && c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
        pthread_mutex_unlock(&g_mu);
        free(c);
    }
}

static ca_status mpi_abort(void *comm) {
    mpi_comm *c = comm;
    atomic_store(&c->aborted, true);
    atomic_store(&g_any_aborted, true);
    return CA_OK;
}

static ca_status dtype_of(ca_dtype dt, MPI_Datatype *out, const char *what) {
    switch (dt) {
    case CA_F32: *out = MPI_FLOAT; return CA_OK;
    case CA_F16:
    case CA_BF16: *out = MPI_UINT16_T; return CA_OK;
    case CA_I32: *out = MPI_INT32_T; return CA_OK;
    case CA_I64: *out = MPI_INT64_T; return CA_OK;
    case CA_U8: *out = MPI_UINT8_T; return CA_OK;
    default: return ca_error(CA_ERR_INVALID, "%s: dtype %d is not supported by backend mpi", what, (int)dt);
    }
}

static ca_status op_of(ca_dtype dt, ca_reduce_op op, MPI_Op *out, const char *what) {
    if (dt == CA_F16 || dt == CA_BF16) {
        int t = dt == CA_F16 ? 0 : 1;
        switch (op) {
        case CA_OP_SUM:
        case CA_OP_AVG: *out = g_ops16[t][0]; return CA_OK;
        case CA_OP_MIN: *out = g_ops16[t][1]; return CA_OK;
        case CA_OP_MAX: *out = g_ops16[t][2]; return CA_OK;
        }
    } else {
        switch (op) {
        case CA_OP_SUM:
        case CA_OP_AVG: *out = MPI_SUM; return CA_OK;
        case CA_OP_MIN: *out = MPI_MIN; return CA_OK;
        case CA_OP_MAX: *out = MPI_MAX; return CA_OK;
        }
    }
    return ca_error(CA_ERR_INVALID, "%s: unknown reduce op %d (backend mpi)", what, (int)op);
}

static ca_work_impl *work_new(mpi_comm *c, int nreq, const char *what) {
    ca_work_impl *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->c = c;
    w->what = what;
    w->nreq = nreq;
    if (nreq <= 1) {
        w->reqs = &w->one;
    } else {
        w->reqs = calloc((size_t)nreq, sizeof *w->reqs);
        if (!w->reqs) {
            free(w);
            return NULL;
        }
    }
    for (int i = 0; i < nreq; i++) w->reqs[i] = MPI_REQUEST_NULL;
    return w;
}

static void work_release(ca_work_impl *w) {
    if (!w) return;
    if (w->reqs != &w->one) free(w->reqs);
    free(w->tmp);
    free(w);
}

static ca_status alive(mpi_comm *c, const char *what) {
    if (atomic_load(&c->aborted))
        return ca_error(CA_ERR_STATE, "%s on an aborted communicator (backend mpi, rank %d)", what, c->rank);
    return CA_OK;
}

static ca_status mpi_all_reduce(void *comm, const void *send, void *recv, size_t count, ca_dtype dt,
                                ca_reduce_op op, ca_work_impl **work) {
    mpi_comm *c = comm;
    *work = NULL;
    ca_status st = alive(c, "all_reduce");
    if (st != CA_OK) return st;
    MPI_Datatype t;
    MPI_Op mop;
    if ((st = dtype_of(dt, &t, "all_reduce")) != CA_OK) return st;
    pthread_mutex_lock(&g_mu);
    if ((st = op_of(dt, op, &mop, "all_reduce")) != CA_OK) {
        pthread_mutex_unlock(&g_mu);
        return st;
    }
    size_t es = ca_dtype_size(dt);
    int nreq = count == 0 ? 1 : (int)((count + CHUNK_MAX - 1) / CHUNK_MAX);
    ca_work_impl *w = work_new(c, nreq, "MPI_Iallreduce");
    if (!w) {
        pthread_mutex_unlock(&g_mu);
        return ca_error(CA_ERR_NOMEM, "out of memory (backend mpi)");
    }
    if (op == CA_OP_AVG) {
        w->avg_buf = recv;
        w->avg_count = count;
        w->dt = dt;
    }
    for (int i = 0; i < nreq; i++) {
        size_t off = (size_t)i * CHUNK_MAX, n = count - off < CHUNK_MAX ? count - off : CHUNK_MAX;
        if (count == 0) n = 0;
        const void *sb = send == recv ? MPI_IN_PLACE : (const char *)send + off * es;
        CA_MPI_TRY(MPI_Iallreduce(sb, (char *)recv + off * es, (int)n, t, mop, c->comm, &w->reqs[i]),
                   "MPI_Iallreduce", c);
    }
cleanup:
    pthread_mutex_unlock(&g_mu);
    if (st != CA_OK) {
        /* requests already posted stay with MPI; the core aborts the communicator */
        work_release(w);
        return st;
    }
    *work = w;
    return CA_OK;
}

static ca_status mpi_broadcast(void *comm, void *buf, size_t count, ca_dtype dt, int root, ca_work_impl **work) {
    mpi_comm *c = comm;
    *work = NULL;
    ca_status st = alive(c, "broadcast");
    if (st != CA_OK) return st;
    if (root < 0 || root >= c->size)
        return ca_error(CA_ERR_INVALID, "broadcast: root %d outside 0..%d (backend mpi)", root, c->size - 1);
    MPI_Datatype t;
    if ((st = dtype_of(dt, &t, "broadcast")) != CA_OK) return st;
    size_t es = ca_dtype_size(dt);
    int nreq = count == 0 ? 1 : (int)((count + CHUNK_MAX - 1) / CHUNK_MAX);
    ca_work_impl *w = work_new(c, nreq, "MPI_Ibcast");
    if (!w) return ca_error(CA_ERR_NOMEM, "out of memory (backend mpi)");
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < nreq; i++) {
        size_t off = (size_t)i * CHUNK_MAX, n = count == 0 ? 0 : (count - off < CHUNK_MAX ? count - off : CHUNK_MAX);
        CA_MPI_TRY(MPI_Ibcast((char *)buf + off * es, (int)n, t, root, c->comm, &w->reqs[i]), "MPI_Ibcast", c);
    }
cleanup:
    pthread_mutex_unlock(&g_mu);
    if (st != CA_OK) {
        work_release(w);
        return st;
    }
    *work = w;
    return CA_OK;
}

static ca_status mpi_all_gather(void *comm, const void *send, void *recv, size_t count, ca_dtype dt,
                                ca_work_impl **work) {
    mpi_comm *c = comm;
    *work = NULL;
    ca_status st = alive(c, "all_gather");
    if (st != CA_OK) return st;
    if (count > INT_MAX)
        return ca_error(CA_ERR_UNSUPPORTED, "all_gather of %zu elements per rank: backend mpi takes at most %d",
                        count, INT_MAX);
    MPI_Datatype t;
    if ((st = dtype_of(dt, &t, "all_gather")) != CA_OK) return st;
    size_t es = ca_dtype_size(dt), bytes = count * es;
    ca_work_impl *w = work_new(c, 1, "MPI_Iallgather");
    if (!w) return ca_error(CA_ERR_NOMEM, "out of memory (backend mpi)");
    const char *mine = (const char *)recv + (size_t)c->rank * bytes;
    const void *sb = send;
    if (send == mine && count) {
        sb = MPI_IN_PLACE;
    } else if (count && (const char *)send < (const char *)recv + (size_t)c->size * bytes &&
               (const char *)send + bytes > (const char *)recv) {
        /* overlapping but not in place: stage the input */
        w->tmp = malloc(bytes);
        if (!w->tmp) {
            work_release(w);
            return ca_error(CA_ERR_NOMEM, "out of memory (backend mpi)");
        }
        memcpy(w->tmp, send, bytes);
        sb = w->tmp;
    }
    pthread_mutex_lock(&g_mu);
    CA_MPI_TRY(MPI_Iallgather(sb, (int)count, t, recv, (int)count, t, c->comm, &w->reqs[0]), "MPI_Iallgather", c);
cleanup:
    pthread_mutex_unlock(&g_mu);
    if (st != CA_OK) {
        work_release(w);
        return st;
    }
    *work = w;
    return CA_OK;
}

static ca_status mpi_reduce_scatter(void *comm, const void *send, void *recv, size_t count, ca_dtype dt,
                                    ca_reduce_op op, ca_work_impl **work) {
    mpi_comm *c = comm;
    *work = NULL;
    ca_status st = alive(c, "reduce_scatter");
    if (st != CA_OK) return st;
    if (count > INT_MAX)
        return ca_error(CA_ERR_UNSUPPORTED, "reduce_scatter of %zu elements per rank: backend mpi takes at most %d",
                        count, INT_MAX);
    MPI_Datatype t;
    MPI_Op mop;
    if ((st = dtype_of(dt, &t, "reduce_scatter")) != CA_OK) return st;
    size_t es = ca_dtype_size(dt), bytes = count * es;
    ca_work_impl *w = work_new(c, 1, "MPI_Ireduce_scatter_block");
    if (!w) return ca_error(CA_ERR_NOMEM, "out of memory (backend mpi)");
    if (op == CA_OP_AVG) {
        w->avg_buf = recv;
        w->avg_count = count;
        w->dt = dt;
    }
    const void *sb = send;
    if (send == recv) {
        sb = MPI_IN_PLACE;
    } else if (count && (const char *)send < (const char *)recv + bytes &&
               (const char *)send + bytes * (size_t)c->size > (const char *)recv) {
        w->tmp = malloc(bytes * (size_t)c->size);
        if (!w->tmp) {
            work_release(w);
            return ca_error(CA_ERR_NOMEM, "out of memory (backend mpi)");
        }
        memcpy(w->tmp, send, bytes * (size_t)c->size);
        sb = w->tmp;
    }
    pthread_mutex_lock(&g_mu);
    if ((st = op_of(dt, op, &mop, "reduce_scatter")) != CA_OK) goto cleanup;
    CA_MPI_TRY(MPI_Ireduce_scatter_block(sb, recv, (int)count, t, mop, c->comm, &w->reqs[0]),
               "MPI_Ireduce_scatter_block", c);
cleanup:
    pthread_mutex_unlock(&g_mu);
    if (st != CA_OK) {
        work_release(w);
        return st;
    }
    *work = w;
    return CA_OK;
}

static ca_status mpi_barrier(void *comm, ca_work_impl **work) {
    mpi_comm *c = comm;
    *work = NULL;
    ca_status st = alive(c, "barrier");
    if (st != CA_OK) return st;
    ca_work_impl *w = work_new(c, 1, "MPI_Ibarrier");
    if (!w) return ca_error(CA_ERR_NOMEM, "out of memory (backend mpi)");
    pthread_mutex_lock(&g_mu);
    CA_MPI_TRY(MPI_Ibarrier(c->comm, &w->reqs[0]), "MPI_Ibarrier", c);
cleanup:
    pthread_mutex_unlock(&g_mu);
    if (st != CA_OK) {
        work_release(w);
        return st;
    }
    *work = w;
    return CA_OK;
}

/* AVG: the sum divided by the world size (integers: truncated toward zero). */
static void finish_avg(ca_work_impl *w) {
    size_t n = w->avg_count;
    int p = w->c->size;
    switch (w->dt) {
    case CA_F32:
        ca_avg_f32(w->avg_buf, n, p);
        break;
    case CA_F16:
    case CA_BF16:
        ca_half_divide(w->dt, w->avg_buf, n, p);
        break;
    case CA_I32: {
        int32_t *x = w->avg_buf;
        for (size_t i = 0; i < n; i++) x[i] /= p;
        break;
    }
    case CA_I64: {
        int64_t *x = w->avg_buf;
        for (size_t i = 0; i < n; i++) x[i] /= p;
        break;
    }
    case CA_U8: {
        uint8_t *x = w->avg_buf;
        for (size_t i = 0; i < n; i++) x[i] = (uint8_t)(x[i] / p);
        break;
    }
    default:
        break;
    }
}

/* One poll. CA_OK done, CA_IN_PROGRESS not yet, else failed. */
static ca_status poll_once(ca_work_impl *w) {
    if (w->done) return CA_OK;
    if (atomic_load(&w->c->aborted))
        return ca_error(CA_ERR_STATE, "%s abandoned: the communicator was aborted (backend mpi, rank %d)", w->what,
                        w->c->rank);
    int flag = 0;
    pthread_mutex_lock(&g_mu);
    int rc = MPI_Testall(w->nreq, w->reqs, &flag, MPI_STATUSES_IGNORE);
    pthread_mutex_unlock(&g_mu);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, w->what, w->c);
    if (!flag) return CA_IN_PROGRESS;
    if (w->avg_buf) finish_avg(w);
    w->done = true;
    return CA_OK;
}

static ca_status mpi_work_test(ca_work_impl *w) { return poll_once(w); }

static ca_status mpi_work_wait(ca_work_impl *w, int64_t timeout_ms) {
    int64_t start = ca_now_ms(), deadline = timeout_ms < 0 ? INT64_MAX : start + timeout_ms;
    for (;;) {
        ca_status s = poll_once(w);
        if (s != CA_IN_PROGRESS) return s;
        int64_t now = ca_now_ms();
        if (now >= deadline)
            return ca_error(CA_ERR_TIMEOUT, "%s not complete after %lld ms (backend mpi, rank %d)", w->what,
                            (long long)(now - start), w->c->rank);
        /* MPI's own blocking calls spin too; yield only when the cores are shared */
        if (now - start < SPIN_MS) {
            if (w->c->oversubscribed || now - start > 1) sched_yield();
        } else {
            usleep(200);
        }
    }
}

static void mpi_work_free(ca_work_impl *w) {
    if (!w) return;
    if (!w->done && !atomic_load(&w->c->aborted)) {
        /* an unfinished request must not be dropped: MPI would write into freed memory later */
        pthread_mutex_lock(&g_mu);
        MPI_Waitall(w->nreq, w->reqs, MPI_STATUSES_IGNORE);
        pthread_mutex_unlock(&g_mu);
    } else if (!w->done) {
        return;   /* aborted: MPI may still own the buffers; leak rather than corrupt */
    }
    work_release(w);
}

/* Another communicator may run on a second thread at once only under MPI_THREAD_MULTIPLE (the
 * lock alone would serialise the calls, but MPI_THREAD_SERIALIZED does not promise that two
 * threads' outstanding operations on two communicators progress together). */
static bool mpi_threads_concurrent(void *comm) {
    (void)comm;
    return g_provided == MPI_THREAD_MULTIPLE;
}

/* MPI_Isend and MPI_Irecv, both posted before either is waited for (what MPI_Sendrecv does, without
 * blocking); one tag, as MPI's non-overtaking rule matches the messages between two ranks in order. */
static ca_status mpi_sendrecv(void *comm, const void *send, size_t send_count, int dst, void *recv, size_t recv_count,
                              int src, ca_dtype dt, ca_work_impl **work) {
    mpi_comm *c = comm;
    *work = NULL;
    ca_status st = alive(c, "sendrecv");
    if (st != CA_OK) return st;
    if (send_count > INT_MAX || recv_count > INT_MAX)
        return ca_error(CA_ERR_UNSUPPORTED, "sendrecv of %zu / %zu elements: backend mpi takes at most %d", send_count,
                        recv_count, INT_MAX);
    MPI_Datatype t;
    if ((st = dtype_of(dt, &t, "sendrecv")) != CA_OK) return st;
    ca_work_impl *w = work_new(c, 2, "MPI_Isend/MPI_Irecv");
    if (!w) return ca_error(CA_ERR_NOMEM, "out of memory (backend mpi)");
    pthread_mutex_lock(&g_mu);
    if (src >= 0)
        CA_MPI_TRY(MPI_Irecv(recv, (int)recv_count, t, src, P2P_TAG, c->comm, &w->reqs[0]), "MPI_Irecv", c);
    if (dst >= 0)
        CA_MPI_TRY(MPI_Isend(send, (int)send_count, t, dst, P2P_TAG, c->comm, &w->reqs[1]), "MPI_Isend", c);
cleanup:
    pthread_mutex_unlock(&g_mu);
    if (st != CA_OK) {
        work_release(w);
        return ca_error_context("sendrecv (to rank %d, from rank %d of this communicator)", dst, src);
    }
    *work = w;
    return CA_OK;
}

static const ca_collective_ops mpi_ops = {
    .struct_size = sizeof(ca_collective_ops),
    .abi_version = CA_ABI_VERSION,
    .name = "mpi",
    .device_names = "cpu",
    .init = mpi_init,
    .destroy = mpi_destroy,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .barrier = mpi_barrier,
    .work_test = mpi_work_test,
    .work_wait = mpi_work_wait,
    .work_free = mpi_work_free,
    .abort = mpi_abort,
    .split = mpi_split,
    .needs_mpi_launcher = true,
    .threads_concurrent = mpi_threads_concurrent,
    .sendrecv = mpi_sendrecv,
};

static const ca_collective_ops *const mpi_list[] = { &mpi_ops };

/* Usable when an MPI launcher started this process, or the program initialised MPI itself. */
static int mpi_score(char *reason, size_t len) {
    static const char *const vars[] = { "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS",
                                        "PMI_RANK" };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 10;
    int init = 0;
    MPI_Initialized(&init);
    if (init) return 10;
    snprintf(reason, len, "not started by an MPI launcher (mpirun/mpiexec/srun --mpi): none of "
                          "OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK is set");
    return 0;
}

static ca_plugin mpi_plugin = {
    .struct_size = sizeof(ca_plugin),
    .abi_version = CA_ABI_VERSION,
    .name = "mpi",
    .version = g_version,
    .num_devices = 0,
    .devices = NULL,
    .num_collectives = 1,
    .collectives = mpi_list,
    .score = mpi_score,
};

CA_PLUGIN_EXPORT const ca_plugin *ca_plugin_init(void);
CA_PLUGIN_EXPORT const ca_plugin *ca_plugin_init(void) {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(v, &len) == MPI_SUCCESS && len > 0) {
        v[len < (int)sizeof v ? len : (int)sizeof v - 1] = '\0';
        char *nl = strpbrk(v, "\r\n,");
        if (nl) *nl = '\0';
        snprintf(g_version, sizeof g_version, "%s", v);
    }
    return &mpi_plugin;
}
