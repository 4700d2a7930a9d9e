/* The rendezvous store's server: a token-checked TCP key-value server on one poll thread, and the job token. */
#include "comm/store_wire_impl.h"
#include "base/thread_impl.h"

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

#define MAX_CONNS 8192
#define AUTH_DEADLINE_MS 10000
/* Connections that have not presented the token yet. When a bound is reached the oldest such
 * connection is dropped, never the new one: a job member presents its token as soon as it connects,
 * so a flood of idle connections cannot keep it out. */
#define MAX_UNAUTH 1024
#define MAX_UNAUTH_PER_ADDR 256
/* With no descriptor to accept into, the listening socket is left out of poll this long. */
#define EMFILE_BACKOFF_MS 100
#define ACCEPT_BATCH 256
/* At most one wrong-token warning per interval; the rest are counted into the next line. */
#define REJECT_LOG_INTERVAL_MS 10000

/* Compares in time independent of where the strings differ. */
static bool token_equal(const uint8_t *a, size_t alen, const char *b) {
    size_t blen = strlen(b);
    unsigned diff = (unsigned)(alen ^ blen);
    for (size_t i = 0; i < alen; i++) diff |= (unsigned)(a[i] ^ (uint8_t)b[i % (blen ? blen : 1)]);
    return diff == 0 && blen > 0;
}

ca_status ca_store_make_token(char *buf, size_t len) {
    uint8_t raw[16];
    if (len < 2 * sizeof raw + 1) return ca_error(CA_ERR_INVALID, "token buffer too small (%zu bytes)", len);
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return ca_error(CA_ERR_IO, "getrandom failed while making a job token: %s", strerror(errno));
        }
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof raw; i++) snprintf(buf + 2 * i, 3, "%02x", raw[i]);
    return CA_OK;
}


typedef struct kv {
    char *key;          /* NULL: empty slot */
    uint8_t *val;
    size_t len;
} kv;

typedef struct conn {
    int fd;
    bool authed;
    bool closing;       /* drop once the output is flushed */
    int64_t accepted_ms;
    char peer[64];
    char host[48];      /* the peer's address without the port: the per-address bound */
    uint8_t hdr[REQ_HDR];
    size_t hdr_got;
    uint8_t *payload;   /* key then value */
    size_t payload_len, payload_got;
    /* a GET or WAIT that waits for keys to appear */
    bool parked;
    uint32_t park_op;
    int64_t park_deadline;
    uint8_t *out;
    size_t out_len, out_off;
} conn;

struct ca_store_server {
    int listen_fd;
    int wake_pipe[2];
    int port;
    char token[CA_STORE_MAX_TOKEN + 1];
    pthread_t thread;
    bool thread_started;
    kv *table;
    size_t cap, used;
    conn **conns;
    size_t nconns, conns_cap;
    size_t nunauth;           /* connections in conns without the token yet */
    int reserve_fd;           /* given up to accept-and-close a connection when out of descriptors */
    int64_t listen_paused_until;
    bool fd_warned;
    int64_t reject_log_ms;    /* when the last wrong-token warning was written */
    unsigned long rejects_unlogged;
    char reject_last_peer[64];
};

