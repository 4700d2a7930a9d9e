/* Communicators with threads as ranks (no MPI, no launcher): Gloo collectives, desync and timeout diagnosis. */
#include "comm/store_impl.h"

#include <caccel/caccel.h>

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

/*
 * Each thread is one rank with its own store client, as a process would be.
 * Everything here goes through the public ca_comm API over the Gloo plugin,
 * loaded from CACCEL_PLUGIN_PATH (make check sets it); without the plugin the
 * program exits 77.
 */

#define TOKEN "threads-as-ranks-test-token"
#define MAXR 4

typedef struct rank_ctx {
    int rank, world;
    int port;
    int64_t timeout_ms;
    const char *scenario;
    /* results */
    ca_status status;
    double seconds;
    char msg[4096];
    int bad;       /* a wrong value, with the message in msg */
} rank_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int record(rank_ctx *r, ca_status s) {
    r->status = s;
    if (s != CA_OK) snprintf(r->msg, sizeof r->msg, "%s", ca_last_error());
    return s != CA_OK;
}

/* Exercises every collective once with values whose results are known. */
static void correctness(rank_ctx *r, ca_comm *c) {
    int w = r->world, me = r->rank;
    enum { N = 1001 };
    float a[N], g[N * MAXR], rs[N];
    for (int i = 0; i < N; i++) a[i] = (float)(me + 1) * (float)(i % 13);
    if (record(r, ca_comm_all_reduce(c, a, a, N, CA_F32, CA_OP_SUM, NULL))) return;
    for (int i = 0; i < N; i++)
        if (a[i] != (float)(w * (w + 1) / 2) * (float)(i % 13)) {
            r->bad = 1;
            snprintf(r->msg, sizeof r->msg, "all_reduce element %d is %g", i, a[i]);
            return;
        }
    int32_t b[7];
    for (int i = 0; i < 7; i++) b[i] = me == 1 ? 100 + i : -1;
    if (record(r, ca_comm_broadcast(c, b, 7, CA_I32, 1, NULL))) return;
    for (int i = 0; i < 7; i++)
        if (b[i] != 100 + i) {
            r->bad = 1;
            snprintf(r->msg, sizeof r->msg, "broadcast element %d is %d", i, b[i]);
            return;
        }
    for (int i = 0; i < N; i++) a[i] = (float)(me * N + i);
    if (record(r, ca_comm_all_gather(c, a, g, N, CA_F32, NULL))) return;
    for (int i = 0; i < N * w; i++)
        if (g[i] != (float)i) {
            r->bad = 1;
            snprintf(r->msg, sizeof r->msg, "all_gather element %d is %g", i, g[i]);
            return;
        }
    float in[N * MAXR];
    for (int i = 0; i < N * w; i++) in[i] = (float)(i + me);
    if (record(r, ca_comm_reduce_scatter(c, in, rs, N, CA_F32, CA_OP_MAX, NULL))) return;
    for (int i = 0; i < N; i++)
        if (rs[i] != (float)(me * N + i + w - 1)) {
            r->bad = 1;
            snprintf(r->msg, sizeof r->msg, "reduce_scatter element %d is %g", i, rs[i]);
            return;
        }
    /* asynchronous: three in flight, waited out of order */
    int64_t x[3][64];
    ca_work *wk[3];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 64; i++) x[k][i] = k + me + i;
        if (record(r, ca_comm_all_reduce(c, x[k], x[k], 64, CA_I64, CA_OP_SUM, &wk[k]))) return;
    }
    for (int k = 2; k >= 0; k--) {
        if (record(r, ca_work_wait(wk[k], -1))) return;
        ca_work_free(wk[k]);
        for (int i = 0; i < 64; i++)
            if (x[k][i] != (int64_t)w * (k + i) + (int64_t)w * (w - 1) / 2) {
                r->bad = 1;
                snprintf(r->msg, sizeof r->msg, "async all_reduce %d element %d is %lld", k, i, (long long)x[k][i]);
                return;
            }
    }
    if (record(r, ca_comm_barrier(c, NULL))) return;
    if (ca_comm_seq(c) != 8) {
        r->bad = 1;
        snprintf(r->msg, sizeof r->msg, "sequence number %llu after 8 collectives",
                 (unsigned long long)ca_comm_seq(c));
    }
}

/* Colors by parity, keys reversed: each group of two orders its ranks backwards, sums only its own
 * members, and the parent still works afterwards. */
