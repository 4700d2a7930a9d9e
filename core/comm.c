/* Communicators: sequence numbers, deadlines, out-of-band progress publishing, and desync/hang diagnosis. */
#include "core/core_impl.h"
#include "core/comm_impl.h"
#include "core/procenv_impl.h"
#include "core/store_impl.h"
#include "base/peer_impl.h"

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

/*
 * How a hang becomes a message.
 *
 * Every rank numbers its collectives (#0, #1, ...) and keeps a small record:
 * the last one issued, the oldest one not finished, the one a thread waits
 * on, and the last signature-checked one. A watchdog thread publishes that
 * record to the rendezvous store (key <prefix>/state/<rank>) when it changed,
 * at most every WATCH_TICK_MS, so the collective path itself never touches
 * the store. While a thread waits on a collective, the watchdog also reads
 * the peers' records and fails the communicator when a peer sits at the same
 * number with a different signature, waits on an earlier number that this
 * rank issued differently, or has failed. A wait that reaches its deadline
 * reads every record and says where each rank is.
 *
 * Checked collectives (barrier, broadcast, all_gather always; every one in
 * debug mode or while ca_comm_set_checked is on) publish at once and wait,
 * before moving any data, until every peer has reached the same number with
 * the same signature, so a mismatch fails on every rank instead of matching
 * the wrong operation.
 */

#define WATCH_TICK_MS 50
#define CHECK_FIRST_MS 200     /* a wait this old makes the watchdog look at the peers */
#define CHECK_MAX_MS 2000
#define WAIT_SLICE_MS 100      /* the waiting thread looks at the failure flag this often */
#define HIST 1024              /* signatures remembered, for judging late peers */
#define MSG_MAX 2048
#define STATE_MAX 1024
#define LEFT_GRACE_MS 300      /* a peer that destroyed its communicator may be about to exit: wait for its status */
#define BACKEND_SETTLE_MS 200  /* a backend error waits this long for the peer that caused it to show */
#define EXIT_IO_MS 2000        /* the exit announcement gives up on an unreachable store this soon */

/* Where a rank's process stands with the communicator (rank_state.gone). */
enum { GONE_NO = 0, GONE_LEFT = 1, GONE_EXITED = 2 };

const char *ca_coll_kind_name(ca_coll_kind k) {
    switch (k) {
    case CA_COLL_ALL_REDUCE: return "all_reduce";
    case CA_COLL_BROADCAST: return "broadcast";
    case CA_COLL_ALL_GATHER: return "all_gather";
    case CA_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case CA_COLL_BARRIER: return "barrier";
    default: return "none";
    }
}

/* 301056 -> "301,056" */
static void fmt_count(uint64_t n, char *buf, size_t len) {
    char tmp[32];
    int d = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)n);
    size_t o = 0;
    for (int i = 0; i < d && o + 1 < len; i++) {
        if (i > 0 && (d - i) % 3 == 0 && o + 2 < len) buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = '\0';
}

void ca_coll_sig_format(const ca_coll_sig *s, char *buf, size_t len) {
    char n[40];
    fmt_count(s->count, n, sizeof n);
    switch (s->kind) {
    case CA_COLL_BARRIER:
        snprintf(buf, len, "barrier");
        break;
    case CA_COLL_BROADCAST:
        snprintf(buf, len, "broadcast(%s, %s, root %d)", ca_dtype_name((ca_dtype)s->dtype), n, s->root);
        break;
    case CA_COLL_ALL_REDUCE:
    case CA_COLL_REDUCE_SCATTER:
        snprintf(buf, len, "%s(%s, %s, %s)", ca_coll_kind_name(s->kind), ca_dtype_name((ca_dtype)s->dtype), n,
                 ca_reduce_op_name((ca_reduce_op)s->redop));
        break;
    case CA_COLL_ALL_GATHER:
        snprintf(buf, len, "all_gather(%s, %s)", ca_dtype_name((ca_dtype)s->dtype), n);
        break;
    default:
        snprintf(buf, len, "?");
        break;
    }
}

/* "all_reduce #1043 (f32, 301,056 elements, sum)" */
static void fmt_op(uint64_t seq, const ca_coll_sig *s, char *buf, size_t len) {
    char n[40];
    fmt_count(s->count, n, sizeof n);
    switch (s->kind) {
    case CA_COLL_BARRIER:
        snprintf(buf, len, "barrier #%llu", (unsigned long long)seq);
        break;
    case CA_COLL_BROADCAST:
        snprintf(buf, len, "broadcast #%llu (%s, %s elements, root %d)", (unsigned long long)seq,
                 ca_dtype_name((ca_dtype)s->dtype), n, s->root);
        break;
    case CA_COLL_ALL_GATHER:
        snprintf(buf, len, "all_gather #%llu (%s, %s elements per rank)", (unsigned long long)seq,
                 ca_dtype_name((ca_dtype)s->dtype), n);
        break;
    default:
        snprintf(buf, len, "%s #%llu (%s, %s elements%s, %s)", ca_coll_kind_name(s->kind),
                 (unsigned long long)seq, ca_dtype_name((ca_dtype)s->dtype), n,
                 s->kind == CA_COLL_REDUCE_SCATTER ? " per rank" : "",
                 ca_reduce_op_name((ca_reduce_op)s->redop));
        break;
    }
}

static bool sig_equal(const ca_coll_sig *a, const ca_coll_sig *b) {
    return a->kind == b->kind && a->dtype == b->dtype && a->redop == b->redop && a->root == b->root &&
           a->count == b->count;
}

static void fmt_duration(int64_t ms, char *buf, size_t len) {
    if (ms % 1000 == 0) snprintf(buf, len, "%lld s", (long long)(ms / 1000));
    else if (ms >= 10000) snprintf(buf, len, "%.1f s", (double)ms / 1000.0);
    else snprintf(buf, len, "%lld ms", (long long)ms);
}

/* ------------------------------------------------------------ rank records */

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
    bool dead;                 /* not published: judged here from /proc */
    char reason[STATE_MAX / 2];
} rank_state;

static int sig_print(char *b, size_t len, const ca_coll_sig *s) {
    return snprintf(b, len, "%d,%d,%d,%d,%llu", (int)s->kind, s->dtype, s->redop, s->root,
                    (unsigned long long)s->count);
}

static size_t state_encode(const rank_state *st, char *buf, size_t len) {
    char a[64], b[64], c[64], d[64];
    sig_print(a, sizeof a, &st->last);
    sig_print(b, sizeof b, &st->unf_sig);
    sig_print(c, sizeof c, &st->wsig);
    sig_print(d, sizeof d, &st->chk_sig);
    int n = snprintf(buf, len, "CAST2 %llu %s %lld %s %lld %s %lld %s %d %d %d %ld %llu %llu\n%s",
                     (unsigned long long)st->nissued, a,
                     st->has_unf ? (long long)st->unf : -1LL, b,
                     st->waiting ? (long long)st->wseq : -1LL, c,
                     st->has_chk ? (long long)st->chk : -1LL, d,
                     st->aborted ? 1 : 0, st->gone, st->exit_status, st->pid, st->start,
                     (unsigned long long)st->host, st->aborted ? st->reason : "");
    return n < 0 ? 0 : ((size_t)n < len ? (size_t)n : len - 1);
}

