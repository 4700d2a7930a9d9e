/* Communicators: sequence numbers, deadlines, host staging, creation and destruction. The desync and
 * hang diagnosis is in comm_diag.c. */
#include "comm/comm_diag_impl.h"
#include "base/trace_impl.h"
#include "comm/procenv_impl.h"
#include "core/registry_impl.h"

#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>


int ca_comm_rank(const ca_comm *c) { return c ? c->rank : -1; }
int ca_comm_size(const ca_comm *c) { return c ? c->world : 0; }
const char *ca_comm_backend(const ca_comm *c) { return c ? c->backend : "?"; }
int64_t ca_comm_timeout_ms(const ca_comm *c) { return c ? c->timeout_ms : 0; }
bool ca_comm_threads_concurrent(const ca_comm *c) {
    return c && c->ops.threads_concurrent && c->ops.threads_concurrent(c->bc);
}
bool ca_comm_is_aborted(const ca_comm *c) { return c && atomic_load(&c->failed); }

ca_store_ref ca_comm_launch_store(const ca_comm *c) {
    ca_store_ref none = {0};
    return c && c->launch_notes ? c->store : none;
}

uint64_t ca_comm_seq(const ca_comm *c) {
    if (!c) return 0;
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    uint64_t s = c->next_seq;
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
    return s;
}

uint64_t ca_comm_bytes(const ca_comm *c) {
    if (!c) return 0;
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    uint64_t b = c->bytes;
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
    return b + atomic_load(&((ca_comm *)c)->split_bytes);
}

bool ca_comm_set_checked(ca_comm *c, bool on) {
    if (!c) return false;
    bool old = c->checked_user;
    c->checked_user = on;
    return old;
}

/* ------------------------------------------------------------- collectives */

static void unf_remove(ca_comm *c, ca_work *w) {
    if (w->prev) w->prev->next = w->next;
    else c->unf_head = w->next;
    if (w->next) w->next->prev = w->prev;
    else c->unf_tail = w->prev;
    w->prev = w->next = NULL;
}

/* Host staging: the result goes back to the device (only when the op
 * succeeded), then the host copies are freed. */
static ca_status unstage(ca_comm *c, ca_work *w, ca_status s) {
    if (s == CA_OK && w->st_recv && w->recv_bytes) {
        s = ca_device_copy_from_host(c->device, w->dev_recv, w->st_recv, w->recv_bytes);
        if (s != CA_OK) ca_error_context("copying a host-staged %s result to %s", ca_coll_kind_name(w->sig.kind),
                                         ca_device_name(c->device));
    }
    if (w->st_recv != w->st_send) free(w->st_recv);
    free(w->st_send);
    w->st_send = w->st_recv = NULL;
    return s;
}

/* s with quotes, backslashes and control characters escaped for a JSON string (ca_comm_set_name takes
 * any text). */
static void json_inside(const char *s, char *out, size_t n) {
    size_t o = 0;
    for (; *s && o + 7 < n; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') { out[o++] = '\\'; out[o++] = (char)ch; }
        else if (ch < 0x20) o += (size_t)snprintf(out + o, n - o, "\\u%04x", ch);
        else out[o++] = (char)ch;
    }
    out[o] = '\0';
}

/* The profiler's slice of a collective, from its issue to its end, with its sequence number. The
 * backends (Gloo, MPI, NCCL) do not say when the peers arrived and when the data moved, so the
 * time the caller was blocked in the wait (wait_us) holds both; issue_us is from the issue to the
 * wait (the caller's overlap). */
static void trace_coll(const ca_comm *c, const ca_work *w, ca_status s) {
    int64_t now = ca_trace_now_ns(), wt = w->tr_wait_ns ? w->tr_wait_ns : now;
    char args[400], name[sizeof c->name * 6];
    json_inside(c->name, name, sizeof name);   /* the program's name ("tp"): a JSON string's inside */
    snprintf(args, sizeof args, "\"seq\":%llu,\"comm\":\"%s\",\"name\":\"%s\",\"rank\":%d,\"world\":%d,"
             "\"dtype\":\"%s\",\"count\":%llu,\"bytes\":%llu,\"issue_us\":%.3f,\"wait_us\":%.3f,\"ok\":%s",
             (unsigned long long)w->seq, c->prefix[0] ? c->prefix : "single", name, c->rank, c->world,
             w->sig.dtype >= 0 ? ca_dtype_name((ca_dtype)w->sig.dtype) : "none", (unsigned long long)w->sig.count,
             (unsigned long long)w->tr_bytes, (double)(wt - w->tr_issue_ns) / 1e3, (double)(now - wt) / 1e3,
             s == CA_OK ? "true" : "false");
    ca_trace_collective(ca_coll_kind_name(w->sig.kind), w->tr_issue_ns, now, args, c->prefix[0] ? c->prefix : "single",
                        w->seq, c->rank, c->world);
}

/* Marks w finished (under mu) and frees its backend handle; returns its final status. */
static ca_status finish(ca_comm *c, ca_work *w, ca_status s) {
    if (!w->done && (w->st_send || w->st_recv)) s = unstage(c, w, s);
    if (!w->done && w->tr_issue_ns && ca_trace_on()) trace_coll(c, w, s);
    pthread_mutex_lock(&c->mu);
    if (!w->done) {
        w->done = true;
        w->status = s;
        unf_remove(c, w);
        if (c->fr) ca_comm_fr_end(c, w, s);
        if (c->waiting && c->wseq == w->seq) c->waiting = false;
        c->version++;
    }
    pthread_mutex_unlock(&c->mu);
    if (w->impl) {
        if (c->ops.work_free) c->ops.work_free(w->impl);
        w->impl = NULL;
    }
    return w->status;
}

/* Test hook: CACCEL_TEST_WAIT_DELAY=<rank>:<n>:<ms> holds rank <rank> of a communicator that is not a
 * split's child for <ms> ms in its wait for collective #<n>, after it has said that it waits (so its
 * watchdog watches the peers) and before it looks at the backend: a peer that finishes the collective
 * and exits meanwhile is then certain to have done so while this rank still waited. Read once. */
static struct { int rank; unsigned long long seq; long ms; } g_wait_delay = { -1, 0, 0 };
static pthread_once_t g_wait_delay_once = PTHREAD_ONCE_INIT;

static void wait_delay_init(void) {
    const char *v = getenv("CACCEL_TEST_WAIT_DELAY");
    if (v && sscanf(v, "%d:%llu:%ld", &g_wait_delay.rank, &g_wait_delay.seq, &g_wait_delay.ms) != 3)
        g_wait_delay.rank = -1;
}

