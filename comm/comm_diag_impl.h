/* comm_diag_impl.h: what the communicator (comm.c) and its diagnosis (comm_diag.c) share: the
 * communicator's state, each rank's published record, and the diagnosis entry points. Private to
 * those two files. */
#ifndef CACCEL_COMM_DIAG_IMPL_H
#define CACCEL_COMM_DIAG_IMPL_H

#include "core/device_impl.h"
#include "core/registry_impl.h"
#include "comm/comm_impl.h"
#include "comm/store_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define WATCH_TICK_MS 50
#define CHECK_FIRST_MS 200     /* a wait this old makes the watchdog look at the peers */
#define CHECK_MAX_MS 2000
#define WAIT_SLICE_MS 100      /* the waiting thread looks at the failure flag this often */
#define HIST 1024              /* signatures remembered, for judging late peers */
#define MSG_MAX 2048
#define STATE_MAX 1024
#define LEFT_GRACE_MS 300      /* a peer that destroyed its communicator may be about to exit: wait for its status */
#define BACKEND_SETTLE_MS 200  /* a backend error waits this long for the peer that caused it to show */
#define LINGER_MS 2000         /* a failed rank waits this long at destroy for its peers to report the cause */
#define DRAIN_MS 10000         /* the store's host waits this long at most for its peers to finish its collectives */
#define STALL_MS 1000         /* a store with requests pending and no reply this long has stalled */
#define EXIT_IO_MS 2000        /* the exit announcement gives up on an unreachable store this soon */
#define POSITIONS_MS 4000      /* a timeout's reading of the other ranks' positions ends this soon */

/* Where a rank's process stands with the communicator (rank_state.gone). */
enum { GONE_NO = 0, GONE_LEFT = 1, GONE_EXITED = 2 };

/* A rank's record as published to the store (and as read back from a peer). */
typedef struct rank_state {
    bool valid;
    uint64_t nissued;          /* collectives issued; the last is #nissued-1 */
    ca_coll_sig last;
    bool has_unf;              /* oldest unfinished */
    uint64_t unf;
    ca_coll_sig unf_sig;
    bool waiting;
    uint64_t wseq;
    ca_coll_sig wsig;
    bool has_chk;              /* last checked */
    uint64_t chk;
    ca_coll_sig chk_sig;
    bool aborted;
    int gone;                  /* GONE_*: destroyed its communicator, or its process exited */
    int exit_status;           /* with GONE_EXITED */
    long pid;                  /* who publishes the record, for the liveness check */
    unsigned long long start;
    uint64_t host;
    char addr[48];             /* the address it reaches MASTER_ADDR from ("" unknown): its machine */
    bool dead;                 /* not published: judged here from /proc */
    bool stopped;              /* not published: stopped (SIGSTOP, a debugger), judged here from /proc */
    char reason[STATE_MAX / 2];
} rank_state;

struct ca_work {
    ca_comm *comm;
    ca_work_impl *impl;        /* NULL once finished (or when the backend finished at once) */
    uint64_t seq;
    ca_coll_sig sig;
    int64_t issue_ms;
    bool done;
    bool heap;
    ca_status status;
    struct ca_work *prev, *next;   /* the communicator's unfinished list, in order */
    /* host staging (c->stage): host copies the backend works on, and where the result goes */
    void *st_send, *st_recv;
    void *dev_recv;
    size_t recv_bytes;
    /* the profiler's times (ns; 0: not recorded): issued, the caller began to wait; bytes sent */
    int64_t tr_issue_ns, tr_wait_ns;
    uint64_t tr_bytes;
};

struct ca_comm {
    ca_collective_ops ops;     /* normalised copy */
    void *bc;                  /* backend communicator */
    char backend[32];
    int rank, world, local_rank, local_world;
    ca_device *device;
    bool stage;                /* the backend reduces host memory only: device buffers go through host copies */
    int64_t timeout_ms;
    bool debug;
    bool checked_user;

    ca_store_ref store;        /* ops NULL: no diagnosis (world of one) */
    ca_store_client *own_client;
    ca_store_server *own_server;
    char prefix[96];
    unsigned nsplits;          /* ca_comm_split calls so far: numbers the children's key prefixes */
    _Atomic int ndeferred;     /* collectives recorded in a lazy device's graph, not yet run */
    struct ca_comm *parent;    /* a split's child: its parent, which counts the child's bytes too */
    _Atomic uint64_t split_bytes; /* bytes sent by the communicators split from this one */
    int *global;               /* a split's child: the job's rank of each of its ranks (owned) */
    char name[24];             /* ca_comm_set_name: what the group is to the program ("tp"); "" none */
    bool store_host;           /* this process serves the store (own_server here or on the split's root) */
    bool launch_notes;         /* the store is caccel launch's: leave it a note on failure */

    pthread_mutex_t mu;        /* the record below */
    uint64_t next_seq;
    uint64_t bytes;            /* ca_comm_bytes */
    ca_coll_sig last_sig;
    ca_work *unf_head, *unf_tail;
    bool waiting;
    uint64_t wseq;
    ca_coll_sig wsig;
    int64_t wait_start_ms;
    bool has_chk;
    uint64_t chk;
    ca_coll_sig chk_sig;
    uint64_t version;
    ca_coll_sig hist[HIST];
    int gone, exit_status;     /* GONE_*: what this rank's record announces */