static bool sig_parse(const char *t, ca_coll_sig *s) {
    int k;
    unsigned long long cnt;
    if (sscanf(t, "%d,%d,%d,%d,%llu", &k, &s->dtype, &s->redop, &s->root, &cnt) != 5) return false;
    if (k < 0 || k >= CA_COLL_KIND_COUNT) return false;
    s->kind = (ca_coll_kind)k;
    s->count = cnt;
    return true;
}

static bool state_decode(const char *buf, rank_state *st) {
    memset(st, 0, sizeof *st);
    char a[64], b[64], c[64], d[64];
    unsigned long long n;
    long long u, w, k;
    int ab, gone, xs;
    long pid;
    unsigned long long start, host;
    if (sscanf(buf, "CAST2 %llu %63s %lld %63s %lld %63s %lld %63s %d %d %d %ld %llu %llu", &n, a, &u, b, &w, c, &k,
               d, &ab, &gone, &xs, &pid, &start, &host) != 14)
        return false;
    if (!sig_parse(a, &st->last) || !sig_parse(b, &st->unf_sig) || !sig_parse(c, &st->wsig) ||
        !sig_parse(d, &st->chk_sig))
        return false;
    st->nissued = n;
    st->has_unf = u >= 0;
    st->unf = (uint64_t)u;
    st->waiting = w >= 0;
    st->wseq = (uint64_t)w;
    st->has_chk = k >= 0;
    st->chk = (uint64_t)k;
    st->aborted = ab != 0;
    st->gone = gone;
    st->exit_status = xs;
    st->pid = pid;
    st->start = start;
    st->host = (uint64_t)host;
    const char *nl = strchr(buf, '\n');
    if (nl) snprintf(st->reason, sizeof st->reason, "%s", nl + 1);
    st->valid = true;
    return true;
}

/* ---------------------------------------------------------------- objects */

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
    bool launch_notes;         /* the store is caccel launch's: leave it a note on failure */

    pthread_mutex_t mu;        /* the record below */
    uint64_t next_seq;
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

    _Atomic int failed;
    ca_status fail_status;
    char fail_msg[MSG_MAX];
    char fail_hint[512];

    pthread_mutex_t pub_mu;    /* one publisher at a time, newest record wins */
    uint64_t published_version;

    pthread_t wd;
    bool wd_running, wd_stop;
    pthread_mutex_t wd_mu;
    pthread_cond_t wd_cv;
};

int ca_comm_rank(const ca_comm *c) { return c ? c->rank : -1; }
int ca_comm_size(const ca_comm *c) { return c ? c->world : 0; }
const char *ca_comm_backend(const ca_comm *c) { return c ? c->backend : "?"; }
int64_t ca_comm_timeout_ms(const ca_comm *c) { return c ? c->timeout_ms : 0; }
bool ca_comm_is_aborted(const ca_comm *c) { return c && atomic_load(&c->failed); }

uint64_t ca_comm_seq(const ca_comm *c) {
    if (!c) return 0;
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    uint64_t s = c->next_seq;
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
    return s;
}

bool ca_comm_set_checked(ca_comm *c, bool on) {
    if (!c) return false;
    bool old = c->checked_user;
    c->checked_user = on;
    return old;
}

/* This process, as its peers' liveness checks see it. */
static pthread_once_t g_self_once = PTHREAD_ONCE_INIT;
static long g_self_pid;
static unsigned long long g_self_start;
static uint64_t g_self_host;

static void self_init(void) {
    g_self_pid = (long)getpid();
    g_self_start = ca_proc_self_start();
    g_self_host = ca_proc_host_key();
}

static void self_identity(long *pid, unsigned long long *start, uint64_t *host) {
    pthread_once(&g_self_once, self_init);
    *pid = g_self_pid;
    *start = g_self_start;
    *host = g_self_host;
}

/* A store that says it is gone (its server ended) fails every wait on this communicator. */
static void note_store_error(ca_comm *c, ca_status s) {
    if (s != CA_ERR_PEER || atomic_load(&c->store_lost)) return;
    pthread_mutex_lock(&c->mu);
    if (!atomic_load(&c->store_lost)) {
        snprintf(c->store_lost_msg, sizeof c->store_lost_msg, "%s", ca_last_error());
        atomic_store(&c->store_lost, 1);
    }
    pthread_mutex_unlock(&c->mu);
}

static void snapshot(ca_comm *c, rank_state *st, uint64_t *version) {
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&c->mu);
    st->valid = true;
    st->nissued = c->next_seq;
    st->last = c->last_sig;
    if (c->unf_head) {
        st->has_unf = true;
        st->unf = c->unf_head->seq;
        st->unf_sig = c->unf_head->sig;
    }
    st->waiting = c->waiting;
    st->wseq = c->wseq;
    st->wsig = c->wsig;
    st->has_chk = c->has_chk;
    st->chk = c->chk;
    st->chk_sig = c->chk_sig;
    st->gone = c->gone;
    st->exit_status = c->exit_status;
    if (version) *version = c->version;
    pthread_mutex_unlock(&c->mu);
    self_identity(&st->pid, &st->start, &st->host);
    if (atomic_load(&c->failed)) {
        st->aborted = true;
        snprintf(st->reason, sizeof st->reason, "%s", c->fail_msg);
    }
}

static void state_key(const ca_comm *c, int rank, char *buf, size_t len) {
    snprintf(buf, len, "%s/state/%d", c->prefix, rank);
}

/* Publishes the record if it changed since the last publication (force: always). */
static ca_status publish(ca_comm *c, bool force) {
    if (!c->store.ops) return CA_OK;
    pthread_mutex_lock(&c->pub_mu);
    rank_state st;
    uint64_t v;
    snapshot(c, &st, &v);
    ca_status s = CA_OK;
    if (force || v != c->published_version) {
        char buf[STATE_MAX], key[160];
        size_t n = state_encode(&st, buf, sizeof buf);
        state_key(c, c->rank, key, sizeof key);
        s = c->store.ops->set(c->store.store, key, buf, n);
        if (s == CA_OK) c->published_version = v;
        else note_store_error(c, s);
    }
    pthread_mutex_unlock(&c->pub_mu);
    return s;
}

static bool fetch_state(ca_comm *c, int rank, int64_t timeout_ms, rank_state *st) {
    memset(st, 0, sizeof *st);
    pthread_once(&g_self_once, self_init);
    if (rank == c->rank) {
        snapshot(c, st, NULL);
        return true;
    }
    char buf[STATE_MAX + 1], key[160];
    size_t len = STATE_MAX;
    state_key(c, rank, key, sizeof key);
    ca_status s = c->store.ops->get(c->store.store, key, buf, &len, timeout_ms);
    if (s != CA_OK) {
        note_store_error(c, s);
        ca_clear_error();
        return false;
    }
    buf[len] = '\0';
    if (!state_decode(buf, st)) return false;
    if (!st->gone && !st->aborted && st->host && st->host == g_self_host && st->pid != g_self_pid)
        st->dead = ca_proc_ended(st->pid, st->start);
    return true;
}

/* Peer p can never take part in our collective #s: it left or died before issuing it, or while in it. */
static bool gone_before(const rank_state *p, uint64_t s) {
    if (!p->gone && !p->dead) return false;
    return p->nissued <= s || (p->has_unf && p->unf <= s);
}

