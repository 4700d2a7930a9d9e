/* ca_find_executable_batch_size (one process) and the device memory limit it is tested with: the
 * batch sizes tried follow Accelerate's 0.9 steps, the one returned is the largest of them whose
 * step fits the limit, the tries leave nothing behind, and the refusals carry their messages. */
#include "test_util.h"

/* A forward pass of a two-layer MLP at the given batch: its activations grow with the batch, the
 * weights do not. Records every batch size it is called with. */
typedef struct mlp_try {
    ca_tensor *w1, *w2;
    int64_t calls[32];
    int ncalls;
    int fail_with;            /* != 0: return this status (not out of memory) instead */
} mlp_try;

static ca_status mlp_step(void *ctx, int64_t batch) {
    mlp_try *m = ctx;
    if (m->ncalls < 32) m->calls[m->ncalls++] = batch;
    if (m->fail_with) return ca_error((ca_status)m->fail_with, "test: step failed on purpose");
    ca_tensor *x = ca_full(ca_cpu_device(), CA_F32, 2, (int64_t[]){batch, 64}, 0.5);
    ca_tensor *y = ca_matmul(ca_gelu(ca_matmul(x, m->w1)), m->w2);
    return y ? CA_OK : ca_last_status();
}

static mlp_try *make_mlp(void) {
    mlp_try *m = calloc(1, sizeof *m);
    m->w1 = ca_tensor_keep(T_NN(ca_full(ca_cpu_device(), CA_F32, 2, (int64_t[]){64, 512}, 0.01)));
    m->w2 = ca_tensor_keep(T_NN(ca_full(ca_cpu_device(), CA_F32, 2, (int64_t[]){512, 16}, 0.01)));
    return m;
}

static void free_mlp(mlp_try *m) {
    ca_tensor_free(m->w1);
    ca_tensor_free(m->w2);
    free(m);
}

/* Peak bytes tensors hold during one step at `batch`, measured without a limit. */
static size_t step_peak(mlp_try *m, int64_t batch) {
    ca_device *d = ca_cpu_device();
    ca_allocator_stats st;
    T_OK(ca_device_reset_peak_stats(d));
    CA_SCOPE { T_OK(mlp_step(m, batch)); }
    T_OK(ca_device_memory_stats(d, &st));
    m->ncalls = 0;
    return st.peak_allocated;
}

static void test_shrinks_by_tenths(void **state) {
    (void)state;
    mlp_try *m = make_mlp();
    size_t fits = step_peak(m, 40), too_big = step_peak(m, 45);
    assert_true(too_big > fits);
    T_OK(ca_device_set_memory_limit(ca_cpu_device(), fits));
    int64_t found = -1;
    int64_t live = ca_scope_live_tensors();
    T_OK(ca_find_executable_batch_size(NULL, 64, mlp_step, m, &found));
    T_OK(ca_device_set_memory_limit(ca_cpu_device(), 0));
    assert_int_equal(found, 40);
    const int64_t want[] = {64, 57, 51, 45, 40};   /* int(b * 0.9), as Accelerate */
    assert_int_equal(m->ncalls, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(m->calls[i], want[i]);
    assert_int_equal(ca_scope_live_tensors(), live);   /* every try's tensors were released */
    free_mlp(m);
}

static void test_nothing_fits(void **state) {
    (void)state;
    mlp_try *m = make_mlp();
    ca_allocator_stats st;
    T_OK(ca_device_memory_stats(ca_cpu_device(), &st));
    T_OK(ca_device_set_memory_limit(ca_cpu_device(), st.allocated + 1));   /* not even batch 1 */
    int64_t found = -1;
    ca_status s = ca_find_executable_batch_size(NULL, 3, mlp_step, m, &found);
    T_OK(ca_device_set_memory_limit(ca_cpu_device(), 0));
    assert_int_equal(s, CA_ERR_NOMEM);
    assert_int_equal(found, 0);
    assert_non_null(strstr(ca_last_error(), "no batch size down to 1 fit in memory (started at 3"));
    assert_non_null(strstr(ca_last_error(), "memory limit"));   /* the last out-of-memory error */
    assert_int_equal(m->ncalls, 3);   /* 3, 2, 1 */
    free_mlp(m);
}

static void test_other_errors_stop(void **state) {
    (void)state;
    mlp_try *m = make_mlp();
    m->fail_with = CA_ERR_IO;
    int64_t found = -1;
    assert_int_equal(ca_find_executable_batch_size(NULL, 64, mlp_step, m, &found), CA_ERR_IO);
    assert_non_null(strstr(ca_last_error(), "step failed on purpose"));
    assert_int_equal(m->ncalls, 1);   /* not retried: only out of memory is */
    assert_int_equal(ca_find_executable_batch_size(NULL, 0, mlp_step, m, &found), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "starting batch size must be >= 1 (got 0)"));
    assert_int_equal(ca_find_executable_batch_size(NULL, 8, NULL, m, &found), CA_ERR_INVALID);
    free_mlp(m);
}

static void test_limit_message(void **state) {
    (void)state;
    ca_device *d = ca_cpu_device();
    assert_int_equal(ca_device_memory_limit(d), 0);
    T_OK(ca_device_set_memory_limit(d, 1));
    assert_int_equal(ca_device_memory_limit(d), 1);
    assert_null(ca_zeros(d, CA_F32, 1, (int64_t[]){1024}));
    T_OK(ca_device_set_memory_limit(d, 0));
    assert_int_equal(ca_last_status(), CA_ERR_NOMEM);
    assert_non_null(strstr(ca_last_error(), "cpu:0: out of memory allocating 4096 bytes: the device's memory limit is 1 bytes"));
    assert_non_null(T_NN(ca_zeros(d, CA_F32, 1, (int64_t[]){1024})));
    assert_int_equal(ca_device_set_memory_limit(NULL, 1), CA_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shrinks_by_tenths),
        cmocka_unit_test(test_nothing_fits),
        cmocka_unit_test(test_other_errors_stop),
        cmocka_unit_test(test_limit_message),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    ca_shutdown();
    return r;
}
