/* comm_impl.h: private communicator API: signature checks for user-level calls, store ownership, op names. */
#ifndef CACCEL_COMM_IMPL_H
#define CACCEL_COMM_IMPL_H

#include <caccel/collective.h>
#include "comm/procenv_impl.h"

#include <stdbool.h>
#include <stdint.h>

struct ca_store_client;
struct ca_store_server;

/* The collectives, as named in messages ("all_reduce #12 (f32, 1,024 elements, sum)"). */
typedef enum ca_coll_kind {
    CA_COLL_NONE = 0,
    CA_COLL_ALL_REDUCE,
    CA_COLL_BROADCAST,
    CA_COLL_ALL_GATHER,
    CA_COLL_REDUCE_SCATTER,
    CA_COLL_BARRIER,
    CA_COLL_SENDRECV,   /* point-to-point (send, recv, sendrecv): root the peer sent to, redop the one received
                         * from (job ranks, -1 none), count the elements sent (received when none are) */
    CA_COLL_KIND_COUNT
} ca_coll_kind;

/* What every rank must agree on for one collective. Fields that do not apply
 * to the kind are zero (root -1). */
typedef struct ca_coll_sig {
    ca_coll_kind kind;
    int dtype;          /* ca_dtype, -1 for barrier */
    int redop;          /* ca_reduce_op, -1 where none */
    int root;           /* broadcast root, -1 where none */
    uint64_t count;     /* elements (per rank for all_gather / reduce_scatter) */
} ca_coll_sig;

const char *ca_coll_kind_name(ca_coll_kind k);
/* "all_reduce(f32, 301,056, sum)" */
void ca_coll_sig_format(const ca_coll_sig *s, char *buf, size_t len);

/* While on, every collective on c is signature-checked before it moves data,
 * as barrier, broadcast and all_gather always are (the accelerator turns it
 * on around user-level gather/reduce calls). Returns the previous setting. */
bool ca_comm_set_checked(ca_comm *c, bool on);

/* ca_comm_create over a store made for this communicator from the process
 * environment (ca_comm_create_from_env): client (required) and server (may be
 * NULL) are closed with the communicator, also when creation fails, and the
 * communicator's store keys are numbered among such communicators in creation
 * order, which is the same on every rank. */
ca_status ca_comm_create_owning(const ca_comm_options *opts, struct ca_store_client *client,
                                struct ca_store_server *server, ca_comm **out);

/* ca_comm_split, the child's buffers in host memory (the cpu device) whatever the parent's device:
 * for a thread that exchanges a few host values while the parent's collectives are recorded or
 * enqueued on a device (the lazy xla device's graph, CUDA streams). The child's backend is the
 * parent's where that one reduces on host memory (gloo, mpi), else Gloo over the parent's store
 * (nccl). Collective over the parent, as ca_comm_split. */
ca_status ca_comm_split_host(ca_comm *parent, int color, int key, ca_comm **out);

/* True once c failed (timeout, desync, peer failure) or was aborted. */
bool ca_comm_is_aborted(const ca_comm *c);
/* The rendezvous store of a job started by caccel launch (ops NULL otherwise): an elastic job's processes
 * read and leave the launcher's notes there (accelerator/state.c). Borrowed: the communicator owns it. */
ca_store_ref ca_comm_launch_store(const ca_comm *c);

/* Default communicator timeout: CACCEL_TIMEOUT (seconds) or 1800 s. */
int64_t ca_comm_default_timeout_ms(void);

/* Creates the communicator for pe: picks the backend (see above), loads its
 * plugin (a missing one fails with CA_ERR_NOT_FOUND naming the plugin file and
 * the Debian package to install), connects the store when the backend needs
 * one. timeout_ms 0: the default (CACCEL_TIMEOUT or 30 min). */
ca_status ca_comm_create_from_env(const ca_procenv *pe, const char *backend, ca_device *device,
                                  int64_t timeout_ms, bool debug, ca_comm **out);

/* The error for a collective backend that is not available: plugin file,
 * Debian package, and the registry's reason. Returns CA_ERR_NOT_FOUND. */
ca_status ca_comm_backend_missing(const char *backend);

#endif
