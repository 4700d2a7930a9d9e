/* The rendezvous store's client: pooled connections, deadlines, and the cut a failing job's diagnosis uses. */
#include "comm/store_wire_impl.h"

#include <caccel/log.h>

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Grace the client adds to a server-side wait before it gives up on the socket. */
#define CLIENT_SLACK_MS 5000


struct ca_store_client {
    char host[256];
    int port;
    char addr[300];
    char token[CA_STORE_MAX_TOKEN + 1];
    int64_t io_timeout_ms;
    pthread_mutex_t mu;
    int *idle;
    int nidle, idle_cap;
    /* Once the server has been reached, losing it is final: the process serving
     * it ended, and retrying for the whole deadline only hides that. */
    bool reached;
    bool gone;
    char gone_why[256];
    /* ca_store_client_cut: exchanges begun before cut_at end by cut_at (a failed job's diagnosis and
     * teardown must not wait out the 30 s of a store whose process is stopped). */
    _Atomic int64_t cut_at;
    /* The last exchange timed out with no answer (the store's process stopped or hung): later
     * requests wait only SILENT_SLACK_MS beyond their own wait, until one is answered. */
    atomic_bool silent;
    /* requests under way and the last reply: a store with requests waiting and no reply for a
     * while has stalled (ca_store_client_stalled) */
    atomic_int pending;
    _Atomic int64_t last_reply_at;
};

#define SILENT_SLACK_MS 500

/* The client and start of the request this thread is exchanging, read by wait_fd for the cut;
 * thread-local, as requests run on several threads at once and wait_fd sits under them. */
static _Thread_local ca_store_client *tl_client;
static _Thread_local int64_t tl_start;

typedef struct reply {
    ca_status status;
    int64_t arg;
    uint8_t *val;       /* malloc'd, NUL-terminated */
    size_t len;
} reply;

/* deadline, or the cut of this thread's request when that comes sooner (ca_store_client_cut) */
static int64_t cut_deadline(int64_t deadline) {
    if (tl_client) {
        int64_t cut = atomic_load(&tl_client->cut_at);
        if (tl_start <= cut && cut < deadline) return cut;
    }
    return deadline;
}

/* Waits for fd to be ready for `ev` until deadline. 0 ready, ETIMEDOUT, or errno. */
static int wait_fd(int fd, short ev, int64_t deadline) {
    for (;;) {
        int64_t left = cut_deadline(deadline) - now_ms();
        if (left <= 0) return ETIMEDOUT;
        struct pollfd p = { .fd = fd, .events = ev };
        int r = poll(&p, 1, left > 200 ? 200 : (int)left);   /* short: a cut may come meanwhile */
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) return errno;
    }
}

static int send_all(int fd, const uint8_t *buf, size_t len, int64_t deadline) {
    while (len) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int e = wait_fd(fd, POLLOUT, deadline);
            if (e) return e;
            continue;
        }
        return n < 0 ? errno : EPIPE;
    }
    return 0;
}

static int recv_all(int fd, uint8_t *buf, size_t len, int64_t deadline) {
    while (len) {
        ssize_t n = recv(fd, buf, len, MSG_DONTWAIT);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) return ECONNRESET;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int e = wait_fd(fd, POLLIN, deadline);
            if (e) return e;
            continue;
        }
        return errno;
    }
    return 0;
}

static void mark_gone(ca_store_client *c, const char *why) {
    pthread_mutex_lock(&c->mu);
    if (!c->gone) {
        c->gone = true;
        snprintf(c->gone_why, sizeof c->gone_why, "%s", why);
    }
    pthread_mutex_unlock(&c->mu);
}

static bool is_gone(ca_store_client *c) {
    pthread_mutex_lock(&c->mu);
    bool g = c->gone;
    pthread_mutex_unlock(&c->mu);
    return g;
}

static ca_status gone_error(ca_store_client *c) {
    pthread_mutex_lock(&c->mu);
    char why[256];
    snprintf(why, sizeof why, "%s", c->gone_why);
    pthread_mutex_unlock(&c->mu);
    ca_error(CA_ERR_PEER, "the rendezvous store at %s is gone: %s", c->addr, why);
    ca_error_hint("the process serving the store (caccel launch, or rank 0 without a launcher) exited or "
                  "was killed; look at its output for the first failure");
    return CA_ERR_PEER;
}

static ca_status io_error(ca_store_client *c, int e, const char *doing) {
    if (e == ETIMEDOUT)
        return ca_error(CA_ERR_TIMEOUT, "rendezvous store at %s did not answer while %s", c->addr, doing);
    if (e == ECONNRESET || e == EPIPE) {
        char why[256];
        snprintf(why, sizeof why, "it closed the connection while %s", doing);
        mark_gone(c, why);
        return gone_error(c);
    }
    return ca_error(CA_ERR_IO, "rendezvous store at %s: %s while %s", c->addr, strerror(e), doing);
}