static void test_wait_delay(const ca_comm *c, uint64_t seq) {
    pthread_once(&g_wait_delay_once, wait_delay_init);
    long ms = g_wait_delay.ms;
    if (g_wait_delay.rank != c->rank || g_wait_delay.seq != seq || ms <= 0 || c->parent) return;
    fprintf(stderr, "caccel: rank %d holds its wait for collective #%llu for %ld ms (CACCEL_TEST_WAIT_DELAY)\n",
            c->rank, g_wait_delay.seq, ms);
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* Waits for w until deadline; a passed deadline of the operation fails the
 * communicator, a shorter caller deadline only returns CA_ERR_TIMEOUT. */
static ca_status wait_work_on(ca_comm *c, ca_work *w, int64_t deadline, bool op_deadline) {
    if (w->done) return w->status;
    pthread_mutex_lock(&c->mu);
    c->waiting = true;
    c->wseq = w->seq;
    c->wsig = w->sig;
    c->wait_start_ms = ca_now_ms();
    c->version++;
    pthread_mutex_unlock(&c->mu);
    if (w->tr_issue_ns && !w->tr_wait_ns) w->tr_wait_ns = ca_trace_now_ns();
    test_wait_delay(c, w->seq);
    ca_status ret;
    for (;;) {
        if (atomic_load(&c->failed)) {
            ret = ca_comm_diag_failure(c);
            finish(c, w, ret);
            return ret;
        }
        int64_t now = ca_now_ms();
        int64_t left = deadline - now;
        int64_t slice = left < WAIT_SLICE_MS ? (left > 0 ? left : 0) : WAIT_SLICE_MS;
        ca_status s = c->ops.work_wait(w->impl, slice);
        if (s == CA_OK) return finish(c, w, CA_OK);
        if (s == CA_ERR_TIMEOUT || s == CA_IN_PROGRESS) {
            ca_clear_error();
            if (ca_now_ms() < deadline) continue;
            if (!op_deadline) {
                pthread_mutex_lock(&c->mu);
                if (c->waiting && c->wseq == w->seq) c->waiting = false;
                c->version++;
                pthread_mutex_unlock(&c->mu);
                char op[200];
                ca_comm_diag_fmt_op(w->seq, &w->sig, op, sizeof op);
                return ca_error(CA_ERR_TIMEOUT, "%s not finished within the %lld ms asked (still running)", op,
                                (long long)(deadline - w->issue_ms));
            }
            ret = ca_comm_diag_fail_timeout(c, w->seq, &w->sig, ca_now_ms() - w->issue_ms, false);
            finish(c, w, ret);
            return ret;
        }
        /* a backend that gives up at the same deadline (Gloo) is a timeout, not a fault */
        if (op_deadline && ca_now_ms() + 50 >= deadline && !atomic_load(&c->failed)) {
            ca_clear_error();
            ret = ca_comm_diag_fail_timeout(c, w->seq, &w->sig, ca_now_ms() - w->issue_ms, false);
        } else {
            char m[MSG_MAX];
            snprintf(m, sizeof m, "%s", ca_last_error());
            ret = ca_comm_diag_fail_backend(c, w->seq, &w->sig, m);
        }
        finish(c, w, ret);
        return ret;
    }
}

/* A split's child says which group it is ("(in the group of ranks 1, 3 split from caccel/c0)");
 * its messages name the job's ranks. */
static ca_status wait_work(ca_comm *c, ca_work *w, int64_t deadline, bool op_deadline) {
    ca_status s = wait_work_on(c, w, deadline, op_deadline);
    if (s == CA_OK || !c->global) return s;
    char note[256];
    size_t at = (size_t)snprintf(note, sizeof note, "(in the %s%sgroup of ranks ", c->name, c->name[0] ? " " : "");
    for (int i = 0; i < c->world && at < sizeof note; i++)
        at += (size_t)snprintf(note + at, sizeof note - at, "%s%d", i ? ", " : "", c->global[i]);
    if (at < sizeof note)
        snprintf(note + at, sizeof note - at, " split from %s)", c->parent->prefix[0] ? c->parent->prefix : "caccel/single");
    ca_error_context("%s", note);
    return s;
}

static ca_status check_buffers(ca_comm *c, const char *what, const void *send, const void *recv, size_t count,
                               ca_dtype dt, size_t recv_mult, size_t send_mult) {
    size_t es = ca_dtype_size(dt);
    if (!es) return ca_error(CA_ERR_INVALID, "%s: invalid dtype %d", what, (int)dt);
    size_t big = recv_mult > send_mult ? recv_mult : send_mult;
    if (count && (count > SIZE_MAX / es / big))
        return ca_error(CA_ERR_INVALID, "%s: %zu elements of %s times %zu ranks overflow", what, count,
                        ca_dtype_name(dt), big);
    if (count && (!send || !recv))
        return ca_error(CA_ERR_INVALID, "%s: NULL buffer for %zu elements", what, count);
    (void)c;
    return CA_OK;
}

typedef struct issue_args {
    const void *send;
    void *recv;
    size_t count;
    ca_dtype dt;
    ca_reduce_op op;
    int root;           /* broadcast's root; point-to-point: the rank sent to (-1 none) */
    int src;            /* point-to-point: the rank received from (-1 none) */
    size_t rcount;      /* point-to-point: the elements received */
} issue_args;

/* Bytes of the operation's send and receive buffers. */
static void coll_bytes(const ca_comm *c, ca_coll_kind kind, const issue_args *a, size_t *sb, size_t *rb) {
    size_t n = a->count * ca_dtype_size(a->dt), world = (size_t)c->world;
    *sb = kind == CA_COLL_REDUCE_SCATTER ? n * world : n;
    *rb = kind == CA_COLL_ALL_GATHER ? n * world : n;
    if (kind == CA_COLL_SENDRECV) *rb = a->rcount * ca_dtype_size(a->dt);
}

/* Host staging: host copies of the operation's buffers (the send buffer
 * copied from the device, which waits for the kernels that wrote it); *h
 * gets the host pointers the backend is given. */
static ca_status stage(ca_comm *c, ca_coll_kind kind, const issue_args *a, ca_work *w, issue_args *h) {
    *h = *a;
    if (kind == CA_COLL_BARRIER) return CA_OK;
    size_t sb, rb;
    coll_bytes(c, kind, a, &sb, &rb);
    bool same = a->send == a->recv;   /* in place: one host buffer of the larger size */
    size_t alloc = same && sb > rb ? sb : rb;
    w->st_recv = malloc(alloc ? alloc : 1);
    w->st_send = same ? w->st_recv : malloc(sb ? sb : 1);
    if (!w->st_send || !w->st_recv) {
        unstage(c, w, CA_ERR_NOMEM);
        return ca_error(CA_ERR_NOMEM, "%s: out of host memory for %zu bytes of host staging",
                        ca_coll_kind_name(kind), sb + rb);
    }
    ca_status s = ca_device_copy_to_host(c->device, w->st_send, a->send, sb);
    if (s != CA_OK) {
        unstage(c, w, s);
        return ca_error_context("staging a %s through host memory", ca_coll_kind_name(kind));
    }
    w->dev_recv = a->recv;
    w->recv_bytes = rb;
    h->send = w->st_send;
    h->recv = w->st_recv;
    return CA_OK;
}

/* The bytes one rank sends for a collective under a bandwidth-optimal (ring) algorithm: the
 * "bus bytes" of nccl-tests, whatever algorithm the backend really runs. */
static uint64_t bus_bytes(const ca_comm *c, ca_coll_kind kind, const issue_args *a) {
    uint64_t n = (uint64_t)c->world, b = (uint64_t)a->count * ca_dtype_size(a->dt);
    if (n < 2) return 0;
    switch (kind) {
    case CA_COLL_ALL_REDUCE: return 2 * (n - 1) * b / n;
    case CA_COLL_ALL_GATHER:
    case CA_COLL_REDUCE_SCATTER: return (n - 1) * b;   /* count is the per-rank part */
    case CA_COLL_BROADCAST: return b;
    case CA_COLL_SENDRECV: return a->root >= 0 ? b : 0;   /* what this rank sends */
    default: return 0;
    }
}

/* Hands the operation to the backend; a failure is diagnosed (which peer, why). */
static ca_status issue(ca_comm *c, ca_coll_kind kind, const issue_args *a, ca_work *w) {
    ca_status s;
    switch (kind) {
    case CA_COLL_ALL_REDUCE:
        s = c->ops.all_reduce(c->bc, a->send, a->recv, a->count, a->dt, a->op, &w->impl);
        break;
    case CA_COLL_BROADCAST:
        s = c->ops.broadcast(c->bc, a->recv, a->count, a->dt, a->root, &w->impl);
        break;
    case CA_COLL_ALL_GATHER:
        s = c->ops.all_gather(c->bc, a->send, a->recv, a->count, a->dt, &w->impl);
        break;
    case CA_COLL_REDUCE_SCATTER:
        s = c->ops.reduce_scatter(c->bc, a->send, a->recv, a->count, a->dt, a->op, &w->impl);
        break;
    case CA_COLL_BARRIER:
        s = c->ops.barrier(c->bc, &w->impl);
        break;
    case CA_COLL_SENDRECV:
        s = c->ops.sendrecv(c->bc, a->send, a->root >= 0 ? a->count : 0, a->root, a->recv, a->src >= 0 ? a->rcount : 0,
                            a->src, a->dt, &w->impl);
        break;
    default:
        s = ca_error(CA_ERR_INTERNAL, "unknown collective %d", (int)kind);
        break;
    }
    if (s != CA_OK) {
        char m[MSG_MAX];
        snprintf(m, sizeof m, "%s", ca_last_error());
        s = ca_comm_diag_fail_backend(c, w->seq, &w->sig, m);
    }
    return s;
}

/* Numbers w and puts it on the list of unfinished operations (what the watchdog publishes). */
static void enlist(ca_comm *c, ca_work *w, ca_coll_kind kind, const issue_args *a) {
    pthread_mutex_lock(&c->mu);
    w->seq = c->next_seq++;
    uint64_t sent = bus_bytes(c, kind, a);
    c->bytes += sent;
    if (ca_trace_on()) {
        w->tr_issue_ns = ca_trace_now_ns();
        w->tr_bytes = sent;
    }
    for (ca_comm *p = c->parent; p; p = p->parent) atomic_fetch_add(&p->split_bytes, sent);
    c->last_sig = w->sig;
    c->hist[w->seq % HIST] = w->sig;
    if (c->fr) ca_comm_fr_issue(c, w);
    w->prev = c->unf_tail;
    if (c->unf_tail) c->unf_tail->next = w;
    else c->unf_head = w;
    c->unf_tail = w;
    c->version++;
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------ in a lazy device's graph */

/* A collective on a lazy device (xla) is a node of its graph: recorded now, numbered now (so
 * every rank numbers it the same), run by the device's executor in graph order, on the memory
 * behind the device buffers (whose host addresses the executor hands it). The caller's work is
 * complete at once: every later device operation sees the result, and a host read runs the graph
 * first. */
typedef struct deferred {
    ca_comm *c;
    ca_work *w;                /* the numbered operation, finished by the node */
    ca_coll_kind kind;
    issue_args a;
    bool checked;
} deferred;

static ca_status deferred_run(void *ctx, bool run, const void *in, void *out) {
    deferred *d = ctx;
    ca_comm *c = d->c;
    ca_work *w = d->w;
    ca_status s;
    if (!run) {
        s = finish(c, w, CA_ERR_STATE);
    } else {
        d->a.send = d->a.send == d->a.recv ? out : in;   /* the same bytes at their host addresses */
        d->a.recv = out;
        w->issue_ms = ca_now_ms();   /* the deadline runs from when the graph reaches it */
        if (w->tr_issue_ns) w->tr_issue_ns = ca_trace_now_ns();
        int64_t deadline = w->issue_ms + c->timeout_ms;
        s = atomic_load(&c->failed) ? ca_comm_diag_failed_already(c, ca_coll_kind_name(d->kind)) : CA_OK;
        if (s == CA_OK && d->checked) s = ca_comm_diag_precheck(c, w->seq, &w->sig, deadline);
        if (s == CA_OK) s = issue(c, d->kind, &d->a, w);
        if (s != CA_OK) finish(c, w, s);
        else s = w->impl ? wait_work(c, w, deadline, true) : finish(c, w, CA_OK);
    }
    atomic_fetch_sub(&c->ndeferred, 1);
    free(w);
    free(d);
    return s;
}

static ca_status run_deferred(ca_comm *c, ca_coll_kind kind, const issue_args *a, const ca_coll_sig *sig,
                              bool checked, ca_work **out) {
    ca_work *w = calloc(1, sizeof *w), *done = out ? calloc(1, sizeof *done) : NULL;
    deferred *d = malloc(sizeof *d);
    if (!w || !d || (out && !done)) {
        free(w);
        free(d);
        free(done);
        return ca_error(CA_ERR_NOMEM, "out of memory recording %s", ca_coll_kind_name(kind));
    }
    w->comm = c;
    w->heap = true;
    w->sig = *sig;
    w->issue_ms = ca_now_ms();
    enlist(c, w, kind, a);
    *d = (deferred){ .c = c, .w = w, .kind = kind, .a = *a, .checked = checked };
    atomic_fetch_add(&c->ndeferred, 1);
    unsigned long long seq = (unsigned long long)w->seq;
    size_t sb, rb;
    coll_bytes(c, kind, a, &sb, &rb);
    const ca_device_ops *dops = ca_device_ops_of(c->device);
    const void *in = a->send != a->recv ? a->send : NULL;
    /* what the operation is, for the graph's key: a point-to-point exchange with other peers is
     * another program, as the same bytes all-reduced are */
    int64_t attr[] = {kind, a->dt, (int64_t)a->count, a->op, a->root, a->src, (int64_t)a->rcount, c->world};
    ca_status s = dops->enqueue_host_fn_keyed
                      ? dops->enqueue_host_fn_keyed(ca_device_context(c->device), deferred_run, d, in, sb, a->recv, rb,
                                                    attr, (int)(sizeof attr / sizeof *attr))
                      : dops->enqueue_host_fn(ca_device_context(c->device), deferred_run, d, in, sb, a->recv, rb);
    if (s != CA_OK) {   /* the device dropped it: deferred_run(d, false) finished and freed w */
        free(done);
        return ca_error_context("recording %s #%llu in the graph of device %s", ca_coll_kind_name(kind), seq,
                                ca_device_name(c->device));
    }
    if (out) {
        *done = (ca_work){ .comm = c, .heap = true, .done = true, .status = CA_OK, .sig = *sig };
        *out = done;
    }
    return CA_OK;
}

/* Whether c's collectives go into its device's graph: a lazy device, a backend on host memory. */
static bool in_graph(const ca_comm *c, ca_coll_kind kind) {
    if (!c->stage || kind == CA_COLL_BARRIER || !c->device) return false;
    const ca_device_ops *d = ca_device_ops_of(c->device);
    return d && d->enqueue_host_fn;
}

static ca_status run(ca_comm *c, ca_coll_kind kind, const issue_args *a, ca_work **out) {
    if (!c) return ca_error(CA_ERR_INVALID, "%s: NULL communicator", ca_coll_kind_name(kind));
    if (out) *out = NULL;
    if (atomic_load(&c->failed)) return ca_comm_diag_failed_already(c, ca_coll_kind_name(kind));

    ca_coll_sig sig = { .kind = kind, .dtype = -1, .redop = -1, .root = -1, .count = 0 };
    if (kind != CA_COLL_BARRIER) {
        sig.dtype = (int)a->dt;
        sig.count = a->count;
    }
    if (kind == CA_COLL_ALL_REDUCE || kind == CA_COLL_REDUCE_SCATTER) sig.redop = (int)a->op;
    if (kind == CA_COLL_BROADCAST) sig.root = a->root;
    if (kind == CA_COLL_SENDRECV) {   /* the peers by their job ranks, as every message names ranks */
        sig.root = a->root >= 0 ? ca_comm_grank(c, a->root) : -1;
        sig.redop = a->src >= 0 ? ca_comm_grank(c, a->src) : -1;
        if (a->root < 0) sig.count = a->rcount;
    }
    /* point-to-point is never checked: only its two ends take part, and their signatures differ */
    bool checked = kind != CA_COLL_SENDRECV && c->store.ops && (c->debug || c->checked_user || kind == CA_COLL_BARRIER ||
                                    kind == CA_COLL_BROADCAST || kind == CA_COLL_ALL_GATHER);

    if (in_graph(c, kind)) return run_deferred(c, kind, a, &sig, checked, out);
    /* an operation that runs now comes after the ones still in the device's graph */
    if (atomic_load(&c->ndeferred) > 0) {
        ca_status s = ca_device_synchronize(c->device);
        if (s != CA_OK) return ca_error_context("running the collectives recorded before %s", ca_coll_kind_name(kind));
    }

    ca_work stack_w, *w = &stack_w;
    if (out) {
        w = malloc(sizeof *w);
        if (!w) return ca_error(CA_ERR_NOMEM, "out of memory issuing %s", ca_coll_kind_name(kind));
    }
    memset(w, 0, sizeof *w);
    w->comm = c;
    w->heap = out != NULL;
    w->sig = sig;
    w->issue_ms = ca_now_ms();

    enlist(c, w, kind, a);

    int64_t deadline = w->issue_ms + c->timeout_ms;
    ca_status s = CA_OK;
    if (checked) s = ca_comm_diag_precheck(c, w->seq, &sig, deadline);
    issue_args staged;
    if (s == CA_OK && c->stage) {
        s = stage(c, kind, a, w, &staged);
        a = &staged;
    }
    if (s == CA_OK) s = issue(c, kind, a, w);
    if (s != CA_OK) {
        finish(c, w, s);
        if (w->heap) free(w);
        return s;
    }
    if (!w->impl) {
        s = finish(c, w, CA_OK);
        if (s != CA_OK) {
            if (w->heap) free(w);
            return s;
        }
        if (out) *out = w;
        return CA_OK;
    }
    if (out) {
        *out = w;
        return CA_OK;
    }
    return wait_work(c, w, deadline, true);
}

ca_status ca_comm_all_reduce(ca_comm *c, const void *send, void *recv, size_t count, ca_dtype dt,
                             ca_reduce_op op, ca_work **work) {
    ca_status s = check_buffers(c, "all_reduce", send, recv, count, dt, 1, 1);
    if (s != CA_OK) return s;
    if ((unsigned)op > CA_OP_MAX) return ca_error(CA_ERR_INVALID, "all_reduce: unknown reduce op %d", (int)op);
    issue_args a = { .send = send, .recv = recv, .count = count, .dt = dt, .op = op, .root = -1 };
    return run(c, CA_COLL_ALL_REDUCE, &a, work);
}

ca_status ca_comm_broadcast(ca_comm *c, void *buf, size_t count, ca_dtype dt, int root, ca_work **work) {
    ca_status s = check_buffers(c, "broadcast", buf, buf, count, dt, 1, 1);
    if (s != CA_OK) return s;
    if (c && (root < 0 || root >= c->world))
        return ca_error(CA_ERR_INVALID, "broadcast: root %d is not a rank of this communicator (size %d)", root,
                        c->world);
    issue_args a = { .send = buf, .recv = buf, .count = count, .dt = dt, .op = CA_OP_SUM, .root = root };
    return run(c, CA_COLL_BROADCAST, &a, work);
}

ca_status ca_comm_all_gather(ca_comm *c, const void *send, void *recv, size_t count, ca_dtype dt,
                             ca_work **work) {
    ca_status s = check_buffers(c, "all_gather", send, recv, count, dt, c ? (size_t)c->world : 1, 1);
    if (s != CA_OK) return s;
    issue_args a = { .send = send, .recv = recv, .count = count, .dt = dt, .op = CA_OP_SUM, .root = -1 };
    return run(c, CA_COLL_ALL_GATHER, &a, work);
}

ca_status ca_comm_reduce_scatter(ca_comm *c, const void *send, void *recv, size_t count, ca_dtype dt,
                                 ca_reduce_op op, ca_work **work) {
    ca_status s = check_buffers(c, "reduce_scatter", send, recv, count, dt, 1, c ? (size_t)c->world : 1);
    if (s != CA_OK) return s;
    if ((unsigned)op > CA_OP_MAX)
        return ca_error(CA_ERR_INVALID, "reduce_scatter: unknown reduce op %d", (int)op);
    issue_args a = { .send = send, .recv = recv, .count = count, .dt = dt, .op = op, .root = -1 };
    return run(c, CA_COLL_REDUCE_SCATTER, &a, work);
}

ca_status ca_comm_barrier(ca_comm *c, ca_work **work) {
    issue_args a = { .send = NULL, .recv = NULL, .count = 0, .dt = CA_U8, .op = CA_OP_SUM, .root = -1 };
    return run(c, CA_COLL_BARRIER, &a, work);
}

/* ------------------------------------------------------------------ point-to-point */

static ca_status check_peer(const ca_comm *c, const char *what, const char *role, int peer) {
    if (peer < c->world) return CA_OK;
    return ca_error(CA_ERR_INVALID, "%s: %s rank %d is not a rank of this communicator (size %d)%s%s", what, role,
                    peer, c->world, c->name[0] ? ", the group " : "", c->name);
}

ca_status ca_comm_sendrecv(ca_comm *c, const void *send, size_t send_count, int dst, void *recv, size_t recv_count,
                           int src, ca_dtype dt, ca_work **work) {
    const char *what = dst >= 0 && src >= 0 ? "sendrecv" : dst >= 0 ? "send" : "recv";
    if (!c) return ca_error(CA_ERR_INVALID, "%s: NULL communicator", what);
    if (dst < 0 && src < 0) return ca_error(CA_ERR_INVALID, "%s: neither a rank to send to nor one to receive from", what);
    ca_status s = check_buffers(c, what, send, send, dst >= 0 ? send_count : 0, dt, 1, 1);
    if (s == CA_OK) s = check_buffers(c, what, recv, recv, src >= 0 ? recv_count : 0, dt, 1, 1);
    if (s == CA_OK) s = check_peer(c, what, "destination", dst);
    if (s == CA_OK) s = check_peer(c, what, "source", src);
    if (s != CA_OK) return s;
    /* to itself only as both ends of one exchange (a ring of one), which copies */
    if ((dst == c->rank || src == c->rank) && (dst != src || send_count != recv_count))
        return ca_error(CA_ERR_INVALID, "%s on rank %d: this rank is a peer of itself only as both the destination "
                        "and the source of one exchange of equal counts (destination %d, source %d, %zu and %zu "
                        "elements)", what, ca_comm_grank(c, c->rank), dst, src, send_count, recv_count);
    if (!c->ops.sendrecv)
        return ca_error(CA_ERR_UNSUPPORTED, "%s: collective backend '%s' has no point-to-point operations", what,
                        c->backend);
    issue_args a = { .send = send, .recv = recv, .count = dst >= 0 ? send_count : 0, .dt = dt, .op = CA_OP_SUM,
                     .root = dst, .src = src, .rcount = src >= 0 ? recv_count : 0 };
    return run(c, CA_COLL_SENDRECV, &a, work);
}

ca_status ca_comm_send(ca_comm *c, const void *buf, size_t count, ca_dtype dt, int dst, ca_work **work) {
    if (dst < 0) return ca_error(CA_ERR_INVALID, "send: destination rank %d", dst);
    return ca_comm_sendrecv(c, buf, count, dst, NULL, 0, -1, dt, work);
}

ca_status ca_comm_recv(ca_comm *c, void *buf, size_t count, ca_dtype dt, int src, ca_work **work) {
    if (src < 0) return ca_error(CA_ERR_INVALID, "recv: source rank %d", src);
    return ca_comm_sendrecv(c, NULL, 0, -1, buf, count, src, dt, work);
}

ca_status ca_work_wait(ca_work *w, int64_t timeout_ms) {
    if (!w) return CA_OK;
    ca_comm *c = w->comm;
    if (w->done) return w->status;
    int64_t op_deadline = w->issue_ms + c->timeout_ms;
    if (timeout_ms < 0) return wait_work(c, w, op_deadline, true);
    int64_t d = ca_now_ms() + timeout_ms;
    if (d >= op_deadline) return wait_work(c, w, op_deadline, true);
    return wait_work(c, w, d, false);
}

ca_status ca_work_test(ca_work *w) {
    if (!w) return CA_OK;
    ca_comm *c = w->comm;
    if (w->done) return w->status;
    if (atomic_load(&c->failed)) {
        ca_status s = ca_comm_diag_failed_already(c, "collective");
        finish(c, w, s);
        return s;
    }
    ca_status s = c->ops.work_test(w->impl);
    if (s == CA_OK) return finish(c, w, CA_OK);
    if (s == CA_IN_PROGRESS) {
        if (ca_now_ms() >= w->issue_ms + c->timeout_ms) {
            s = ca_comm_diag_fail_timeout(c, w->seq, &w->sig, ca_now_ms() - w->issue_ms, false);
            finish(c, w, s);
            return s;
        }
        return CA_IN_PROGRESS;
    }
    char m[MSG_MAX];
    snprintf(m, sizeof m, "%s", ca_last_error());
    s = ca_comm_diag_fail_backend(c, w->seq, &w->sig, m);
    finish(c, w, s);
    return s;
}

void ca_work_free(ca_work *w) {
    if (!w) return;
    if (!w->done) {
        if (ca_work_wait(w, -1) != CA_OK) CA_LOG_W("freeing an unfinished collective: %s", ca_last_error());
    }
    if (w->heap) free(w);
}

/* ------------------------------------------------------------- creation */

/* Communicators on one store are numbered by the store itself, per rank, in
 * creation order, which is the same on every rank: "caccel/c<n>". */
static ca_status number_comm(ca_comm *c) {
    char key[64];
    snprintf(key, sizeof key, "caccel/comms/%d", c->rank);
    int64_t n = 0;
    ca_status s = c->store.ops->add(c->store.store, key, 1, &n);
    if (s != CA_OK) return ca_error_context("numbering a new communicator");
    snprintf(c->prefix, sizeof c->prefix, "caccel/c%lld", (long long)(n - 1));
    return CA_OK;
}

/* An address of this machine the other machines can reach. */
static void host_address(char *buf, size_t len) {
    const char *m = getenv("CACCEL_STORE_HOST");
    if (m && *m) {
        snprintf(buf, len, "%s", m);
        return;
    }
    struct ifaddrs *ifa = NULL;
    snprintf(buf, len, "127.0.0.1");
    if (getifaddrs(&ifa) != 0) return;
    for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        char h[NI_MAXHOST];
        if (getnameinfo(i->ifa_addr, sizeof(struct sockaddr_in), h, sizeof h, NULL, 0, NI_NUMERICHOST)) continue;
        if (strncmp(h, "127.", 4) == 0) continue;
        snprintf(buf, len, "%s", h);
        break;
    }
    freeifaddrs(ifa);
}

/* With no store (MPI without a launcher), rank 0 serves one and tells the
 * others through the backend's own broadcast. */
static ca_status bootstrap_store(ca_comm *c) {
    char blob[512] = "";
    ca_store_server *srv = NULL;
    bool local = c->local_world == c->world;
    if (c->rank == 0) {
        char token[64], host[256];
        ca_status s = ca_store_make_token(token, sizeof token);
        if (s != CA_OK) return s;
        s = ca_store_server_start(local ? "127.0.0.1" : NULL, 0, token, &srv, NULL);
        if (s != CA_OK) return s;
        if (local) snprintf(host, sizeof host, "127.0.0.1");
        else host_address(host, sizeof host);
        snprintf(blob, sizeof blob, "%s %d %s", host, ca_store_server_port(srv), token);
    }
    /* the backend's own memory: the device's (nccl), or the host's where it stages (mpi, gloo) */
    void *dbuf = NULL;
    ca_status s = c->stage ? CA_OK : ca_device_alloc(c->device, sizeof blob, &dbuf);
    if (s == CA_OK && dbuf) s = ca_device_copy_from_host(c->device, dbuf, blob, sizeof blob);
    ca_work_impl *wi = NULL;
    if (s == CA_OK) s = c->ops.broadcast(c->bc, dbuf ? dbuf : blob, sizeof blob, CA_U8, 0, &wi);
    if (s == CA_OK && wi) {
        s = c->ops.work_wait(wi, c->timeout_ms);
        c->ops.work_free(wi);
    }
    if (s == CA_OK && dbuf) s = ca_device_copy_to_host(c->device, blob, dbuf, sizeof blob);
    if (dbuf) ca_device_free(c->device, dbuf);
    if (s != CA_OK) {
        ca_store_server_stop(srv);
        return ca_error_context("sharing the rendezvous store address over backend %s", c->backend);
    }
    blob[sizeof blob - 1] = '\0';
    char host[256], token[300];
    int port = 0;
    if (sscanf(blob, "%255s %d %299s", host, &port, token) != 3) {
        ca_store_server_stop(srv);
        return ca_error(CA_ERR_PEER, "rank 0 sent no rendezvous store address over backend %s", c->backend);
    }
    ca_store_client *cl = NULL;
    s = ca_store_client_connect(host, port, token, c->timeout_ms, &cl);
    if (s != CA_OK) {
        ca_store_server_stop(srv);
        return s;
    }
    ca_store_client_set_server_name(cl, "rank 0");
    c->own_client = cl;
    c->own_server = srv;
    c->store = ca_store_client_ref(cl);
    return CA_OK;
}

/* Every rank publishes its first record, then waits for all the others:
 * a rank that never arrives is named here, not in the first collective. */
static ca_status join(ca_comm *c) {
    ca_status s = ca_comm_diag_publish(c, true);
    if (s != CA_OK) return ca_error_context("joining communicator %s", c->prefix);
    int n = c->world;
    char **keys = calloc((size_t)n, sizeof *keys);
    if (!keys) return ca_error(CA_ERR_NOMEM, "out of memory");
    for (int r = 0; r < n; r++) {
        keys[r] = malloc(160);
        if (!keys[r]) {
            for (int q = 0; q < r; q++) free(keys[q]);
            free(keys);
            return ca_error(CA_ERR_NOMEM, "out of memory");
        }
        ca_comm_diag_state_key(c, r, keys[r], 160);
    }
    s = c->store.ops->wait(c->store.store, (const char *const *)keys, n, c->timeout_ms);
    if (s == CA_ERR_TIMEOUT) {
        int *missing = calloc((size_t)n, sizeof *missing), m = 0;
        for (int r = 0; missing && r < n; r++)
            if (c->store.ops->check(c->store.store, keys[r]) != CA_OK) missing[m++] = r;
        ca_clear_error();
        char rl[256] = "?", dur[32];
        if (missing) ca_comm_diag_fmt_ranks(missing, m, rl, sizeof rl);
        ca_comm_diag_fmt_duration(c->timeout_ms, dur, sizeof dur);
        free(missing);
        s = ca_error(CA_ERR_TIMEOUT, "creating a %s communicator of %d ranks: rank%s %s did not join within %s",
                     c->backend, n, m == 1 ? "" : "s", rl, dur);
        ca_error_hint("each of the %d processes must create the communicator; a rank that crashed or was never "
                      "started is named above", n);
    }
    for (int r = 0; r < n; r++) free(keys[r]);
    free(keys);
    return s;
}

void ca_comm_destroy(ca_comm *c) {
    if (!c) return;
    /* collectives still in a lazy device's graph run (or are dropped) while c exists */
    if (atomic_load(&c->ndeferred) > 0 && ca_device_synchronize(c->device) != CA_OK)
        CA_LOG_W("destroying a communicator: the collectives recorded on %s failed: %s", ca_device_name(c->device),
                 ca_last_error());
    bool announce = c->wd_running && c->store.ops;
    if (c->wd_running) {
        pthread_mutex_lock(&c->wd_mu);
        c->wd_stop = true;
        pthread_cond_signal(&c->wd_cv);
        pthread_mutex_unlock(&c->wd_mu);
        pthread_join(c->wd, NULL);
    }
    if (announce) {
        pthread_mutex_lock(&c->mu);
        if (!c->gone) c->gone = GONE_LEFT;
        c->version++;
        pthread_mutex_unlock(&c->mu);
        if (ca_comm_diag_publish(c, true) != CA_OK) ca_clear_error();
    }
    if (announce && atomic_load(&c->failed)) ca_comm_diag_linger(c, LINGER_MS);
    else if (announce && c->store_host) ca_comm_diag_drain(c);
    ca_comm_diag_live_remove(c, announce);
    if (c->bc && c->ops.destroy) c->ops.destroy(c->bc);
    ca_store_client_close(c->own_client);
    ca_store_server_stop(c->own_server);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->pub_mu);
    pthread_mutex_destroy(&c->wd_mu);
    pthread_cond_destroy(&c->wd_cv);
    ca_comm_fr_free(c);
    free(c->global);
    free(c);
}

