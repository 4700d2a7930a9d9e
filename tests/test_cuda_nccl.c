/* The nccl collective backend at world size 1 on one GPU: every op and dtype through the public communicator API, blocking and asynchronous. */
#include "test_cuda_util.h"
#include "test_kcall.h"

static ca_device *G;
static ca_comm *comm;

static const ca_dtype DTS[] = {CA_F32, CA_F16, CA_BF16, CA_I32, CA_I64, CA_U8};

/* n elements of dt with small integer values (exact in every dtype). */
static void *values(ca_dtype dt, size_t n, int base) {
    float *f = malloc(n * sizeof *f);
    for (size_t i = 0; i < n; i++) f[i] = (float)((base + (int)i) % 50);
    void *h = malloc(n * ca_dtype_size(dt));
    T_OK(TKC("cpu", ca_device_kernels(ca_cpu_device()), ca_device_context(ca_cpu_device()), cast, .src_dt = CA_F32,
             .x = f, .dst_dt = dt, .y = h, .n = (int64_t)n, .alpha = 1.0f));
    free(f);
    return h;
}

static void test_ops(void **state) {
    size_t n = 1000;
    for (size_t d = 0; d < sizeof DTS / sizeof DTS[0]; d++) {
        ca_dtype dt = DTS[d];
        size_t bytes = n * ca_dtype_size(dt);
        void *h = values(dt, n, (int)d), *o = malloc(bytes);
        for (int op = 0; op <= CA_OP_MAX; op++) {
            void *send = tc_put(h, bytes), *recv = tc_alloc(bytes);
            T_OK(ca_comm_all_reduce(comm, send, recv, n, dt, op, NULL));      /* world 1: the identity */
            tc_get(o, recv, bytes);
            assert_memory_equal(h, o, bytes);
            T_OK(ca_comm_all_reduce(comm, send, send, n, dt, op, NULL));      /* in place */
            tc_get(o, send, bytes);
            assert_memory_equal(h, o, bytes);
            T_OK(ca_comm_reduce_scatter(comm, send, recv, n, dt, op, NULL));
            tc_get(o, recv, bytes);
            assert_memory_equal(h, o, bytes);
            tc_free_all();
        }
        void *buf = tc_put(h, bytes), *all = tc_alloc(bytes);
        T_OK(ca_comm_broadcast(comm, buf, n, dt, 0, NULL));
        tc_get(o, buf, bytes);
        assert_memory_equal(h, o, bytes);
        T_OK(ca_comm_all_gather(comm, buf, all, n, dt, NULL));
        tc_get(o, all, bytes);
        assert_memory_equal(h, o, bytes);
        /* asynchronous: a handle to test and wait on */
        ca_work *w = NULL;
        T_OK(ca_comm_all_reduce(comm, buf, all, n, dt, CA_OP_SUM, &w));
        assert_non_null(w);
        ca_status s;
        while ((s = ca_work_test(w)) == CA_IN_PROGRESS) {}
        T_OK(s);
        T_OK(ca_work_wait(w, 1000));
        ca_work_free(w);
        T_OK(ca_comm_barrier(comm, NULL));
        free(h);
        free(o);
        tc_free_all();
    }
    assert_true(ca_comm_seq(comm) > 0);
}

/* Gradient-sized buffers, many in flight at once, as the accelerator's buckets are. */
static void test_many_in_flight(void **state) {
    enum { NW = 16 };
    size_t n = 1 << 20;
    float *h = malloc(n * 4), *o = malloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = (float)(i % 1000) * 0.5f;
    void *b[NW];
    ca_work *w[NW];
    for (int i = 0; i < NW; i++) {
        b[i] = tc_put(h, n * 4);
        T_OK(ca_comm_all_reduce(comm, b[i], b[i], n, CA_F32, CA_OP_AVG, &w[i]));
    }
    for (int i = NW - 1; i >= 0; i--) {
        T_OK(ca_work_wait(w[i], -1));
        ca_work_free(w[i]);
        tc_get(o, b[i], n * 4);
        assert_memory_equal(h, o, n * 4);
    }
    free(h);
    free(o);
    tc_free_all();
}

int main(void) {
    ca_log_set_level(CA_LOG_WARNING);
    G = tc_open_or_skip("test_cuda_nccl");
    tc_dev = G;
    ca_comm_options co = {.backend = "nccl", .rank = 0, .world_size = 1, .local_rank = 0, .local_world_size = 1,
                          .device = G, .timeout_ms = 60000};
    if (ca_comm_create(&co, &comm) != CA_OK) {
        fprintf(stderr, "FAIL: nccl communicator of one rank: %s\n", ca_last_error());
        return 1;
    }
    if (strcmp(ca_comm_backend(comm), "nccl") != 0) {
        fprintf(stderr, "FAIL: the communicator runs on %s, not nccl\n", ca_comm_backend(comm));
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops),
        cmocka_unit_test(test_many_in_flight),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_comm_destroy(comm);
    ca_shutdown();
    return rc;
}
