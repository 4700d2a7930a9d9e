/* Host simulations of the CUDA kernels' rounding, run on every machine: they show that the parity
 * bounds of test_ops's cuda column tell the kernels' old numerics from the new ones, without a GPU.
 * (a) embedding backward in f16/bf16: the old half atomics (a rounding per add, in the order the
 *     threads happen to run) against the CPU's f32 sum in index order, rounded once, at the parity
 *     row's shape; the new kernel's algorithm (stable sort of the indices, one run per row, f32 in
 *     index order) replayed step by step.
 * (b) log_softmax [29,10] in f32: a shift m + log s one ulp away, or summed in another order, passes
 *     the bound of the shift's ulps (t_shift_ulps) and failed the relative one it replaced. */
#include "test_util.h"
#include "test_ulp.h"

#include "base/half_impl.h"

/* ------------------------------------------------------------------ (a) embedding backward */

enum { EROWS = 50, EDIM = 37, EN = 301 };   /* test_ops: "embedding [50,37] i32 indices" */

static float h2f(ca_dtype dt, uint16_t h) { return dt == CA_F16 ? ca_f16_to_f32(h) : ca_bf16_to_f32(h); }
static uint16_t f2h(ca_dtype dt, float f) { return dt == CA_F16 ? ca_f32_to_f16(f) : ca_f32_to_bf16(f); }

/* test_ops's gen_labels with IDX50: uniform rows, every fifth position row 0 (many repeats). */
static void emb_indices(int64_t *idx, uint64_t *seed) {
    for (int i = 0; i < EN; i++) idx[i] = i % 5 == 3 ? 0 : (int64_t)(t_rand_u64(seed) % EROWS);
}

/* The CPU: per row, f32 from the table's value, the gradients added in index order, rounded once. */
static void emb_cpu(ca_dtype dt, const int64_t *idx, const uint16_t *dy, uint16_t *dtab) {
    for (int v = 0; v < EROWS; v++)
        for (int c = 0; c < EDIM; c++) {
            float acc = h2f(dt, dtab[v * EDIM + c]);
            for (int i = 0; i < EN; i++)
                if (idx[i] == v) acc += h2f(dt, dy[i * EDIM + c]);
            dtab[v * EDIM + c] = f2h(dt, acc);
        }
}

/* The old kernel: one atomicAdd on the half element per (position, column), in a shuffled order;
 * the hardware adds in f32 and rounds the sum to the half type at every add. */
static void emb_old_atomics(ca_dtype dt, const int64_t *idx, const uint16_t *dy, uint16_t *dtab, uint64_t *seed) {
    static int order[EN * EDIM];
    for (int t = 0; t < EN * EDIM; t++) order[t] = t;
    for (int t = EN * EDIM - 1; t > 0; t--) {
        int j = (int)(t_rand_u64(seed) % (uint64_t)(t + 1)), x = order[t];
        order[t] = order[j];
        order[j] = x;
    }
    for (int k = 0; k < EN * EDIM; k++) {
        int t = order[k], i = t / EDIM, c = t % EDIM;
        uint16_t *p = &dtab[idx[i] * EDIM + c];
        *p = f2h(dt, h2f(dt, *p) + h2f(dt, dy[t]));
    }
}

/* The new kernel, step by step: emb_keys_k (keys, positions; an index outside the table gets the
 * key `rows`), a stable sort by key (CUB's radix sort is stable), emb_bwd_runs_k (a run per key,
 * f32 from the table's value, positions in sorted = index order, one rounding). */
static void emb_new_sorted(ca_dtype dt, const int64_t *idx, const uint16_t *dy, uint16_t *dtab) {
    uint64_t keys[EN];
    int64_t pos[EN];
    for (int i = 0; i < EN; i++) {
        keys[i] = idx[i] < 0 || idx[i] >= EROWS ? EROWS : (uint64_t)idx[i];
        pos[i] = i;
    }
    for (int i = 1; i < EN; i++)   /* insertion sort: stable */
        for (int j = i; j > 0 && keys[j - 1] > keys[j]; j--) {
            uint64_t k = keys[j];
            keys[j] = keys[j - 1];
            keys[j - 1] = k;
            int64_t p = pos[j];
            pos[j] = pos[j - 1];
            pos[j - 1] = p;
        }
    for (int s = 0; s < EN; s++) {
        uint64_t v = keys[s];
        if (v >= EROWS || (s > 0 && keys[s - 1] == v)) continue;
        int e = s + 1;
        while (e < EN && keys[e] == v) e++;
        for (int c = 0; c < EDIM; c++) {
            float acc = h2f(dt, dtab[v * EDIM + c]);
            for (int j = s; j < e; j++) acc += h2f(dt, dy[pos[j] * EDIM + c]);
            dtab[v * EDIM + c] = f2h(dt, acc);
        }
    }
}

/* The largest |got - ref| in units of test_ops's T_EMB_B limit (2 ulps of the half type at |ref|);
 * *over: how many elements exceed it. */
static double worst_in_limits(ca_dtype dt, const uint16_t *ref, const uint16_t *got, int *over) {
    double worst = 0;
    *over = 0;
    for (int t = 0; t < EROWS * EDIM; t++) {
        double a = h2f(dt, ref[t]), d = fabs(a - h2f(dt, got[t])), lim = 2 * t_ulp_of(dt, a);
        if (d / lim > worst) worst = d / lim;
        *over += d > lim;
    }
    return worst;
}