/* owned_client/owned_server: a store made for this communicator from the
 * environment; it is closed with the communicator, and such communicators
 * are numbered in creation order across the process. */
/* The backend for o's device: its table, and whether device buffers go through host copies (a
 * backend for host memory, one that names cpu or names nothing, works on another device so). */
static ca_status choose_backend(const ca_comm_options *o, ca_device *dev, const ca_collective_ops **ops,
                                bool *staged) {
    *staged = false;
    if (!dev) return ca_error(CA_ERR_STATE, "ca_comm_create: no CPU device");
    if (!(*ops = ca_registry_collective(o->backend))) return ca_comm_backend_missing(o->backend);
    const char *names = (*ops)->device_names;
    bool direct = !names || strcmp(names, "*") == 0 || ca_registry_names_device(names, ca_device_name(dev));
    *staged = !ca_device_is_host(dev) && (!names || (!direct && ca_registry_names_host(names)));
    if (*staged || direct) return CA_OK;
    ca_error(CA_ERR_UNSUPPORTED, "collective backend '%s' cannot reduce on device '%s' (it supports: %s)",
             o->backend, ca_device_name(dev), names);
    const char *serving = ca_registry_collective_serving(ca_device_name(dev));
    if (serving) ca_error_hint("use backend %s for %s devices", serving, ca_device_name(dev));
    else ca_error_hint("no collective backend here reduces on %s devices", ca_device_name(dev));
    return CA_ERR_UNSUPPORTED;
}