/* One request/reply exchange on fd. */
static int exchange(int fd, uint32_t op, const char *key, size_t klen, const void *val, size_t vlen,
                    int64_t arg, int64_t deadline, reply *rep) {
    uint8_t hdr[REQ_HDR];
    put32(hdr, MAGIC_REQ);
    put32(hdr + 4, op);
    put32(hdr + 8, (uint32_t)klen);
    put32(hdr + 12, (uint32_t)vlen);
    put64(hdr + 16, (uint64_t)arg);
    int e;
    if (klen + vlen <= 4096) {
        uint8_t buf[REQ_HDR + 4096];
        memcpy(buf, hdr, REQ_HDR);
        if (klen) memcpy(buf + REQ_HDR, key, klen);
        if (vlen) memcpy(buf + REQ_HDR + klen, val, vlen);
        e = send_all(fd, buf, REQ_HDR + klen + vlen, deadline);
    } else {
        e = send_all(fd, hdr, REQ_HDR, deadline);
        if (!e && klen) e = send_all(fd, (const uint8_t *)key, klen, deadline);
        if (!e && vlen) e = send_all(fd, val, vlen, deadline);
    }
    if (e) return e;
    uint8_t rh[REP_HDR];
    if ((e = recv_all(fd, rh, REP_HDR, deadline))) return e;
    if (get32(rh) != MAGIC_REP) return EPROTO;
    rep->status = (ca_status)(int32_t)get32(rh + 4);
    rep->len = get32(rh + 8);
    rep->arg = (int64_t)get64(rh + 12);
    if (rep->len > CA_STORE_MAX_VALUE) return EPROTO;
    rep->val = malloc(rep->len + 1);
    if (!rep->val) return ENOMEM;
    rep->val[rep->len] = 0;
    if (rep->len && (e = recv_all(fd, rep->val, rep->len, deadline))) {
        free(rep->val);
        rep->val = NULL;
        return e;
    }
    return 0;
}

/* Opens a connection and presents the token; retries refused connections until deadline. */
static ca_status open_conn(ca_store_client *c, int64_t deadline, int *out_fd) {
    int64_t backoff = 20;
    int last = 0;
    for (;;) {
        struct addrinfo *ai = NULL;
        ca_status st = resolve(c->host, c->port, false, &ai, "rendezvous store");
        if (st != CA_OK) return st;
        int fd = -1;
        for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
            fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
            if (fd < 0) {
                last = errno;
                continue;
            }
            int r = connect(fd, a->ai_addr, a->ai_addrlen);
            if (r < 0 && errno == EINPROGRESS) {
                int e = wait_fd(fd, POLLOUT, deadline);
                if (!e) {
                    socklen_t el = sizeof e;
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
                }
                r = e ? -1 : 0;
                errno = e;
            }
            if (r < 0) {
                last = errno;
                close(fd);
                fd = -1;
            }
        }
        freeaddrinfo(ai);
        if (fd >= 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            reply rep = { 0 };
            int e = exchange(fd, OP_HELLO, NULL, 0, c->token, strlen(c->token), 0, deadline, &rep);
            if (e) {
                close(fd);
                return io_error(c, e, "presenting the job token");
            }
            ca_status rs = rep.status;
            free(rep.val);
            if (rs != CA_OK) {
                close(fd);
                ca_error(CA_ERR_PEER, "the rendezvous store at %s rejected this process: wrong job token", c->addr);
                ca_error_hint("every process of a job must carry the launcher's %s; on several machines export "
                              "the same value on each (see docs/DISTRIBUTED.md)", CA_STORE_TOKEN_ENV);
                return CA_ERR_PEER;
            }
            pthread_mutex_lock(&c->mu);
            c->reached = true;
            pthread_mutex_unlock(&c->mu);
            *out_fd = fd;
            return CA_OK;
        }
        if (last == ECONNREFUSED && c->reached) {
            char why[256];
            snprintf(why, sizeof why, "connection refused (it was reached before)");
            mark_gone(c, why);
            return gone_error(c);
        }
        bool retry = last == ECONNREFUSED || last == ENETUNREACH || last == EHOSTUNREACH ||
                     last == ETIMEDOUT || last == ECONNRESET;
        int64_t now = now_ms();
        if (!retry) break;
        if (now + backoff >= cut_deadline(deadline)) {
            /* a network that stays unreachable until the deadline (a link down) is a silent store */
            if (last == ENETUNREACH || last == EHOSTUNREACH)
                return ca_error(CA_ERR_TIMEOUT, "cannot reach the rendezvous store at %s: %s", c->addr,
                                strerror(last));
            break;
        }
        usleep((useconds_t)(backoff * 1000));
        if (backoff < 500) backoff *= 2;
    }
    if (last == ECONNREFUSED) {
        ca_error(CA_ERR_IO, "cannot reach the rendezvous store at %s: connection refused", c->addr);
        ca_error_hint("start the program with `caccel launch` (it serves the store), check MASTER_ADDR/MASTER_PORT, "
                      "or make sure rank 0 is running when there is no launcher");
        return CA_ERR_IO;
    }
    if (last == ETIMEDOUT || last == 0)
        return ca_error(CA_ERR_TIMEOUT, "cannot reach the rendezvous store at %s: timed out", c->addr);
    return ca_error(CA_ERR_IO, "cannot reach the rendezvous store at %s: %s", c->addr, strerror(last));
}