static void emb_case(ca_dtype dt) {
    uint64_t seed = 7;
    int64_t idx[EN];
    static uint16_t dy[EN * EDIM], ref[EROWS * EDIM], old_[EROWS * EDIM], new_[EROWS * EDIM];
    emb_indices(idx, &seed);
    for (int t = 0; t < EN * EDIM; t++) dy[t] = f2h(dt, t_randf(&seed, -1, 1));
    memset(ref, 0, sizeof ref);   /* the gradient buffer starts at zero (0x0000 in both types) */
    memset(old_, 0, sizeof old_);
    memset(new_, 0, sizeof new_);
    emb_cpu(dt, idx, dy, ref);
    emb_new_sorted(dt, idx, dy, new_);
    double worst_old = 0;
    int over_old = 0, over_new = 0;
    for (int trial = 0; trial < 4; trial++) {   /* four thread schedules */
        memset(old_, 0, sizeof old_);
        emb_old_atomics(dt, idx, dy, old_, &seed);
        int over;
        double w = worst_in_limits(dt, ref, old_, &over);
        if (w > worst_old) worst_old = w;
        if (over > over_old) over_old = over;
    }
    double worst_new = worst_in_limits(dt, ref, new_, &over_new);
    printf("embedding backward %s [%d,%d], %d indices: half atomics put up to %d of %d elements outside the "
           "2-ulp limit (up to %.1f x it); the sorted f32 runs %s the CPU's bits (%d outside)\n", ca_dtype_name(dt),
           EROWS, EDIM, EN, over_old, EROWS * EDIM, worst_old,
           memcmp(ref, new_, sizeof ref) == 0 ? "equal" : "differ from", over_new);
    assert_true(over_old > 0);                          /* the old kernel fails test_ops's check */
    assert_memory_equal(ref, new_, sizeof ref);         /* the new one is the CPU's sum, bit for bit */
    assert_true(worst_new <= 1.0);
}

static void test_embedding_backward_f16(void **state) { emb_case(CA_F16); }
static void test_embedding_backward_bf16(void **state) { emb_case(CA_BF16); }

/* Positions outside the table are skipped by the sorted runs (their key is past every row), and
 * the others still add in index order (the CPU's emb_cpu matches no row for them). */
static void test_embedding_backward_bad_index(void **state) {
    uint64_t seed = 11;
    int64_t idx[EN];
    static uint16_t dy[EN * EDIM], ref[EROWS * EDIM], got[EROWS * EDIM];
    emb_indices(idx, &seed);
    idx[17] = EROWS + 3;
    idx[200] = -1;
    for (int t = 0; t < EN * EDIM; t++) dy[t] = f2h(CA_F16, t_randf(&seed, -1, 1));
    for (int t = 0; t < EROWS * EDIM; t++) ref[t] = got[t] = f2h(CA_F16, t_randf(&seed, -1, 1));
    emb_cpu(CA_F16, idx, dy, ref);
    emb_new_sorted(CA_F16, idx, dy, got);
    assert_memory_equal(ref, got, sizeof ref);
}

/* ------------------------------------------------------------------ (b) log_softmax [29,10] */

enum { LR = 29, LC = 10 };

/* The limit test_ops applied before: atol 1e-7 + rtol 1e-5 |cpu|. */
static double old_limit(const float *ref, int64_t i) { return 1e-7 + 1e-5 * fabs((double)ref[i]); }

/* y = x - shift per row; shift = m + logf(s) with s summed forwards (the CPU) or as the GPU's
 * block reduction does (pairwise over the 32 lanes), or forced one ulp up. */
static void log_softmax_rows(const float *x, float *y, int how) {
    for (int r = 0; r < LR; r++) {
        const float *row = x + r * LC;
        float m = row[0];
        for (int c = 1; c < LC; c++) m = row[c] > m ? row[c] : m;
        float s;
        if (how == 1) {   /* the warp's xor shuffles: lane c holds exp(x_c - m), lanes >= LC hold 0 */
            float lane[32] = {0};
            for (int c = 0; c < LC; c++) lane[c] = expf(row[c] - m);
            for (int o = 16; o > 0; o >>= 1) {
                float nl[32];
                for (int l = 0; l < 32; l++) nl[l] = lane[l] + lane[l ^ o];
                memcpy(lane, nl, sizeof lane);
            }
            s = lane[0];
        } else {
            s = 0;
            for (int c = 0; c < LC; c++) s += expf(row[c] - m);
        }
        float shift = m + logf(s);
        if (how == 2) shift = nextafterf(shift, INFINITY);
        for (int c = 0; c < LC; c++) y[r * LC + c] = row[c] - shift;
    }
}

static void test_log_softmax_shift_bound(void **state) {
    uint64_t seed = 3;
    float x[LR * LC], ref[LR * LC], got[LR * LC];
    for (int i = 0; i < LR * LC; i++) x[i] = t_randf(&seed, -8, 8);
    log_softmax_rows(x, ref, 0);
    int old_fail[3] = {0}, new_fail[3] = {0};
    for (int how = 1; how <= 2; how++) {
        log_softmax_rows(x, got, how);
        for (int i = 0; i < LR * LC; i++) {
            double d = fabs((double)got[i] - (double)ref[i]);
            old_fail[how] += !(d <= old_limit(ref, i));
            new_fail[how] += !(d <= t_shift_ulps(x, ref, i, LC));
        }
    }
    printf("log_softmax [29,10] f32: the relative limit fails %d (pairwise sum) and %d (shift one ulp up) of %d "
           "values, the shift's ulps %d and %d\n", old_fail[1], old_fail[2], LR * LC, new_fail[1], new_fail[2]);
    assert_true(old_fail[2] > 0);   /* a one-ulp different shift failed the old check */
    assert_int_equal(new_fail[1], 0);
    assert_int_equal(new_fail[2], 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_backward_f16),
        cmocka_unit_test(test_embedding_backward_bf16),
        cmocka_unit_test(test_embedding_backward_bad_index),
        cmocka_unit_test(test_log_softmax_shift_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