/* A new communicator's fields, before any collective can run. */
static void comm_init_fields(ca_comm *c, const ca_comm_options *o, const ca_collective_ops *ops, ca_device *dev,
                             bool staged) {
    const char *launcher = getenv("CACCEL_LAUNCHER");
    c->launch_notes = c->own_client && launcher && strcmp(launcher, "caccel") == 0;
    ca_copy_vtable(&c->ops, sizeof c->ops, ops, ops->struct_size);
    snprintf(c->backend, sizeof c->backend, "%s", o->backend);
    c->rank = o->rank;
    c->world = o->world_size;
    c->local_rank = o->local_rank;
    c->local_world = o->local_world_size;
    c->device = dev;
    c->stage = staged;
    if (staged && o->rank == 0)
        CA_LOG_I("collective backend %s works on host memory: %s buffers are staged through host copies", o->backend,
                 ca_device_name(dev));
    c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : ca_comm_default_timeout_ms();
    c->debug = o->debug;
    c->last_sig = (ca_coll_sig){ .kind = CA_COLL_NONE, .dtype = -1, .redop = -1, .root = -1 };
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->pub_mu, NULL);
    pthread_mutex_init(&c->wd_mu, NULL);
    pthread_cond_init(&c->wd_cv, NULL);
    c->published_version = UINT64_MAX;
    ca_comm_fr_init(c);
}