static uint64_t hash_key(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static kv *table_find(ca_store_server *s, const char *key, size_t klen) {
    if (!s->cap) return NULL;
    size_t i = hash_key(key, klen) & (s->cap - 1);
    while (s->table[i].key) {
        if (strlen(s->table[i].key) == klen && memcmp(s->table[i].key, key, klen) == 0) return &s->table[i];
        i = (i + 1) & (s->cap - 1);
    }
    return NULL;
}

static bool table_grow(ca_store_server *s) {
    size_t ncap = s->cap ? s->cap * 2 : 256;
    kv *nt = calloc(ncap, sizeof *nt);
    if (!nt) return false;
    for (size_t i = 0; i < s->cap; i++) {
        if (!s->table[i].key) continue;
        size_t j = hash_key(s->table[i].key, strlen(s->table[i].key)) & (ncap - 1);
        while (nt[j].key) j = (j + 1) & (ncap - 1);
        nt[j] = s->table[i];
    }
    free(s->table);
    s->table = nt;
    s->cap = ncap;
    return true;
}

/* Takes ownership of val. */
static bool table_put(ca_store_server *s, const char *key, size_t klen, uint8_t *val, size_t len) {
    kv *e = table_find(s, key, klen);
    if (e) {
        free(e->val);
        e->val = val;
        e->len = len;
        return true;
    }
    if ((s->used + 1) * 10 >= s->cap * 7 && !table_grow(s)) return false;
    char *k = malloc(klen + 1);
    if (!k) return false;
    memcpy(k, key, klen);
    k[klen] = '\0';
    size_t i = hash_key(key, klen) & (s->cap - 1);
    while (s->table[i].key) i = (i + 1) & (s->cap - 1);
    s->table[i] = (kv){ .key = k, .val = val, .len = len };
    s->used++;
    return true;
}

static void conn_free(conn *c) {
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    free(c->payload);
    free(c->out);
    free(c);
}

static bool queue_reply(conn *c, ca_status st, const void *val, size_t len, int64_t arg) {
    size_t need = c->out_len + REP_HDR + len;
    uint8_t *o = realloc(c->out, need);
    if (!o) return false;
    c->out = o;
    uint8_t *h = o + c->out_len;
    put32(h, MAGIC_REP);
    put32(h + 4, (uint32_t)(int32_t)st);
    put32(h + 8, (uint32_t)len);
    put64(h + 12, (uint64_t)arg);
    if (len) memcpy(h + REP_HDR, val, len);
    c->out_len = need;
    return true;
}

/* Keys of a WAIT request: NUL-separated in the value. Returns the first
 * missing key (pointer into buf) or NULL when all exist. */
static const char *first_missing(ca_store_server *s, const uint8_t *buf, size_t len, size_t *mlen) {
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && buf[j]) j++;
        if (j > i && !table_find(s, (const char *)buf + i, j - i)) {
            *mlen = j - i;
            return (const char *)buf + i;
        }
        i = j + 1;
    }
    return NULL;
}

static void finish_request(conn *c) {
    free(c->payload);
    c->payload = NULL;
    c->payload_len = c->payload_got = 0;
    c->hdr_got = 0;
    c->parked = false;
}

/* Answers a parked GET/WAIT if its keys exist now, or if its deadline passed. */
static void try_unpark(ca_store_server *s, conn *c, int64_t now) {
    uint32_t klen = get32(c->hdr + 8), vlen = get32(c->hdr + 12);
    const uint8_t *key = c->payload, *val = c->payload + klen;
    size_t mlen = 0;
    const char *missing;
    if (c->park_op == OP_GET) {
        kv *e = table_find(s, (const char *)key, klen);
        if (e) {
            if (!queue_reply(c, CA_OK, e->val, e->len, 0)) c->closing = true;
            finish_request(c);
            return;
        }
        missing = (const char *)key;
        mlen = klen;
    } else {
        missing = first_missing(s, val, vlen, &mlen);
        if (!missing) {
            if (!queue_reply(c, CA_OK, NULL, 0, 0)) c->closing = true;
            finish_request(c);
            return;
        }
    }
    if (now >= c->park_deadline) {
        if (!queue_reply(c, CA_ERR_TIMEOUT, missing, mlen, 0)) c->closing = true;
        finish_request(c);
    }
}

/* Dropped connections are NULL until the poll loop compacts the array. */
static void wake_parked(ca_store_server *s, int64_t now) {
    for (size_t i = 0; i < s->nconns; i++)
        if (s->conns[i] && s->conns[i]->parked) try_unpark(s, s->conns[i], now);
}

static void log_rejects(ca_store_server *s) {
    ca_log_printf(CA_LOG_WARNING, "rendezvous store: rejected %lu more connection(s) with a wrong job token "
                  "in the last %d s (the last from %s)", s->rejects_unlogged, REJECT_LOG_INTERVAL_MS / 1000,
                  s->reject_last_peer);
    s->rejects_unlogged = 0;
}

/* The first rejection is logged at once, later ones at most once per interval with a count. */
static void note_reject(ca_store_server *s, const conn *c, int64_t now) {
    snprintf(s->reject_last_peer, sizeof s->reject_last_peer, "%s", c->peer);
    if (s->reject_log_ms && now < s->reject_log_ms + REJECT_LOG_INTERVAL_MS) {
        s->rejects_unlogged++;
        return;
    }
    s->reject_log_ms = now;
    ca_log_printf(CA_LOG_WARNING, "rendezvous store: rejected a connection from %s: wrong job token "
                  "(further rejections are counted, one line per %d s)", c->peer, REJECT_LOG_INTERVAL_MS / 1000);
}