static ca_status acquire(ca_store_client *c, int64_t deadline, int *fd) {
    pthread_mutex_lock(&c->mu);
    if (c->nidle > 0) {
        *fd = c->idle[--c->nidle];
        pthread_mutex_unlock(&c->mu);
        return CA_OK;
    }
    pthread_mutex_unlock(&c->mu);
    return open_conn(c, deadline, fd);
}

static void release(ca_store_client *c, int fd) {
    pthread_mutex_lock(&c->mu);
    if (c->nidle == c->idle_cap) {
        int ncap = c->idle_cap ? c->idle_cap * 2 : 4;
        int *ni = realloc(c->idle, (size_t)ncap * sizeof *ni);
        if (!ni) {
            pthread_mutex_unlock(&c->mu);
            close(fd);
            return;
        }
        c->idle = ni;
        c->idle_cap = ncap;
    }
    c->idle[c->nidle++] = fd;
    pthread_mutex_unlock(&c->mu);
}

/* Sends one request. A connection whose exchange failed is closed, never reused. */
static ca_status request(ca_store_client *c, uint32_t op, const char *key, const void *val, size_t vlen,
                         int64_t arg, int64_t io_deadline, const char *doing, reply *rep) {
    size_t klen = key ? strlen(key) : 0;
    if (klen > CA_STORE_MAX_KEY)
        return ca_error(CA_ERR_INVALID, "rendezvous store key is %zu bytes (limit %u)", klen, CA_STORE_MAX_KEY);
    if (is_gone(c)) return gone_error(c);
    int64_t start = now_ms();
    if (atomic_load(&c->silent)) {
        int64_t cap = start + (op == OP_GET || op == OP_WAIT ? arg : 0) + SILENT_SLACK_MS;
        if (cap < io_deadline) io_deadline = cap;
    }
    tl_client = c;
    tl_start = start;
    atomic_fetch_add(&c->pending, 1);
    int fd;
    ca_status st = acquire(c, io_deadline, &fd);
    /* a store found gone while connecting (the pooled connection busy with another thread's call) reads as
     * it does for every later call, without this request's prefix: a lost store has one message */
    if (st != CA_OK) {
        tl_client = NULL;
        atomic_fetch_sub(&c->pending, 1);
        if (st == CA_ERR_TIMEOUT) atomic_store(&c->silent, true);
        return is_gone(c) ? gone_error(c) : ca_error_context("%s", doing);
    }
    int e = exchange(fd, op, key, klen, val, vlen, arg, io_deadline, rep);
    tl_client = NULL;
    atomic_fetch_sub(&c->pending, 1);
    atomic_store(&c->silent, e == ETIMEDOUT);
    if (!e) atomic_store(&c->last_reply_at, now_ms());
    if (e) {
        close(fd);
        return io_error(c, e, doing);
    }
    release(c, fd);
    return CA_OK;
}

static ca_status cl_set(void *store, const char *key, const void *value, size_t len) {
    ca_store_client *c = store;
    if (len > CA_STORE_MAX_VALUE)
        return ca_error(CA_ERR_INVALID, "value for key '%s' is %zu bytes; the rendezvous store holds at most %u",
                        key, len, CA_STORE_MAX_VALUE);
    char doing[CA_STORE_MAX_KEY + 32];
    snprintf(doing, sizeof doing, "setting key '%s'", key);
    reply rep = { 0 };
    ca_status st = request(c, OP_SET, key, value, len, 0, now_ms() + c->io_timeout_ms, doing, &rep);
    if (st != CA_OK) return st;
    st = rep.status;
    free(rep.val);
    if (st != CA_OK) return ca_error(st, "rendezvous store at %s refused key '%s'", c->addr, key);
    return CA_OK;
}

