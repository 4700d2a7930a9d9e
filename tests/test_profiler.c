/* The profiler's recorder: the schedule (wait/warmup/active/repeat in steps), buffers that grow
 * past their first page, two threads recording at once, the refusals at begin, and the kernel
 * hook's slice (op, shapes, FLOPs). The trace's format is checked by tests/test_profiler.sh. */
#include "test_util.h"

#include <pthread.h>

static char g_dir[256];

static void setup_dir(void) {
    if (ca_profile_running()) ca_profile_end();   /* a failed test's profile does not fail the next */
    snprintf(g_dir, sizeof g_dir, "test_profiler.%ld.d", (long)getpid());
    t_rm_tree(g_dir);
}

/* The trace's text, or fails. */
static char *read_trace(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/trace_rank0.json", g_dir);
    assert_string_equal(ca_profile_last_path(), path);
    return t_read_text(path);
}

/* torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2): steps 2, 3, 6, 7 record. */
static void test_schedule(void **state) {
    (void)state;
    setup_dir();
    T_OK(ca_profile_begin(&(ca_profile_config){.wait = 1, .warmup = 1, .active = 2, .repeat = 2,
                                               .output_trace_dir = g_dir}));
    const bool want[] = {false, false, true, true, false, false, true, true, false, false, false};
    for (int s = 0; s < (int)(sizeof want / sizeof want[0]); s++) {
        assert_int_equal(ca_profile_recording(), want[s]);
        CA_PROFILE_SCOPE("work") { (void)0; }
        T_OK(ca_profile_step());
    }
    T_OK(ca_profile_end());
    char *t = read_trace();
    assert_int_equal(t_count(t, "\"name\":\"work\""), 4);
    assert_int_equal(t_count(t, "\"name\":\"ProfilerStep\""), 4);
    free(t);
    assert_false(ca_profile_recording());
    t_rm_tree(g_dir);
}

/* No schedule: every step records; 100000 events grow the buffer far past its first 4 KiB. */
static void test_growth(void **state) {
    (void)state;
    setup_dir();
    T_OK(ca_profile_begin(&(ca_profile_config){.output_trace_dir = g_dir}));
    for (int i = 0; i < 100000; i++) CA_PROFILE_SCOPE("grow") { (void)0; }
    T_OK(ca_profile_end());
    char *t = read_trace();
    assert_int_equal(t_count(t, "\"name\":\"grow\""), 100000);
    free(t);
    t_rm_tree(g_dir);
}

static void *record_many(void *arg) {
    for (int i = 0; i < 20000; i++) CA_PROFILE_SCOPE((const char *)arg) { (void)0; }
    return NULL;
}

/* Two threads record at once, each into its own buffer under its own tid: none is lost. */
static void test_threads(void **state) {
    (void)state;
    setup_dir();
    T_OK(ca_profile_begin(&(ca_profile_config){.output_trace_dir = g_dir}));
    pthread_t a, b;
    assert_int_equal(pthread_create(&a, NULL, record_many, "thread_a"), 0);
    assert_int_equal(pthread_create(&b, NULL, record_many, "thread_b"), 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    T_OK(ca_profile_end());
    char *t = read_trace();
    assert_int_equal(t_count(t, "\"name\":\"thread_a\""), 20000);
    assert_int_equal(t_count(t, "\"name\":\"thread_b\""), 20000);
    assert_int_equal(t_count(t, "\"name\":\"thread_name\""), 2);
    free(t);
    t_rm_tree(g_dir);
}

/* Refusals: an unwritable output_trace_dir (named), a second begin, an end without begin, a
 * schedule without active steps, an unknown activity. */
static void test_refusals(void **state) {
    (void)state;
    char file[256], under[300];
    snprintf(file, sizeof file, "test_profiler.%ld.file", (long)getpid());
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(under, sizeof under, "%s/traces", file);   /* a directory below a regular file */
    assert_int_equal(ca_profile_begin(&(ca_profile_config){.output_trace_dir = under}), CA_ERR_IO);
    assert_non_null(strstr(ca_last_error(), under));
    assert_false(ca_profile_running());
    remove(file);
    assert_int_equal(ca_profile_end(), CA_ERR_STATE);
    assert_int_equal(ca_profile_begin(&(ca_profile_config){.wait = 2}), CA_ERR_INVALID);
    assert_int_equal(ca_profile_begin(&(ca_profile_config){.activities = "tpu"}), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "tpu"));
    setup_dir();
    T_OK(ca_profile_begin(&(ca_profile_config){.output_trace_dir = g_dir}));
    assert_int_equal(ca_profile_begin(&(ca_profile_config){.output_trace_dir = g_dir}), CA_ERR_STATE);
    T_OK(ca_profile_end());
    t_rm_tree(g_dir);
}

/* The kernel hook: a matmul's GEMM slice carries its op, device, dtype, shapes and 2 m n k FLOPs;
 * off, nothing is recorded. */
static void test_kernel_slice(void **state) {
    (void)state;
    setup_dir();
    ca_device *dev;
    T_OK(ca_device_open("cpu", 0, NULL, &dev));
    ca_tensor *a = T_NN(ca_zeros(dev, CA_F32, 2, (int64_t[]){4, 8}));
    ca_tensor *b = T_NN(ca_zeros(dev, CA_F32, 2, (int64_t[]){8, 16}));
    T_OK(ca_profile_begin(&(ca_profile_config){.output_trace_dir = g_dir, .record_shapes = true, .with_flops = true}));
    ca_tensor *c = T_NN(ca_matmul(a, b));
    T_OK(ca_profile_end());
    ca_tensor *d = T_NN(ca_matmul(a, b));   /* after the end: not in the file */
    char *t = read_trace();
    assert_int_equal(t_count(t, "\"name\":\"gemm\""), 1);
    assert_non_null(strstr(t, "\"op\":\"gemm\",\"device\":\"cpu:0\",\"dtype\":\"f32\",\"shapes\":[[1,4,8],[1,8,16]],"
                              "\"flops\":1024"));
    free(t);
    ca_tensor_free(d);
    ca_tensor_free(c);
    ca_tensor_free(b);
    ca_tensor_free(a);
    t_rm_tree(g_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_kernel_slice),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_shutdown();
    return rc;
}