/* ---------------------------------------------------------------- judging */

typedef enum { J_WAIT, J_AGREE, J_DESYNC, J_UNKNOWN } judgement;

/* P's signature at seq s, when its record shows it. */
static bool peer_sig_at(const rank_state *p, uint64_t s, ca_coll_sig *out) {
    if (p->nissued > 0 && p->nissued - 1 == s) { *out = p->last; return true; }
    if (p->has_unf && p->unf == s) { *out = p->unf_sig; return true; }
    if (p->waiting && p->wseq == s) { *out = p->wsig; return true; }
    if (p->has_chk && p->chk == s) { *out = p->chk_sig; return true; }
    return false;
}

/* Our signature at seq q, if still remembered. Caller holds nothing. */
static bool own_sig_at(ca_comm *c, uint64_t q, ca_coll_sig *out) {
    pthread_mutex_lock(&c->mu);
    bool ok = q < c->next_seq && c->next_seq - q <= HIST;
    if (ok) *out = c->hist[q % HIST];
    pthread_mutex_unlock(&c->mu);
    return ok;
}

/* Compares peer record p with our collective #s (signature x). In a checked
 * collective (`pre`), a peer past s passed its own check of s against us, so
 * it agreed; in a plain wait that proves nothing. *at receives the number the
 * disagreement is at, *theirs the peer's signature there. */
static judgement judge(ca_comm *c, const rank_state *p, uint64_t s, const ca_coll_sig *x, bool pre,
                       uint64_t *at, ca_coll_sig *theirs) {
    ca_coll_sig y;
    if (peer_sig_at(p, s, &y)) {
        if (sig_equal(&y, x)) return J_AGREE;
        *at = s;
        *theirs = y;
        return J_DESYNC;
    }
    if (p->nissued <= s) {
        /* not there yet: stuck on something we did differently? */
        uint64_t qs[2];
        const ca_coll_sig *ys[2];
        int nq = 0;
        if (p->waiting) { qs[nq] = p->wseq; ys[nq++] = &p->wsig; }
        if (p->has_unf) { qs[nq] = p->unf; ys[nq++] = &p->unf_sig; }
        for (int i = 0; i < nq; i++) {
            ca_coll_sig mine;
            if (qs[i] < s && own_sig_at(c, qs[i], &mine) && !sig_equal(&mine, ys[i])) {
                *at = qs[i];
                *theirs = *ys[i];
                return J_DESYNC;
            }
        }
        return J_WAIT;
    }
    return pre ? J_AGREE : J_UNKNOWN;
}

/* "0-2,5" */
static void fmt_ranks(const int *r, int n, char *buf, size_t len) {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && o + 1 < len;) {
        int j = i;
        while (j + 1 < n && r[j + 1] == r[j] + 1) j++;
        int w;
        if (j > i + 1) w = snprintf(buf + o, len - o, "%s%d-%d", o ? "," : "", r[i], r[j]);
        else if (j == i + 1) w = snprintf(buf + o, len - o, "%s%d,%d", o ? "," : "", r[i], r[j]);
        else w = snprintf(buf + o, len - o, "%s%d", o ? "," : "", r[i]);
        if (w < 0) break;
        o += (size_t)w;
        if (o >= len) { o = len - 1; break; }
        i = j + 1;
    }
}

/* When a rank that is gone stopped: "after collective #4", "during #5 all_reduce(...)". */
static void gone_when(const rank_state *st, char *buf, size_t len) {
    char sig[160];
    if (st->has_unf) {
        ca_coll_sig_format(&st->unf_sig, sig, sizeof sig);
        snprintf(buf, len, "during #%llu %s", (unsigned long long)st->unf, sig);
    } else if (st->nissued == 0) {
        snprintf(buf, len, "before its first collective");
    } else {
        snprintf(buf, len, "after collective #%llu", (unsigned long long)(st->nissued - 1));
    }
}

/* Where one rank is, as "<verb> <rest>" with the verb for one rank or many. */
static void describe(const rank_state *st, bool plural, char *buf, size_t len) {
    char sig[160], when[200];
    if (st->valid && !st->aborted && (st->gone || st->dead)) {
        gone_when(st, when, sizeof when);
        if (st->gone == GONE_EXITED) snprintf(buf, len, "exited (status %d) %s", st->exit_status, when);
        else if (st->gone == GONE_LEFT) snprintf(buf, len, "left (destroyed the communicator) %s", when);
        else snprintf(buf, len, "died (pid %ld ended without exiting: killed or crashed; last seen %s)", st->pid, when);
    } else if (!st->valid) {
        snprintf(buf, len, "%s not published %s state (not started, crashed, or unreachable)",
                 plural ? "have" : "has", plural ? "their" : "its");
    } else if (st->aborted) {
        snprintf(buf, len, "failed: %.400s", st->reason);
    } else if (st->waiting) {
        ca_coll_sig_format(&st->wsig, sig, sizeof sig);
        snprintf(buf, len, "%s in #%llu %s", plural ? "wait" : "waits", (unsigned long long)st->wseq, sig);
    } else if (st->has_unf) {
        ca_coll_sig_format(&st->unf_sig, sig, sizeof sig);
        snprintf(buf, len, "%s in #%llu %s (issued, not waited on)", plural ? "are" : "is",
                 (unsigned long long)st->unf, sig);
    } else if (st->nissued == 0) {
        snprintf(buf, len, "%s not called any collective", plural ? "have" : "has");
    } else {
        ca_coll_sig_format(&st->last, sig, sizeof sig);
        snprintf(buf, len, "%s finished #%llu %s and not called the next collective", plural ? "have" : "has",
                 (unsigned long long)(st->nissued - 1), sig);
    }
}

/* "rank 3 is in #1042 all_reduce(f32, 301,056, sum) while ranks 0-2 wait in #1043 barrier" */
static void positions_with(ca_comm *c, int known_rank, const rank_state *known, char *buf, size_t len) {
    int n = c->world;
    rank_state *st = calloc((size_t)n, sizeof *st);
    int *grp = calloc((size_t)n, sizeof *grp), *members = calloc((size_t)n, sizeof *members);
    char (*desc)[600] = calloc((size_t)n, sizeof *desc);
    if (!st || !grp || !members || !desc) {
        snprintf(buf, len, "(out of memory reading the other ranks' state)");
        free(st); free(grp); free(members); free(desc);
        return;
    }
    for (int r = 0; r < n; r++) {
        if (r == known_rank) st[r] = *known;
        else fetch_state(c, r, 2000, &st[r]);
        describe(&st[r], false, desc[r], sizeof desc[r]);
        grp[r] = -1;
    }
    int ngroups = 0;
    for (int r = 0; r < n; r++) {
        if (grp[r] >= 0) continue;
        grp[r] = ngroups;
        for (int q = r + 1; q < n; q++)
            if (grp[q] < 0 && strcmp(desc[q], desc[r]) == 0) grp[q] = ngroups;
        ngroups++;
    }
    size_t o = 0;
    buf[0] = '\0';
    int own = grp[c->rank];
    for (int pass = 0; pass < 2; pass++) {
        for (int g = 0; g < ngroups; g++) {
            if ((pass == 0) == (g == own)) continue;
            int m = 0, first = -1;
            for (int r = 0; r < n; r++)
                if (grp[r] == g) {
                    if (first < 0) first = r;
                    members[m++] = r;
                }
            char rl[256], d[600];
            fmt_ranks(members, m, rl, sizeof rl);
            describe(&st[first], m > 1, d, sizeof d);
            int w = snprintf(buf + o, len - o, "%s%s %s %s",
                             o == 0 ? "" : (pass == 1 ? " while " : "; "), m > 1 ? "ranks" : "rank", rl, d);
            if (w < 0) break;
            o += (size_t)w;
            if (o >= len) { o = len - 1; break; }
        }
    }
    free(st); free(grp); free(members); free(desc);
}

