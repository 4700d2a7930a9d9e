/* Desync and hang diagnosis of the communicators: each rank's published record, the watchdog
 * that judges the peers while a collective waits, the failure messages that say where every rank
 * is, the checked collectives' rendezvous, and the announcement of a rank that leaves. */
#include "comm/comm_diag_impl.h"
#include "base/thread_impl.h"
#include "base/peer_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
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

const char *ca_coll_kind_name(ca_coll_kind k) {
    switch (k) {
    case CA_COLL_ALL_REDUCE: return "all_reduce";
    case CA_COLL_BROADCAST: return "broadcast";
    case CA_COLL_ALL_GATHER: return "all_gather";
    case CA_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case CA_COLL_BARRIER: return "barrier";
    case CA_COLL_SENDRECV: return "sendrecv";
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

/* A point-to-point operation by what it does: "send", "recv" or "sendrecv". */
static const char *p2p_name(const ca_coll_sig *s) {
    return s->root >= 0 && s->redop >= 0 ? "sendrecv" : s->root >= 0 ? "send" : "recv";
}

/* "to rank 1, from rank 3" (the job's ranks) */
static void p2p_peers(const ca_coll_sig *s, char *buf, size_t len) {
    if (s->root >= 0 && s->redop >= 0) snprintf(buf, len, "to rank %d, from rank %d", s->root, s->redop);
    else if (s->root >= 0) snprintf(buf, len, "to rank %d", s->root);
    else snprintf(buf, len, "from rank %d", s->redop);
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
    case CA_COLL_SENDRECV: {
        char peers[64];
        p2p_peers(s, peers, sizeof peers);
        snprintf(buf, len, "%s(%s, %s, %s)", p2p_name(s), ca_dtype_name((ca_dtype)s->dtype), n, peers);
        break;
    }
    default:
        snprintf(buf, len, "?");
        break;
    }
}

/* "all_reduce #1043 (f32, 301,056 elements, sum)" */
void ca_comm_diag_fmt_op(uint64_t seq, const ca_coll_sig *s, char *buf, size_t len) {
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
    case CA_COLL_SENDRECV: {
        char peers[64];
        p2p_peers(s, peers, sizeof peers);
        snprintf(buf, len, "%s #%llu (%s, %s elements, %s)", p2p_name(s), (unsigned long long)seq,
                 ca_dtype_name((ca_dtype)s->dtype), n, peers);
        break;
    }
    default:
        snprintf(buf, len, "%s #%llu (%s, %s elements%s, %s)", ca_coll_kind_name(s->kind),
                 (unsigned long long)seq, ca_dtype_name((ca_dtype)s->dtype), n,
                 s->kind == CA_COLL_REDUCE_SCATTER ? " per rank" : "",
                 ca_reduce_op_name((ca_reduce_op)s->redop));
        break;
    }
}

/* Point-to-point operations agree whatever their peers and counts (a ring's ranks each name their
 * own neighbours); collectives in every field. */
static bool sig_equal(const ca_coll_sig *a, const ca_coll_sig *b) {
    if (a->kind == CA_COLL_SENDRECV && b->kind == CA_COLL_SENDRECV) return true;
    return a->kind == b->kind && a->dtype == b->dtype && a->redop == b->redop && a->root == b->root &&
           a->count == b->count;
}

void ca_comm_diag_fmt_duration(int64_t ms, char *buf, size_t len) {
    if (ms % 1000 == 0) snprintf(buf, len, "%lld s", (long long)(ms / 1000));
    else if (ms >= 10000) snprintf(buf, len, "%.1f s", (double)ms / 1000.0);
    else snprintf(buf, len, "%lld ms", (long long)ms);
}

