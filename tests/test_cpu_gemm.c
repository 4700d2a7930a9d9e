/* Tests of the CPU backend's GEMM (every transpose, padded leading dimensions, batches, f16/bf16) against a double-precision reference. */
#include "test_cpu_util.h"

#include <cblas.h>

#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"
#include "backends/cpu/cpu_plugin.h"
#define SENTINEL 1536.0 /* exact in f16 and bf16 */

typedef struct gcase {
    ca_dtype ab, c;
    bool ta, tb;
    int64_t m, n, k, pad, batch;
    float alpha, beta;
} gcase;

/* Runs one GEMM through the kernel table and checks every element of C,
 * and that the padding between rows of C is left alone. */
static void run_gemm(const gcase *g) {
    int64_t m = g->m, n = g->n, k = g->k, batch = g->batch;
    int64_t ar = g->ta ? k : m, ac = g->ta ? m : k, br = g->tb ? n : k, bc = g->tb ? k : n;
    int64_t lda = (ac > 1 ? ac : 1) + g->pad, ldb = (bc > 1 ? bc : 1) + g->pad, ldc = n + g->pad;
    int64_t sa = ar * lda + 5, sb = br * ldb + 3, sc = m * ldc + 7;
    int64_t nb = batch > 1 ? batch : 1;
    void *a = mk_rand(g->ab, sa * nb, -1, 1), *b = mk_rand(g->ab, sb * nb, -1, 1);
    void *c = mk(g->c, sc * nb);
    for (int64_t i = 0; i < sc * nb; i++) set(g->c, c, i, SENTINEL);
    for (int64_t t = 0; t < nb; t++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                set(g->c, c, t * sc + i * ldc + j, g->beta == 0 ? NAN : urand(-1, 1));
    double *ref = malloc((size_t)(nb * m * n) * sizeof *ref), *bound = malloc((size_t)(nb * m * n) * sizeof *bound);
    for (int64_t t = 0; t < nb; t++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0, ab = 0;
                for (int64_t l = 0; l < k; l++) {
                    double x = get(g->ab, a, t * sa + (g->ta ? l * lda + i : i * lda + l));
                    double y = get(g->ab, b, t * sb + (g->tb ? j * ldb + l : l * ldb + j));
                    s += x * y;
                    ab += fabs(x * y);
                }
                double cv = g->beta == 0 ? 0 : g->beta * get(g->c, c, t * sc + i * ldc + j);
                ref[(t * m + i) * n + j] = g->alpha * s + cv;
                bound[(t * m + i) * n + j] = fabs(g->alpha) * ab + fabs(cv);
            }
    ca_gemm_args args = {.trans_a = g->ta, .trans_b = g->tb, .m = m, .n = n, .k = k,
                         .alpha = g->alpha, .beta = g->beta, .a_dtype = g->ab, .b_dtype = g->ab,
                         .c_dtype = g->c, .a = a, .lda = lda, .stride_a = sa, .b = b, .ldb = ldb,
                         .stride_b = sb, .c = c, .ldc = ldc, .stride_c = sc, .batch = batch};
    OK(KC_ARGS(gemm, &args));
    double out_tol = g->c == CA_F32 ? 0 : (g->c == CA_F16 ? 1e-3 : 8e-3);
    for (int64_t t = 0; t < nb; t++)
        for (int64_t i = 0; i < m; i++) {
            for (int64_t j = 0; j < n; j++) {
                double got = get(g->c, c, t * sc + i * ldc + j), r = ref[(t * m + i) * n + j];
                double tol = 2e-5 * bound[(t * m + i) * n + j] + out_tol * fabs(r) + 1e-6;
                if (!(fabs(got - r) <= tol))
                    fail_msg("gemm %s->%s ta=%d tb=%d m=%lld n=%lld k=%lld pad=%lld batch=%lld beta=%g: "
                             "C[%lld][%lld][%lld] = %.9g, want %.9g",
                             ca_dtype_name(g->ab), ca_dtype_name(g->c), g->ta, g->tb, (long long)m,
                             (long long)n, (long long)k, (long long)g->pad, (long long)batch,
                             (double)g->beta, (long long)t, (long long)i, (long long)j, got, r);
            }
            for (int64_t j = n; j < ldc && (t * sc + i * ldc + j) < sc * nb; j++)
                if (get(g->c, c, t * sc + i * ldc + j) != SENTINEL)
                    fail_msg("gemm wrote C's padding at batch %lld row %lld col %lld", (long long)t,
                             (long long)i, (long long)j);
        }
    free(a);
    free(b);
    free(c);
    free(ref);
    free(bound);
}

static void test_gemm_f32(void **state) {
    const int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {13, 7, 257}, {64, 33, 17},
                                {3, 257, 31}, {128, 10, 128}, {129, 65, 300}};
    int count = 0;
    for (int s = 0; s < NELEM(sizes); s++)
        for (int tr = 0; tr < 4; tr++)
            for (int pad = 0; pad < 2; pad++)
                for (int bt = 0; bt < 2; bt++)
                    for (int be = 0; be < 2; be++) {
                        gcase g = {CA_F32, CA_F32, tr & 1, (tr >> 1) & 1, sizes[s][0], sizes[s][1],
                                   sizes[s][2], pad ? 3 : 0, bt ? 3 : 0, 1.5f, be ? 0.5f : 0.0f};
                        run_gemm(&g);
                        count++;
                    }
    assert_int_equal(count, 7 * 4 * 2 * 2 * 2);
}