/* The same, every record read from the store. */
static void positions(ca_comm *c, char *buf, size_t len) { positions_with(c, -1, NULL, buf, len); }

/* ------------------------------------------------------------------ failure */

/* Records the communicator's first failure, tells the peers and the backend.
 * Returns the status, with the message recorded on the calling thread. */
static ca_status comm_fail(ca_comm *c, ca_status s, const char *msg, const char *hint) {
    int expected = 0;
    pthread_mutex_lock(&c->mu);
    bool first = atomic_compare_exchange_strong(&c->failed, &expected, 2);
    if (first) {
        c->fail_status = s;
        snprintf(c->fail_msg, sizeof c->fail_msg, "%s", msg);
        snprintf(c->fail_hint, sizeof c->fail_hint, "%s", hint ? hint : "");
        c->version++;
        atomic_store(&c->failed, 1);
    }
    pthread_mutex_unlock(&c->mu);
    if (first) {
        CA_LOG_E("%s", msg);
        publish(c, true);
        ca_clear_error();
        if (c->launch_notes) {
            /* caccel launch names the rank that failed first on its own, not those that failed with it */
            char key[96];
            snprintf(key, sizeof key, "caccel/launch/comm_failed/%d", c->rank);
            if (c->store.ops->set(c->store.store, key, msg, strlen(msg)) != CA_OK) ca_clear_error();
        }
        if (c->ops.abort) c->ops.abort(c->bc);
        ca_clear_error();
    }
    while (atomic_load(&c->failed) == 2) sched_yield();
    ca_error(c->fail_status, "%s", c->fail_msg);
    if (c->fail_hint[0]) ca_error_hint("%s", c->fail_hint);
    return c->fail_status;
}

static ca_status failed_already(ca_comm *c, const char *what) {
    while (atomic_load(&c->failed) == 2) sched_yield();
    ca_error(c->fail_status == CA_OK ? CA_ERR_STATE : c->fail_status,
             "%s on a communicator that already failed: %s", what, c->fail_msg);
    if (c->fail_hint[0]) ca_error_hint("%s", c->fail_hint);
    return c->fail_status == CA_OK ? CA_ERR_STATE : c->fail_status;
}

/* The failure that ended a wait in progress: the communicator's own message. */
static ca_status failure(ca_comm *c) {
    while (atomic_load(&c->failed) == 2) sched_yield();
    ca_error(c->fail_status == CA_OK ? CA_ERR_STATE : c->fail_status, "%s", c->fail_msg);
    if (c->fail_hint[0]) ca_error_hint("%s", c->fail_hint);
    return c->fail_status == CA_OK ? CA_ERR_STATE : c->fail_status;
}

static const char *DESYNC_HINT =
    "every rank must call the same collectives in the same order; a collective inside "
    "`if (is_main_process)` (or a loop whose length differs between ranks) is the usual cause";

static ca_status fail_desync(ca_comm *c, uint64_t s, const ca_coll_sig *x, int peer, uint64_t at,
                             const ca_coll_sig *theirs) {
    char ours[200], other[200], ourat[200], pos[MSG_MAX], msg[MSG_MAX * 2];
    fmt_op(s, x, ours, sizeof ours);
    ca_coll_sig_format(theirs, other, sizeof other);
    positions(c, pos, sizeof pos);
    if (at == s) {
        snprintf(msg, sizeof msg, "collective mismatch in %s on rank %d: rank %d called #%llu %s instead; %s",
                 ours, c->rank, peer, (unsigned long long)at, other, pos);
    } else {
        ca_coll_sig mine;
        if (own_sig_at(c, at, &mine)) ca_coll_sig_format(&mine, ourat, sizeof ourat);
        else snprintf(ourat, sizeof ourat, "(forgotten)");
        snprintf(msg, sizeof msg, "collective mismatch at #%llu seen while rank %d was in %s: rank %d called "
                 "#%llu %s, rank %d called #%llu %s; %s",
                 (unsigned long long)at, c->rank, ours, peer, (unsigned long long)at, other, c->rank,
                 (unsigned long long)at, ourat, pos);
    }
    return comm_fail(c, CA_ERR_PEER, msg, DESYNC_HINT);
}

static ca_status fail_peer(ca_comm *c, uint64_t s, const ca_coll_sig *x, int peer, const char *reason) {
    char ours[200], msg[MSG_MAX * 2];
    fmt_op(s, x, ours, sizeof ours);
    snprintf(msg, sizeof msg, "%s on rank %d cannot complete: rank %d failed: %.1200s", ours, c->rank, peer, reason);
    return comm_fail(c, CA_ERR_PEER, msg, NULL);
}

/* Peer `peer` left, exited or died before it could take part in our #s. */
static ca_status fail_gone(ca_comm *c, uint64_t s, const ca_coll_sig *x, int peer, const rank_state *p) {
    char ours[200], pos[MSG_MAX], msg[MSG_MAX * 2], hint[300];
    fmt_op(s, x, ours, sizeof ours);
    /* the waiting peers publish their records within a watchdog tick: say where they are now */
    usleep(2 * WATCH_TICK_MS * 1000);
    positions_with(c, peer, p, pos, sizeof pos);
    snprintf(msg, sizeof msg, "%s on rank %d cannot complete: %s", ours, c->rank, pos);
    if (p->gone && (p->gone == GONE_LEFT || p->exit_status == 0))
        snprintf(hint, sizeof hint, "rank %d finished while the others still call collectives: every rank must make "
                 "the same collective calls (a loop shorter on one rank, uneven shards with even_batches false, a "
                 "return before the last collective)", peer);
    else
        snprintf(hint, sizeof hint, "rank %d ended first; its own output says why", peer);
    return comm_fail(c, CA_ERR_PEER, msg, hint);
}

/* The store died with the process serving it (rank 0 without a launcher, or the launcher). */
static ca_status fail_store(ca_comm *c, uint64_t s, const ca_coll_sig *x) {
    char ours[200], msg[MSG_MAX * 2];
    fmt_op(s, x, ours, sizeof ours);
    snprintf(msg, sizeof msg, "%s on rank %d cannot complete: %s", ours, c->rank, c->store_lost_msg);
    return comm_fail(c, CA_ERR_PEER, msg,
                     "the process serving the rendezvous store ended (rank 0 serves it when there is no launcher); "
                     "its own output says why");
}

/* Destroying the communicator usually comes right before exit: wait a moment for the exit status. */
static void settle_left(ca_comm *c, int r, rank_state *st) {
    if (st->gone != GONE_LEFT) return;
    usleep(LEFT_GRACE_MS * 1000);
    rank_state again;
    if (fetch_state(c, r, 1000, &again)) *st = again;
}

