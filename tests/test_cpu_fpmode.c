/* The CPU backend's floating-point mode: arithmetic kernels flush subnormals (FTZ/DAZ) while they
 * run, the caller's mode is what it was after every call, data-movement kernels keep subnormals
 * bit-exact, and flushing can be turned off. Values only, no timing. */
#include "test_cpu_util.h"

#if defined(__SSE2__)
#include <xmmintrin.h>

#define FTZ_DAZ 0x8040u    /* MXCSR bits 15 and 6 */
#define RC_MASK 0x6000u    /* rounding control */
#define CONTROL 0xffc0u    /* every bit but the six status flags */

static const float TINY = 1e-20f;  /* TINY * TINY = 1e-40 is subnormal */

/* A subnormal computed in this (the caller's) code: nonzero unless the caller flushes. */
static float caller_square(float x) {
    volatile float v = x;
    return v * v;
}

static float subnormal(void) {
    volatile float s = 1e-40f;
    return s;
}

static void mul1(float a, float b, float *y) {
    ca_bcast_args sh = {.ndim = 1, .shape = {1}, .a_stride = {1}, .b_stride = {1}};
    OK(KC(binary, .op = CA_BINARY_MUL, .dt = CA_F32, .shape = sh, .a = &a, .b = &b, .y = y));
}

/* Runs first: the variable is read at the first kernel call. */
static void test_env_turns_off(void **state) {
    setenv("CACCEL_CPU_FLUSH_DENORMAL", "off", 1);
    float y = 0.0f;
    _mm_setcsr(_mm_getcsr() & ~FTZ_DAZ);
    mul1(TINY, TINY, &y);
    assert_false(ca_cpu_flush_denormal());
    assert_true(y > 0.0f);
    unsetenv("CACCEL_CPU_FLUSH_DENORMAL");
    ca_cpu_set_flush_denormal(true);
}

static void test_flushed_inside_restored_outside(void **state) {
    unsigned before = _mm_getcsr() & ~FTZ_DAZ;
    _mm_setcsr(before);
    assert_true(caller_square(TINY) > 0.0f);         /* the caller computes subnormals */
    float y = -1.0f;
    mul1(TINY, TINY, &y);
    assert_true(y == 0.0f);                           /* FTZ: the subnormal product is 0 */
    float s = subnormal(), zero = 0.0f;
    ca_bcast_args sh = {.ndim = 1, .shape = {1}, .a_stride = {1}, .b_stride = {1}};
    OK(KC(binary, .op = CA_BINARY_ADD, .dt = CA_F32, .shape = sh, .a = &s, .b = &zero, .y = &y));
    assert_true(y == 0.0f);                           /* DAZ: a subnormal input reads as 0 */
    float e, x = -100.0f;
    OK(KC(unary, .op = CA_UNARY_EXP, .dt = CA_F32, .n = 1, .x = &x, .y = &e, .alpha = 0));
    assert_true(e == 0.0f);                           /* exp(-100) ~ 3.7e-44 flushes */
    assert_int_equal(_mm_getcsr() & CONTROL, before & CONTROL);
    assert_true(caller_square(TINY) > 0.0f);         /* and the caller still does */
}

/* A caller that flushes itself and rounds toward zero keeps both. */
static void test_caller_mode_kept(void **state) {
    unsigned saved = _mm_getcsr();
    unsigned mine = (saved & ~RC_MASK) | FTZ_DAZ | 0x6000u;
    _mm_setcsr(mine);
    float y = -1.0f;
    mul1(TINY, TINY, &y);
    assert_true(y == 0.0f);
    unsigned after = _mm_getcsr();
    _mm_setcsr(saved);
    assert_int_equal(after & CONTROL, mine & CONTROL);
}

