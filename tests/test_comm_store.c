/* Tests of the rendezvous store: every operation, blocking waits, deadlines, the job token, limits, failures. */
#include "comm/store_impl.h"

#include <caccel/caccel.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#define TOKEN "0123456789abcdef0123456789abcdef"

#define T_OK(expr)                                                                                   \
    do {                                                                                             \
        ca_status t_s_ = (expr);                                                                     \
        if (t_s_ != CA_OK) fail_msg("%s -> %s: %s", #expr, ca_status_name(t_s_), ca_last_error()); \
    } while (0)

typedef struct fixture {
    ca_store_server *srv;
    ca_store_client *cl;
    ca_store_ref ref;
    int port;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    T_OK(ca_store_server_start("127.0.0.1", 0, TOKEN, &f->srv, NULL));
    f->port = ca_store_server_port(f->srv);
    assert_true(f->port > 0);
    T_OK(ca_store_client_connect("127.0.0.1", f->port, TOKEN, 5000, &f->cl));
    f->ref = ca_store_client_ref(f->cl);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    ca_store_client_close(f->cl);
    ca_store_server_stop(f->srv);
    free(f);
    return 0;
}

static int64_t ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_set_get_check_add(void **state) {
    fixture *f = *state;
    const ca_store_ops *o = f->ref.ops;
    assert_int_equal(o->check(f->ref.store, "a"), CA_ERR_NOT_FOUND);
    T_OK(o->set(f->ref.store, "a", "hello", 5));
    T_OK(o->check(f->ref.store, "a"));
    char buf[16];
    size_t len = sizeof buf;
    T_OK(o->get(f->ref.store, "a", buf, &len, 1000));
    assert_int_equal(len, 5);
    assert_memory_equal(buf, "hello", 5);
    /* overwrite, and an empty value */
    T_OK(o->set(f->ref.store, "a", "", 0));
    len = sizeof buf;
    T_OK(o->get(f->ref.store, "a", buf, &len, 1000));
    assert_int_equal(len, 0);
    int64_t v = 0;
    T_OK(o->add(f->ref.store, "n", 5, &v));
    assert_int_equal(v, 5);
    T_OK(o->add(f->ref.store, "n", -7, &v));
    assert_int_equal(v, -2);
    len = sizeof buf;
    T_OK(o->get(f->ref.store, "n", buf, &len, 1000));
    assert_int_equal(len, 2);
    assert_memory_equal(buf, "-2", 2);
    /* add on a key that is not a number */
    T_OK(o->set(f->ref.store, "s", "xyz", 3));
    assert_int_equal(o->add(f->ref.store, "s", 1, &v), CA_ERR_INVALID);
    const char *keys[] = {"a", "n", "s"};
    T_OK(o->wait(f->ref.store, keys, 3, 1000));
}

static void test_small_buffer(void **state) {
    fixture *f = *state;
    T_OK(f->ref.ops->set(f->ref.store, "long", "0123456789", 10));
    char buf[4];
    size_t len = sizeof buf;
    assert_int_equal(f->ref.ops->get(f->ref.store, "long", buf, &len, 1000), CA_ERR_INVALID);
    assert_int_equal(len, 10);
    /* the connection is still usable afterwards */
    T_OK(f->ref.ops->check(f->ref.store, "long"));
}

static void test_large_value(void **state) {
    fixture *f = *state;
    size_t n = 3u << 20;
    unsigned char *a = malloc(n), *b = malloc(n);
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i * 31 + 7);
    T_OK(f->ref.ops->set(f->ref.store, "big", a, n));
    size_t len = n;
    T_OK(f->ref.ops->get(f->ref.store, "big", b, &len, 5000));
    assert_int_equal(len, n);
    assert_memory_equal(a, b, n);
    free(a);
    free(b);
}

static void test_value_limit(void **state) {
    fixture *f = *state;
    size_t n = (size_t)CA_STORE_MAX_VALUE + 1;
    char *a = calloc(1, n);
    assert_int_equal(f->ref.ops->set(f->ref.store, "huge", a, n), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "huge"));
    free(a);
    char key[CA_STORE_MAX_KEY + 2];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = '\0';
    assert_int_equal(f->ref.ops->set(f->ref.store, key, "x", 1), CA_ERR_INVALID);
}