/* What a peer's record says against our #s: a failure, a departure, a desync. Returns
 * true when it failed the communicator. */
static bool judge_peer(ca_comm *c, uint64_t s, const ca_coll_sig *x, int r, rank_state *st, bool pre,
                       ca_status *ret) {
    if (st->aborted) {
        *ret = fail_peer(c, s, x, r, st->reason);
        return true;
    }
    if (gone_before(st, s)) {
        settle_left(c, r, st);
        *ret = fail_gone(c, s, x, r, st);
        return true;
    }
    uint64_t at = 0;
    ca_coll_sig theirs;
    if (judge(c, st, s, x, pre, &at, &theirs) == J_DESYNC) {
        *ret = fail_desync(c, s, x, r, at, &theirs);
        return true;
    }
    return false;
}

static ca_status fail_timeout(ca_comm *c, uint64_t s, const ca_coll_sig *x, int64_t waited_ms, bool in_check) {
    char ours[200], pos[MSG_MAX], dur[32], msg[MSG_MAX * 2];
    fmt_op(s, x, ours, sizeof ours);
    /* the configured timeout reads better than the few ms of wake-up late it was noticed */
    if (waited_ms >= c->timeout_ms && waited_ms < c->timeout_ms + 1000) waited_ms = c->timeout_ms;
    fmt_duration(waited_ms, dur, sizeof dur);
    if (c->store.ops) positions(c, pos, sizeof pos);
    else snprintf(pos, sizeof pos, "(no rendezvous store: the other ranks' positions are unknown)");
    snprintf(msg, sizeof msg, "%s timed out after %s on rank %d%s: %s", ours, dur, c->rank,
             in_check ? " (waiting for the other ranks to reach it)" : "", pos);
    return comm_fail(c, CA_ERR_TIMEOUT, msg,
                     "a rank that is late (long work on the main process only, a crash, a missing collective) "
                     "is named above; raise the timeout with CACCEL_TIMEOUT (seconds) when the work is legitimate");
}

/* A backend error: prefer a peer's own failure report, which says why. */
static ca_status fail_backend(ca_comm *c, uint64_t s, const ca_coll_sig *x, const char *backend_msg) {
    if (atomic_load(&c->failed)) return failure(c);
    char saved[MSG_MAX];
    snprintf(saved, sizeof saved, "%s", backend_msg);
    /* a peer's socket closes while its process exits, a moment before /proc shows it ended: look twice */
    for (int pass = 0; pass < 2 && c->store.ops; pass++) {
        if (pass) usleep(BACKEND_SETTLE_MS * 1000);
        for (int r = 0; r < c->world; r++) {
            if (r == c->rank) continue;
            rank_state st;
            if (!fetch_state(c, r, 1000, &st)) continue;
            if (st.aborted) return fail_peer(c, s, x, r, st.reason);
            if (st.gone || st.dead) {
                settle_left(c, r, &st);
                return fail_gone(c, s, x, r, &st);
            }
        }
        if (atomic_load(&c->store_lost)) return fail_store(c, s, x);
        if (atomic_load(&c->failed)) return failure(c);
    }
    char ours[200], pos[MSG_MAX], msg[MSG_MAX * 2];
    fmt_op(s, x, ours, sizeof ours);
    if (c->store.ops) positions(c, pos, sizeof pos);
    else pos[0] = '\0';
    snprintf(msg, sizeof msg, "%s failed on rank %d (backend %s): %s%s%s", ours, c->rank, c->backend, saved,
             pos[0] ? "; " : "", pos);
    return comm_fail(c, CA_ERR_BACKEND, msg, NULL);
}

/* ---------------------------------------------------------------- watchdog */

static void watch_peers(ca_comm *c) {
    pthread_mutex_lock(&c->mu);
    bool waiting = c->waiting;
    uint64_t s = c->wseq;
    ca_coll_sig x = c->wsig;
    pthread_mutex_unlock(&c->mu);
    if (!waiting) return;
    for (int r = 0; r < c->world && !atomic_load(&c->failed); r++) {
        if (r == c->rank) continue;
        rank_state st;
        ca_status ret;
        if (fetch_state(c, r, 1000, &st) && judge_peer(c, s, &x, r, &st, false, &ret)) {
            ca_clear_error();
            return;
        }
        if (atomic_load(&c->store_lost)) {
            fail_store(c, s, &x);
            ca_clear_error();
            return;
        }
    }
}

static void *watchdog_main(void *arg) {
    ca_comm *c = arg;
    int64_t next_check = 0, interval = CHECK_FIRST_MS;
    uint64_t checked_wait = UINT64_MAX;
    pthread_mutex_lock(&c->wd_mu);
    while (!c->wd_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WATCH_TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&c->wd_cv, &c->wd_mu, &ts);
        if (c->wd_stop) break;
        pthread_mutex_unlock(&c->wd_mu);

        if (publish(c, false) != CA_OK) ca_clear_error();
        if (!atomic_load(&c->failed)) {
            pthread_mutex_lock(&c->mu);
            bool waiting = c->waiting;
            uint64_t w = c->wseq;
            int64_t since = c->wait_start_ms;
            pthread_mutex_unlock(&c->mu);
            int64_t now = ca_now_ms();
            if (!waiting) {
                interval = CHECK_FIRST_MS;
                checked_wait = UINT64_MAX;
            } else {
                if (w != checked_wait) {
                    checked_wait = w;
                    interval = CHECK_FIRST_MS;
                    next_check = since + CHECK_FIRST_MS;
                }
                if (now >= next_check) {
                    watch_peers(c);
                    next_check = now + interval;
                    interval = interval * 2 > CHECK_MAX_MS ? CHECK_MAX_MS : interval * 2;
                }
            }
        }
        pthread_mutex_lock(&c->wd_mu);
    }
    pthread_mutex_unlock(&c->wd_mu);
    return NULL;
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