static void split(rank_ctx *r, ca_comm *c) {
    ca_comm *g = NULL;
    if (record(r, ca_comm_split(c, r->rank % 2, r->world - r->rank, &g))) return;
    int want_rank = 0, want_size = 0;
    float want_sum = 0.0f;
    for (int q = r->rank % 2; q < r->world; q += 2) {
        want_size++;
        want_rank += q > r->rank;
        want_sum += (float)(q + 1);
    }
    float v = (float)(r->rank + 1), all = 1.0f;
    uint64_t pb0 = ca_comm_bytes(c), gb0 = ca_comm_bytes(g);
    if (!record(r, ca_comm_all_reduce(g, &v, &v, 1, CA_F32, CA_OP_SUM, NULL))) {
        uint64_t gsent = ca_comm_bytes(g) - gb0;   /* the parent counts its children's bytes */
        if (ca_comm_bytes(c) - pb0 != gsent || (want_size > 1 && !gsent)) {
            r->bad = 1;
            snprintf(r->msg, sizeof r->msg, "the parent counted %llu bytes for the group's %llu",
                     (unsigned long long)(ca_comm_bytes(c) - pb0), (unsigned long long)gsent);
            ca_comm_destroy(g);
            return;
        }
        record(r, ca_comm_all_reduce(c, &all, &all, 1, CA_F32, CA_OP_SUM, NULL));
    }
    if (r->status == CA_OK && (ca_comm_rank(g) != want_rank || ca_comm_size(g) != want_size || v != want_sum ||
                               all != (float)r->world)) {
        r->bad = 1;
        snprintf(r->msg, sizeof r->msg, "group rank %d of %d (want %d of %d), group sum %g (want %g), parent sum %g",
                 ca_comm_rank(g), ca_comm_size(g), want_rank, want_size, (double)v, (double)want_sum, (double)all);
    }
    ca_comm_destroy(g);
}

static void *rank_main(void *arg) {
    rank_ctx *r = arg;
    ca_store_client *cl = NULL;
    if (record(r, ca_store_client_connect("127.0.0.1", r->port, TOKEN, 10000, &cl))) return NULL;
    ca_comm *c = NULL;
    ca_comm_options o = {
        .backend = "gloo", .rank = r->rank, .world_size = r->world, .local_rank = r->rank,
        .local_world_size = r->world, .store = ca_store_client_ref(cl), .timeout_ms = r->timeout_ms,
    };
    if (record(r, ca_comm_create(&o, &c))) {
        ca_store_client_close(cl);
        return NULL;
    }
    float v[16] = {0};
    double t0 = now_s();
    if (strcmp(r->scenario, "correctness") == 0) {
        correctness(r, c);
    } else if (strcmp(r->scenario, "split") == 0) {
        split(r, c);
    } else if (strcmp(r->scenario, "desync") == 0) {
        record(r, ca_comm_all_reduce(c, v, v, 16, CA_F32, CA_OP_SUM, NULL));
        t0 = now_s();
        /* the classic mistake: a barrier only the main process reaches */
        if (r->status == CA_OK)
            record(r, r->rank == 0 ? ca_comm_barrier(c, NULL) : ca_comm_all_reduce(c, v, v, 16, CA_F32, CA_OP_SUM, NULL));
    } else if (strcmp(r->scenario, "split-timeout") == 0) {
        /* groups by parity; in the odd group (ranks 1, 3) rank 3 never calls the collective */
        ca_comm *g = NULL;
        if (!record(r, ca_comm_split(c, r->rank % 2, r->rank, &g)) && !record(r, ca_comm_set_name(g, "tp"))) {
            t0 = now_s();
            if (r->rank == 1) record(r, ca_comm_all_reduce(g, v, v, 16, CA_F32, CA_OP_SUM, NULL));
            else if (r->rank == 3) usleep((useconds_t)(r->timeout_ms + 1500) * 1000);
        }
        ca_comm_destroy(g);
    } else if (strcmp(r->scenario, "timeout") == 0) {
        /* the last rank never calls the collective */
        if (r->rank != r->world - 1) record(r, ca_comm_all_reduce(c, v, v, 16, CA_F32, CA_OP_SUM, NULL));
        else usleep((useconds_t)(r->timeout_ms + 1500) * 1000);
    }
    r->seconds = now_s() - t0;
    if (r->status != CA_OK && strcmp(r->scenario, "split-timeout") != 0) {   /* there the parent is healthy */
        /* after a failure every call fails at once */
        double t1 = now_s();
        if (ca_comm_barrier(c, NULL) == CA_OK || now_s() - t1 > 1.0) {
            r->bad = 1;
            snprintf(r->msg, sizeof r->msg, "a barrier after the failure did not fail at once");
        }
    }
    ca_comm_destroy(c);
    ca_store_client_close(cl);
    return NULL;
}