static void test_gemm_half(void **state) {
    const ca_dtype pairs[][2] = {{CA_F16, CA_F32}, {CA_F16, CA_F16}, {CA_BF16, CA_F32}, {CA_BF16, CA_BF16}};
    const int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {13, 7, 257}, {33, 64, 17}};
    for (int p = 0; p < NELEM(pairs); p++)
        for (int s = 0; s < NELEM(sizes); s++)
            for (int tr = 0; tr < 4; tr++)
                for (int v = 0; v < 4; v++) {
                    gcase g = {pairs[p][0], pairs[p][1], tr & 1, (tr >> 1) & 1, sizes[s][0],
                               sizes[s][1], sizes[s][2], (v & 1) ? 2 : 0, (v & 2) ? 2 : 1, -0.75f,
                               (v == 1 || v == 2) ? 0.0f : 1.0f};
                    run_gemm(&g);
                }
}

static void test_gemm_edges(void **state) {
    /* k == 0: C = beta C; beta 0 gives zeros even over NaN */
    float c[6] = {NAN, NAN, NAN, 1, 2, 3}, a[4] = {1, 2, 3, 4}, b[4] = {NAN, NAN, NAN, NAN};
    ca_gemm_args g = {.m = 1, .n = 3, .k = 0, .alpha = 1, .beta = 0, .a_dtype = CA_F32,
                      .b_dtype = CA_F32, .c_dtype = CA_F32, .a = a, .lda = 1, .b = b, .ldb = 3,
                      .c = c, .ldc = 3};
    OK(KC_ARGS(gemm, &g));
    assert_true(c[0] == 0 && c[1] == 0 && c[2] == 0 && c[3] == 1);
    g.c = c + 3;
    g.beta = 2;
    OK(KC_ARGS(gemm, &g));
    assert_true(c[3] == 2 && c[4] == 4 && c[5] == 6);
    /* alpha == 0: A and B are not read (b holds NaN) */
    g.k = 1;
    g.alpha = 0;
    g.beta = 0.5f;
    OK(KC_ARGS(gemm, &g));
    assert_true(c[3] == 1 && c[4] == 2 && c[5] == 3);
    /* m == 0: nothing to do, C may be NULL */
    g.m = 0;
    g.c = NULL;
    OK(KC_ARGS(gemm, &g));
    /* a batch sharing one A (stride_a = 0) */
    float A[2] = {2, 3}, B[4] = {1, 10, 100, 1000}, C[4];
    ca_gemm_args sb = {.m = 1, .n = 1, .k = 2, .alpha = 1, .beta = 0, .a_dtype = CA_F32,
                       .b_dtype = CA_F32, .c_dtype = CA_F32, .a = A, .lda = 2, .stride_a = 0,
                       .b = B, .ldb = 1, .stride_b = 2, .c = C, .ldc = 1, .stride_c = 1, .batch = 2};
    OK(KC_ARGS(gemm, &sb));
    assert_true(C[0] == 32 && C[1] == 3200);
    uint16_t Ah[2] = {0x4000, 0x4200}; /* f16 2, 3 */
    sb.a = Ah;
    sb.a_dtype = sb.b_dtype = CA_F16;
    uint16_t Bh[4] = {0x3c00, 0x4900, 0x5640, 0x63d0}; /* 1, 10, 100, 1000 */
    sb.b = Bh;
    OK(KC_ARGS(gemm, &sb));
    assert_true(C[0] == 32 && C[1] == 3200);
    /* errors */
    ca_gemm_args e = {.m = 2, .n = 2, .k = 2, .alpha = 1, .a_dtype = CA_F32, .b_dtype = CA_F32,
                      .c_dtype = CA_F32, .a = a, .lda = 1, .b = a, .ldb = 2, .c = c, .ldc = 2};
    assert_int_equal(KC_ARGS(gemm, &e), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "lda"));
    e.lda = 2;
    e.ldc = 1;
    assert_int_equal(KC_ARGS(gemm, &e), CA_ERR_INVALID);
    e.ldc = 2;
    e.b_dtype = CA_F16;
    assert_int_equal(KC_ARGS(gemm, &e), CA_ERR_INVALID);
    e.a_dtype = CA_BF16;
    e.b_dtype = CA_BF16;
    e.c_dtype = CA_F16;
    assert_int_equal(KC_ARGS(gemm, &e), CA_ERR_INVALID);
    e.a_dtype = e.b_dtype = e.c_dtype = CA_I32;
    assert_int_equal(KC_ARGS(gemm, &e), CA_ERR_UNSUPPORTED);
    e.a_dtype = e.b_dtype = e.c_dtype = CA_F32;
    e.m = -1;
    assert_int_equal(KC_ARGS(gemm, &e), CA_ERR_INVALID);
    assert_int_equal(KC_ARGS(gemm, NULL), CA_ERR_INVALID);
}

