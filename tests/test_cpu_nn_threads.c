/* The CPU nn kernels (cpu_nn.c) on 1, 2 and 3 threads: every output is bit-identical, the sums over rows
 * (the norms' parameter gradients, the cross-entropy loss) included, since they add fixed blocks of rows in
 * block order; and the embedding backward adds each table element's gradients in index order, f16/bf16 in
 * f32 with one rounding at the end. CACCEL_CPU_GRAIN=1 (set below) makes every kernel split its rows even
 * on these small shapes. */
#include "test_cpu_util.h"

#include "backends/cpu/cpu_parallel.h"

/* The outputs of one run, appended byte for byte. */
typedef struct blob {
    unsigned char *p;
    size_t n;
} blob;

static void put(blob *b, const void *p, size_t n) {
    b->p = realloc(b->p, b->n + n + 1);
    assert_non_null(b->p);
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

/* One family of kernels on one shape and dtype; fresh inputs from a fixed seed, outputs into out. */
typedef void (*run_fn)(ca_dtype dt, int64_t rows, int64_t cols, blob *out);

/* Shapes whose sums over rows span several blocks (block_len in cpu_nn.c: at least 8192 elements). */
static const int64_t SHAPES[][2] = {{300, 64}, {1000, 37}, {33, 768}, {5, 4099}, {3, 5}};
static const ca_dtype FLOATS[] = {CA_F32, CA_F16, CA_BF16};

static void same_at_threads(const char *what, run_fn fn) {
    for (int s = 0; s < NELEM(SHAPES); s++)
        for (int d = 0; d < NELEM(FLOATS); d++) {
            int64_t rows = SHAPES[s][0], cols = SHAPES[s][1];
            blob ref = {0};
            cpu_set_threads(1);
            fn(FLOATS[d], rows, cols, &ref);
            for (int t = 2; t <= 3; t++) {
                blob got = {0};
                cpu_set_threads(t);
                fn(FLOATS[d], rows, cols, &got);
                assert_int_equal(got.n, ref.n);
                for (size_t i = 0; i < ref.n; i++)
                    if (got.p[i] != ref.p[i])
                        fail_msg("%s (%s, [%lld, %lld]): byte %zu of %zu differs between 1 and %d threads", what,
                                 ca_dtype_name(FLOATS[d]), (long long)rows, (long long)cols, i, ref.n, t);
                free(got.p);
            }
            free(ref.p);
        }
    cpu_set_threads(1);
}

static size_t bytes(ca_dtype dt, int64_t n) { return (size_t)n * ca_dtype_size(dt); }

static void run_layer_norm(ca_dtype dt, int64_t rows, int64_t cols, blob *out) {
    rng_state = 0x9e3779b97f4a7c15ull;
    int64_t n = rows * cols;
    void *x = mk_rand(dt, n, -3, 5), *g = mk_rand(dt, cols, 0.5, 1.5), *bb = mk_rand(dt, cols, -1, 1);
    void *y = mk(dt, n), *dy = mk_rand(dt, n, -1, 1), *dx = mk_rand(dt, n, -1, 1);
    void *dg = mk_rand(dt, cols, -1, 1), *db = mk_rand(dt, cols, -1, 1);
    float *mean = malloc((size_t)rows * 4), *rstd = malloc((size_t)rows * 4);
    OK(KC(layer_norm, .dt = dt, .rows = rows, .cols = cols, .x = x, .gamma = g, .beta_ = bb, .eps = 1e-5f, .y = y,
          .mean = mean, .rstd = rstd));
    put(out, y, bytes(dt, n));
    put(out, mean, (size_t)rows * 4);
    put(out, rstd, (size_t)rows * 4);
    for (int acc = 0; acc < 2; acc++) {   /* parameter gradients overwritten, then accumulated */
        OK(KC(layer_norm_backward, .dt = dt, .rows = rows, .cols = cols, .x = x, .gamma = g, .mean = mean,
              .rstd = rstd, .dy = dy, .dx = dx, .beta = acc ? 0.5f : 0.0f, .dgamma = dg, .dbeta_ = db,
              .accumulate_params = acc == 1));
        put(out, dx, bytes(dt, n));
        put(out, dg, bytes(dt, cols));
        put(out, db, bytes(dt, cols));
    }
    /* without gamma, and dbeta alone */
    OK(KC(layer_norm_backward, .dt = dt, .rows = rows, .cols = cols, .x = x, .mean = mean, .rstd = rstd, .dy = dy,
          .dx = dx, .dbeta_ = db));
    put(out, dx, bytes(dt, n));
    put(out, db, bytes(dt, cols));
    free(x), free(g), free(bb), free(y), free(dy), free(dx), free(dg), free(db), free(mean), free(rstd);
}

static void run_rms_norm(ca_dtype dt, int64_t rows, int64_t cols, blob *out) {
    rng_state = 0x243f6a8885a308d3ull;
    int64_t n = rows * cols;
    void *x = mk_rand(dt, n, -3, 3), *g = mk_rand(dt, cols, 0.5, 1.5), *y = mk(dt, n);
    void *dy = mk_rand(dt, n, -1, 1), *dx = mk_rand(dt, n, -1, 1), *dg = mk_rand(dt, cols, -1, 1);
    float *rstd = malloc((size_t)rows * 4);
    OK(KC(rms_norm, .dt = dt, .rows = rows, .cols = cols, .x = x, .gamma = g, .eps = 1e-6f, .y = y, .rstd = rstd));
    put(out, y, bytes(dt, n));
    put(out, rstd, (size_t)rows * 4);
    for (int acc = 0; acc < 2; acc++) {
        OK(KC(rms_norm_backward, .dt = dt, .rows = rows, .cols = cols, .x = x, .gamma = g, .rstd = rstd, .dy = dy,
              .dx = dx, .beta = acc ? 0.5f : 0.0f, .dgamma = dg, .accumulate_params = acc == 1));
        put(out, dx, bytes(dt, n));
        put(out, dg, bytes(dt, cols));
    }
    free(x), free(g), free(y), free(dy), free(dx), free(dg), free(rstd);
}

static void run_softmax(ca_dtype dt, int64_t rows, int64_t cols, blob *out) {
    rng_state = 0x13198a2e03707344ull;
    int64_t n = rows * cols;
    void *x = mk_rand(dt, n, -8, 8), *y = mk(dt, n), *dy = mk_rand(dt, n, -1, 1), *dx = mk_rand(dt, n, -1, 1);
    for (int log = 0; log < 2; log++) {
        OK(KC(softmax, .log = log, .dt = dt, .rows = rows, .cols = cols, .x = x, .y = y));
        put(out, y, bytes(dt, n));
        OK(KC(softmax_backward, .log = log, .dt = dt, .rows = rows, .cols = cols, .y = y, .dy = dy, .dx = dx,
              .beta = 0.5f));
        put(out, dx, bytes(dt, n));
    }
    free(x), free(y), free(dy), free(dx);
}

static void run_cross_entropy(ca_dtype dt, int64_t rows, int64_t cols, blob *out) {
    rng_state = 0xa4093822299f31d0ull;
    int64_t n = rows * cols;
    void *x = mk_rand(dt, n, -6, 6), *dx = mk_rand(dt, n, -1, 1);
    int64_t *labels = malloc((size_t)rows * 8);
    for (int64_t r = 0; r < rows; r++) labels[r] = r % 7 == 3 ? -100 : (int64_t)urand(0, (double)cols);
    float *lse = malloc((size_t)rows * 4), loss, count, dloss = 1.5f;
    OK(KC(cross_entropy, .dt = dt, .rows = rows, .cols = cols, .logits = x, .label_dt = CA_I64, .labels = labels,
          .ignore_index = -100, .loss = &loss, .lse = lse, .count = &count));
    put(out, &loss, 4);
    put(out, &count, 4);
    put(out, lse, (size_t)rows * 4);
    OK(KC(cross_entropy_backward, .dt = dt, .rows = rows, .cols = cols, .logits = x, .lse = lse,
          .label_dt = CA_I64, .labels = labels, .ignore_index = -100, .dloss = &dloss, .count = &count, .dlogits = dx,
          .beta = 0.5f));
    put(out, dx, bytes(dt, n));
    free(x), free(dx), free(labels), free(lse);
}

/* A table of `cols` columns with rows / 8 + 1 rows (many repeats, a frequent row 0), looked up `rows` times. */
static void run_embedding(ca_dtype dt, int64_t rows, int64_t cols, blob *out) {
    rng_state = 0x082efa98ec4e6c89ull;
    int64_t V = rows / 8 + 1, n = rows;
    int32_t *idx = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) idx[i] = i % 3 == 0 ? 0 : (int32_t)urand(0, (double)V);
    void *table = mk_rand(dt, V * cols, -1, 1), *y = mk(dt, n * cols);
    void *dy = mk_rand(dt, n * cols, -1, 1), *dtab = mk_rand(dt, V * cols, -1, 1);
    OK(KC(embedding, .dt = dt, .n = n, .rows = V, .dim = cols, .table = table, .idx_dt = CA_I32, .idx = idx, .y = y));
    put(out, y, bytes(dt, n * cols));
    OK(KC(embedding_backward, .dt = dt, .n = n, .rows = V, .dim = cols, .idx_dt = CA_I32, .idx = idx, .dy = dy,
          .dtable = dtab));
    put(out, dtab, bytes(dt, V * cols));
    free(idx), free(table), free(y), free(dy), free(dtab);
}

