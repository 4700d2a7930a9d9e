/* test_cpu_threads: the CPU kernels give the same bits at 1, 2 and 3 threads: reductions (a full one
 * in fixed chunks, one per row, one over a middle dim), the random draws and dropout (counter-based:
 * an element's value does not depend on which thread drew it), and the elementwise kernels whose
 * ranges are split (binary with broadcasting, casts). The sizes are above every grain, so the
 * parallel paths run without CACCEL_CPU_GRAIN. */
#include "test_cpu_util.h"
#include "backends/cpu/cpu_parallel.h"

#define N 300007               /* odd, so that the ranges and the last chunk are ragged */
#define THREADS 3

/* Runs a group of kernels once, their outputs appended to out; returns the bytes written. */
typedef size_t (*run_fn)(unsigned char *out);

static float *input(int64_t n) {
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)urand(-1.0, 1.0) * (i % 7 == 0 ? 1000.0f : 1.0f);
    return x;
}

static float *X;               /* N inputs, shared by the runs */

static size_t put(unsigned char *out, size_t at, const void *p, size_t bytes) {
    memcpy(out + at, p, bytes);
    return at + bytes;
}

static size_t run_reduce(unsigned char *out) {
    float y[4096];
    uint16_t h[1024];
    size_t at = 0;
    for (int op = CA_OP_SUM; op <= CA_OP_MAX; op++) {   /* sum, avg, min, max */
        /* the whole vector: chunk partials on the threads, folded in order */
        OK(KC(reduce, .op = op, .dt = CA_F32, .outer = 1, .len = N, .inner = 1, .x = X, .y = y, .beta = 0));
        at = put(out, at, y, sizeof(float));
        /* two long rows; many rows; a middle dim (a bias grad: columns on the threads) */
        OK(KC(reduce, .op = op, .dt = CA_F32, .outer = 2, .len = N / 2, .inner = 1, .x = X, .y = y, .beta = 0));
        at = put(out, at, y, 2 * sizeof(float));
        OK(KC(reduce, .op = op, .dt = CA_F32, .outer = 3000, .len = 100, .inner = 1, .x = X, .y = y, .beta = 0));
        at = put(out, at, y, 3000 * sizeof(float));
        OK(KC(reduce, .op = op, .dt = CA_F32, .outer = 1, .len = 400, .inner = 700, .x = X, .y = y, .beta = 0));
        at = put(out, at, y, 700 * sizeof(float));
        /* bf16 in, converted chunk by chunk on each thread */
        OK(KC(reduce, .op = op, .dt = CA_BF16, .outer = 1, .len = N / 2, .inner = 1, .x = X, .y = h, .beta = 0));
        at = put(out, at, h, sizeof(uint16_t));
    }
    return at;
}

static size_t run_rng(unsigned char *out) {
    float *y = malloc(N * sizeof *y);
    uint8_t *mask = malloc(N);
    assert_non_null(y);
    assert_non_null(mask);
    size_t at = 0;
    OK(KC(rng, .kind = CA_RNG_UNIFORM, .dt = CA_F32, .n = N, .seed = 42, .offset = 7, .a = -1, .b = 2, .y = y));
    at = put(out, at, y, N * sizeof *y);
    OK(KC(rng, .kind = CA_RNG_NORMAL, .dt = CA_F32, .n = N, .seed = 42, .offset = 9, .a = 0, .b = 1, .y = y));
    at = put(out, at, y, N * sizeof *y);
    OK(KC(rng, .kind = CA_RNG_NORMAL, .dt = CA_BF16, .n = N, .seed = 3, .offset = 0, .a = 0, .b = 1, .y = y));
    at = put(out, at, y, N * sizeof(uint16_t));
    OK(KC(dropout, .dt = CA_F32, .n = N, .p = 0.3f, .seed = 5, .offset = 11, .x = X, .y = y, .mask = mask));
    at = put(out, at, y, N * sizeof *y);
    at = put(out, at, mask, N);
    free(y);
    free(mask);
    return at;
}

static size_t run_elementwise(unsigned char *out) {
    float *y = malloc(N * sizeof *y);
    uint16_t *h = malloc(N * sizeof *h);
    assert_non_null(y);
    assert_non_null(h);
    size_t at = 0;
    /* [N/700, 700] * [700] broadcast: rows split mid-row at the range ends */
    ca_bcast_args sh = {.ndim = 2, .shape = {N / 700, 700}, .a_stride = {700, 1}, .b_stride = {0, 1}};
    OK(KC(binary, .op = CA_BINARY_MUL, .dt = CA_F32, .shape = sh, .a = X, .b = X + 5, .y = y));
    at = put(out, at, y, (size_t)(N / 700 * 700) * sizeof *y);
    OK(KC(cast, .src_dt = CA_F32, .x = X, .dst_dt = CA_BF16, .y = h, .n = N, .alpha = 0.5f));
    at = put(out, at, h, N * sizeof *h);
    OK(KC(unary, .op = CA_UNARY_GELU_TANH, .dt = CA_BF16, .n = N, .x = h, .y = h, .alpha = 0));
    at = put(out, at, h, N * sizeof *h);
    free(y);
    free(h);
    return at;
}

/* The bytes of run() at 2 and 3 threads equal those at 1. */
static void same_at_every_count(run_fn run) {
    size_t cap = 16u * N + (1u << 20);
    unsigned char *ref = malloc(cap), *got = malloc(cap);
    assert_non_null(ref);
    assert_non_null(got);
    cpu_set_threads(1);
    size_t n = run(ref);
    assert_true(n <= cap);
    for (int t = 2; t <= THREADS; t++) {
        cpu_set_threads(t);
        memset(got, 0xa5, n);
        assert_int_equal(run(got), n);
        for (size_t i = 0; i < n; i++)
            if (got[i] != ref[i]) fail_msg("%d threads: byte %zu differs from 1 thread's", t, i);
    }
    cpu_set_threads(1);
    free(ref);
    free(got);
}

static void test_reduce(void **state) { same_at_every_count(run_reduce); }
static void test_rng(void **state) { same_at_every_count(run_rng); }
static void test_elementwise(void **state) { same_at_every_count(run_elementwise); }

int main(void) {
    X = input(N);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduce),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_elementwise),
    };
    int r = cmocka_run_group_tests(tests, setup, teardown);
    free(X);
    return r;
}