static void flush_rejects(ca_store_server *s, int64_t now) {
    if (s->rejects_unlogged && now >= s->reject_log_ms + REJECT_LOG_INTERVAL_MS) {
        s->reject_log_ms = now;
        log_rejects(s);
    }
}

static void handle_request(ca_store_server *s, conn *c) {
    uint32_t op = get32(c->hdr + 4), klen = get32(c->hdr + 8), vlen = get32(c->hdr + 12);
    int64_t arg = (int64_t)get64(c->hdr + 16);
    const uint8_t *key = c->payload, *val = c->payload ? c->payload + klen : NULL;
    bool ok = true;

    if (!c->authed) {
        if (op == OP_HELLO && token_equal(val, vlen, s->token)) {
            c->authed = true;
            s->nunauth--;
            ok = queue_reply(c, CA_OK, NULL, 0, 0);
        } else {
            note_reject(s, c, now_ms());
            static const char msg[] = "wrong job token";
            ok = queue_reply(c, CA_ERR_PEER, msg, sizeof msg - 1, 0);
            c->closing = true;
        }
    } else {
        switch (op) {
        case OP_HELLO:
            ok = queue_reply(c, CA_OK, NULL, 0, 0);
            break;
        case OP_SET: {
            uint8_t *copy = malloc(vlen ? vlen : 1);
            if (!copy || !table_put(s, (const char *)key, klen, copy, vlen)) {
                free(copy);
                ok = queue_reply(c, CA_ERR_NOMEM, "out of memory", 13, 0);
                break;
            }
            if (vlen) memcpy(copy, val, vlen);
            ok = queue_reply(c, CA_OK, NULL, 0, 0);
            int64_t now = now_ms();
            wake_parked(s, now);
            break;
        }
        case OP_ADD: {
            kv *e = table_find(s, (const char *)key, klen);
            int64_t cur = 0;
            if (e) {
                char num[32];
                if (e->len == 0 || e->len >= sizeof num) {
                    ok = queue_reply(c, CA_ERR_INVALID, "value is not an integer", 23, 0);
                    break;
                }
                memcpy(num, e->val, e->len);
                num[e->len] = '\0';
                char *end;
                cur = strtoll(num, &end, 10);
                if (*end) {
                    ok = queue_reply(c, CA_ERR_INVALID, "value is not an integer", 23, 0);
                    break;
                }
            }
            if (__builtin_add_overflow(cur, arg, &cur)) {   /* the counter stays as it was */
                ok = queue_reply(c, CA_ERR_INVALID, "counter overflow", 16, 0);
                break;
            }
            char num[32];
            int n = snprintf(num, sizeof num, "%lld", (long long)cur);
            uint8_t *copy = malloc((size_t)n);
            if (!copy || !table_put(s, (const char *)key, klen, copy, (size_t)n)) {
                free(copy);
                ok = queue_reply(c, CA_ERR_NOMEM, "out of memory", 13, 0);
                break;
            }
            memcpy(copy, num, (size_t)n);
            ok = queue_reply(c, CA_OK, NULL, 0, cur);
            int64_t now = now_ms();
            wake_parked(s, now);
            break;
        }
        case OP_CHECK:
            ok = queue_reply(c, table_find(s, (const char *)key, klen) ? CA_OK : CA_ERR_NOT_FOUND, NULL, 0, 0);
            break;
        case OP_GET:
        case OP_WAIT: {
            int64_t now = now_ms(), wait = arg < 0 ? DEFAULT_WAIT_MS : arg;
            c->parked = true;
            c->park_op = op;
            c->park_deadline = wait > INT64_MAX - now ? INT64_MAX : now + wait;   /* a huge wait: forever */
            try_unpark(s, c, now);
            return;   /* the payload stays until the reply is sent */
        }
        default:
            ok = queue_reply(c, CA_ERR_INVALID, "unknown request", 15, 0);
            c->closing = true;
            break;
        }
    }
    if (!ok) c->closing = true;
    finish_request(c);
}