static ca_status check_slots(const ca_comm *c) {
    static const char *const required[] = { "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier",
                                            "work_test", "work_wait", "work_free", "init" };
    const void *slots[] = { (const void *)c->ops.all_reduce, (const void *)c->ops.broadcast,
                            (const void *)c->ops.all_gather, (const void *)c->ops.reduce_scatter,
                            (const void *)c->ops.barrier, (const void *)c->ops.work_test,
                            (const void *)c->ops.work_wait, (const void *)c->ops.work_free,
                            (const void *)c->ops.init };
    for (size_t i = 0; i < CA_ARRAY_LEN(required); i++)
        if (!slots[i]) return ca_error(CA_ERR_UNSUPPORTED, "collective backend '%s' has no '%s'", c->backend, required[i]);
    return CA_OK;
}

/* A split's request to a backend that splits natively (its split slot). */
typedef struct split_req {
    void *parent;              /* the parent's backend communicator */
    int color, key;
} split_req;

/* The backend's own communicator, over the store it was given or, without one, the store it
 * bootstraps (a split's, natively split from its parent's); then the job's numbering, the
 * rendezvous of every rank, and the watchdog. */
static ca_status comm_start(ca_comm *c, const ca_comm_options *o, const split_req *sp) {
    ca_status s = CA_OK;
    if (o->store.ops && o->world_size > 1) {
        c->store = o->store;
        /* a split's child comes with its prefix, derived from its parent's */
        if (!c->prefix[0] && (s = number_comm(c)) != CA_OK) return s;
    }
    char bprefix[128];
    snprintf(bprefix, sizeof bprefix, "%s/%s", c->prefix[0] ? c->prefix : "caccel/single", o->backend);
    ca_device *via = c->stage ? ca_cpu_device() : c->device;
    ca_comm_init_args ia = {
        .struct_size = sizeof ia,
        .rank = o->rank,
        .world_size = o->world_size,
        .local_rank = o->local_rank,
        .local_world_size = o->local_world_size,
        .store = c->store,
        .timeout_ms = c->timeout_ms,
        .device_ops = ca_device_ops_of(via),
        .device = ca_device_context(via),
        .prefix = bprefix,
        .host_collective = ca_registry_collective("gloo"),
        .host_device_ops = ca_device_ops_of(ca_cpu_device()),
        .host_device = ca_device_context(ca_cpu_device()),
    };
    if ((sp ? c->ops.split(sp->parent, sp->color, sp->key, &ia, &c->bc) : c->ops.init(&ia, &c->bc)) != CA_OK)
        return ca_error_context("creating a %s communicator (rank %d of %d)", o->backend, o->rank, o->world_size);
    if (o->world_size == 1) return CA_OK;
    if (!c->store.ops) {
        s = bootstrap_store(c);
        if (s == CA_OK) s = number_comm(c);
    }
    if (s == CA_OK) s = join(c);
    if (s != CA_OK) return s;
    c->store_host = c->parent ? c->parent->store_host : c->own_server != NULL;
    /* counted as the flight recorder's watcher before it runs: a rank stopped before the new thread
     * is first scheduled (a busy machine) must still write its dump on the SIGTERM that ends it */
    ca_comm_fr_watch(c, true);
    if (pthread_create(&c->wd, NULL, ca_comm_diag_watchdog_main, c) != 0) {
        ca_comm_fr_watch(c, false);   /* no watchdog after all: a SIGTERM noted meanwhile acts now */
        return ca_error(CA_ERR_NOMEM, "cannot start the communicator's watchdog thread");
    }
    c->wd_running = true;
    ca_comm_diag_live_add(c);
    return CA_OK;
}