static void run(const char *scenario, int world, int64_t timeout_ms, rank_ctx *ranks) {
    ca_store_server *srv = NULL;
    if (ca_store_server_start("127.0.0.1", 0, TOKEN, &srv, NULL) != CA_OK) fail_msg("store: %s", ca_last_error());
    pthread_t th[MAXR];
    for (int i = 0; i < world; i++) {
        ranks[i] = (rank_ctx){.rank = i, .world = world, .port = ca_store_server_port(srv), .timeout_ms = timeout_ms,
                              .scenario = scenario};
        pthread_create(&th[i], NULL, rank_main, &ranks[i]);
    }
    for (int i = 0; i < world; i++) pthread_join(th[i], NULL);
    ca_store_server_stop(srv);
}

static void test_collectives(void **state) {
    (void)state;
    for (int world = 2; world <= MAXR; world++) {
        rank_ctx r[MAXR];
        run("correctness", world, 30000, r);
        for (int i = 0; i < world; i++) {
            if (r[i].status != CA_OK || r[i].bad)
                fail_msg("world %d rank %d: %s (%s)", world, i, r[i].msg, ca_status_name(r[i].status));
        }
    }
}

static void test_split(void **state) {
    (void)state;
    for (int world = 3; world <= MAXR; world++) {
        rank_ctx r[MAXR];
        run("split", world, 30000, r);
        for (int i = 0; i < world; i++)
            if (r[i].status != CA_OK || r[i].bad)
                fail_msg("split of %d, rank %d: %s (%s)", world, i, r[i].msg, ca_status_name(r[i].status));
    }
}

/* Every rank fails within seconds (not after the 60 s timeout) and says what was mismatched. */
static void test_desync_fails_fast_everywhere(void **state) {
    (void)state;
    rank_ctx r[3];
    run("desync", 3, 60000, r);
    for (int i = 0; i < 3; i++) {
        print_message("rank %d after %.2f s: %s\n", i, r[i].seconds, r[i].msg);
        assert_int_equal(r[i].status, CA_ERR_PEER);
        assert_false(r[i].bad);
        assert_true(r[i].seconds < 10.0);
        assert_non_null(strstr(r[i].msg, "mismatch"));
        assert_non_null(strstr(r[i].msg, "barrier"));
        assert_non_null(strstr(r[i].msg, "all_reduce(f32, 16, sum)"));
        assert_non_null(strstr(r[i].msg, "#1"));
    }
}

/* The waiting ranks fail at the timeout, naming the collective and the rank that never came. */
static void test_timeout_names_late_rank(void **state) {
    (void)state;
    rank_ctx r[3];
    run("timeout", 3, 1500, r);
    for (int i = 0; i < 2; i++) {
        print_message("rank %d after %.2f s: %s\n", i, r[i].seconds, r[i].msg);
        assert_int_equal(r[i].status, CA_ERR_TIMEOUT);
        assert_false(r[i].bad);
        assert_true(r[i].seconds >= 1.4 && r[i].seconds < 6.0);
        assert_non_null(strstr(r[i].msg, "all_reduce #0 (f32, 16 elements, sum) timed out after 1500 ms"));
        assert_non_null(strstr(r[i].msg, "rank 2 has not called any collective"));
    }
}

/* In a split, the timeout names the late member by its rank in the job, and the group. */
static void test_split_timeout_names_parent_ranks(void **state) {
    (void)state;
    rank_ctx r[4];
    run("split-timeout", 4, 1500, r);
    print_message("rank 1 after %.2f s: %s\n", r[1].seconds, r[1].msg);
    assert_int_equal(r[1].status, CA_ERR_TIMEOUT);
    assert_true(r[1].seconds >= 1.4 && r[1].seconds < 6.0);
    assert_non_null(strstr(r[1].msg, "timed out after 1500 ms on rank 1: rank 3 has not called any collective"));
    /* named as the device mesh names its groups (ca_comm_set_name) */
    assert_non_null(strstr(r[1].msg, "(in the tp group of ranks 1, 3 split from "));
    for (int i = 0; i < 4; i += 2) assert_int_equal(r[i].status, CA_OK);
}

int main(void) {
    ca_registry_load_plugins();
    ca_clear_error();
    if (!ca_registry_collective("gloo")) {
        fprintf(stderr, "SKIP: no gloo collective backend: %s\n", ca_last_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_desync_fails_fast_everywhere),
        cmocka_unit_test(test_timeout_names_late_rank),
        cmocka_unit_test(test_split_timeout_names_parent_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