/* rope over [2, 1, rows / 2, cols] (per-batch tables), rot the even part of cols (37: partial); forward,
 * then the inverse accumulated in place (beta 0.5, y = x). swiglu (cpu_elementwise.c) over rows * cols,
 * forward and both gradients, one accumulated. */
static void run_rope_swiglu(ca_dtype dt, int64_t rows, int64_t cols, blob *out) {
    rng_state = 0x9e3779b97f4a7c15ull;
    int64_t n = rows * cols, seq = rows / 2 > 0 ? rows / 2 : 1, rot = cols & ~(int64_t)1, m = 2 * seq * cols;
    float *cs = mk_rand(CA_F32, 2 * seq * rot / 2, -1, 1), *sn = mk_rand(CA_F32, 2 * seq * rot / 2, -1, 1);
    void *x = mk_rand(dt, m, -2, 2), *y = mk(dt, m);
    OK(KC(rope, .dt = dt, .batch = 2, .heads = 1, .seq = seq, .dim = cols, .rot = rot, .table_batch = 2, .x = x,
          .cos = cs, .sin = sn, .y = y));
    put(out, y, bytes(dt, m));
    OK(KC(rope, .dt = dt, .batch = 2, .heads = 1, .seq = seq, .dim = cols, .rot = rot, .table_batch = 2, .x = y,
          .cos = cs, .sin = sn, .inverse = true, .y = y, .beta = 0.5f));
    put(out, y, bytes(dt, m));
    void *g = mk_rand(dt, n, -6, 6), *u = mk_rand(dt, n, -2, 2), *sy = mk(dt, n), *dy = mk_rand(dt, n, -1, 1);
    void *dg = mk_rand(dt, n, -1, 1), *du = mk(dt, n);
    OK(KC(swiglu, .dt = dt, .n = n, .gate = g, .up = u, .y = sy));
    OK(KC(swiglu_backward, .dt = dt, .n = n, .gate = g, .up = u, .dy = dy, .dgate = dg, .dup = du, .beta_gate = 1.0f));
    put(out, sy, bytes(dt, n));
    put(out, dg, bytes(dt, n));
    put(out, du, bytes(dt, n));
    free(cs), free(sn), free(x), free(y), free(g), free(u), free(sy), free(dy), free(dg), free(du);
}