static ca_status cl_get(void *store, const char *key, void *value, size_t *len, int64_t timeout_ms) {
    ca_store_client *c = store;
    if (timeout_ms < 0) timeout_ms = DEFAULT_WAIT_MS;
    char doing[CA_STORE_MAX_KEY + 32];
    snprintf(doing, sizeof doing, "waiting for key '%s'", key);
    reply rep = { 0 };
    ca_status st = request(c, OP_GET, key, NULL, 0, timeout_ms,
                           now_ms() + timeout_ms + CLIENT_SLACK_MS, doing, &rep);
    if (st != CA_OK) return st;
    st = rep.status;
    if (st == CA_ERR_TIMEOUT) {
        free(rep.val);
        return ca_error(CA_ERR_TIMEOUT, "timed out after %lld ms waiting for key '%s' in the rendezvous store at %s",
                        (long long)timeout_ms, key, c->addr);
    }
    if (st != CA_OK) {
        free(rep.val);
        return ca_error(st, "rendezvous store at %s: get '%s' failed", c->addr, key);
    }
    if (rep.len > *len) {
        size_t cap = *len;
        *len = rep.len;
        free(rep.val);
        return ca_error(CA_ERR_INVALID, "value of key '%s' is %zu bytes; the buffer holds %zu", key, rep.len, cap);
    }
    if (rep.len) memcpy(value, rep.val, rep.len);
    *len = rep.len;
    free(rep.val);
    return CA_OK;
}

static ca_status cl_add(void *store, const char *key, int64_t delta, int64_t *result) {
    ca_store_client *c = store;
    char doing[CA_STORE_MAX_KEY + 32];
    snprintf(doing, sizeof doing, "adding to key '%s'", key);
    reply rep = { 0 };
    ca_status st = request(c, OP_ADD, key, NULL, 0, delta, now_ms() + c->io_timeout_ms, doing, &rep);
    if (st != CA_OK) return st;
    st = rep.status;
    free(rep.val);
    if (st != CA_OK) return ca_error(st, "rendezvous store at %s: key '%s' does not hold an integer", c->addr, key);
    if (result) *result = rep.arg;
    return CA_OK;
}

static ca_status cl_check(void *store, const char *key) {
    ca_store_client *c = store;
    char doing[CA_STORE_MAX_KEY + 32];
    snprintf(doing, sizeof doing, "checking key '%s'", key);
    reply rep = { 0 };
    ca_status st = request(c, OP_CHECK, key, NULL, 0, 0, now_ms() + c->io_timeout_ms, doing, &rep);
    if (st != CA_OK) return st;
    st = rep.status;
    free(rep.val);
    return st;   /* CA_ERR_NOT_FOUND is an answer, not a failure: no message */
}

static ca_status cl_wait(void *store, const char *const *keys, int nkeys, int64_t timeout_ms) {
    ca_store_client *c = store;
    if (timeout_ms < 0) timeout_ms = DEFAULT_WAIT_MS;
    size_t total = 0;
    for (int i = 0; i < nkeys; i++) {
        size_t k = strlen(keys[i]);
        if (k > CA_STORE_MAX_KEY)
            return ca_error(CA_ERR_INVALID, "rendezvous store key is %zu bytes (limit %u)", k, CA_STORE_MAX_KEY);
        total += k + 1;
    }
    if (total > MAX_WAIT_LIST) return ca_error(CA_ERR_INVALID, "waiting for too many keys at once (%d)", nkeys);
    if (nkeys <= 0) return CA_OK;
    char *list = malloc(total);
    if (!list) return ca_error(CA_ERR_NOMEM, "out of memory");
    size_t off = 0;
    for (int i = 0; i < nkeys; i++) {
        size_t k = strlen(keys[i]);
        memcpy(list + off, keys[i], k + 1);
        off += k + 1;
    }
    char doing[CA_STORE_MAX_KEY + 64];
    snprintf(doing, sizeof doing, "waiting for %d key(s) starting with '%s'", nkeys, keys[0]);
    reply rep = { 0 };
    ca_status st = request(c, OP_WAIT, NULL, list, total, timeout_ms,
                           now_ms() + timeout_ms + CLIENT_SLACK_MS, doing, &rep);
    free(list);
    if (st != CA_OK) return st;
    st = rep.status;
    if (st == CA_ERR_TIMEOUT) {
        ca_error(CA_ERR_TIMEOUT, "timed out after %lld ms waiting for key '%s' in the rendezvous store at %s",
                 (long long)timeout_ms, rep.val ? (const char *)rep.val : "?", c->addr);
        free(rep.val);
        return CA_ERR_TIMEOUT;
    }
    free(rep.val);
    if (st != CA_OK) return ca_error(st, "rendezvous store at %s: wait failed", c->addr);
    return CA_OK;
}

