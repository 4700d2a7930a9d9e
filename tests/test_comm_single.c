/* The single-process communicator: every collective's semantics for a world of one, on device memory. */
#include <caccel/caccel.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define T_OK(expr)                                                                                   \
    do {                                                                                             \
        ca_status t_s_ = (expr);                                                                     \
        if (t_s_ != CA_OK) fail_msg("%s -> %s: %s", #expr, ca_status_name(t_s_), ca_last_error()); \
    } while (0)

static ca_comm *make(void) {
    ca_comm *c = NULL;
    ca_comm_options o = {.backend = "single", .rank = 0, .world_size = 1};
    T_OK(ca_comm_create(&o, &c));
    return c;
}

/* Buffers live in device memory and go through the device's copies, as on a GPU. */
static void *dev_from(ca_device *d, const void *host, size_t bytes) {
    void *p = NULL;
    T_OK(ca_device_alloc(d, bytes ? bytes : 1, &p));
    if (bytes && host) T_OK(ca_device_copy_from_host(d, p, host, bytes));
    return p;
}

/* Point-to-point in a world of one: an exchange with itself copies (a ring of one); a peer outside
 * the world, or this rank as one end only, is refused; bytes count what was sent (none: world 1). */
static void test_sendrecv_with_itself(void **state) {
    (void)state;
    ca_comm *c = make();
    ca_device *d = ca_cpu_device();
    float h[5] = {1, 2, 3, 4, 5}, back[5] = {0};
    void *src = dev_from(d, h, sizeof h), *dst = dev_from(d, NULL, sizeof h);
    T_OK(ca_comm_sendrecv(c, src, 5, 0, dst, 5, 0, CA_F32, NULL));
    T_OK(ca_device_copy_to_host(d, back, dst, sizeof back));
    assert_memory_equal(back, h, sizeof h);
    ca_work *w = NULL;
    T_OK(ca_comm_sendrecv(c, src, 0, 0, dst, 0, 0, CA_F32, &w));
    T_OK(ca_work_wait(w, -1));
    ca_work_free(w);
    assert_int_equal(ca_comm_send(c, src, 5, CA_F32, 1, NULL), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "destination rank 1 is not a rank of this communicator (size 1)"));
    assert_int_equal(ca_comm_send(c, src, 5, CA_F32, 0, NULL), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "only as both the destination and the source"));
    assert_int_equal(ca_comm_sendrecv(c, src, 5, 0, dst, 4, 0, CA_F32, NULL), CA_ERR_INVALID);
    assert_int_equal(ca_comm_sendrecv(c, NULL, 0, -1, NULL, 0, -1, CA_F32, NULL), CA_ERR_INVALID);
    assert_int_equal(ca_comm_bytes(c), 0);
    ca_device_free(d, src);
    ca_device_free(d, dst);
    ca_comm_destroy(c);
}

static void test_all_reduce_is_identity(void **state) {
    (void)state;
    ca_comm *c = make();
    ca_device *d = ca_cpu_device();
    assert_int_equal(ca_comm_size(c), 1);
    assert_int_equal(ca_comm_rank(c), 0);
    assert_string_equal(ca_comm_backend(c), "single");
    /* no threads_concurrent slot (ABI 3.4) reads as no; so does no communicator */
    assert_false(ca_comm_threads_concurrent(c));
    assert_false(ca_comm_threads_concurrent(NULL));
    float h[5] = {1.5f, -2, 3, 0, 7};
    const ca_reduce_op ops[] = {CA_OP_SUM, CA_OP_AVG, CA_OP_MIN, CA_OP_MAX};
    for (size_t k = 0; k < 4; k++) {
        void *s = dev_from(d, h, sizeof h), *r = dev_from(d, NULL, sizeof h);
        T_OK(ca_comm_all_reduce(c, s, r, 5, CA_F32, ops[k], NULL));
        float out[5];
        T_OK(ca_device_copy_to_host(d, out, r, sizeof out));
        assert_memory_equal(out, h, sizeof h);
        T_OK(ca_comm_all_reduce(c, s, s, 5, CA_F32, ops[k], NULL));   /* in place */
        T_OK(ca_device_copy_to_host(d, out, s, sizeof out));
        assert_memory_equal(out, h, sizeof h);
        ca_device_free(d, s);
        ca_device_free(d, r);
    }
    int64_t i64[3] = {1, -5, 9}, o64[3];
    void *s = dev_from(d, i64, sizeof i64), *r = dev_from(d, NULL, sizeof i64);
    T_OK(ca_comm_all_reduce(c, s, r, 3, CA_I64, CA_OP_AVG, NULL));
    T_OK(ca_device_copy_to_host(d, o64, r, sizeof o64));
    assert_memory_equal(o64, i64, sizeof i64);
    ca_device_free(d, s);
    ca_device_free(d, r);
    /* zero elements, NULL buffers allowed */
    T_OK(ca_comm_all_reduce(c, NULL, NULL, 0, CA_BF16, CA_OP_SUM, NULL));
    assert_int_equal(ca_comm_seq(c), 10);
    ca_comm_destroy(c);
}