/* The shapes of a Linear layer at batch 128 (784-256): forward x W^T, and the
 * two backward products. */
static void test_gemm_linear_shapes(void **state) {
    gcase fwd = {CA_F32, CA_F32, false, true, 128, 256, 784, 0, 0, 1.0f, 0.0f};
    gcase dx = {CA_F32, CA_F32, false, false, 128, 784, 256, 0, 0, 1.0f, 0.0f};
    gcase dw = {CA_F32, CA_F32, true, false, 256, 784, 128, 0, 0, 1.0f, 1.0f};
    run_gemm(&fwd);
    run_gemm(&dx);
    run_gemm(&dw);
}

/* auto's size rule: oneDNN from 2^19 multiply-adds at one BLAS thread, from 2^26 at more (the MLP's
 * GEMMs stay on OpenBLAS's pool, a transformer's go to oneDNN); only where auto chose oneDNN. */
static void test_gemm_path_by_threads(void **state) {
    (void)state;
    const char *env = getenv("CACCEL_CPU_GEMM");
    if ((env && strcmp(env, "auto") != 0) || !strstr(cpu_f32_gemm_path(), "through oneDNN") ||
        cpu_openblas_coretype_hint()) {   /* below the CPU's kernels: every size goes to oneDNN */
        printf("skipped: f32 GEMMs not on auto's oneDNN path here (%s)\n", cpu_f32_gemm_path());
        return;
    }
    int was = openblas_get_num_threads();
    openblas_set_num_threads(1);
    assert_true(cpu_f32_gemm_onednn(64, 128, 64));           /* 2^19 */
    assert_false(cpu_f32_gemm_onednn(64, 128, 63));
    openblas_set_num_threads(2);
    assert_false(cpu_f32_gemm_onednn(128, 256, 784));        /* the MLP's Linear at batch 128 */
    assert_true(cpu_f32_gemm_onednn(2048, 384, 1152));       /* GPT 6 x 384's c_attn at B 8, T 256 */
    assert_false(cpu_f32_gemm_onednn(1024, 256, 255));
    assert_true(cpu_f32_gemm_onednn(1024, 256, 256));        /* 2^26 */
    openblas_set_num_threads(was);
}

/* The OPENBLAS_CORETYPE hint: only for a core without AVX2 kernels on a CPU with AVX2; the AVX-512 core
 * where the CPU has AVX-512. */