/* Reads what is available. Returns false when the connection must be dropped. */
static bool conn_read(ca_store_server *s, conn *c) {
    /* a parked request keeps its header and payload until answered: anything readable meanwhile is a
     * second request (one at a time) or the end of the connection; either drops it, where handling
     * the parked request again would extend its deadline for as long as the peer kept sending */
    if (c->parked) return false;
    for (;;) {
        if (c->hdr_got < REQ_HDR) {
            ssize_t n = recv(c->fd, c->hdr + c->hdr_got, REQ_HDR - c->hdr_got, 0);
            if (n == 0) return false;
            if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
            c->hdr_got += (size_t)n;
            if (c->hdr_got < REQ_HDR) continue;
            uint32_t magic = get32(c->hdr), klen = get32(c->hdr + 8), vlen = get32(c->hdr + 12);
            uint32_t op = get32(c->hdr + 4);
            size_t vmax = !c->authed ? CA_STORE_MAX_TOKEN
                        : op == OP_WAIT ? MAX_WAIT_LIST : CA_STORE_MAX_VALUE;
            if (magic != MAGIC_REQ || klen > CA_STORE_MAX_KEY || vlen > vmax || (!c->authed && klen)) {
                ca_log_printf(CA_LOG_DEBUG, "rendezvous store: dropping %s: malformed or oversized request "
                              "(key %u bytes, value %u bytes)", c->peer, klen, vlen);
                return false;
            }
            c->payload_len = (size_t)klen + vlen;
            c->payload_got = 0;
            c->payload = malloc(c->payload_len + 1);
            if (!c->payload) return false;
            c->payload[c->payload_len] = 0;
        }
        if (c->payload_got < c->payload_len) {
            ssize_t n = recv(c->fd, c->payload + c->payload_got, c->payload_len - c->payload_got, 0);
            if (n == 0) return false;
            if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
            c->payload_got += (size_t)n;
            if (c->payload_got < c->payload_len) continue;
        }
        handle_request(s, c);
        if (c->closing || c->parked) return true;
    }
}

static bool conn_write(conn *c) {
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        c->out_off += (size_t)n;
    }
    c->out_off = c->out_len = 0;
    return !c->closing;
}

/* Removes conns[i] (the order of conns does not matter). */
static void drop_at(ca_store_server *s, size_t i) {
    conn *c = s->conns[i];
    if (!c->authed) s->nunauth--;
    conn_free(c);
    s->conns[i] = s->conns[--s->nconns];
}

/* Drops the oldest connection without the token, from `host` if given. False when there is none. */
static bool evict_oldest_unauth(ca_store_server *s, const char *host) {
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < s->nconns; i++) {
        const conn *c = s->conns[i];
        if (c->authed || (host && strcmp(c->host, host) != 0)) continue;
        if (best == SIZE_MAX || c->accepted_ms < s->conns[best]->accepted_ms) best = i;
    }
    if (best == SIZE_MAX) return false;
    ca_log_printf(CA_LOG_DEBUG, "rendezvous store: dropping %s: too many connections without the job token",
                  s->conns[best]->peer);
    drop_at(s, best);
    return true;
}

static size_t unauth_from(const ca_store_server *s, const char *host) {
    size_t n = 0;
    for (size_t i = 0; i < s->nconns; i++)
        if (!s->conns[i]->authed && strcmp(s->conns[i]->host, host) == 0) n++;
    return n;
}

/* Out of descriptors: free one by dropping the oldest unauthenticated connection, else accept the
 * pending connection into the reserve descriptor and close it, else stop polling the listening socket
 * for a while. Any of these keeps the thread from spinning on a listening socket it cannot accept from. */
static void out_of_fds(ca_store_server *s, int err) {
    if (!s->fd_warned) {   /* one line: the condition repeats under a flood */
        s->fd_warned = true;
        ca_log_printf(CA_LOG_WARNING, "rendezvous store on port %d: cannot accept a connection: %s; dropping "
                      "connections without the job token (raise `ulimit -n`)", s->port, strerror(err));
    }
    if (evict_oldest_unauth(s, NULL)) return;
    if (s->reserve_fd >= 0) {
        close(s->reserve_fd);
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) close(fd);
        s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && s->reserve_fd >= 0) return;
    }
    s->listen_paused_until = now_ms() + EMFILE_BACKOFF_MS;
}