/* ------------------------------------------------------------ rank records */

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
    int n = snprintf(buf, len, "CAST2 %llu %s %lld %s %lld %s %lld %s %d %d %d %ld %llu %llu %s\n%s",
                     (unsigned long long)st->nissued, a,
                     st->has_unf ? (long long)st->unf : -1LL, b,
                     st->waiting ? (long long)st->wseq : -1LL, c,
                     st->has_chk ? (long long)st->chk : -1LL, d,
                     st->aborted ? 1 : 0, st->gone, st->exit_status, st->pid, st->start,
                     (unsigned long long)st->host, st->addr[0] ? st->addr : "-", st->aborted ? st->reason : "");
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
    char addr[48];
    if (sscanf(buf, "CAST2 %llu %63s %lld %63s %lld %63s %lld %63s %d %d %d %ld %llu %llu %47s", &n, a, &u, b, &w, c,
               &k, d, &ab, &gone, &xs, &pid, &start, &host, addr) != 15)
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
    if (strcmp(addr, "-") != 0) snprintf(st->addr, sizeof st->addr, "%s", addr);
    const char *nl = strchr(buf, '\n');
    if (nl) snprintf(st->reason, sizeof st->reason, "%s", nl + 1);
    st->valid = true;
    return true;
}

/* This process, as its peers' liveness checks see it. */
static pthread_once_t g_self_once = PTHREAD_ONCE_INIT;
static long g_self_pid;
static unsigned long long g_self_start;
static uint64_t g_self_host;
static char g_self_addr[48];

/* The local address the routing table picks to reach MASTER_ADDR (as Gloo binds it): what names
 * this rank's machine to the others. A UDP connect sends nothing. */
static void self_address(char *buf, size_t len) {
    buf[0] = '\0';
    const char *m = getenv("MASTER_ADDR");
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *ai = NULL;
    if (!m || !*m || getaddrinfo(m, "9", &hints, &ai) != 0) return;
    int fd = socket(ai->ai_family, SOCK_DGRAM, 0);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &sl) == 0) {
        const void *in = sa.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&sa)->sin6_addr
                                                  : (const void *)&((struct sockaddr_in *)&sa)->sin_addr;
        if (!inet_ntop(sa.ss_family, in, buf, (socklen_t)len)) buf[0] = '\0';
    }
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
}

static void self_init(void) {
    g_self_pid = (long)getpid();
    g_self_start = ca_proc_self_start();
    g_self_host = ca_proc_host_key();
    self_address(g_self_addr, sizeof g_self_addr);
}

static void self_identity(long *pid, unsigned long long *start, uint64_t *host, char *addr, size_t alen) {
    pthread_once(&g_self_once, self_init);
    *pid = g_self_pid;
    *start = g_self_start;
    *host = g_self_host;
    if (addr) snprintf(addr, alen, "%s", g_self_addr);
}

/* " on 10.0.0.3" for a rank on another machine than ours; "" on ours or when unknown. */
static void where(const rank_state *st, char *buf, size_t len) {
    char self[48];
    long pid;
    unsigned long long start;
    uint64_t host;
    self_identity(&pid, &start, &host, self, sizeof self);
    if (st->valid && st->addr[0] && strcmp(st->addr, self) != 0) snprintf(buf, len, " on %s", st->addr);
    else buf[0] = '\0';
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
    self_identity(&st->pid, &st->start, &st->host, st->addr, sizeof st->addr);
    if (atomic_load(&c->failed)) {
        st->aborted = true;
        snprintf(st->reason, sizeof st->reason, "%s", c->fail_msg);
    }
}

void ca_comm_diag_state_key(const ca_comm *c, int rank, char *buf, size_t len) {
    snprintf(buf, len, "%s/state/%d", c->prefix, rank);
}