static void test_coretype_hint(void **state) {
    (void)state;
    assert_string_equal(cpu_coretype_hint_for("Prescott", true, true), "SkylakeX");
    assert_string_equal(cpu_coretype_hint_for("prescott", true, false), "Haswell");
    assert_string_equal(cpu_coretype_hint_for("Nehalem", true, false), "Haswell");
    assert_string_equal(cpu_coretype_hint_for("Sandybridge", true, true), "SkylakeX");
    assert_null(cpu_coretype_hint_for("Prescott", false, false));
    assert_null(cpu_coretype_hint_for("Haswell", true, true));   /* AVX2 kernels: OpenBLAS's own choice */
    assert_null(cpu_coretype_hint_for("Zen", true, true));
    assert_null(cpu_coretype_hint_for("Cooperlake", true, true));
    assert_null(cpu_coretype_hint_for("SkylakeX", true, true));
    assert_null(cpu_coretype_hint_for(NULL, true, true));
}

/* A GEMM of the MLP's sizes is split over the kernels' threads in blocks of C's rows or columns
 * (cpu_gemm_split.c): with more than one thread it is, with one it is not (outside deterministic mode),
 * and the result is the reference's at 1, 2 and 3 threads for every transpose, padded leading dimension,
 * beta, a dimension that is not a multiple of the blocks' alignment, and a split over rows (m > n). */
static void test_gemm_split(void **state) {
    (void)state;
    const int64_t sizes[][3] = {{16, 256, 784}, {16, 784, 256}, {256, 784, 16}, {37, 1000, 20}, {300, 40, 64}};
    int was = cpu_threads();
    float *a = calloc(784 * 1000, sizeof *a), *b = calloc(784 * 1000, sizeof *b), *c = calloc(1000 * 784, sizeof *c);
    ca_status st = CA_OK;
    cpu_set_threads(1);
    assert_false(cpu_gemm_split(false, true, 16, 256, 784, 1, a, 784, b, 784, 0, c, 256, &st));
    cpu_set_threads(2);
    /* where every f32 GEMM goes to oneDNN (CACCEL_CPU_GEMM=onednn, or OpenBLAS on kernels below the CPU's),
     * oneDNN's own threads take it whole */
    bool whole = cpu_f32_gemm_onednn_at(16, 256, 784, 2);
    assert_int_equal(cpu_gemm_split(false, true, 16, 256, 784, 1, a, 784, b, 784, 0, c, 256, &st), !whole);
    assert_int_equal(st, CA_OK);
    assert_false(cpu_gemm_split(false, true, 16, 10, 128, 1, a, 128, b, 128, 0, c, 10, &st));   /* too small */
    for (int t = 1; t <= 3; t++) {
        cpu_set_threads(t);
        for (int s = 0; s < NELEM(sizes); s++)
            for (int v = 0; v < 16; v++) {
                gcase g = {CA_F32, CA_F32, v & 1, (v >> 1) & 1, sizes[s][0], sizes[s][1], sizes[s][2],
                           (v & 4) ? 3 : 0, 0, 1.25f, (v & 8) ? 0.5f : 0.0f};
                run_gemm(&g);
            }
    }
    cpu_set_threads(was);
    free(a);
    free(b);
    free(c);
}

/* A large GEMM (oneDNN's threaded size) is split too where each thread's block keeps CPU_GEMM_SPLIT_BIG_MNK
 * (2^27) multiply-adds: 1024 x 1024 x 256 at 2 threads is, as the same GEMM at 1 thread gives; 1024 x 512 x
 * 256 (2^26 a thread) is not, and neither is the first at 4 threads. */