    _Atomic int store_lost;    /* the store answered that it is gone (store_lost_msg says how) */
    char store_lost_msg[MSG_MAX / 2];
    struct ca_comm *live_next; /* the process's communicators, for the exit announcement */

    _Atomic int failed;        /* 0; 2 while the first failure is recorded and told; 1 once told */
    ca_status fail_status;
    char fail_msg[MSG_MAX];
    char fail_hint[512];

    struct fr_coll *fr;        /* the flight recorder's ring of the last fr_n collectives (NULL: off; under mu) */
    uint64_t fr_n;

    pthread_mutex_t pub_mu;    /* one publisher at a time, newest record wins */
    uint64_t published_version;

    pthread_t wd;
    bool wd_running, wd_stop;
    pthread_mutex_t wd_mu;
    pthread_cond_t wd_cv;
};

/* ---------------------------------------------------------------- comm_diag.c */

/* "all_reduce #3 (f32, 16 elements, sum)" */
void ca_comm_diag_fmt_op(uint64_t seq, const ca_coll_sig *s, char *buf, size_t len);
/* "3 s", "250 ms" */
void ca_comm_diag_fmt_duration(int64_t ms, char *buf, size_t len);
/* "0,2" / "0-3" */
void ca_comm_diag_fmt_ranks(const int *r, int n, char *buf, size_t len);
/* The store key of rank's record. */
void ca_comm_diag_state_key(const ca_comm *c, int rank, char *buf, size_t len);
/* Publishes this rank's record when it changed (force: always). */
ca_status ca_comm_diag_publish(ca_comm *c, bool force);
/* The failure recorded on c, as a status with its message (what: the call refused). */
ca_status ca_comm_diag_failed_already(ca_comm *c, const char *what);
ca_status ca_comm_diag_failure(ca_comm *c);
/* Fails c: collective #s (signature x) timed out after waited_ms / its backend failed. Both read
 * the peers' records and say where each rank is. */
ca_status ca_comm_diag_fail_timeout(ca_comm *c, uint64_t s, const ca_coll_sig *x, int64_t waited_ms, bool in_check);
ca_status ca_comm_diag_fail_backend(ca_comm *c, uint64_t s, const ca_coll_sig *x, const char *backend_msg);
/* The checked collectives' rendezvous: waits until every peer is at #s with signature x. */
ca_status ca_comm_diag_precheck(ca_comm *c, uint64_t s, const ca_coll_sig *x, int64_t deadline);
/* The watchdog thread (arg: the communicator): publishes the record, judges the peers during waits. */
void *ca_comm_diag_watchdog_main(void *arg);
/* On a failed communicator: waits until every peer has failed, left or died, at most ms, so that
 * they report the cause before this rank's exit takes the store or the job down. */
void ca_comm_diag_linger(ca_comm *c, int64_t ms);
/* On the store's host, before the store closes: waits until every peer has finished every collective
 * this rank issued (or has failed, left or died), at most DRAIN_MS (the timeout, if shorter), so that
 * no collective that completed here fails on a peer for want of the store. */
void ca_comm_diag_drain(ca_comm *c);
/* The process's live communicators, for the exit announcement (on_exit). */
void ca_comm_diag_live_add(ca_comm *c);
void ca_comm_diag_live_remove(ca_comm *c, bool announce);

/* ---------------------------------------------------------------- flightrec.c */

/* The flight recorder (docs/PROFILING.md, "Flight recorder"): with CACCEL_FLIGHT_RECORDER_DIR set,
 * each communicator keeps its last CACCEL_FLIGHT_RECORDER_ENTRIES collectives (and the process its
 * last kernel calls); every communicator failure writes them to DIR/rank_<r>.json (the newest; each
 * earlier dump kept as rank_<r>.<n>.json), and so do SIGUSR1 (the process goes on), a fatal signal
 * (then its old action) and a SIGTERM (installed only over the default action). Off, c->fr is NULL and
 * the hooks are a branch. */
/* At creation: allocates c->fr when a directory is configured (out of memory: a warning, off). */
void ca_comm_fr_init(ca_comm *c);
/* Under c->mu: collective w was issued / finished with status s. */
void ca_comm_fr_issue(ca_comm *c, const ca_work *w);
void ca_comm_fr_end(ca_comm *c, const ca_work *w, ca_status s);
/* c failed with status s and message msg: writes the dump (a warning when it cannot). Takes c->mu;
 * called without it. */
void ca_comm_fr_dump(ca_comm *c, ca_status s, const char *msg);
void ca_comm_fr_free(ca_comm *c);
/* The watchdog thread of c is about to start (on: by its creator, before pthread_create, so that a
 * SIGTERM before the thread first runs is still left to it) or ends (off, on that thread). */
void ca_comm_fr_watch(ca_comm *c, bool on);
/* Each watchdog tick: after a SIGTERM, writes the dump and ends the process by SIGTERM. */
void ca_comm_fr_tick(ca_comm *c);

/* Rank r of c as the job numbers it: a split's child maps its own ranks (comm.c). */
static inline int ca_comm_grank(const ca_comm *c, int r) {
    return c->global && r >= 0 && r < c->world ? c->global[r] : r;
}

#endif