static const ca_store_ops client_ops = {
    .struct_size = sizeof(ca_store_ops),
    .abi_version = CA_ABI_VERSION,
    .set = cl_set,
    .get = cl_get,
    .add = cl_add,
    .check = cl_check,
    .wait = cl_wait,
};

ca_status ca_store_client_connect(const char *host, int port, const char *token,
                                  int64_t timeout_ms, ca_store_client **out) {
    *out = NULL;
    if (!host || !*host) return ca_error(CA_ERR_INVALID, "rendezvous store: no host given");
    if (port <= 0 || port > 65535) return ca_error(CA_ERR_INVALID, "rendezvous store: bad port %d", port);
    if (!token || !*token) {
        ca_error(CA_ERR_INVALID, "no job token to present to the rendezvous store at %s:%d", host, port);
        ca_error_hint("set %s to the job's token (caccel launch sets it for its processes)", CA_STORE_TOKEN_ENV);
        return CA_ERR_INVALID;
    }
    if (strlen(token) > CA_STORE_MAX_TOKEN)
        return ca_error(CA_ERR_INVALID, "job token is longer than %u characters", CA_STORE_MAX_TOKEN);
    ca_store_client *c = calloc(1, sizeof *c);
    if (!c) return ca_error(CA_ERR_NOMEM, "out of memory");
    snprintf(c->host, sizeof c->host, "%s", host);
    c->port = port;
    snprintf(c->addr, sizeof c->addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    snprintf(c->token, sizeof c->token, "%s", token);
    c->io_timeout_ms = 30000;
    atomic_init(&c->cut_at, INT64_MIN);
    atomic_init(&c->silent, false);
    atomic_init(&c->pending, 0);
    atomic_init(&c->last_reply_at, now_ms());
    pthread_mutex_init(&c->mu, NULL);
    int fd;
    ca_status st = open_conn(c, now_ms() + (timeout_ms < 0 ? DEFAULT_WAIT_MS : timeout_ms), &fd);
    if (st != CA_OK) {
        ca_store_client_close(c);
        return st;
    }
    release(c, fd);
    *out = c;
    return CA_OK;
}

void ca_store_client_close(ca_store_client *c) {
    if (!c) return;
    for (int i = 0; i < c->nidle; i++) close(c->idle[i]);
    free(c->idle);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

ca_store_ref ca_store_client_ref(ca_store_client *c) {
    return (ca_store_ref){ .ops = &client_ops, .store = c };
}

const char *ca_store_client_address(const ca_store_client *c) { return c ? c->addr : "?"; }

void ca_store_client_set_server_name(ca_store_client *c, const char *who) {
    if (!c || !who || !*who) return;
    snprintf(c->addr, sizeof c->addr, strchr(c->host, ':') ? "[%s]:%d (%s)" : "%s:%d (%s)", c->host, c->port, who);
}

void ca_store_client_set_io_timeout(ca_store_client *c, int64_t timeout_ms) {
    if (c && timeout_ms > 0) c->io_timeout_ms = timeout_ms;
}

bool ca_store_client_silent(ca_store_client *c) { return c && atomic_load(&c->silent); }

bool ca_store_client_gone(ca_store_client *c, char *why, size_t len) {
    if (!c || !is_gone(c)) return false;
    if (why && len) {
        pthread_mutex_lock(&c->mu);
        snprintf(why, len, "%s", c->gone_why);
        pthread_mutex_unlock(&c->mu);
    }
    return true;
}

/* A GET or WAIT may legitimately wait long for its key: only a request with nothing answered for
 * `ms` while requests are pending counts, which a stopped store shows and a busy one does not. */
bool ca_store_client_stalled(ca_store_client *c, int64_t ms) {
    if (!c) return false;
    if (atomic_load(&c->silent)) return true;
    return atomic_load(&c->pending) > 0 && now_ms() - atomic_load(&c->last_reply_at) > ms;
}

int64_t ca_store_client_cut(ca_store_client *c, int64_t within_ms) {
    if (!c) return INT64_MIN;
    int64_t at = now_ms() + within_ms;
    atomic_store(&c->cut_at, at);
    return at;
}

void ca_store_client_uncut(ca_store_client *c, int64_t at) {
    if (c) atomic_compare_exchange_strong(&c->cut_at, &at, INT64_MIN);
}