/* Rank, world and backend from the process environment where the options leave them out. Sets
 * *delegate when the environment's own communicator (ca_comm_create_from_env) is the answer. */
static ca_status resolve_options(ca_comm_options *o, bool *delegate, ca_procenv *pe) {
    *delegate = false;
    if (o->world_size == 0) {
        ca_status s = ca_procenv_detect(pe);
        if (s != CA_OK) return s;
        if (!o->store.ops && pe->world_size > 1) {
            *delegate = true;
            return CA_OK;
        }
        o->rank = pe->rank;
        o->world_size = pe->world_size;
        o->local_rank = pe->local_rank;
        o->local_world_size = pe->local_world_size;
        if (!o->backend) o->backend = ca_procenv_pick_backend(pe, NULL);
    }
    if (o->local_world_size <= 0) {
        o->local_world_size = o->world_size;
        o->local_rank = o->rank;
    }
    if (!o->backend) o->backend = o->world_size == 1 ? "single" : "gloo";
    if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size)
        return ca_error(CA_ERR_INVALID, "ca_comm_create: rank %d of world size %d", o->rank, o->world_size);
    return CA_OK;
}

static ca_status create_impl(const ca_comm_options *opts, ca_store_client *owned_client,
                             ca_store_server *owned_server, ca_comm **out) {
    ca_comm_options o = opts ? *opts : (ca_comm_options){ 0 };
    if (owned_client) o.store = ca_store_client_ref(owned_client);
    ca_procenv pe;
    bool delegate = false;
    ca_status s = out ? resolve_options(&o, &delegate, &pe) : ca_error(CA_ERR_INVALID, "ca_comm_create: NULL output");
    if (out) *out = NULL;
    if (s == CA_OK && delegate) return ca_comm_create_from_env(&pe, o.backend, o.device, o.timeout_ms, o.debug, out);
    ca_device *dev = o.device ? o.device : ca_cpu_device();
    const ca_collective_ops *ops = NULL;
    bool staged = false;
    if (s == CA_OK) s = choose_backend(&o, dev, &ops, &staged);
    ca_comm *c = s == CA_OK ? calloc(1, sizeof *c) : NULL;
    if (s == CA_OK && !c) s = ca_error(CA_ERR_NOMEM, "out of memory creating a communicator");
    if (s != CA_OK) {
        ca_store_client_close(owned_client);
        ca_store_server_stop(owned_server);
        return s;
    }
    c->own_client = owned_client;
    c->own_server = owned_server;
    comm_init_fields(c, &o, ops, dev, staged);
    s = check_slots(c);
    if (s == CA_OK) s = comm_start(c, &o, NULL);
    if (s != CA_OK) {
        ca_comm_destroy(c);
        return s;
    }
    *out = c;
    return CA_OK;
}