static void test_gemm_split_large(void **state) {
    (void)state;
    const int64_t m = 1024, n = 1024, k = 256;
    int was = cpu_threads();
    float *a = malloc((size_t)(m * k) * sizeof *a), *b = malloc((size_t)(n * k) * sizeof *b);
    float *ref = malloc((size_t)(m * n) * sizeof *ref), *got = malloc((size_t)(m * n) * sizeof *got);
    for (int64_t i = 0; i < m * k; i++) a[i] = urand(-1, 1);
    for (int64_t i = 0; i < n * k; i++) b[i] = urand(-1, 1);
    ca_gemm_args g = {.trans_b = true, .m = m, .n = n, .k = k, .alpha = 1, .a_dtype = CA_F32, .b_dtype = CA_F32,
                      .c_dtype = CA_F32, .a = a, .lda = k, .b = b, .ldb = k, .c = ref, .ldc = n, .batch = 1};
    cpu_set_threads(1);
    OK(KC_ARGS(gemm, &g));
    ca_status st = CA_ERR_INVALID;
    cpu_set_threads(2);
    assert_true(cpu_gemm_split(false, true, m, n, k, 1, a, k, b, k, 0, got, n, &st));
    assert_int_equal(st, CA_OK);
    for (int64_t i = 0; i < m * n; i++)
        if (fabsf(got[i] - ref[i]) > 1e-4f * (1 + fabsf(ref[i])))
            fail_msg("split %lld x %lld x %lld: C[%lld] %g, whole %g", (long long)m, (long long)n, (long long)k,
                     (long long)i, got[i], ref[i]);
    assert_false(cpu_gemm_split(false, true, m, n / 2, k, 1, a, k, b, k, 0, got, n / 2, &st));
    cpu_set_threads(4);
    assert_false(cpu_gemm_split(false, true, m, n, k, 1, a, k, b, k, 0, got, n, &st));
    cpu_set_threads(was);
    free(a);
    free(b);
    free(ref);
    free(got);
}

/* Deterministic mode: the split depends on the shape alone and runs at every thread count, one included,
 * so C has the same bits at 1, 2 and 3 threads (and whatever the library chose for a block). */
static void test_gemm_split_deterministic(void **state) {
    (void)state;
    const int64_t sizes[][3] = {{16, 256, 784}, {16, 784, 256}, {256, 784, 16}, {128, 256, 784}, {300, 40, 64}};
    int was = cpu_threads();
    int64_t most = 1000 * 784;
    float *a = malloc((size_t)most * sizeof *a), *b = malloc((size_t)most * sizeof *b);
    float *ref = malloc((size_t)most * sizeof *ref), *got = malloc((size_t)most * sizeof *got);
    for (int64_t i = 0; i < most; i++) {
        a[i] = urand(-1, 1);
        b[i] = urand(-1, 1);
    }
    ca_status st = CA_OK;
    cpu_set_threads(1);
    ca_cpu_set_deterministic(true);   /* as a run sets it: after the thread count, the BLAS on one thread */
    assert_true(cpu_gemm_split(false, true, 16, 256, 784, 1, a, 784, b, 784, 0, ref, 256, &st));
    ca_cpu_set_deterministic(false);
    for (int s = 0; s < NELEM(sizes); s++)
        for (int tr = 0; tr < 4; tr++) {
            int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
            bool ta = tr & 1, tb = tr >> 1;
            ca_gemm_args g = {.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .alpha = 1, .beta = 0.5f,
                              .a_dtype = CA_F32, .b_dtype = CA_F32, .c_dtype = CA_F32, .a = a, .lda = ta ? m : k,
                              .b = b, .ldb = tb ? k : n, .ldc = n, .batch = 1};
            for (int t = 1; t <= 3; t++) {
                cpu_set_threads(t);
                ca_cpu_set_deterministic(true);
                float *c = t == 1 ? ref : got;
                for (int64_t i = 0; i < m * n; i++) c[i] = (float)(i % 7) - 3;
                g.c = c;
                OK(KC_ARGS(gemm, &g));
                ca_cpu_set_deterministic(false);
                if (t > 1 && memcmp(ref, got, (size_t)(m * n) * sizeof *got) != 0)
                    fail_msg("deterministic gemm %lld x %lld x %lld ta=%d tb=%d: %d threads differ from 1", (long long)m,
                             (long long)n, (long long)k, ta, tb, t);
            }
        }
    cpu_set_threads(was);
    free(a);
    free(b);
    free(ref);
    free(got);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_f32),
        cmocka_unit_test(test_gemm_half),
        cmocka_unit_test(test_gemm_edges),
        cmocka_unit_test(test_gemm_linear_shapes),
        cmocka_unit_test(test_gemm_path_by_threads),
        cmocka_unit_test(test_coretype_hint),
        cmocka_unit_test(test_gemm_split),
        cmocka_unit_test(test_gemm_split_deterministic),
        cmocka_unit_test(test_gemm_split_large),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