/* Marks w finished (under mu) and frees its backend handle; returns its final status. */
static ca_status finish(ca_comm *c, ca_work *w, ca_status s) {
    if (!w->done && (w->st_send || w->st_recv)) s = unstage(c, w, s);
    pthread_mutex_lock(&c->mu);
    if (!w->done) {
        w->done = true;
        w->status = s;
        unf_remove(c, w);
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

/* The checked collectives' rendezvous: every peer at #s with signature x. */
static ca_status precheck(ca_comm *c, uint64_t s, const ca_coll_sig *x, int64_t deadline) {
    pthread_mutex_lock(&c->mu);
    c->has_chk = true;
    c->chk = s;
    c->chk_sig = *x;
    c->waiting = true;
    c->wseq = s;
    c->wsig = *x;
    c->wait_start_ms = ca_now_ms();
    c->version++;
    pthread_mutex_unlock(&c->mu);
    if (publish(c, false) != CA_OK) {
        char m[MSG_MAX];
        snprintf(m, sizeof m, "%s", ca_last_error());
        return fail_backend(c, s, x, m);
    }
    int n = c->world;
    bool *agreed = calloc((size_t)n, sizeof *agreed);
    if (!agreed) return ca_error(CA_ERR_NOMEM, "out of memory");
    agreed[c->rank] = true;
    int left = n - 1;
    int64_t sleep_us = 0, start = ca_now_ms();
    ca_status ret = CA_OK;
    while (left > 0) {
        for (int r = 0; r < n && left > 0; r++) {
            if (agreed[r]) continue;
            rank_state st;
            int64_t rem = deadline - ca_now_ms();
            if (!fetch_state(c, r, rem < 1 ? 1 : (rem > 2000 ? 2000 : rem), &st)) {
                if (atomic_load(&c->store_lost)) {
                    ret = fail_store(c, s, x);
                    goto out;
                }
                continue;
            }
            if (st.aborted || gone_before(&st, s)) {
                judge_peer(c, s, x, r, &st, true, &ret);
                goto out;
            }
            uint64_t at = 0;
            ca_coll_sig theirs;
            judgement j = judge(c, &st, s, x, true, &at, &theirs);
            if (j == J_AGREE) {
                agreed[r] = true;
                left--;
            } else if (j == J_DESYNC) {
                ret = fail_desync(c, s, x, r, at, &theirs);
                goto out;
            }
        }
        if (left == 0) break;
        if (atomic_load(&c->failed)) {
            ret = failure(c);
            goto out;
        }
        int64_t now = ca_now_ms();
        if (now >= deadline) {
            ret = fail_timeout(c, s, x, now - start, true);
            goto out;
        }
        sleep_us = sleep_us ? (sleep_us * 2 > 20000 ? 20000 : sleep_us * 2) : 50;
        usleep((useconds_t)sleep_us);
    }
out:
    free(agreed);
    pthread_mutex_lock(&c->mu);
    c->waiting = false;
    c->version++;
    pthread_mutex_unlock(&c->mu);
    return ret;
}

/* Waits for w until deadline; a passed deadline of the operation fails the
 * communicator, a shorter caller deadline only returns CA_ERR_TIMEOUT. */
static ca_status wait_work(ca_comm *c, ca_work *w, int64_t deadline, bool op_deadline) {
    if (w->done) return w->status;
    pthread_mutex_lock(&c->mu);
    c->waiting = true;
    c->wseq = w->seq;
    c->wsig = w->sig;
    c->wait_start_ms = ca_now_ms();
    c->version++;
    pthread_mutex_unlock(&c->mu);
    ca_status ret;
    for (;;) {
        if (atomic_load(&c->failed)) {
            ret = failure(c);
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
                fmt_op(w->seq, &w->sig, op, sizeof op);
                return ca_error(CA_ERR_TIMEOUT, "%s not finished within the %lld ms asked (still running)", op,
                                (long long)(deadline - w->issue_ms));
            }
            ret = fail_timeout(c, w->seq, &w->sig, ca_now_ms() - w->issue_ms, false);
            finish(c, w, ret);
            return ret;
        }
        /* a backend that gives up at the same deadline (Gloo) is a timeout, not a fault */
        if (op_deadline && ca_now_ms() + 50 >= deadline && !atomic_load(&c->failed)) {
            ca_clear_error();
            ret = fail_timeout(c, w->seq, &w->sig, ca_now_ms() - w->issue_ms, false);
        } else {
            char m[MSG_MAX];
            snprintf(m, sizeof m, "%s", ca_last_error());
            ret = fail_backend(c, w->seq, &w->sig, m);
        }
        finish(c, w, ret);
        return ret;
    }
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
    int root;
} issue_args;

/* Host staging: host copies of the operation's buffers (the send buffer
 * copied from the device, which waits for the kernels that wrote it); *h
 * gets the host pointers the backend is given. */
static ca_status stage(ca_comm *c, ca_coll_kind kind, const issue_args *a, ca_work *w, issue_args *h) {
    *h = *a;
    if (kind == CA_COLL_BARRIER) return CA_OK;
    size_t es = ca_dtype_size(a->dt), n = a->count * es, world = (size_t)c->world;
    size_t sb = kind == CA_COLL_REDUCE_SCATTER ? n * world : n;
    size_t rb = kind == CA_COLL_ALL_GATHER ? n * world : n;
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

static ca_status run(ca_comm *c, ca_coll_kind kind, const issue_args *a, ca_work **out) {
    if (!c) return ca_error(CA_ERR_INVALID, "%s: NULL communicator", ca_coll_kind_name(kind));
    if (out) *out = NULL;
    if (atomic_load(&c->failed)) return failed_already(c, ca_coll_kind_name(kind));

    ca_coll_sig sig = { .kind = kind, .dtype = -1, .redop = -1, .root = -1, .count = 0 };
    if (kind != CA_COLL_BARRIER) {
        sig.dtype = (int)a->dt;
        sig.count = a->count;
    }
    if (kind == CA_COLL_ALL_REDUCE || kind == CA_COLL_REDUCE_SCATTER) sig.redop = (int)a->op;
    if (kind == CA_COLL_BROADCAST) sig.root = a->root;
    bool checked = c->store.ops && (c->debug || c->checked_user || kind == CA_COLL_BARRIER ||
                                    kind == CA_COLL_BROADCAST || kind == CA_COLL_ALL_GATHER);

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

    pthread_mutex_lock(&c->mu);
    w->seq = c->next_seq++;
    c->last_sig = sig;
    c->hist[w->seq % HIST] = sig;
    w->prev = c->unf_tail;
    if (c->unf_tail) c->unf_tail->next = w;
    else c->unf_head = w;
    c->unf_tail = w;
    c->version++;
    pthread_mutex_unlock(&c->mu);

    int64_t deadline = w->issue_ms + c->timeout_ms;
    ca_status s = CA_OK;
    if (checked) s = precheck(c, w->seq, &sig, deadline);
    issue_args staged;
    if (s == CA_OK && c->stage) {
        s = stage(c, kind, a, w, &staged);
        a = &staged;
    }
    if (s == CA_OK) {
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
        default:
            s = ca_error(CA_ERR_INTERNAL, "unknown collective %d", (int)kind);
            break;
        }
        if (s != CA_OK) {
            char m[MSG_MAX];
            snprintf(m, sizeof m, "%s", ca_last_error());
            s = fail_backend(c, w->seq, &sig, m);
        }
    }
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
        ca_status s = failed_already(c, "collective");
        finish(c, w, s);
        return s;
    }
    ca_status s = c->ops.work_test(w->impl);
    if (s == CA_OK) return finish(c, w, CA_OK);
    if (s == CA_IN_PROGRESS) {
        if (ca_now_ms() >= w->issue_ms + c->timeout_ms) {
            s = fail_timeout(c, w->seq, &w->sig, ca_now_ms() - w->issue_ms, false);
            finish(c, w, s);
            return s;
        }
        return CA_IN_PROGRESS;
    }
    char m[MSG_MAX];
    snprintf(m, sizeof m, "%s", ca_last_error());
    s = fail_backend(c, w->seq, &w->sig, m);
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

static bool device_supported(const char *names, const char *dev) {
    if (!names || strcmp(names, "*") == 0) return true;
    size_t dl = strlen(dev);
    for (const char *p = names; *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        while (l && *p == ' ') { p++; l--; }
        if (l == dl && strncmp(p, dev, dl) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
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
    void *dbuf = NULL;
    ca_status s = ca_device_alloc(c->device, sizeof blob, &dbuf);
    if (s == CA_OK) s = ca_device_copy_from_host(c->device, dbuf, blob, sizeof blob);
    ca_work_impl *wi = NULL;
    if (s == CA_OK) s = c->ops.broadcast(c->bc, dbuf, sizeof blob, CA_U8, 0, &wi);
    if (s == CA_OK && wi) {
        s = c->ops.work_wait(wi, c->timeout_ms);
        c->ops.work_free(wi);
    }
    if (s == CA_OK) s = ca_device_copy_to_host(c->device, blob, dbuf, sizeof blob);
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
    ca_status s = publish(c, true);
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
        state_key(c, r, keys[r], 160);
    }
    s = c->store.ops->wait(c->store.store, (const char *const *)keys, n, c->timeout_ms);
    if (s == CA_ERR_TIMEOUT) {
        int *missing = calloc((size_t)n, sizeof *missing), m = 0;
        for (int r = 0; missing && r < n; r++)
            if (c->store.ops->check(c->store.store, keys[r]) != CA_OK) missing[m++] = r;
        ca_clear_error();
        char rl[256] = "?", dur[32];
        if (missing) fmt_ranks(missing, m, rl, sizeof rl);
        fmt_duration(c->timeout_ms, dur, sizeof dur);
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

/* ------------------------------------------------------ leaving the job
 *
 * A rank that stops calling collectives while the others wait in one would
 * leave them waiting until the timeout. So every rank says in its record when
 * it leaves: ca_comm_destroy announces GONE_LEFT, and an on_exit handler
 * announces GONE_EXITED with the exit status, for the communicators still
 * alive and for those destroyed before (their store client is kept for that).
 * The peers' watchdogs fail a wait on a collective the departed rank never
 * issued within a second or two.
 */

typedef struct departed {
    ca_store_client *client;
    char key[160];
    rank_state st;
    struct departed *next;
} departed;

static pthread_mutex_t g_live_mu = PTHREAD_MUTEX_INITIALIZER;
static ca_comm *g_live;
static departed *g_departed;
static bool g_exit_hook;

static void announce_exit(int status, void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_live_mu);
    for (ca_comm *c = g_live; c; c = c->live_next) {
        pthread_mutex_lock(&c->mu);
        c->gone = GONE_EXITED;
        c->exit_status = status;
        c->version++;
        pthread_mutex_unlock(&c->mu);
        if (c->own_client) ca_store_client_set_io_timeout(c->own_client, EXIT_IO_MS);
        if (publish(c, true) != CA_OK) ca_clear_error();
    }
    while (g_departed) {
        departed *d = g_departed;
        g_departed = d->next;
        d->st.gone = GONE_EXITED;
        d->st.exit_status = status;
        char buf[STATE_MAX];
        size_t n = state_encode(&d->st, buf, sizeof buf);
        ca_store_ref ref = ca_store_client_ref(d->client);
        if (ref.ops->set(ref.store, d->key, buf, n) != CA_OK) ca_clear_error();
        ca_store_client_close(d->client);
        free(d);
    }
    pthread_mutex_unlock(&g_live_mu);
}

static void live_add(ca_comm *c) {
    pthread_mutex_lock(&g_live_mu);
    if (!g_exit_hook) g_exit_hook = on_exit(announce_exit, NULL) == 0;
    c->live_next = g_live;
    g_live = c;
    pthread_mutex_unlock(&g_live_mu);
}

/* Takes c off the live list; its own store client (if any) is kept to announce the exit status. */
static void live_remove(ca_comm *c, bool announce) {
    pthread_mutex_lock(&g_live_mu);
    bool was_live = false;
    for (ca_comm **p = &g_live; *p; p = &(*p)->live_next)
        if (*p == c) {
            *p = c->live_next;
            was_live = true;
            break;
        }
    departed *d = NULL;
    if (was_live && announce && g_exit_hook && c->own_client && !c->own_server) d = calloc(1, sizeof *d);
    if (d) {
        d->client = c->own_client;
        c->own_client = NULL;
        ca_store_client_set_io_timeout(d->client, EXIT_IO_MS);
        state_key(c, c->rank, d->key, sizeof d->key);
        snapshot(c, &d->st, NULL);
        d->next = g_departed;
        g_departed = d;
    }
    pthread_mutex_unlock(&g_live_mu);
}

void ca_comm_destroy(ca_comm *c) {
    if (!c) return;
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
        if (publish(c, true) != CA_OK) ca_clear_error();
    }
    live_remove(c, announce);
    if (c->bc && c->ops.destroy) c->ops.destroy(c->bc);
    ca_store_client_close(c->own_client);
    ca_store_server_stop(c->own_server);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->pub_mu);
    pthread_mutex_destroy(&c->wd_mu);
    pthread_cond_destroy(&c->wd_cv);
    free(c);
}

/* owned_client/owned_server: a store made for this communicator from the
 * environment; it is closed with the communicator, and such communicators
 * are numbered in creation order across the process. */
static ca_status create_impl(const ca_comm_options *opts, ca_store_client *owned_client,
                             ca_store_server *owned_server, ca_comm **out) {
    if (!out) {
        ca_store_client_close(owned_client);
        ca_store_server_stop(owned_server);
        return ca_error(CA_ERR_INVALID, "ca_comm_create: NULL output");
    }
    *out = NULL;
    ca_comm_options o = opts ? *opts : (ca_comm_options){ 0 };
    if (owned_client) o.store = ca_store_client_ref(owned_client);
    ca_status s = CA_OK;
    if (o.world_size == 0) {
        ca_procenv pe;
        s = ca_procenv_detect(&pe);
        if (s != CA_OK) return s;
        if (!o.store.ops && pe.world_size > 1)
            return ca_procenv_comm_create(&pe, o.backend, o.device, o.timeout_ms, o.debug, out);
        o.rank = pe.rank;
        o.world_size = pe.world_size;
        o.local_rank = pe.local_rank;
        o.local_world_size = pe.local_world_size;
        if (!o.backend) o.backend = ca_procenv_pick_backend(&pe, NULL);
    }
    if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
        s = ca_error(CA_ERR_INVALID, "ca_comm_create: rank %d of world size %d", o.rank, o.world_size);
    if (o.local_world_size <= 0) {
        o.local_world_size = o.world_size;
        o.local_rank = o.rank;
    }
    if (!o.backend) o.backend = o.world_size == 1 ? "single" : "gloo";
    ca_device *dev = o.device ? o.device : ca_cpu_device();
    const ca_collective_ops *ops = NULL;
    if (s == CA_OK && !dev) s = ca_error(CA_ERR_STATE, "ca_comm_create: no CPU device");
    if (s == CA_OK && !(ops = ca_registry_collective(o.backend))) s = ca_procenv_backend_missing(o.backend);
    /* a backend for host memory (it names cpu, or names nothing) works on another
     * device's buffers through host copies */
    bool staged = false;
    if (s == CA_OK && !ca_device_is_host(dev) && (!ops->device_names || strcmp(ops->device_names, "*") != 0) &&
        !(ops->device_names && device_supported(ops->device_names, ca_device_name(dev))) &&
        (!ops->device_names || device_supported(ops->device_names, "cpu")))
        staged = true;
    if (s == CA_OK && !staged && !device_supported(ops->device_names, ca_device_name(dev))) {
        ca_error(CA_ERR_UNSUPPORTED, "collective backend '%s' cannot reduce on device '%s' (it supports: %s)",
                 o.backend, ca_device_name(dev), ops->device_names);
        ca_error_hint("use backend nccl for cuda devices, gloo or mpi for cpu");
        s = CA_ERR_UNSUPPORTED;
    }
    ca_comm *c = s == CA_OK ? calloc(1, sizeof *c) : NULL;
    if (s == CA_OK && !c) s = ca_error(CA_ERR_NOMEM, "out of memory creating a communicator");
    if (s != CA_OK) {
        ca_store_client_close(owned_client);
        ca_store_server_stop(owned_server);
        return s;
    }
    c->own_client = owned_client;
    c->own_server = owned_server;
    const char *launcher = getenv("CACCEL_LAUNCHER");
    c->launch_notes = owned_client && launcher && strcmp(launcher, "caccel") == 0;
    ca_copy_vtable(&c->ops, sizeof c->ops, ops, ops->struct_size);
    snprintf(c->backend, sizeof c->backend, "%s", o.backend);
    c->rank = o.rank;
    c->world = o.world_size;
    c->local_rank = o.local_rank;
    c->local_world = o.local_world_size;
    c->device = dev;
    c->stage = staged;
    if (staged && o.rank == 0)
        CA_LOG_I("collective backend %s works on host memory: %s buffers are staged through host copies", o.backend,
                 ca_device_name(dev));
    c->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : ca_comm_default_timeout_ms();
    c->debug = o.debug;
    c->last_sig = (ca_coll_sig){ .kind = CA_COLL_NONE, .dtype = -1, .redop = -1, .root = -1 };
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->pub_mu, NULL);
    pthread_mutex_init(&c->wd_mu, NULL);
    pthread_cond_init(&c->wd_cv, NULL);
    c->published_version = UINT64_MAX;

    static const char *const required[] = { "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier",
                                            "work_test", "work_wait", "work_free", "init" };
    const void *slots[] = { (const void *)c->ops.all_reduce, (const void *)c->ops.broadcast,
                            (const void *)c->ops.all_gather, (const void *)c->ops.reduce_scatter,
                            (const void *)c->ops.barrier, (const void *)c->ops.work_test,
                            (const void *)c->ops.work_wait, (const void *)c->ops.work_free,
                            (const void *)c->ops.init };
    for (size_t i = 0; i < CA_ARRAY_LEN(required); i++) {
        if (!slots[i]) {
            ca_comm_destroy(c);
            return ca_error(CA_ERR_UNSUPPORTED, "collective backend '%s' has no '%s'", o.backend, required[i]);
        }
    }

    if (o.store.ops && o.world_size > 1) {
        c->store = o.store;
        s = number_comm(c);
        if (s != CA_OK) {
            ca_comm_destroy(c);
            return s;
        }
    }

    char bprefix[128];
    snprintf(bprefix, sizeof bprefix, "%s/%s", c->prefix[0] ? c->prefix : "caccel/single", o.backend);
    ca_comm_init_args ia = {
        .struct_size = sizeof ia,
        .rank = o.rank,
        .world_size = o.world_size,
        .local_rank = o.local_rank,
        .local_world_size = o.local_world_size,
        .store = c->store,
        .timeout_ms = c->timeout_ms,
        .device_ops = ca_device_ops_of(staged ? ca_cpu_device() : dev),
        .device = ca_device_context(staged ? ca_cpu_device() : dev),
        .prefix = bprefix,
    };
    s = c->ops.init(&ia, &c->bc);
    if (s != CA_OK) {
        ca_error_context("creating a %s communicator (rank %d of %d)", o.backend, o.rank, o.world_size);
        ca_comm_destroy(c);
        return ca_last_status();
    }
    if (o.world_size > 1 && !c->store.ops) {
        s = bootstrap_store(c);
        if (s == CA_OK) s = number_comm(c);
        if (s != CA_OK) {
            ca_comm_destroy(c);
            return s;
        }
    }
    if (o.world_size > 1) {
        s = join(c);
        if (s != CA_OK) {
            ca_comm_destroy(c);
            return s;
        }
        if (pthread_create(&c->wd, NULL, watchdog_main, c) != 0) {
            ca_comm_destroy(c);
            return ca_error(CA_ERR_NOMEM, "cannot start the communicator's watchdog thread");
        }
        c->wd_running = true;
        live_add(c);
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

ca_status ca_procenv_backend_missing(const char *backend) {
    char reason[1024];
    snprintf(reason, sizeof reason, "%s", ca_last_error());
    const char *file = NULL, *pkg = NULL, *more = "";
    if (strcmp(backend, "gloo") == 0) {
        file = "caccel_gloo.so";
        pkg = "libgloo-dev";
        more = "; or start the program with mpirun and backend mpi";
    } else if (strcmp(backend, "mpi") == 0) {
        file = "caccel_mpi.so";
        pkg = "libopenmpi-dev (and openmpi-bin for mpirun)";
        more = "; the MPI backend runs only under mpirun/mpiexec/srun --mpi";
    } else if (strcmp(backend, "nccl") == 0) {
        file = "caccel_cuda.so";
        pkg = "libnccl-dev and the CUDA toolkit";
    }
    if (!file) {
        ca_error(CA_ERR_NOT_FOUND, "unknown collective backend '%s' (%s)", backend, reason);
        ca_error_hint("backends: single, gloo, mpi, nccl (`caccel env` lists those found)");
        return CA_ERR_NOT_FOUND;
    }
    ca_error(CA_ERR_NOT_FOUND, "collective backend '%s' is not available: plugin %s (%s)", backend, file, reason);
    ca_error_hint("install the Debian package %s, then reconfigure and rebuild caccel so %s is built and installed "
                  "in %s (or add its directory to CACCEL_PLUGIN_PATH)%s",
                  pkg, file, CA_PLUGIN_DIR, more);
    return CA_ERR_NOT_FOUND;
}

ca_status ca_procenv_comm_create(const ca_procenv *pe, const char *backend, ca_device *device, int64_t timeout_ms,
                                 bool debug, ca_comm **out) {
    *out = NULL;
    const char *name = ca_procenv_pick_backend(pe, backend);
    /* GPU memory: NCCL, unless asked otherwise (or under mpirun with no address for its store) */
    bool asked = backend && *backend && strcmp(backend, "auto") != 0;
    if (!asked && pe->world_size > 1 && device && !ca_device_is_host(device) &&
        !(pe->under_mpi && (!pe->master_addr[0] || pe->master_port <= 0)))
        name = "nccl";
    if (!ca_registry_collective(name)) return ca_procenv_backend_missing(name);
    if (strcmp(name, "mpi") == 0 && !pe->under_mpi && pe->world_size > 1) {
        ca_error(CA_ERR_CONFIG, "backend mpi asked for, but this process was started by %s, not by an MPI launcher",
                 pe->launcher_name);
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
    if (pe->world_size > 1 && strcmp(name, "mpi") != 0) {
        ca_store_client *cl = NULL;
        ca_store_server *srv = NULL;
        ca_status s = ca_procenv_store(pe, timeout_ms > 0 ? timeout_ms : ca_comm_default_timeout_ms(), &cl, &srv);
        if (s != CA_OK) return s;
        return ca_comm_create_owning(&o, cl, srv, out);
    }
    return ca_comm_create(&o, out);
}