ca_status ca_comm_create(const ca_comm_options *opts, ca_comm **out) {
    return create_impl(opts, NULL, NULL, out);
}

ca_status ca_comm_create_owning(const ca_comm_options *opts, ca_store_client *client, ca_store_server *server,
                                ca_comm **out) {
    return create_impl(opts, client, server, out);
}

/* ---------------------------------------------- MULTI_CPU from the environment */

ca_status ca_comm_backend_missing(const char *backend) {
    char reason[1024];
    snprintf(reason, sizeof reason, "%s", ca_last_error());
    const ca_plugin_hint *h = ca_registry_hint(CA_BACKEND_COLLECTIVE, backend, CA_DEVICE_KIND_UNSET);
    if (!h) {
        ca_error(CA_ERR_NOT_FOUND, "unknown collective backend '%s' (%s)", backend, reason);
        ca_error_hint("backends: single, gloo, mpi, nccl (`caccel env` lists those found)");
        return CA_ERR_NOT_FOUND;
    }
    ca_error(CA_ERR_NOT_FOUND, "collective backend '%s' is not available: plugin %s (%s)", backend, h->file, reason);
    ca_error_hint("install the Debian package %s, then reconfigure and rebuild caccel so %s is built and installed "
                  "in %s (or add its directory to CACCEL_PLUGIN_PATH)%s",
                  h->package, h->file, CA_PLUGIN_DIR, h->more);
    return CA_ERR_NOT_FOUND;
}

ca_status ca_comm_create_from_env(const ca_procenv *pe, const char *backend, ca_device *device, int64_t timeout_ms,
                                 bool debug, ca_comm **out) {
    *out = NULL;
    const char *name = ca_procenv_pick_backend(pe, backend);
    /* GPU memory: the first collective that reduces on the device itself (NCCL on cuda), unless
     * asked otherwise (or under mpirun with no address for its store); none: the launcher's,
     * staged through the host */
    bool asked = backend && *backend && strcmp(backend, "auto") != 0;
    if (!asked && pe->world_size > 1 && ca_device_kind_of(device) == CA_DEVICE_GPU &&
        !(pe->under_mpi && (!pe->master_addr[0] || pe->master_port <= 0))) {
        const char *serving = ca_registry_collective_serving(ca_device_name(device));
        if (serving) name = serving;
        else if (pe->rank == 0)   /* said once: it runs, but every collective copies through the host */
            CA_LOG_W("no collective backend that reduces in %s memory is available (`caccel env` says why); "
                     "using %s, through host memory", ca_device_name(device), name);
    }
    const ca_collective_ops *ops = ca_registry_collective(name);
    if (!ops) return ca_comm_backend_missing(name);
    bool launcher_ranks = ca_registry_collective_needs_mpi_launcher(name);
    if (launcher_ranks && !pe->under_mpi && pe->world_size > 1) {
        ca_error(CA_ERR_CONFIG, "backend %s asked for, but this process was started by %s, not by an MPI launcher",
                 name, pe->launcher_name);
        ca_error_hint("run `caccel launch --backend mpi ...` (it starts mpirun) or `mpirun -np N ...`");
        return CA_ERR_CONFIG;
    }
    ca_comm_options o = {
        .backend = name,
        .rank = pe->rank,
        .world_size = pe->world_size,
        .local_rank = pe->local_rank,
        .local_world_size = pe->local_world_size,
        .device = device,
        .timeout_ms = timeout_ms,
        .debug = debug,
    };
    if (pe->world_size > 1 && !launcher_ranks) {   /* an MPI launcher's ranks need no store */
        ca_store_client *cl = NULL;
        ca_store_server *srv = NULL;
        ca_status s = ca_procenv_store(pe, timeout_ms > 0 ? timeout_ms : ca_comm_default_timeout_ms(), &cl, &srv);
        if (s != CA_OK) return s;
        return ca_comm_create_owning(&o, cl, srv, out);
    }
    return ca_comm_create(&o, out);
}

