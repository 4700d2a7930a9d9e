/* caccel/collective.h: communicators over the collective vtable, with deadlines and desync checks. */
#ifndef CACCEL_COLLECTIVE_H
#define CACCEL_COLLECTIVE_H

#include <caccel/backend.h>
#include <caccel/device.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A group of ranks talking through one collective backend. Created by the
 * accelerator (or directly in tests and tools). Calls on one communicator
 * must come from one thread at a time, in the same order on every rank. */
typedef struct ca_comm ca_comm;
/* An in-flight operation. Owned by the caller: wait (or test until done) and free. */
typedef struct ca_work ca_work;

typedef struct ca_comm_options {
    const char *backend;       /* "single", "mpi", "gloo", "nccl" */
    int rank, world_size;      /* world_size 0: from the process environment */
    int local_rank, local_world_size;
    ca_device *device;         /* where buffers live; NULL = cpu */
    ca_store_ref store;        /* rendezvous store, if the backend needs one */
    int64_t timeout_ms;        /* 0: CACCEL_TIMEOUT or 30 min */
    bool debug;                /* check the signature of every collective */
} ca_comm_options;

/* Creates a communicator. Errors: CA_ERR_NOT_FOUND (backend not built or
 * plugin missing: message names the plugin and the package to install),
 * CA_ERR_TIMEOUT (peers did not arrive: message says which), CA_ERR_BACKEND. */
CA_API ca_status ca_comm_create(const ca_comm_options *opts, ca_comm **out);
CA_API void ca_comm_destroy(ca_comm *c);          /* accepts NULL */
CA_API int ca_comm_rank(const ca_comm *c);
CA_API int ca_comm_size(const ca_comm *c);
CA_API const char *ca_comm_backend(const ca_comm *c);
/* Whether a communicator split from c (ca_comm_split) may run collectives on a second thread while
 * c runs its own on the first: Gloo's may; MPI's when the library gave MPI_THREAD_MULTIPLE; false
 * for a backend that does not say (ABI before 3.4) and for NULL. */
CA_API bool ca_comm_threads_concurrent(const ca_comm *c);
/* Number of collectives issued so far (the sequence number of the next one). */
CA_API uint64_t ca_comm_seq(const ca_comm *c);
CA_API int64_t ca_comm_timeout_ms(const ca_comm *c);
/* Bytes this rank has sent in the collectives issued so far, counted as a bandwidth-optimal ring
 * sends them (nccl-tests' bus bytes): an all-reduce of S bytes 2(N-1)/N * S, an all-gather or a
 * reduce-scatter of a per-rank part of S bytes (N-1) * S, a broadcast S; 0 on one rank. Includes
 * the bytes of the communicators split from c (ca_comm_split), while they exist. */
CA_API uint64_t ca_comm_bytes(const ca_comm *c);

/* Splits `parent` as MPI_Comm_split does. Collective over the parent: every rank of it calls this,
 * in the same order relative to its other collectives, from the thread that uses the parent. Ranks
 * with the same color form one new communicator, ranked by key, ties by parent rank; a negative
 * color joins none (*out = NULL, CA_OK). The child keeps the parent's backend, device, timeout and
 * debug checks, rendezvouses through the parent's store under its own key prefix, and is owned by
 * the caller (ca_comm_destroy it before the parent); its bytes count in the parent's ca_comm_bytes. On backend mpi the child is
 * MPI_Comm_split of the parent's communicator (a group of one too); elsewhere the group's
 * communicator is built over the store and a group of one is a "single" communicator. Errors:
 * those of the gathering collective on the parent (which bounds the wait for a missing rank),
 * CA_ERR_TIMEOUT (a member did not join, named by its rank in the group), the backend's failure to
 * split. Messages name this rank and the parent's key prefix. */
CA_API ca_status ca_comm_split(ca_comm *parent, int color, int key, ca_comm **out);

/* Names what a split's group is to the program ("tp", "dp_replicate": the device mesh's dimensions), at
 * most 23 characters; a failed collective on it then says "(in the tp group of ranks 0, 1 split from
 * ...)", and the profiler's slices of its collectives carry it as `name` (docs/PROFILING.md). Set it
 * before the group's first collective, from the thread that uses it. CA_ERR_INVALID for
 * NULL or a longer name. ca_comm_name: the name, "" when none (and for NULL). */
CA_API ca_status ca_comm_set_name(ca_comm *c, const char *name);
CA_API const char *ca_comm_name(const ca_comm *c);

/* Collectives. `work` NULL: blocking (waits with the communicator's timeout);
 * otherwise *work receives a handle to wait on. A timeout fails with
 * CA_ERR_TIMEOUT naming the operation, its sequence number and the ranks that
 * did not arrive; every later call on the communicator fails at once. */
CA_API ca_status ca_comm_all_reduce(ca_comm *c, const void *send, void *recv, size_t count,
                                    ca_dtype dt, ca_reduce_op op, ca_work **work);
CA_API ca_status ca_comm_broadcast(ca_comm *c, void *buf, size_t count, ca_dtype dt,
                                   int root, ca_work **work);
CA_API ca_status ca_comm_all_gather(ca_comm *c, const void *send, void *recv, size_t count,
                                    ca_dtype dt, ca_work **work);
CA_API ca_status ca_comm_reduce_scatter(ca_comm *c, const void *send, void *recv,
                                        size_t count, ca_dtype dt, ca_reduce_op op,
                                        ca_work **work);
CA_API ca_status ca_comm_barrier(ca_comm *c, ca_work **work);

/* Point-to-point, between ranks of c (not collective: only the two ends call, each side's calls on
 * c numbered among its collectives). ca_comm_sendrecv sends send_count elements to rank dst and
 * receives recv_count elements from rank src, both in flight together: every rank of a ring may
 * call it with its right and left neighbours at once without deadlock. dst < 0 sends nothing, src <
 * 0 receives nothing; ca_comm_send and ca_comm_recv are the one-sided forms. Messages from one rank
 * to another are matched in issue order; the receiver's count must equal the sender's
 * (CA_ERR_BACKEND otherwise, where the backend can tell). send and recv must not overlap. Errors as
 * the collectives' (a dead or hung peer ends the call within the communicator's timeout), with
 * the peer ranks and the group named; CA_ERR_UNSUPPORTED for a backend without point-to-point;
 * CA_ERR_INVALID for a peer outside the communicator or this rank itself. */
CA_API ca_status ca_comm_sendrecv(ca_comm *c, const void *send, size_t send_count, int dst, void *recv,
                                  size_t recv_count, int src, ca_dtype dt, ca_work **work);
CA_API ca_status ca_comm_send(ca_comm *c, const void *buf, size_t count, ca_dtype dt, int dst, ca_work **work);
CA_API ca_status ca_comm_recv(ca_comm *c, void *buf, size_t count, ca_dtype dt, int src, ca_work **work);

/* Waits for the work (timeout_ms < 0: the communicator's timeout). */
CA_API ca_status ca_work_wait(ca_work *w, int64_t timeout_ms);
/* CA_OK when done, CA_IN_PROGRESS when not, <0 on failure. */
CA_API ca_status ca_work_test(ca_work *w);
CA_API void ca_work_free(ca_work *w);             /* accepts NULL; waits first if needed */

#ifdef __cplusplus
}
#endif
#endif