/* AdamW's state decays into the subnormal range: with gradient 0 it is flushed to 0. */
static void test_adamw_state_flushed(void **state) {
    _mm_setcsr(_mm_getcsr() & ~FTZ_DAZ);
    float p[4] = {1, 1, 1, 1}, g[4] = {0}, m[4], v[4];
    for (int i = 0; i < 4; i++) m[i] = v[i] = subnormal() * (float)(i + 1);
    void *pp[1] = {p}, *gp[1] = {g}, *mp[1] = {m}, *vp[1] = {v};
    int64_t numel[1] = {4};
    ca_tensor_list t = {.count = 1, .param = pp, .grad = (const void **)gp, .state1 = mp, .state2 = vp,
                        .numel = numel, .grad_dtype = CA_F32};
    ca_adamw_args a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0,
                       .bias_correction1 = 0.5f, .bias_correction2 = 0.5f, .grad_scale = 1};
    OK(KC_LIST(adamw, &t, &a));
    for (int i = 0; i < 4; i++) {
        assert_true(m[i] == 0.0f && v[i] == 0.0f);
        assert_true(p[i] == 1.0f);
    }
    /* flushing off: the state stays subnormal, as plain IEEE arithmetic gives */
    ca_cpu_set_flush_denormal(false);
    assert_false(ca_cpu_flush_denormal());
    for (int i = 0; i < 4; i++) m[i] = v[i] = subnormal() * (float)(i + 1);
    OK(KC_LIST(adamw, &t, &a));
    ca_cpu_set_flush_denormal(true);
    for (int i = 0; i < 4; i++) {
        assert_true(m[i] > 0.0f && m[i] < 1.2e-38f);
        assert_true(m[i] == 0.9f * (subnormal() * (float)(i + 1)));
        assert_true(v[i] > 0.0f && v[i] < 1.2e-38f);
    }
    assert_true(ca_cpu_flush_denormal());
}

static void test_flush_off(void **state) {
    ca_cpu_set_flush_denormal(false);
    float y = 0.0f, e, x = -100.0f;
    mul1(TINY, TINY, &y);
    OK(KC(unary, .op = CA_UNARY_EXP, .dt = CA_F32, .n = 1, .x = &x, .y = &e, .alpha = 0));
    ca_cpu_set_flush_denormal(true);
    assert_true(y == caller_square(TINY) && y > 0.0f);
    assert_true(e > 3.7e-44f && e < 3.9e-44f);
}

/* Copies, casts, fills and gathers pass subnormals through bit for bit. */
static void test_movers_keep_subnormals(void **state) {
    float x[3] = {subnormal(), -subnormal(), 1.0f}, y[3] = {0};
    OK(KC(cast, .src_dt = CA_F32, .x = x, .dst_dt = CA_F32, .y = y, .n = 3, .alpha = 1.0f));
    assert_memory_equal(x, y, sizeof x);
    int64_t shape[1] = {3}, st[1] = {1};
    memset(y, 0, sizeof y);
    OK(KC(copy_strided, .dt = CA_F32, .ndim = 1, .shape = shape, .x = x, .x_stride = st, .y = y,
          .y_stride = st));
    assert_memory_equal(x, y, sizeof x);
    OK(KC(fill, .dt = CA_F32, .n = 3, .value = 1e-40, .y = y));
    assert_true(y[0] == (float)1e-40 && y[0] > 0.0f);
    int32_t idx[2] = {1, 0};
    float g[2];
    OK(KC(gather, .dt = CA_F32, .outer = 1, .len = 3, .inner = 1, .n = 2, .x = x, .idx_dt = CA_I32,
          .idx = idx, .y = g));
    assert_memory_equal(g, ((float[]){x[1], x[0]}), sizeof g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_turns_off),
        cmocka_unit_test(test_flushed_inside_restored_outside),
        cmocka_unit_test(test_caller_mode_kept),
        cmocka_unit_test(test_adamw_state_flushed),
        cmocka_unit_test(test_flush_off),
        cmocka_unit_test(test_movers_keep_subnormals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

#else
int main(void) { return 77; /* no MXCSR on this CPU: nothing to flush */ }
#endif