/* Publishes the record if it changed since the last publication (force: always). */
ca_status ca_comm_diag_publish(ca_comm *c, bool force) {
    if (!c->store.ops) return CA_OK;
    pthread_mutex_lock(&c->pub_mu);
    rank_state st;
    uint64_t v;
    snapshot(c, &st, &v);
    ca_status s = CA_OK;
    if (force || v != c->published_version) {
        char buf[STATE_MAX], key[160];
        size_t n = state_encode(&st, buf, sizeof buf);
        ca_comm_diag_state_key(c, c->rank, key, sizeof key);
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
    ca_comm_diag_state_key(c, rank, key, sizeof key);
    ca_status s = c->store.ops->get(c->store.store, key, buf, &len, timeout_ms);
    if (s != CA_OK) {
        note_store_error(c, s);
        ca_clear_error();
        return false;
    }
    buf[len] = '\0';
    if (!state_decode(buf, st)) return false;
    if (!st->gone && !st->aborted && st->host && st->host == g_self_host && st->pid != g_self_pid) {
        st->dead = ca_proc_ended(st->pid, st->start);
        st->stopped = !st->dead && ca_proc_stopped(st->pid, st->start);
    }
    return true;
}

/* A failed rank that goes away too soon hides the cause from peers that have not judged it yet:
 * the store dies with the process that serves it (rank 0 without a launcher), and mpirun or
 * caccel launch stop every rank when one exits. So a failed communicator, when destroyed, waits
 * until every peer has failed, left or died, for at most `ms`. */
void ca_comm_diag_linger(ca_comm *c, int64_t ms) {
    if (c->own_client && ca_store_client_silent(c->own_client)) return;   /* a mute store: nobody to wait for */
    int64_t deadline = ca_now_ms() + ms;
    for (int r = 0; r < c->world && ca_now_ms() < deadline;) {
        rank_state st;
        if (r == c->rank || (fetch_state(c, r, 100, &st) && (st.aborted || st.gone || st.dead)) ||
            atomic_load(&c->store_lost)) {
            r++;
            continue;
        }
        usleep(20 * 1000);
    }
}

/* Whether peer p is done with our collectives #0..#n-1: it has issued and finished them all, or failed,
 * left or died (a peer ahead of us is done with them too). */
static bool done_with(const rank_state *p, uint64_t n) {
    return p->aborted || p->gone || p->dead || (p->nissued >= n && (!p->has_unf || p->unf >= n));
}

/* The store's host ends the store with its communicator (rank 0 without a launcher), yet a peer still
 * in a collective that this rank has finished reads the store: its watchdog reads every record 0.2 s
 * into a wait (and fails the wait when the store is gone), a checked collective reads them before it
 * moves data. So a peer slower than rank 0 to see its last collective complete failed it ("the
 * rendezvous store ... is gone"), once in about a hundred runs on a loaded machine. The host therefore
 * waits until every peer's record says that it is done with every collective this rank issued; a peer
 * that is stopped, hung, or dead on another machine (its record cannot say so) costs the bound.
 * Groups split from this communicator keep their records in the same store, and a group without this
 * rank (a tensor-parallel pair of ranks 2 and 3) may still be in a collective this rank never sees: once
 * a split has been made, the host waits until every peer has left this communicator (it destroys its
 * groups first) instead. */
void ca_comm_diag_drain(ca_comm *c) {
    pthread_mutex_lock(&c->mu);
    uint64_t n = c->nsplits > 0 ? UINT64_MAX : c->next_seq;
    pthread_mutex_unlock(&c->mu);
    /* a peer that has not finished within the collective timeout has failed by its own */
    int64_t deadline = ca_now_ms() + (c->timeout_ms < DRAIN_MS ? c->timeout_ms : DRAIN_MS);
    for (int r = 0; r < c->world && ca_now_ms() < deadline && !atomic_load(&c->store_lost);) {
        rank_state st;
        if (r == c->rank || (fetch_state(c, r, 100, &st) && done_with(&st, n))) {
            r++;
            continue;
        }
        usleep(20 * 1000);
    }
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
void ca_comm_diag_fmt_ranks(const int *r, int n, char *buf, size_t len) {
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

/* A stopped peer: "is stopped (pid 42: SIGSTOP or a debugger; it last published: waits in #5 ...)". */
static void describe(const rank_state *st, bool plural, char *buf, size_t len);
static void describe_stopped(const rank_state *st, bool plural, char *buf, size_t len) {
    rank_state last = *st;
    last.stopped = false;
    char was[600];
    describe(&last, false, was, sizeof was);
    snprintf(buf, len, "%s stopped (pid %ld: SIGSTOP or a debugger; it last published that it %.500s)",
             plural ? "are" : "is", st->pid, was);
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
    } else if (st->stopped) {   /* its record is as old as the stop: say what it was, not where it is */
        describe_stopped(st, plural, buf, len);
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

/* "; #5 waits on rank 1 (it has not called #5)": the ranks whose records (read just now) have not
 * issued #s; nothing where every rank has (the wait is then on the data, not on a late rank). */
static void waited_on(ca_comm *c, const rank_state *st, uint64_t s, char *buf, size_t len) {
    int *late = calloc((size_t)c->world, sizeof *late), n = 0;
    buf[0] = '\0';
    for (int r = 0; late && r < c->world; r++)
        if (r != c->rank && st[r].valid && st[r].nissued <= s) late[n++] = ca_comm_grank(c, r);
    if (n > 0) {
        char rl[256];
        ca_comm_diag_fmt_ranks(late, n, rl, sizeof rl);
        snprintf(buf, len, "; #%llu waits on %s %s (%s not called it)", (unsigned long long)s, n > 1 ? "ranks" : "rank",
                 rl, n > 1 ? "they have" : "it has");
    }
    free(late);
}

/* "rank 3 is in #1042 all_reduce(f32, 301,056, sum) while ranks 0-2 wait in #1043 barrier"; with
 * `waited` (s: the collective waited in), also the ranks that have not called #s (waited_on). */
static void positions_with(ca_comm *c, int known_rank, const rank_state *known, char *buf, size_t len, uint64_t s,
                           char *waited, size_t wlen) {
    int n = c->world;
    rank_state *st = calloc((size_t)n, sizeof *st);
    int *grp = calloc((size_t)n, sizeof *grp), *members = calloc((size_t)n, sizeof *members);
    char (*desc)[600] = calloc((size_t)n, sizeof *desc);
    if (!st || !grp || !members || !desc) {
        snprintf(buf, len, "(out of memory reading the other ranks' state)");
        free(st); free(grp); free(members); free(desc);
        return;
    }
    bool mute = false;   /* a store that left one fetch unanswered is not asked for the others' */
    for (int r = 0; r < n; r++) {
        if (r == known_rank) {
            st[r] = *known;
        } else if (!mute) {
            fetch_state(c, r, 2000, &st[r]);
            mute = c->own_client && ca_store_client_silent(c->own_client);
        }
        /* ranks group by what they do and by their machine */
        char on[64], d1[540];
        describe(&st[r], false, d1, sizeof d1);
        where(&st[r], on, sizeof on);
        snprintf(desc[r], sizeof desc[r], "%s|%s", d1, on);
        grp[r] = -1;
    }
    if (c->own_client && ca_store_client_silent(c->own_client)) {   /* not the ranks: the store is mute */
        snprintf(buf, len, "the rendezvous store at %s does not answer (its process is stopped or hung, or the "
                 "network to it is down), so where the other ranks are is unknown",
                 ca_store_client_address(c->own_client));
        free(st); free(grp); free(members); free(desc);
        return;
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
                    members[m++] = ca_comm_grank(c, r);
                }
            char rl[256], d[600], on[64];
            ca_comm_diag_fmt_ranks(members, m, rl, sizeof rl);
            describe(&st[first], m > 1, d, sizeof d);
            where(&st[first], on, sizeof on);
            int w = snprintf(buf + o, len - o, "%s%s %s%s %s",
                             o == 0 ? "" : (pass == 1 ? " while " : "; "), m > 1 ? "ranks" : "rank", rl, on, d);
            if (w < 0) break;
            o += (size_t)w;
            if (o >= len) { o = len - 1; break; }
        }
    }
    if (waited) waited_on(c, st, s, waited, wlen);
    free(st); free(grp); free(members); free(desc);
}

/* The same, every record read from the store. */
static void positions(ca_comm *c, char *buf, size_t len) { positions_with(c, -1, NULL, buf, len, 0, NULL, 0); }

/* ------------------------------------------------------------------ failure */

/* Until the failing thread has told the backend (failed == 2), the others wait: a thread that acted on
 * the failure sooner could free an operation the backend still owns (MPI would wait in MPI_Waitall
 * for a peer that is gone). Publishing the failure takes a store round trip: sleep, do not spin. */
static void wait_failure_recorded(ca_comm *c) {
    while (atomic_load(&c->failed) == 2) usleep(500);
}

/* Records the communicator's first failure, tells the peers and the backend, and only then lets the
 * other threads see it as failed (failed 2 -> 1). Returns the status, with the message recorded on
 * the calling thread. */
static ca_status comm_fail(ca_comm *c, ca_status s, const char *msg, const char *hint) {
    int expected = 0;
    pthread_mutex_lock(&c->mu);
    bool first = atomic_compare_exchange_strong(&c->failed, &expected, 2);
    if (first) {
        c->fail_status = s;
        snprintf(c->fail_msg, sizeof c->fail_msg, "%s", msg);
        snprintf(c->fail_hint, sizeof c->fail_hint, "%s", hint ? hint : "");
        c->version++;
    }
    pthread_mutex_unlock(&c->mu);
    if (first) {
        CA_LOG_E("%s", msg);
        if (c->own_client && ca_store_client_stalled(c->own_client, STALL_MS)) {
            /* a store that stopped answering gets short waits for the goodbye, also those under way */
            ca_store_client_set_io_timeout(c->own_client, EXIT_IO_MS);
            ca_store_client_cut(c->own_client, EXIT_IO_MS);
        }
        ca_comm_diag_publish(c, true);
        ca_clear_error();
        if (c->launch_notes) {
            /* caccel launch names the rank that failed first on its own, not those that failed with it */
            char key[96];
            snprintf(key, sizeof key, "caccel/launch/comm_failed/%d", c->rank);
            if (c->store.ops->set(c->store.store, key, msg, strlen(msg)) != CA_OK) ca_clear_error();
        }
        if (c->ops.abort) c->ops.abort(c->bc);
        ca_clear_error();
        /* before the failure is told: the caller may exit as soon as it is */
        ca_comm_fr_dump(c, s, msg);
        atomic_store(&c->failed, 1);
    }
    wait_failure_recorded(c);
    ca_error(c->fail_status, "%s", c->fail_msg);
    if (c->fail_hint[0]) ca_error_hint("%s", c->fail_hint);
    return c->fail_status;
}

ca_status ca_comm_diag_failed_already(ca_comm *c, const char *what) {
    wait_failure_recorded(c);
    ca_error(c->fail_status == CA_OK ? CA_ERR_STATE : c->fail_status,
             "%s on a communicator that already failed: %s", what, c->fail_msg);
    if (c->fail_hint[0]) ca_error_hint("%s", c->fail_hint);
    return c->fail_status == CA_OK ? CA_ERR_STATE : c->fail_status;
}

/* The failure that ended a wait in progress: the communicator's own message. */
ca_status ca_comm_diag_failure(ca_comm *c) {
    wait_failure_recorded(c);
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
    ca_comm_diag_fmt_op(s, x, ours, sizeof ours);
    ca_coll_sig_format(theirs, other, sizeof other);
    positions(c, pos, sizeof pos);
    if (at == s) {
        snprintf(msg, sizeof msg, "collective mismatch in %s on rank %d: rank %d called #%llu %s instead; %s",
                 ours, ca_comm_grank(c, c->rank), ca_comm_grank(c, peer), (unsigned long long)at, other, pos);
    } else {
        ca_coll_sig mine;
        if (own_sig_at(c, at, &mine)) ca_coll_sig_format(&mine, ourat, sizeof ourat);
        else snprintf(ourat, sizeof ourat, "(forgotten)");
        snprintf(msg, sizeof msg, "collective mismatch at #%llu seen while rank %d was in %s: rank %d called "
                 "#%llu %s, rank %d called #%llu %s; %s",
                 (unsigned long long)at, ca_comm_grank(c, c->rank), ours, ca_comm_grank(c, peer), (unsigned long long)at,
                 other, ca_comm_grank(c, c->rank), (unsigned long long)at, ourat, pos);
    }
    return comm_fail(c, CA_ERR_PEER, msg, DESYNC_HINT);
}

static ca_status fail_peer(ca_comm *c, uint64_t s, const ca_coll_sig *x, int peer, const char *reason) {
    char ours[200], msg[MSG_MAX * 2];
    ca_comm_diag_fmt_op(s, x, ours, sizeof ours);
    snprintf(msg, sizeof msg, "%s on rank %d cannot complete: rank %d failed: %.1200s", ours, ca_comm_grank(c, c->rank),
             ca_comm_grank(c, peer), reason);
    return comm_fail(c, CA_ERR_PEER, msg, NULL);
}

/* Peer `peer` left, exited or died before it could take part in our #s. */
static ca_status fail_gone(ca_comm *c, uint64_t s, const ca_coll_sig *x, int peer, const rank_state *p) {
    char ours[200], pos[MSG_MAX], msg[MSG_MAX * 2], hint[300];
    ca_comm_diag_fmt_op(s, x, ours, sizeof ours);
    /* the waiting peers publish their records within a watchdog tick: say where they are now */
    usleep(2 * WATCH_TICK_MS * 1000);
    positions_with(c, peer, p, pos, sizeof pos, 0, NULL, 0);
    snprintf(msg, sizeof msg, "%s on rank %d cannot complete: %s", ours, ca_comm_grank(c, c->rank), pos);
    peer = ca_comm_grank(c, peer);
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
    ca_comm_diag_fmt_op(s, x, ours, sizeof ours);
    snprintf(msg, sizeof msg, "%s on rank %d cannot complete: %s", ours, ca_comm_grank(c, c->rank), c->store_lost_msg);
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

ca_status ca_comm_diag_fail_timeout(ca_comm *c, uint64_t s, const ca_coll_sig *x, int64_t waited_ms, bool in_check) {
    char ours[200], pos[MSG_MAX], dur[32], msg[MSG_MAX * 2];
    ca_comm_diag_fmt_op(s, x, ours, sizeof ours);
    /* the configured timeout reads better than the few ms of wake-up late it was noticed, or early:
     * the deadline runs from the operation's issue, the wait measured here from a little later */
    int64_t early = c->timeout_ms / 10 < 1000 ? c->timeout_ms / 10 : 1000;
    if (waited_ms >= c->timeout_ms - early && waited_ms < c->timeout_ms + 1000) waited_ms = c->timeout_ms;
    ca_comm_diag_fmt_duration(waited_ms, dur, sizeof dur);
    /* a peer that does not arrive may be the store's process, stopped: then read the positions briefly;
     * and a store that is cut off (the network to it down) must not hold the diagnosis for its
     * waits' 5 s slack each: the reading of the positions is bounded either way */
    bool stalled = c->own_client && ca_store_client_stalled(c->own_client, STALL_MS);
    int64_t cut = c->own_client ? ca_store_client_cut(c->own_client, stalled ? EXIT_IO_MS : POSITIONS_MS) : 0;
    char waited[400] = "";
    if (c->store.ops) positions_with(c, -1, NULL, pos, sizeof pos, s, waited, sizeof waited);
    else snprintf(pos, sizeof pos, "(no rendezvous store: the other ranks' positions are unknown)");
    if (!stalled) ca_store_client_uncut(c->own_client, cut);
    snprintf(msg, sizeof msg, "%s timed out after %s on rank %d%s: %s%s", ours, dur, ca_comm_grank(c, c->rank),
             in_check ? " (waiting for the other ranks to reach it)" : "", pos, waited);
    return comm_fail(c, CA_ERR_TIMEOUT, msg,
                     "a rank that is late (long work on the main process only, a crash, a missing collective) "
                     "is named above; raise the timeout with CACCEL_TIMEOUT (seconds) when the work is legitimate");
}

/* A backend error: prefer a peer's own failure report, which says why. */
ca_status ca_comm_diag_fail_backend(ca_comm *c, uint64_t s, const ca_coll_sig *x, const char *backend_msg) {
    if (atomic_load(&c->failed)) return ca_comm_diag_failure(c);
    char saved[MSG_MAX];
    snprintf(saved, sizeof saved, "%s", backend_msg);
    /* a peer's socket closes while its process exits, a moment before /proc shows it ended: look twice */
    for (int pass = 0; pass < 2 && c->store.ops; pass++) {
        if (c->own_client && ca_store_client_silent(c->own_client)) break;   /* a mute store tells nothing */
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
        if (atomic_load(&c->failed)) return ca_comm_diag_failure(c);
    }
    char ours[200], pos[MSG_MAX], msg[MSG_MAX * 2];
    ca_comm_diag_fmt_op(s, x, ours, sizeof ours);
    if (c->store.ops) positions(c, pos, sizeof pos);
    else pos[0] = '\0';
    snprintf(msg, sizeof msg, "%s failed on rank %d (backend %s): %s%s%s", ours, ca_comm_grank(c, c->rank), c->backend, saved,
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

void *ca_comm_diag_watchdog_main(void *arg) {
    ca_comm *c = arg;
    ca_thread_begin("watchdog");
    int64_t next_check = 0, interval = CHECK_FIRST_MS;
    uint64_t checked_wait = UINT64_MAX;   /* counted as a watcher by its creator (ca_comm_fr_watch) */
    pthread_mutex_lock(&c->wd_mu);
    while (!c->wd_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WATCH_TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&c->wd_cv, &c->wd_mu, &ts);
        if (c->wd_stop) break;
        pthread_mutex_unlock(&c->wd_mu);

        if (c->fr) ca_comm_fr_tick(c);
        if (ca_comm_diag_publish(c, false) != CA_OK) ca_clear_error();
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
    ca_comm_fr_watch(c, false);
    return NULL;
}

/* The checked collectives' rendezvous: every peer at #s with signature x. */
ca_status ca_comm_diag_precheck(ca_comm *c, uint64_t s, const ca_coll_sig *x, int64_t deadline) {
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
    if (ca_comm_diag_publish(c, false) != CA_OK) {
        char m[MSG_MAX];
        snprintf(m, sizeof m, "%s", ca_last_error());
        return ca_comm_diag_fail_backend(c, s, x, m);
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
            ret = ca_comm_diag_failure(c);
            goto out;
        }
        int64_t now = ca_now_ms();
        if (now >= deadline) {
            ret = ca_comm_diag_fail_timeout(c, s, x, now - start, true);
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
        if (ca_comm_diag_publish(c, true) != CA_OK) ca_clear_error();
    }
    /* a clean exit without ca_comm_destroy takes the store down as well (a failing one leaves at once) */
    for (ca_comm *c = g_live; c && status == 0; c = c->live_next)
        if (c->store_host && !atomic_load(&c->failed)) ca_comm_diag_drain(c);
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

void ca_comm_diag_live_add(ca_comm *c) {
    pthread_mutex_lock(&g_live_mu);
    if (!g_exit_hook) g_exit_hook = on_exit(announce_exit, NULL) == 0;
    c->live_next = g_live;
    g_live = c;
    pthread_mutex_unlock(&g_live_mu);
}

/* Takes c off the live list; its own store client (if any) is kept to announce the exit status. */
void ca_comm_diag_live_remove(ca_comm *c, bool announce) {
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
        ca_comm_diag_state_key(c, c->rank, d->key, sizeof d->key);
        snapshot(c, &d->st, NULL);
        d->next = g_departed;
        g_departed = d;
    }
    pthread_mutex_unlock(&g_live_mu);
}