/* Makes room for one more unauthenticated connection from host, dropping the oldest ones. */
static void bound_unauth(ca_store_server *s, const char *host) {
    if (unauth_from(s, host) >= MAX_UNAUTH_PER_ADDR) evict_oldest_unauth(s, host);
    if (s->nunauth >= MAX_UNAUTH) evict_oldest_unauth(s, NULL);
}

static conn *new_conn(ca_store_server *s, int fd, const struct sockaddr_storage *sa, socklen_t sl) {
    if (s->nconns == s->conns_cap) {
        size_t ncap = s->conns_cap ? s->conns_cap * 2 : 64;
        conn **nc = realloc(s->conns, ncap * sizeof *nc);
        if (!nc) return NULL;
        s->conns = nc;
        s->conns_cap = ncap;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    c->accepted_ms = now_ms();
    char serv[NI_MAXSERV] = "?";
    snprintf(c->host, sizeof c->host, "?");
    getnameinfo((const struct sockaddr *)sa, sl, c->host, sizeof c->host, serv, sizeof serv,
                NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(c->peer, sizeof c->peer, "%s:%s", c->host, serv);
    return c;
}

static void accept_all(ca_store_server *s) {
    /* a bounded batch: a flood that connects as fast as we accept must not starve the members' requests */
    for (int batch = 0; batch < ACCEPT_BATCH; batch++) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                out_of_fds(s, errno);
                if (s->listen_paused_until) return;
                continue;
            }
            return;
        }
        conn *c = s->nconns < MAX_CONNS ? new_conn(s, fd, &sa, sl) : NULL;
        if (!c) {
            close(fd);
            continue;
        }
        bound_unauth(s, c->host);
        s->conns[s->nconns++] = c;
        s->nunauth++;
        /* A job member sends its token right after connecting: read it now, so that it never waits
         * behind the connections without one. */
        bool keep = conn_read(s, c);
        if (keep && c->out_len > c->out_off) keep = conn_write(c);
        else if (keep && c->closing) keep = false;
        if (!keep) drop_at(s, s->nconns - 1);
    }
}

static void *server_main(void *arg) {
    ca_store_server *s = arg;
    ca_thread_begin("store_server");
    struct pollfd *pfd = NULL;
    size_t pcap = 0;
    for (;;) {
        size_t n = 2 + s->nconns;
        if (n > pcap) {
            struct pollfd *np = realloc(pfd, n * sizeof *np);
            if (!np) {
                usleep(10000);
                continue;
            }
            pfd = np;
            pcap = n;
        }
        pfd[0] = (struct pollfd){ .fd = s->wake_pipe[0], .events = POLLIN };
        int64_t now = now_ms(), next = now + 1000;
        if (s->listen_paused_until && now >= s->listen_paused_until) s->listen_paused_until = 0;
        pfd[1] = (struct pollfd){ .fd = s->listen_fd, .events = s->listen_paused_until ? 0 : POLLIN };
        if (s->listen_paused_until) next = s->listen_paused_until;
        for (size_t i = 0; i < s->nconns; i++) {
            conn *c = s->conns[i];
            short ev = POLLIN;
            if (c->out_len > c->out_off) ev |= POLLOUT;
            pfd[2 + i] = (struct pollfd){ .fd = c->fd, .events = ev };
            if (c->parked && c->park_deadline < next) next = c->park_deadline;
            if (!c->authed && c->accepted_ms + AUTH_DEADLINE_MS < next) next = c->accepted_ms + AUTH_DEADLINE_MS;
        }
        int wait = next > now ? (int)(next - now) : 0;
        int r = poll(pfd, n, wait);
        if (r < 0 && errno != EINTR) break;
        if (r > 0 && (pfd[0].revents & POLLIN)) break;
        now = now_ms();
        size_t nbefore = s->nconns;
        for (size_t i = 0; i < nbefore; i++) {
            conn *c = s->conns[i];
            bool keep = true;
            short re = r > 0 ? pfd[2 + i].revents : 0;
            if (re & (POLLERR | POLLNVAL)) keep = false;
            if (keep && (re & (POLLIN | POLLHUP))) keep = conn_read(s, c);
            if (keep && c->parked) try_unpark(s, c, now);
            if (keep && !c->authed && !c->closing && now >= c->accepted_ms + AUTH_DEADLINE_MS) {
                ca_log_printf(CA_LOG_DEBUG, "rendezvous store: dropping %s: no job token within %d s",
                              c->peer, AUTH_DEADLINE_MS / 1000);
                keep = false;
            }
            if (keep && c->out_len > c->out_off) keep = conn_write(c);
            else if (keep && c->closing) keep = false;
            if (!keep) {
                if (!c->authed) s->nunauth--;
                conn_free(c);
                s->conns[i] = NULL;
            }
        }
        size_t w = 0;
        for (size_t i = 0; i < s->nconns; i++)
            if (s->conns[i]) s->conns[w++] = s->conns[i];
        s->nconns = w;
        flush_rejects(s, now);
        if (r > 0 && (pfd[1].revents & POLLIN)) accept_all(s);
    }
    free(pfd);
    return NULL;
}