typedef struct delayed {
    ca_store_ref ref;
    const char *key;
    int delay_ms;
} delayed;

static void *set_later(void *arg) {
    delayed *d = arg;
    usleep((useconds_t)d->delay_ms * 1000);
    d->ref.ops->set(d->ref.store, d->key, "late", 4);
    return NULL;
}

static void test_get_waits_for_set(void **state) {
    fixture *f = *state;
    delayed d = {f->ref, "later", 200};
    pthread_t t;
    pthread_create(&t, NULL, set_later, &d);
    char buf[8];
    size_t len = sizeof buf;
    int64_t t0 = ms();
    T_OK(f->ref.ops->get(f->ref.store, "later", buf, &len, 5000));
    int64_t waited = ms() - t0;
    assert_int_equal(len, 4);
    assert_memory_equal(buf, "late", 4);
    assert_true(waited >= 150);
    const char *keys[] = {"later", "later2"};
    d.key = "later2";
    pthread_t t2;
    pthread_create(&t2, NULL, set_later, &d);
    T_OK(f->ref.ops->wait(f->ref.store, keys, 2, 5000));
    pthread_join(t, NULL);
    pthread_join(t2, NULL);
}

static void test_timeouts_name_the_key(void **state) {
    fixture *f = *state;
    char buf[8];
    size_t len = sizeof buf;
    assert_int_equal(f->ref.ops->get(f->ref.store, "never", buf, &len, 150), CA_ERR_TIMEOUT);
    assert_non_null(strstr(ca_last_error(), "'never'"));
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", f->port);
    assert_non_null(strstr(ca_last_error(), addr));
    T_OK(f->ref.ops->set(f->ref.store, "there", "1", 1));
    const char *keys[] = {"there", "missing"};
    assert_int_equal(f->ref.ops->wait(f->ref.store, keys, 2, 150), CA_ERR_TIMEOUT);
    assert_non_null(strstr(ca_last_error(), "'missing'"));
    /* the client still works after timeouts */
    T_OK(f->ref.ops->check(f->ref.store, "there"));
}

static void test_wrong_token(void **state) {
    fixture *f = *state;
    ca_store_client *bad = NULL;
    assert_int_equal(ca_store_client_connect("127.0.0.1", f->port, "not-the-token", 2000, &bad), CA_ERR_PEER);
    assert_null(bad);
    assert_non_null(strstr(ca_last_error(), "wrong job token"));
    assert_int_equal(ca_store_client_connect("127.0.0.1", f->port, "", 2000, &bad), CA_ERR_INVALID);
}

static int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Requests without the token are never executed, and oversized ones drop the connection. */
static void test_unauthenticated_and_oversized(void **state) {
    fixture *f = *state;
    int fd = raw_connect(f->port);
    unsigned char req[24 + 8] = {0};
    put32(req, 0x31534143u);   /* magic */
    put32(req + 4, 2);         /* SET */
    put32(req + 8, 4);         /* key "evil" */
    put32(req + 12, 4);
    memcpy(req + 24, "evilbad!", 8);
    assert_int_equal(send(fd, req, sizeof req, 0), (ssize_t)sizeof req);
    char r[64];
    assert_true(recv(fd, r, sizeof r, 0) <= 0);   /* dropped, nothing answered */
    close(fd);
    assert_int_equal(f->ref.ops->check(f->ref.store, "evil"), CA_ERR_NOT_FOUND);

    fd = raw_connect(f->port);
    unsigned char hdr[24] = {0};
    put32(hdr, 0x31534143u);
    put32(hdr + 4, 1);                     /* HELLO */
    put32(hdr + 12, 64u << 20);            /* a 64 MiB "token" */
    assert_int_equal(send(fd, hdr, sizeof hdr, 0), (ssize_t)sizeof hdr);
    assert_true(recv(fd, r, sizeof r, 0) <= 0);
    close(fd);
    /* the server still serves everybody else */
    T_OK(f->ref.ops->set(f->ref.store, "ok", "1", 1));
}

/* A child process that opens n connections to port and holds them, without a token. It writes one byte
 * to ready once half are open (a server that cannot keep up may stall the rest in the backlog). */
