/* The chunk plan of CUDA attention (backends/cuda/cuda_att_plan.h), on any machine: heads per chunk within the scratch budget, at least one, at most every head and cuBLAS's batch limit, the scratch it needs, one head too large for the address space refused, and grouped-query attention's kv-head units. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "backends/cuda/cuda_att_plan.h"

/* GPT-2 124M at T 1024, batch 8 (96 heads) in the default 256 MiB: 4 MiB a head forward, 8 MiB backward. */
static void test_gpt2_shape(void **state) {
    (void)state;
    cu_att_plan p;
    assert_true(cu_att_plan_make(96, 1024, 1024, 1, CU_ATT_SCRATCH_DEFAULT, &p));
    assert_int_equal(p.heads, 64);
    assert_int_equal(p.chunks, 2);
    assert_int_equal(p.bytes, (size_t)64 << 22);
    assert_true(cu_att_plan_make(96, 1024, 1024, 2, CU_ATT_SCRATCH_DEFAULT, &p));
    assert_int_equal(p.heads, 32);
    assert_int_equal(p.chunks, 3);
    assert_int_equal(p.bytes, (size_t)32 << 23);
    assert_true(p.bytes <= CU_ATT_SCRATCH_DEFAULT);
}

/* Few small heads: one chunk of all of them, scratch only what they need. */
static void test_all_heads_fit(void **state) {
    (void)state;
    cu_att_plan p;
    assert_true(cu_att_plan_make(2, 5, 7, 2, CU_ATT_SCRATCH_DEFAULT, &p));
    assert_int_equal(p.heads, 2);
    assert_int_equal(p.chunks, 1);
    assert_int_equal(p.bytes, 2 * 2 * 5 * 7 * sizeof(float));
}

/* A budget below one head still runs one head at a time (chunks = heads); an uneven split rounds up. */
static void test_budget_edges(void **state) {
    (void)state;
    cu_att_plan p;
    assert_true(cu_att_plan_make(12, 4096, 4096, 2, 1, &p));
    assert_int_equal(p.heads, 1);
    assert_int_equal(p.chunks, 12);
    assert_int_equal(p.bytes, (size_t)2 * 4096 * 4096 * sizeof(float));
    /* 3 heads' worth of budget (plus a little) over 10 heads: 3, 3, 3, 1 */
    size_t head = 70 * 66 * sizeof(float);
    assert_true(cu_att_plan_make(10, 70, 66, 1, 3 * head + 5, &p));
    assert_int_equal(p.heads, 3);
    assert_int_equal(p.chunks, 4);
    assert_int_equal(p.bytes, 3 * head);
}

/* Heads per chunk stay within cuBLAS's int batch count however large the budget. */
static void test_batch_limit(void **state) {
    (void)state;
    cu_att_plan p;
    assert_true(cu_att_plan_make((int64_t)INT_MAX * 3, 1, 1, 1, SIZE_MAX, &p));
    assert_int_equal(p.heads, INT_MAX);
    assert_int_equal(p.chunks, 3);
}

/* One head whose buffers do not fit in size_t is refused, not wrapped around. */
static void test_overflow(void **state) {
    (void)state;
    cu_att_plan p;
    assert_false(cu_att_plan_make(1, INT64_C(1) << 31, INT64_C(1) << 31, 2, CU_ATT_SCRATCH_DEFAULT, &p));
    assert_false(cu_att_plan_make(1, INT64_C(1) << 62, 1, 1, CU_ATT_SCRATCH_DEFAULT, &p));
    assert_true(cu_att_plan_make(1, INT64_C(1) << 30, INT64_C(1) << 30, 2, CU_ATT_SCRATCH_DEFAULT, &p));
    assert_int_equal(p.bytes, (size_t)8 << 60);
}

/* Grouped-query attention: the units are kv heads of g Tq rows (their g query heads read one K and V);
 * kv_heads 0 or heads plans as every head its own; g Tq past cuBLAS's int is refused. */
static void test_groups(void **state) {
    (void)state;
    cu_att_plan p, q;
    /* B 2, H 8 over Hkv 2 (g 4), T 64: a kv head's scores are 4 x 64 x 64 floats; 3 of them fit */
    size_t unit = 4 * 64 * 64 * sizeof(float);
    assert_true(cu_att_plan_groups(2, 8, 2, 64, 64, 1, 3 * unit + 7, &p));
    assert_int_equal(p.heads, 3);
    assert_int_equal(p.chunks, 2);
    assert_int_equal(p.bytes, 3 * unit);
    assert_true(cu_att_plan_groups(2, 8, 1, 64, 64, 2, CU_ATT_SCRATCH_DEFAULT, &p));   /* g 8: 2 units */
    assert_int_equal(p.heads, 2);
    assert_int_equal(p.chunks, 1);
    assert_int_equal(p.bytes, 2 * 2 * 8 * 64 * 64 * sizeof(float));
    assert_true(cu_att_plan_groups(2, 8, 0, 70, 66, 1, 1000000, &p));
    assert_true(cu_att_plan_make(16, 70, 66, 1, 1000000, &q));
    assert_int_equal(p.heads, q.heads);
    assert_int_equal(p.chunks, q.chunks);
    assert_true(cu_att_plan_groups(2, 8, 8, 70, 66, 1, 1000000, &p));
    assert_int_equal(p.heads, q.heads);
    assert_false(cu_att_plan_groups(1, 64, 1, INT_MAX / 32, 1, 1, CU_ATT_SCRATCH_DEFAULT, &p));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_shape),  cmocka_unit_test(test_all_heads_fit), cmocka_unit_test(test_budget_edges),
        cmocka_unit_test(test_batch_limit), cmocka_unit_test(test_overflow), cmocka_unit_test(test_groups),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