static void test_gather_scatter_broadcast_barrier(void **state) {
    (void)state;
    ca_comm *c = make();
    ca_device *d = ca_cpu_device();
    uint16_t h[4] = {1, 2, 3, 4}, out[4];
    void *s = dev_from(d, h, sizeof h), *r = dev_from(d, NULL, sizeof h);
    T_OK(ca_comm_all_gather(c, s, r, 4, CA_F16, NULL));
    T_OK(ca_device_copy_to_host(d, out, r, sizeof out));
    assert_memory_equal(out, h, sizeof h);
    memset(out, 0, sizeof out);
    T_OK(ca_device_copy_from_host(d, r, out, sizeof out));
    T_OK(ca_comm_reduce_scatter(c, s, r, 4, CA_BF16, CA_OP_SUM, NULL));
    T_OK(ca_device_copy_to_host(d, out, r, sizeof out));
    assert_memory_equal(out, h, sizeof h);
    T_OK(ca_comm_broadcast(c, s, 4, CA_F16, 0, NULL));
    T_OK(ca_device_copy_to_host(d, out, s, sizeof out));
    assert_memory_equal(out, h, sizeof h);
    T_OK(ca_comm_barrier(c, NULL));
    /* a root that does not exist */
    assert_int_equal(ca_comm_broadcast(c, s, 4, CA_F16, 1, NULL), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "root 1"));
    /* argument errors are not collective failures: the communicator still works */
    assert_int_equal(ca_comm_all_reduce(c, s, r, 4, (ca_dtype)42, CA_OP_SUM, NULL), CA_ERR_INVALID);
    assert_int_equal(ca_comm_all_reduce(c, s, r, 4, CA_F32, (ca_reduce_op)9, NULL), CA_ERR_INVALID);
    T_OK(ca_comm_barrier(c, NULL));
    ca_device_free(d, s);
    ca_device_free(d, r);
    ca_comm_destroy(c);
}

static void test_work_handles(void **state) {
    (void)state;
    ca_comm *c = make();
    float a[3] = {1, 2, 3}, b[3] = {0};
    ca_work *w = NULL;
    T_OK(ca_comm_all_reduce(c, a, b, 3, CA_F32, CA_OP_SUM, &w));
    assert_non_null(w);
    assert_int_equal(ca_work_test(w), CA_OK);
    T_OK(ca_work_wait(w, 0));
    T_OK(ca_work_wait(w, -1));
    ca_work_free(w);
    assert_memory_equal(a, b, sizeof a);
    ca_work *wb = NULL;
    T_OK(ca_comm_barrier(c, &wb));
    ca_work_free(wb);   /* freeing without waiting is allowed */
    ca_work_free(NULL);
    ca_comm_destroy(c);
    ca_comm_destroy(NULL);
}

static void test_options(void **state) {
    (void)state;
    ca_comm *c = NULL;
    /* world_size 0: from the environment; with no launcher that is one process */
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMI_SIZE");
    unsetenv("PMIX_RANK");
    unsetenv("SLURM_PROCID");
    T_OK(ca_comm_create(&(ca_comm_options){0}, &c));
    assert_string_equal(ca_comm_backend(c), "single");
    assert_int_equal(ca_comm_timeout_ms(c), 1800 * 1000);
    ca_comm_destroy(c);
    setenv("CACCEL_TIMEOUT", "12", 1);
    T_OK(ca_comm_create(&(ca_comm_options){0}, &c));
    assert_int_equal(ca_comm_timeout_ms(c), 12000);
    ca_comm_destroy(c);
    unsetenv("CACCEL_TIMEOUT");
    T_OK(ca_comm_create(&(ca_comm_options){.backend = "single", .world_size = 1, .timeout_ms = 250}, &c));
    assert_int_equal(ca_comm_timeout_ms(c), 250);
    ca_comm_destroy(c);
    /* the single backend serves one process only */
    assert_int_not_equal(ca_comm_create(&(ca_comm_options){.backend = "single", .rank = 1, .world_size = 2}, &c), CA_OK);
    assert_int_equal(ca_comm_create(&(ca_comm_options){.backend = "single", .rank = 2, .world_size = 2}, &c),
                     CA_ERR_INVALID);
    /* an unknown backend names itself and what exists */
    assert_int_equal(ca_comm_create(&(ca_comm_options){.backend = "carrier-pigeon", .world_size = 1}, &c),
                     CA_ERR_NOT_FOUND);
    assert_non_null(strstr(ca_last_error(), "carrier-pigeon"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_reduce_is_identity),
        cmocka_unit_test(test_sendrecv_with_itself),
        cmocka_unit_test(test_gather_scatter_broadcast_barrier),
        cmocka_unit_test(test_work_handles),
        cmocka_unit_test(test_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