static pid_t flood(int port, int n, int *ready_fd) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        for (int i = 0; i < n; i++) {
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
            if (fd >= 0) connect(fd, (struct sockaddr *)&sa, sizeof sa);
            if (i == n / 2 && write(p[1], "r", 1) != 1) _exit(1);
        }
        for (;;) pause();
    }
    close(p[1]);
    *ready_fd = p[0];
    return pid;
}

static void wait_ready(int fd) {
    struct timeval tv = {.tv_sec = 20};
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(fd, &rs);
    char b;
    if (select(fd + 1, &rs, NULL, NULL, &tv) == 1) assert_int_equal(read(fd, &b, 1), 1);
    close(fd);
}

static void end_flood(pid_t pid) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void set_fd_limit(rlim_t cur) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = cur;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
}

typedef struct member {
    int port, rank;
    ca_status st;
    char err[512];
} member;

/* One rank's rendezvous: connect, publish its key, wait for the other's. */
static void *rendezvous(void *arg) {
    member *m = arg;
    ca_store_client *cl = NULL;
    m->st = ca_store_client_connect("127.0.0.1", m->port, TOKEN, 15000, &cl);
    if (m->st == CA_OK) {
        ca_store_ref r = ca_store_client_ref(cl);
        char key[16], other[16], buf[16];
        snprintf(key, sizeof key, "rank%d", m->rank);
        snprintf(other, sizeof other, "rank%d", 1 - m->rank);
        size_t len = sizeof buf;
        m->st = r.ops->set(r.store, key, "x", 1);
        if (m->st == CA_OK) m->st = r.ops->get(r.store, other, buf, &len, 15000);
    }
    if (m->st != CA_OK) snprintf(m->err, sizeof m->err, "%s", ca_last_error());
    ca_store_client_close(cl);
    return NULL;
}

/* A store in a child process whose descriptor limit is `limit`; returns its port. */
static pid_t store_process(rlim_t limit, int *port) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        set_fd_limit(limit);
        ca_store_server *srv = NULL;
        if (ca_store_server_start("127.0.0.1", 0, TOKEN, &srv, NULL) != CA_OK) _exit(1);
        int pt = ca_store_server_port(srv);
        if (write(p[1], &pt, sizeof pt) != (ssize_t)sizeof pt) _exit(1);
        for (;;) pause();
    }
    close(p[1]);
    assert_int_equal(read(p[0], port, sizeof *port), (ssize_t)sizeof *port);
    close(p[0]);
    return pid;
}

/* 2,000 connections without the token, far more than the store's process has descriptors for, are
 * open while two ranks rendezvous: the ranks get in at once (the oldest unauthenticated connections
 * are dropped to make room), not after the flood's 10 s token deadline or never. */