static void test_layer_norm_threads(void **state) { same_at_threads("layer_norm", run_layer_norm); }
static void test_rms_norm_threads(void **state) { same_at_threads("rms_norm", run_rms_norm); }
static void test_softmax_threads(void **state) { same_at_threads("softmax", run_softmax); }
static void test_cross_entropy_threads(void **state) { same_at_threads("cross_entropy", run_cross_entropy); }
static void test_embedding_threads(void **state) { same_at_threads("embedding", run_embedding); }
static void test_rope_swiglu_threads(void **state) { same_at_threads("rope, swiglu", run_rope_swiglu); }

/* The embedding backward against its definition: each table element plus its gradients in index order,
 * added in f32 and rounded to the table's type once. Rounding after every addition would lose the terms
 * below half an ulp of a large running sum. */
static void test_embedding_backward_rounds_once(void **state) {
    const int64_t V = 7, dim = 1031, n = 64;   /* dim spans two conversion chunks */
    int32_t idx[64];
    for (int64_t i = 0; i < n; i++) idx[i] = i % 2 ? 0 : (int32_t)(1 + (i * 3) % (V - 1));   /* odd i: row 0 */
    for (int d = 0; d < NELEM(FLOATS); d++)
        for (int t = 1; t <= 3; t++) {
            ca_dtype dt = FLOATS[d];
            cpu_set_threads(t);
            rng_state = 0x452821e638d01377ull;
            void *dy = mk_rand(dt, n * dim, -1, 1), *tab = mk_rand(dt, V * dim, 8, 16);
            /* half types: column 0 of row 0 starts at 1 and gets 32 terms of a quarter ulp; one rounding
             * at the end gives 1 + 8 ulps, a rounding after each addition stays at 1 */
            double ulp = ldexp(1.0, -mbits_of(dt));
            if (dt != CA_F32) {
                set(dt, tab, 0, 1.0);
                for (int64_t i = 1; i < n; i += 2) set(dt, dy, i * dim, ulp / 4);
            }
            float *want = malloc((size_t)(V * dim) * sizeof *want);
            for (int64_t e = 0; e < V * dim; e++) want[e] = (float)get(dt, tab, e);
            for (int64_t i = 0; i < n; i++)
                for (int64_t c = 0; c < dim; c++) want[idx[i] * dim + c] += (float)get(dt, dy, i * dim + c);
            OK(KC(embedding_backward, .dt = dt, .n = n, .rows = V, .dim = dim, .idx_dt = CA_I32, .idx = idx, .dy = dy,
                  .dtable = tab));
            for (int64_t e = 0; e < V * dim; e++) {
                bool same = dt == CA_F32 ? memcmp(&want[e], (float *)tab + e, 4) == 0
                                         : ((uint16_t *)tab)[e] == ref_encode(want[e], ebits_of(dt), mbits_of(dt));
                if (!same)
                    fail_msg("embedding_backward (%s, %d threads): element %lld is %.9g, want %.9g (f32 sum in "
                             "index order, rounded once)", ca_dtype_name(dt), t, (long long)e, get(dt, tab, e),
                             (double)want[e]);
            }
            if (dt != CA_F32) assert_true(get(dt, tab, 0) == 1.0 + 8 * ulp);
            free(dy), free(tab), free(want);
        }
    cpu_set_threads(1);
}

int main(void) {
    setenv("CACCEL_CPU_GRAIN", "1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_norm_threads),
        cmocka_unit_test(test_rms_norm_threads),
        cmocka_unit_test(test_softmax_threads),
        cmocka_unit_test(test_cross_entropy_threads),
        cmocka_unit_test(test_embedding_threads),
        cmocka_unit_test(test_rope_swiglu_threads),
        cmocka_unit_test(test_embedding_backward_rounds_once),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