ca_status ca_store_server_start(const char *host, int port, const char *token,
                                ca_store_server **out, int *sys_errno) {
    *out = NULL;
    if (sys_errno) *sys_errno = 0;
    if (!token || !*token || strlen(token) > CA_STORE_MAX_TOKEN)
        return ca_error(CA_ERR_INVALID, "rendezvous store: the job token must be 1..%u characters",
                        CA_STORE_MAX_TOKEN);
    if (port < 0 || port > 65535) return ca_error(CA_ERR_INVALID, "rendezvous store: bad port %d", port);
    struct addrinfo *ai = NULL;
    ca_status st = resolve(host, port, true, &ai, "rendezvous store");
    if (st != CA_OK) return st;
    int fd = -1, err = 0;
    /* With no host, prefer the IPv6 wildcard only if IPv4 is absent: peers usually dial IPv4. */
    for (int pass = 0; pass < 2 && fd < 0; pass++) {
        for (struct addrinfo *a = ai; a; a = a->ai_next) {
            if ((pass == 0) != (a->ai_family == AF_INET)) continue;
            fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
            if (fd < 0) {
                err = errno;
                continue;
            }
            int one = 1;
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) break;
            err = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        if (sys_errno) *sys_errno = err;
        return ca_error(CA_ERR_IO, "rendezvous store: cannot listen on %s:%d: %s",
                        host && *host ? host : "*", port, strerror(err));
    }
    ca_store_server *s = calloc(1, sizeof *s);
    if (!s) {
        close(fd);
        return ca_error(CA_ERR_NOMEM, "out of memory starting the rendezvous store");
    }
    s->listen_fd = fd;
    snprintf(s->token, sizeof s->token, "%s", token);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    s->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                             : ((struct sockaddr_in *)&sa)->sin_port);
    if (pipe2(s->wake_pipe, O_CLOEXEC) != 0) {
        close(fd);
        free(s);
        return ca_error(CA_ERR_IO, "rendezvous store: pipe: %s", strerror(errno));
    }
    /* The server thread takes no signals: a process-directed SIGCHLD or SIGINT delivered to it would
     * be lost (or kill the process) where the program (caccel launch) reads them from a signalfd. */
    s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    bool started = table_grow(s) && pthread_create(&s->thread, NULL, server_main, s) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!started) {
        close(fd);
        if (s->reserve_fd >= 0) close(s->reserve_fd);
        close(s->wake_pipe[0]);
        close(s->wake_pipe[1]);
        free(s->table);
        free(s);
        return ca_error(CA_ERR_NOMEM, "rendezvous store: cannot start its thread");
    }
    s->thread_started = true;
    *out = s;
    return CA_OK;
}

int ca_store_server_port(const ca_store_server *s) { return s ? s->port : 0; }

void ca_store_server_stop(ca_store_server *s) {
    if (!s) return;
    if (s->thread_started) {
        ssize_t w;
        do w = write(s->wake_pipe[1], "x", 1); while (w < 0 && errno == EINTR);
        pthread_join(s->thread, NULL);
    }
    for (size_t i = 0; i < s->nconns; i++) conn_free(s->conns[i]);
    free(s->conns);
    if (s->rejects_unlogged) log_rejects(s);
    if (s->reserve_fd >= 0) close(s->reserve_fd);
    for (size_t i = 0; i < s->cap; i++) {
        free(s->table[i].key);
        free(s->table[i].val);
    }
    free(s->table);
    close(s->listen_fd);
    close(s->wake_pipe[0]);
    close(s->wake_pipe[1]);
    free(s);
}