static void test_flood_while_rendezvous(void **state) {
    (void)state;
    /* valgrind keeps descriptors of its own at the top of the limit this test lowers to 128, and runs
     * the forked store 20-50x slower: the limit and the time bound mean nothing there */
    if (getenv("CACCEL_UNDER_VALGRIND")) skip();
    int port, ready;
    pid_t store = store_process(128, &port);
    pid_t pid = flood(port, 2000, &ready);
    wait_ready(ready);
    int64_t t0 = ms();
    member m[2] = {{.port = port, .rank = 0}, {.port = port, .rank = 1}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, rendezvous, &m[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    int64_t took = ms() - t0;
    end_flood(pid);
    end_flood(store);
    for (int i = 0; i < 2; i++)
        if (m[i].st != CA_OK) fail_msg("rank %d: %s: %s", i, ca_status_name(m[i].st), m[i].err);
    print_message("two ranks rendezvoused in %lld ms during the flood\n", (long long)took);
    assert_true(took < 8000);   /* below the 10 s deadline that would free the flood's slots */
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* With every descriptor of the process in use, connections waiting to be accepted do not make the
 * store's thread spin: over 3 s (this thread asleep) the process uses at most 0.5 s of CPU (a
 * spinning thread takes a core). Afterwards the store serves again. */
static void test_emfile_does_not_spin(void **state) {
    fixture *f = *state;
    struct rlimit old;
    getrlimit(RLIMIT_NOFILE, &old);
    set_fd_limit(64);
    int ready;
    pid_t pid = flood(f->port, 500, &ready);
    int fill[64], nfill = 0;
    for (int fd; nfill < 64 && (fd = dup(0)) >= 0;) fill[nfill++] = fd;
    assert_int_equal(errno, EMFILE);
    wait_ready(ready);
    for (int fd; nfill < 64 && (fd = dup(0)) >= 0;) fill[nfill++] = fd;
    double c0 = cpu_seconds();
    usleep(3000 * 1000);
    double used = cpu_seconds() - c0;
    end_flood(pid);
    for (int i = 0; i < nfill; i++) close(fill[i]);
    set_fd_limit(old.rlim_cur);
    print_message("CPU used in 3 s out of descriptors: %.3f s\n", used);
    if (used > 0.5) fail_msg("the store used %.2f s of CPU in 3 s while out of descriptors", used);
    T_OK(f->ref.ops->set(f->ref.store, "after", "1", 1));
    ca_store_client *cl = NULL;
    T_OK(ca_store_client_connect("127.0.0.1", f->port, TOKEN, 5000, &cl));
    ca_store_client_close(cl);
}

/* 300 wrong-token connections write one warning, and one count when the store stops, not 300 lines. */
static void test_wrong_token_warnings_are_limited(void **state) {
    (void)state;
    ca_store_server *srv = NULL;
    T_OK(ca_store_server_start("127.0.0.1", 0, TOKEN, &srv, NULL));
    int port = ca_store_server_port(srv);
    char path[] = "/tmp/ca-store-log-XXXXXX";
    int log = mkstemp(path);
    assert_true(log >= 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(2);
    dup2(log, 2);
    int rejected = 0;
    for (int i = 0; i < 300; i++) {
        ca_store_client *bad = NULL;
        if (ca_store_client_connect("127.0.0.1", port, "not-the-token", 2000, &bad) == CA_ERR_PEER) rejected++;
    }
    ca_store_server_stop(srv);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    assert_int_equal(rejected, 300);
    char buf[8192] = {0};
    ssize_t n = pread(log, buf, sizeof buf - 1, 0);
    close(log);
    assert_true(n > 0);
    int lines = 0;
    for (char *p = buf; (p = strstr(p, "wrong job token")); p++) lines++;
    if (lines != 2) fail_msg("expected 2 warning lines, got %d:\n%s", lines, buf);
    assert_non_null(strstr(buf, "rejected a connection from 127.0.0.1:"));
    assert_non_null(strstr(buf, "rejected 299 more connection(s) with a wrong job token"));
}

typedef struct adder {
    ca_store_ref ref;
    int n;
} adder;

static void *add_many(void *arg) {
    adder *a = arg;
    for (int i = 0; i < a->n; i++) {
        int64_t v;
        if (a->ref.ops->add(a->ref.store, "counter", 1, &v) != CA_OK) return (void *)1;
    }
    return NULL;
}

static void test_concurrent_adds(void **state) {
    fixture *f = *state;
    enum { T = 8, N = 200 };
    pthread_t th[T];
    adder a = {f->ref, N};
    for (int i = 0; i < T; i++) pthread_create(&th[i], NULL, add_many, &a);
    for (int i = 0; i < T; i++) {
        void *r;
        pthread_join(th[i], &r);
        assert_null(r);
    }
    int64_t v;
    T_OK(f->ref.ops->add(f->ref.store, "counter", 0, &v));
    assert_int_equal(v, T * N);
}

static void test_refused_names_address(void **state) {
    (void)state;
    ca_store_server *s = NULL;
    T_OK(ca_store_server_start("127.0.0.1", 0, TOKEN, &s, NULL));
    int port = ca_store_server_port(s);
    ca_store_server_stop(s);
    ca_store_client *c = NULL;
    assert_int_equal(ca_store_client_connect("127.0.0.1", port, TOKEN, 300, &c), CA_ERR_IO);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    assert_non_null(strstr(ca_last_error(), addr));
    assert_non_null(strstr(ca_last_error(), "refused"));
}

static void test_busy_port(void **state) {
    fixture *f = *state;
    ca_store_server *s = NULL;
    int err = 0;
    assert_int_not_equal(ca_store_server_start("127.0.0.1", f->port, TOKEN, &s, &err), CA_OK);
    assert_null(s);
    assert_int_equal(err, EADDRINUSE);
}

typedef struct getter {
    ca_store_ref ref;
    ca_status st;
    char msg[512];
} getter;

static void *get_forever(void *arg) {
    getter *g = arg;
    char buf[8];
    size_t len = sizeof buf;
    g->st = g->ref.ops->get(g->ref.store, "nobody-sets-this", buf, &len, 60000);
    snprintf(g->msg, sizeof g->msg, "%s", ca_last_error());
    return NULL;
}

/* A server that goes away ends a blocked get at once, with a message naming it. */
static void test_server_gone(void **state) {
    (void)state;
    ca_store_server *s = NULL;
    ca_store_client *c = NULL;
    T_OK(ca_store_server_start("127.0.0.1", 0, TOKEN, &s, NULL));
    T_OK(ca_store_client_connect("127.0.0.1", ca_store_server_port(s), TOKEN, 2000, &c));
    getter g = {.ref = ca_store_client_ref(c)};
    pthread_t t;
    pthread_create(&t, NULL, get_forever, &g);
    usleep(100 * 1000);
    int64_t t0 = ms();
    ca_store_server_stop(s);
    pthread_join(t, NULL);
    assert_true(ms() - t0 < 5000);
    assert_int_equal(g.st, CA_ERR_PEER);
    assert_non_null(strstr(g.msg, "closed the connection"));
    ca_store_client_close(c);
}

/* A request that finds the store gone while it opens a connection (the pooled one is busy with another
 * thread's wait) says so in the same words as every later request: "the rendezvous store at ... is gone: ...",
 * not prefixed by the request. The peers of a rank that served the store recognise its loss by that form.
 * Which thread sees the loss first is a race: each round gives the second request a chance to. */
static void test_gone_while_connecting(void **state) {
    (void)state;
    for (int round = 0; round < 40; round++) {
        ca_store_server *s = NULL;
        ca_store_client *c = NULL;
        T_OK(ca_store_server_start("127.0.0.1", 0, TOKEN, &s, NULL));
        T_OK(ca_store_client_connect("127.0.0.1", ca_store_server_port(s), TOKEN, 2000, &c));
        getter g = {.ref = ca_store_client_ref(c)};
        pthread_t t;
        pthread_create(&t, NULL, get_forever, &g);
        usleep(20 * 1000);
        ca_store_server_stop(s);
        char buf[8];
        size_t len = sizeof buf;
        assert_int_equal(g.ref.ops->get(g.ref.store, "another-key", buf, &len, 1000), CA_ERR_PEER);
        const char *m = ca_last_error();
        if (strncmp(m, "the rendezvous store at 127.0.0.1:", 34) != 0 || !strstr(m, " is gone: "))
            fail_msg("round %d: %s", round, m);
        pthread_join(t, NULL);
        assert_int_equal(g.st, CA_ERR_PEER);
        ca_store_client_close(c);
    }
}

static void test_token(void **state) {
    (void)state;
    char a[64], b[64];
    T_OK(ca_store_make_token(a, sizeof a));
    T_OK(ca_store_make_token(b, sizeof b));
    assert_int_equal(strlen(a), 32);
    assert_string_not_equal(a, b);
    assert_int_equal(ca_store_make_token(a, 8), CA_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_set_get_check_add, setup, teardown),
        cmocka_unit_test_setup_teardown(test_small_buffer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_value, setup, teardown),
        cmocka_unit_test_setup_teardown(test_value_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_waits_for_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeouts_name_the_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unauthenticated_and_oversized, setup, teardown),
        cmocka_unit_test(test_flood_while_rendezvous),
        cmocka_unit_test_setup_teardown(test_emfile_does_not_spin, setup, teardown),
        cmocka_unit_test(test_wrong_token_warnings_are_limited),
        cmocka_unit_test_setup_teardown(test_concurrent_adds, setup, teardown),
        cmocka_unit_test(test_refused_names_address),
        cmocka_unit_test_setup_teardown(test_busy_port, setup, teardown),
        cmocka_unit_test(test_server_gone),
        cmocka_unit_test(test_gone_while_connecting),
        cmocka_unit_test(test_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