/* ------------------------------------------------------------------ split */

/* Every rank's (color, key), gathered over the parent in its device's memory. */
static ca_status gather_colors(ca_comm *p, int color, int key, int32_t *all) {
    int32_t mine[2] = { color, key };
    size_t n = (size_t)p->world * sizeof mine;
    void *d = NULL;  /* the gathered records, then this rank's own (not in place: no aliasing rules) */
    ca_status s = ca_device_alloc(p->device, n + sizeof mine, &d);
    char *send = (char *)d + n;
    if (s == CA_OK) s = ca_device_copy_from_host(p->device, send, mine, sizeof mine);
    if (s == CA_OK) s = ca_comm_all_gather(p, send, d, 2, CA_I32, NULL);
    if (s == CA_OK) s = ca_device_copy_to_host(p->device, all, d, n);
    if (d) ca_device_free(p->device, d);
    if (s != CA_OK) return ca_error_context("ca_comm_split: gathering colors (rank %d of %s)", p->rank, p->prefix);
    return CA_OK;
}

/* Whether parent rank a comes before parent rank b in their group: by key, then parent rank. */
static bool split_before(const int32_t *all, int a, int b) {
    return all[2 * a + 1] != all[2 * b + 1] ? all[2 * a + 1] < all[2 * b + 1] : a < b;
}

/* The group's members in its order, as ranks of the job (the root communicator); NULL when out
 * of memory. */
static int *split_members(const ca_comm *p, const int32_t *all, int color) {
    int n = 0, *m = malloc((size_t)p->world * sizeof *m);
    if (!m) return NULL;
    for (int r = 0; r < p->world; r++) {
        if (all[2 * r] != color) continue;
        int i = n++;
        for (; i > 0 && split_before(all, r, m[i - 1]); i--) m[i] = m[i - 1];
        m[i] = r;
    }
    for (int i = 0; i < n; i++) m[i] = ca_comm_grank(p, m[i]);
    return m;
}

/* This rank's place in its group: rank and size, and the same among the members on its machine
 * (machine = parent rank / parent local world size, the launcher's layout). */
static void split_place(const ca_comm *p, const int32_t *all, ca_comm_options *o) {
    int me = p->rank, lw = p->local_world > 0 ? p->local_world : p->world;
    for (int r = 0; r < p->world; r++) {
        if (all[2 * r] != all[2 * me]) continue;
        bool before = split_before(all, r, me);
        o->world_size++;
        o->rank += before;
        if (r / lw == me / lw) {
            o->local_world_size++;
            o->local_rank += before;
        }
    }
}

ca_status ca_comm_set_name(ca_comm *c, const char *name) {
    if (!c || !name || strlen(name) >= sizeof c->name)
        return ca_error(CA_ERR_INVALID, "ca_comm_set_name: a communicator and a name of at most %zu characters are "
                        "required", sizeof c->name - 1);
    snprintf(c->name, sizeof c->name, "%s", name);
    return CA_OK;
}

const char *ca_comm_name(const ca_comm *c) { return c ? c->name : ""; }

/* The backend of a split on `dev`: the parent's where it works there; for a split into host memory
 * off a backend that does not (nccl), Gloo, which every host reduces on and which rendezvouses over
 * the parent's store. */
static const char *split_backend(const ca_comm *parent, ca_device *dev) {
    const ca_collective_ops *ops = ca_registry_collective(parent->backend);
    if (dev == parent->device || !ops || !ops->device_names || !strcmp(ops->device_names, "*") ||
        ca_registry_names_device(ops->device_names, ca_device_name(dev)))
        return parent->backend;
    return "gloo";
}

/* ca_comm_split, the child's buffers on `dev` (the parent's device, or the host's). */
static ca_status comm_split(ca_comm *parent, int color, int key, ca_device *dev, ca_comm **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_comm_split: NULL output");
    *out = NULL;
    if (!parent) return ca_error(CA_ERR_INVALID, "ca_comm_split: NULL parent communicator");
    int32_t *all = calloc((size_t)parent->world * 2, sizeof *all);
    if (!all) return ca_error(CA_ERR_NOMEM, "out of memory splitting communicator %s", parent->prefix);
    ca_status s = gather_colors(parent, color, key, all);
    unsigned n = parent->nsplits++;  /* every parent rank counts every split, so the numbers agree */
    ca_comm_options o = { .device = dev, .timeout_ms = parent->timeout_ms, .debug = parent->debug };
    const char *backend = split_backend(parent, dev);
    int *members = NULL;
    if (s == CA_OK && color >= 0) {
        split_place(parent, all, &o);
        if (!(members = split_members(parent, all, color)))
            s = ca_error(CA_ERR_NOMEM, "out of memory splitting communicator %s", parent->prefix);
    }
    free(all);
    /* a backend that splits natively (MPI) needs every parent rank in its split, a group of one too */
    split_req sp = { .parent = parent->bc, .color = color, .key = key };
    bool native = parent->ops.split != NULL && !strcmp(backend, parent->backend);
    if (s == CA_OK && native && color < 0) {
        void *none = NULL;
        s = parent->ops.split(parent->bc, -1, key, NULL, &none);
    }
    if (s != CA_OK || color < 0) {   /* a negative color joins no group */
        free(members);
        return s;
    }
    bool alone = o.world_size == 1 && !native;
    o.backend = alone ? "single" : backend;
    o.store = alone ? (ca_store_ref){ 0 } : parent->store;
    const ca_collective_ops *ops = NULL;
    bool staged = false;
    ca_comm *c = NULL;
    if ((s = choose_backend(&o, dev, &ops, &staged)) != CA_OK || !(c = calloc(1, sizeof *c))) {
        free(members);
        return s != CA_OK ? s : ca_error(CA_ERR_NOMEM, "out of memory splitting communicator %s", parent->prefix);
    }
    comm_init_fields(c, &o, ops, dev, staged);
    c->global = members;   /* the messages name the job's ranks */
    c->parent = parent;
    /* distinct from the parent's keys, from every other split of it and from the other colors */
    snprintf(c->prefix, sizeof c->prefix, "%s/s%u/g%d", parent->prefix[0] ? parent->prefix : "caccel/single", n,
             color);
    s = check_slots(c);
    if (s == CA_OK) s = comm_start(c, &o, native ? &sp : NULL);
    if (s != CA_OK) {
        ca_comm_destroy(c);
        return ca_error_context("ca_comm_split: color %d, key %d (rank %d of %s)", color, key, parent->rank,
                                parent->prefix);
    }
    *out = c;
    return CA_OK;
}

ca_status ca_comm_split(ca_comm *parent, int color, int key, ca_comm **out) {
    return comm_split(parent, color, key, parent ? parent->device : NULL, out);
}

ca_status ca_comm_split_host(ca_comm *parent, int color, int key, ca_comm **out) {
    return comm_split(parent, color, key, ca_cpu_device(), out);
}
