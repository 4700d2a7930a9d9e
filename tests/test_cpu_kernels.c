/* Tests of the CPU backend's elementwise, reduction, nn and optimizer kernels against naive double-precision references. */
#include "test_cpu_util.h"

static const ca_dtype FLOATS[] = {CA_F32, CA_F16, CA_BF16};
static const int64_t SIZES[] = {1, 7, 13, 16, 257, 1031, 4099};

/* ------------------------------------------------------------ unary */

static bool positive_domain(ca_unary_op op) {
    return op == CA_UNARY_LOG || op == CA_UNARY_SQRT || op == CA_UNARY_RSQRT ||
           op == CA_UNARY_RECIP || op == CA_UNARY_POW;
}

static double ref_unary(ca_unary_op op, double x, double a) {
    const double k = sqrt(2.0 / M_PI);
    switch (op) {
    case CA_UNARY_NEG: return -x;
    case CA_UNARY_RELU: return x < 0 ? 0 : x;
    case CA_UNARY_GELU_TANH: return 0.5 * x * (1 + tanh(k * (x + 0.044715 * x * x * x)));
    case CA_UNARY_TANH: return tanh(x);
    case CA_UNARY_SIGMOID: return 1 / (1 + exp(-x));
    case CA_UNARY_EXP: return exp(x);
    case CA_UNARY_LOG: return log(x);
    case CA_UNARY_SQRT: return sqrt(x);
    case CA_UNARY_RSQRT: return 1 / sqrt(x);
    case CA_UNARY_ABS: return fabs(x);
    case CA_UNARY_SQUARE: return x * x;
    case CA_UNARY_RECIP: return 1 / x;
    case CA_UNARY_SCALE: return a * x;
    case CA_UNARY_ADD_SCALAR: return x + a;
    case CA_UNARY_POW: return pow(x, a);
    case CA_UNARY_GELU_ERF: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case CA_UNARY_SILU: return x / (1 + exp(-x));
    default: return NAN;
    }
}

/* f'(x) given x and the forward output y. */
static double ref_dunary(ca_unary_op op, double x, double y, double a) {
    const double k = sqrt(2.0 / M_PI);
    switch (op) {
    case CA_UNARY_NEG: return -1;
    case CA_UNARY_RELU: return y > 0 ? 1 : 0;
    case CA_UNARY_GELU_TANH: {
        double u = k * (x + 0.044715 * x * x * x), t = tanh(u);
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
    }
    case CA_UNARY_TANH: return 1 - y * y;
    case CA_UNARY_SIGMOID: return y * (1 - y);
    case CA_UNARY_EXP: return y;
    case CA_UNARY_LOG: return 1 / x;
    case CA_UNARY_SQRT: return 0.5 / y;
    case CA_UNARY_RSQRT: return -0.5 * pow(x, -1.5);
    case CA_UNARY_ABS: return x > 0 ? 1 : (x < 0 ? -1 : 0);
    case CA_UNARY_SQUARE: return 2 * x;
    case CA_UNARY_RECIP: return -1 / (x * x);
    case CA_UNARY_SCALE: return a;
    case CA_UNARY_ADD_SCALAR: return 1;
    case CA_UNARY_POW: return a * pow(x, a - 1);
    case CA_UNARY_GELU_ERF: return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
    case CA_UNARY_SILU: return (1 + x * (1 - 1 / (1 + exp(-x)))) / (1 + exp(-x));
    default: return NAN;
    }
}

static void test_unary(void **state) {
    const float alphas[] = {1.5f, 2.0f, 0.5f, -0.75f};
    for (int op = 0; op < CA_UNARY_OP_COUNT; op++)
        for (int d = 0; d < NELEM(FLOATS); d++)
            for (int s = 0; s < NELEM(SIZES); s++)
                for (int ai = 0; ai < (op == CA_UNARY_POW ? 4 : 1); ai++) {
                    ca_dtype dt = FLOATS[d];
                    int64_t n = SIZES[s];
                    float alpha = alphas[ai];
                    bool pos = positive_domain(op);
                    void *x = mk_rand(dt, n, pos ? 0.1 : -4.0, pos ? 3.0 : 4.0);
                    void *y = mk(dt, n);
                    double *ref = malloc((size_t)n * sizeof *ref);
                    for (int64_t i = 0; i < n; i++) ref[i] = ref_unary(op, get(dt, x, i), alpha);
                    char what[64];
                    snprintf(what, sizeof what, "unary %s n=%lld", ca_unary_op_name(op), (long long)n);
                    OK(KC(unary, .op = op, .dt = dt, .n = n, .x = x, .y = y, .alpha = alpha));
                    check_close(what, dt, y, ref, n, tol_of(dt), 1e-6);
                    /* in place */
                    OK(KC(unary, .op = op, .dt = dt, .n = n, .x = x, .y = x, .alpha = alpha));
                    check_close(what, dt, x, ref, n, tol_of(dt), 1e-6);
                    free(x);
                    free(y);
                    free(ref);
                }
}

static void test_unary_special(void **state) {
    float x[6] = {NAN, INFINITY, -INFINITY, -0.0f, 100.0f, -100.0f}, y[6];
    OK(KC(unary, .op = CA_UNARY_RELU, .dt = CA_F32, .n = 6, .x = x, .y = y, .alpha = 0));
    assert_true(isnan(y[0]));
    assert_true(y[1] == INFINITY && y[2] == 0.0f && y[4] == 100.0f && y[5] == 0.0f);
    /* subnormal results need flushing off (tests/test_cpu_fpmode.c checks it on) */
    ca_cpu_set_flush_denormal(false);
    OK(KC(unary, .op = CA_UNARY_EXP, .dt = CA_F32, .n = 6, .x = x, .y = y, .alpha = 0));
    assert_true(isnan(y[0]) && y[1] == INFINITY && y[2] == 0.0f && y[3] == 1.0f);
    assert_true(y[4] == INFINITY);                     /* overflow */
    assert_true(y[5] > 3.7e-44 && y[5] < 3.9e-44);     /* exp(-100) is subnormal */
    OK(KC(unary, .op = CA_UNARY_SIGMOID, .dt = CA_F32, .n = 6, .x = x, .y = y, .alpha = 0));
    assert_true(isnan(y[0]) && y[1] == 1.0f && y[2] == 0.0f && y[3] == 0.5f && y[4] == 1.0f && y[5] == 0.0f);
    OK(KC(unary, .op = CA_UNARY_GELU_TANH, .dt = CA_F32, .n = 6, .x = x, .y = y, .alpha = 0));
    assert_true(isnan(y[0]) && y[4] == 100.0f && y[5] == -0.0f);
    /* exp across the subnormal range matches libm */
    for (float v = -103.0f; v < 89.0f; v += 0.37f) {
        float e;
        OK(KC(unary, .op = CA_UNARY_EXP, .dt = CA_F32, .n = 1, .x = &v, .y = &e, .alpha = 0));
        double r = exp((double)v);
        double tol = r < 1.2e-38 ? 2e-45 * 4 : 4e-7 * r;
        if (fabs(e - r) > tol) fail_msg("exp(%g) = %g, want %g", (double)v, (double)e, r);
    }
    ca_cpu_set_flush_denormal(true);
    /* exact GELU and its gradient keep their relative accuracy in the negative tail (Phi is taken
     * from erfc there, not from 1 + erf, which cancels to 0 below x = -5.7) */
    for (float v = -9.0f; v < 9.0f; v += 0.013f) {
        float gl, d, one = 1.0f;
        OK(KC(unary, .op = CA_UNARY_GELU_ERF, .dt = CA_F32, .n = 1, .x = &v, .y = &gl, .alpha = 0));
        OK(KC(unary_backward, .op = CA_UNARY_GELU_ERF, .dt = CA_F32, .n = 1, .x = &v, .y = NULL, .dy = &one,
              .dx = &d, .alpha = 0, .beta = 0));
        double r = ref_unary(CA_UNARY_GELU_ERF, v, 0), rd = ref_dunary(CA_UNARY_GELU_ERF, v, r, 0);
        r = 0.5 * v * erfc(-v / sqrt(2.0));  /* the reference itself, without cancellation */
        if (fabs(gl - r) > 1e-5 * fabs(r)) fail_msg("gelu(%g) = %.9g, want %.9g", (double)v, (double)gl, r);
        if (fabs(d - rd) > 1e-5 * fabs(rd) + 1e-7)
            fail_msg("gelu'(%g) = %.9g, want %.9g", (double)v, (double)d, rd);
    }
    assert_int_equal(KC(unary, .op = CA_UNARY_OP_COUNT, .dt = CA_F32, .n = 1, .x = x, .y = y, .alpha = 0), CA_ERR_INVALID);
    assert_int_equal(KC(unary, .op = CA_UNARY_NEG, .dt = CA_I32, .n = 1, .x = x, .y = y, .alpha = 0), CA_ERR_UNSUPPORTED);
    assert_non_null(strstr(ca_last_error(), "unary"));
    assert_int_equal(KC(unary, .op = CA_UNARY_NEG, .dt = CA_F32, .n = 4, .x = x, .y = x + 1, .alpha = 0), CA_ERR_INVALID);
}

static void test_unary_backward(void **state) {
    const float betas[] = {0.0f, 0.5f};
    for (int op = 0; op < CA_UNARY_OP_COUNT; op++)
        for (int d = 0; d < NELEM(FLOATS); d++)
            for (int s = 0; s < NELEM(SIZES); s++)
                for (int b = 0; b < 2; b++) {
                    ca_dtype dt = FLOATS[d];
                    int64_t n = SIZES[s];
                    float alpha = op == CA_UNARY_POW ? 1.5f : 0.75f, beta = betas[b];
                    bool pos = positive_domain(op);
                    void *x = mk_rand(dt, n, pos ? 0.1 : -4.0, pos ? 3.0 : 4.0);
                    void *y = mk(dt, n);
                    for (int64_t i = 0; i < n; i++) set(dt, y, i, ref_unary(op, get(dt, x, i), alpha));
                    void *dy = mk_rand(dt, n, -1, 1);
                    void *dx = beta == 0 ? mk(dt, n) : mk_rand(dt, n, -1, 1);
                    if (beta == 0) fill_nan(dt, dx, n);
                    double *ref = malloc((size_t)n * sizeof *ref);
                    for (int64_t i = 0; i < n; i++)
                        ref[i] = (beta ? beta * get(dt, dx, i) : 0) +
                                 get(dt, dy, i) * ref_dunary(op, get(dt, x, i), get(dt, y, i), alpha);
                    char what[64];
                    snprintf(what, sizeof what, "unary_backward %s n=%lld beta=%g",
                             ca_unary_op_name(op), (long long)n, (double)beta);
                    OK(KC(unary_backward, .op = op, .dt = dt, .n = n, .x = x, .y = y, .dy = dy, .dx = dx,
                          .alpha = alpha, .beta = beta));
                    check_close(what, dt, dx, ref, n, tol_of(dt) * 2, 1e-5);
                    free(x);
                    free(y);
                    free(dy);
                    free(dx);
                    free(ref);
                }
    /* relu reads only y, gelu only x: the other may be NULL */
    float x[3] = {-1, 0.5f, 2}, y[3] = {0, 0.5f, 2}, dy[3] = {1, 1, 1}, dx[3];
    OK(KC(unary_backward, .op = CA_UNARY_RELU, .dt = CA_F32, .n = 3, .x = NULL, .y = y, .dy = dy, .dx = dx,
          .alpha = 0, .beta = 0));
    assert_true(dx[0] == 0 && dx[1] == 1 && dx[2] == 1);
    OK(KC(unary_backward, .op = CA_UNARY_GELU_TANH, .dt = CA_F32, .n = 3, .x = x, .y = NULL, .dy = dy,
          .dx = dx, .alpha = 0, .beta = 0));
    assert_int_equal(KC(unary_backward, .op = CA_UNARY_LOG, .dt = CA_F32, .n = 3, .x = NULL, .y = y, .dy = dy,
                        .dx = dx, .alpha = 0, .beta = 0),
                     CA_ERR_INVALID);
}

/* ------------------------------------------------------------ binary */

static double ref_binary(ca_binary_op op, double a, double b) {
    switch (op) {
    case CA_BINARY_ADD: return a + b;
    case CA_BINARY_SUB: return a - b;
    case CA_BINARY_MUL: return a * b;
    case CA_BINARY_DIV: return a / b;
    case CA_BINARY_MAX: return (isnan(a) || isnan(b)) ? NAN : (a > b ? a : b);
    case CA_BINARY_MIN: return (isnan(a) || isnan(b)) ? NAN : (a < b ? a : b);
    default: return NAN;
    }
}

typedef struct bcase {
    int ndim;
    int64_t shape[4];
    int64_t as[4], bs[4];
    int64_t alen, blen;     /* elements the a and b buffers need */
} bcase;

static void run_binary_case(const bcase *c, ca_dtype dt, ca_binary_op op) {
    ca_bcast_args args = {.ndim = c->ndim};
    int64_t n = 1;
    for (int d = 0; d < c->ndim; d++) {
        args.shape[d] = c->shape[d];
        args.a_stride[d] = c->as[d];
        args.b_stride[d] = c->bs[d];
        n *= c->shape[d];
    }
    void *a = mk_rand(dt, c->alen, -3, 3), *b = mk_rand(dt, c->blen, 0.5, 3), *y = mk(dt, n);
    if (op == CA_BINARY_MAX && c->alen > 2) set(dt, a, 1, NAN);
    double *ref = malloc((size_t)n * sizeof *ref);
    int64_t idx[4] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t ao = 0, bo = 0;
        for (int d = 0; d < c->ndim; d++) {
            ao += idx[d] * c->as[d];
            bo += idx[d] * c->bs[d];
        }
        ref[i] = ref_binary(op, get(dt, a, ao), get(dt, b, bo));
        for (int d = c->ndim - 1; d >= 0; d--) {
            if (++idx[d] < c->shape[d]) break;
            idx[d] = 0;
        }
    }
    char what[96];
    snprintf(what, sizeof what, "binary %s ndim=%d n=%lld", ca_binary_op_name(op), c->ndim, (long long)n);
    OK(KC(binary, .op = op, .dt = dt, .shape = args, .a = a, .b = b, .y = y));
    check_close(what, dt, y, ref, n, tol_of(dt), 1e-6);
    /* in place into a when a is dense with y's shape */
    if (c->alen == n) {
        bool dense = true;
        int64_t st = 1;
        for (int d = c->ndim - 1; d >= 0; d--) {
            if (c->shape[d] != 1 && c->as[d] != st) dense = false;
            st *= c->shape[d];
        }
        if (dense) {
            OK(KC(binary, .op = op, .dt = dt, .shape = args, .a = a, .b = b, .y = a));
            check_close(what, dt, a, ref, n, tol_of(dt), 1e-6);
        }
    }
    free(a);
    free(b);
    free(y);
    free(ref);
}

static void test_binary(void **state) {
    const bcase cases[] = {
        /* same shape, contiguous */
        {1, {1}, {1}, {1}, 1, 1},
        {2, {13, 257}, {257, 1}, {257, 1}, 13 * 257, 13 * 257},
        /* bias add: [128, 256] + [256] */
        {2, {128, 256}, {256, 1}, {0, 1}, 128 * 256, 256},
        /* column broadcast [7, 13] * [7, 1] */
        {2, {7, 13}, {13, 1}, {1, 0}, 91, 7},
        /* scalar on either side */
        {1, {1031}, {1}, {0}, 1031, 1},
        {1, {1031}, {0}, {1}, 1, 1031},
        /* a transposed view: a is [13, 7] read as [7, 13] */
        {2, {7, 13}, {1, 7}, {13, 1}, 91, 91},
        /* 3-D with a middle broadcast and a size-1 dim */
        {4, {3, 1, 5, 17}, {85, 85, 17, 1}, {17, 0, 0, 1}, 255, 51},
        /* outer broadcast of a [5,17] over 3 */
        {3, {3, 5, 17}, {0, 17, 1}, {85, 17, 1}, 85, 255},
        /* strided a (every 3rd element) */
        {1, {257}, {3}, {1}, 771, 257},
    };
    for (int c = 0; c < NELEM(cases); c++)
        for (int d = 0; d < NELEM(FLOATS); d++)
            for (int op = 0; op < CA_BINARY_OP_COUNT; op++) run_binary_case(&cases[c], FLOATS[d], op);
    ca_bcast_args bad = {.ndim = 0};
    float v = 1;
    assert_int_equal(KC(binary, .op = CA_BINARY_ADD, .dt = CA_F32, .shape = bad, .a = &v, .b = &v, .y = &v), CA_ERR_INVALID);
    bad.ndim = 1;
    bad.shape[0] = 1;
    assert_int_equal(KC(binary, .op = CA_BINARY_OP_COUNT, .dt = CA_F32, .shape = bad, .a = &v, .b = &v,
                        .y = &v), CA_ERR_INVALID);
    bad.shape[0] = 0;  /* empty: nothing to do */
    OK(KC(binary, .op = CA_BINARY_ADD, .dt = CA_F32, .shape = bad, .a = NULL, .b = NULL, .y = NULL));
}

static void test_axpby(void **state) {
    const float ab[][2] = {{1.5f, 0.0f}, {1.0f, 0.0f}, {1.0f, 1.0f}, {-0.5f, 0.25f}};
    for (int d = 0; d < NELEM(FLOATS); d++)
        for (int s = 0; s < NELEM(SIZES); s++)
            for (int k = 0; k < NELEM(ab); k++) {
                ca_dtype dt = FLOATS[d];
                int64_t n = SIZES[s];
                float alpha = ab[k][0], beta = ab[k][1];
                void *x = mk_rand(dt, n, -2, 2), *y = mk_rand(dt, n, -2, 2);
                if (beta == 0) fill_nan(dt, y, n);
                double *ref = malloc((size_t)n * sizeof *ref);
                for (int64_t i = 0; i < n; i++)
                    ref[i] = alpha * get(dt, x, i) + (beta ? beta * get(dt, y, i) : 0);
                OK(KC(axpby, .dt = dt, .n = n, .alpha = alpha, .x = x, .beta = beta, .y = y));
                check_close("axpby", dt, y, ref, n, tol_of(dt), 1e-6);
                free(x);
                free(y);
                free(ref);
            }
}

/* ------------------------------------------------------------ reductions */

static void test_reduce(void **state) {
    const int64_t shapes[][3] = {{1, 1, 1}, {3, 7, 1}, {2, 257, 13}, {1, 128, 256}, {5, 1031, 1},
                                 {1, 1, 1031}, {2, 3, 1031}, {1, 600, 3}, {3, 4099, 1}};
    const float betas[] = {0.0f, 0.5f};
    for (int sh = 0; sh < NELEM(shapes); sh++)
        for (int d = 0; d < NELEM(FLOATS); d++)
            for (int op = 0; op < 4; op++)
                for (int b = 0; b < 2; b++) {
                    ca_dtype dt = FLOATS[d];
                    int64_t outer = shapes[sh][0], len = shapes[sh][1], inner = shapes[sh][2];
                    float beta = betas[b];
                    void *x = mk_rand(dt, outer * len * inner, -2, 3);
                    void *y = mk_rand(dt, outer * inner, -1, 1);
                    if (beta == 0) fill_nan(dt, y, outer * inner);
                    double *ref = malloc((size_t)(outer * inner) * sizeof *ref);
                    double *bound = malloc((size_t)(outer * inner) * sizeof *bound);
                    for (int64_t o = 0; o < outer; o++)
                        for (int64_t i = 0; i < inner; i++) {
                            double acc = op == CA_OP_MIN ? INFINITY : (op == CA_OP_MAX ? -INFINITY : 0), ab = 0;
                            for (int64_t l = 0; l < len; l++) {
                                double v = get(dt, x, (o * len + l) * inner + i);
                                ab += fabs(v);
                                if (op == CA_OP_SUM || op == CA_OP_AVG) acc += v;
                                else if (op == CA_OP_MIN) acc = v < acc ? v : acc;
                                else acc = v > acc ? v : acc;
                            }
                            if (op == CA_OP_AVG) {
                                acc /= (double)len;
                                ab /= (double)len;
                            }
                            ref[o * inner + i] = (beta ? beta * get(dt, y, o * inner + i) : 0) + acc;
                            bound[o * inner + i] = ab;
                        }
                    OK(KC(reduce, .op = op, .dt = dt, .outer = outer, .len = len, .inner = inner, .x = x,
                          .y = y, .beta = beta));
                    for (int64_t i = 0; i < outer * inner; i++) {
                        double g = get(dt, y, i);
                        double tol = tol_of(dt) * (fabs(ref[i]) + (op <= CA_OP_AVG ? 1e-3 * bound[i] : 0)) + 1e-6;
                        if (!(fabs(g - ref[i]) <= tol))
                            fail_msg("reduce %s %s [%lld,%lld,%lld] beta %g: element %lld got %.9g want %.9g",
                                     ca_reduce_op_name(op), ca_dtype_name(dt), (long long)outer,
                                     (long long)len, (long long)inner, (double)beta, (long long)i, g, ref[i]);
                    }
                    free(x);
                    free(y);
                    free(ref);
                    free(bound);
                }
    /* NaN propagates through max/min; empty dims */
    float x[5] = {1, 2, NAN, 4, 0}, y[2];
    OK(KC(reduce, .op = CA_OP_MAX, .dt = CA_F32, .outer = 1, .len = 5, .inner = 1, .x = x, .y = y, .beta = 0));
    assert_true(isnan(y[0]));
    OK(KC(reduce, .op = CA_OP_MIN, .dt = CA_F32, .outer = 1, .len = 5, .inner = 1, .x = x, .y = y, .beta = 0));
    assert_true(isnan(y[0]));
    /* long runs (the vector lanes): NaN anywhere wins; all-negative and infinite values order right */
    float run[100];
    for (int at = 0; at < 100; at += 33) {
        for (int i = 0; i < 100; i++) run[i] = (float)(i % 7) - 50.0f;
        run[at] = NAN;
        OK(KC(reduce, .op = CA_OP_MAX, .dt = CA_F32, .outer = 1, .len = 100, .inner = 1, .x = run, .y = y,
              .beta = 0));
        assert_true(isnan(y[0]));
        OK(KC(reduce, .op = CA_OP_MIN, .dt = CA_F32, .outer = 1, .len = 100, .inner = 1, .x = run, .y = y,
              .beta = 0));
        assert_true(isnan(y[0]));
    }
    for (int i = 0; i < 100; i++) run[i] = -1000.0f - (float)((i * 37) % 100);
    OK(KC(reduce, .op = CA_OP_MAX, .dt = CA_F32, .outer = 1, .len = 100, .inner = 1, .x = run, .y = y,
          .beta = 0));
    assert_true(y[0] == -1000.0f);
    OK(KC(reduce, .op = CA_OP_MIN, .dt = CA_F32, .outer = 1, .len = 100, .inner = 1, .x = run, .y = y,
          .beta = 0));
    assert_true(y[0] == -1099.0f);
    run[64] = -INFINITY;
    run[65] = INFINITY;
    OK(KC(reduce, .op = CA_OP_MAX, .dt = CA_F32, .outer = 1, .len = 100, .inner = 1, .x = run, .y = y,
          .beta = 0));
    assert_true(y[0] == INFINITY);
    OK(KC(reduce, .op = CA_OP_MIN, .dt = CA_F32, .outer = 1, .len = 100, .inner = 1, .x = run, .y = y,
          .beta = 0));
    assert_true(y[0] == -INFINITY);
    OK(KC(reduce, .op = CA_OP_SUM, .dt = CA_F32, .outer = 2, .len = 0, .inner = 1, .x = NULL, .y = y,
          .beta = 0));
    assert_true(y[0] == 0 && y[1] == 0);
    OK(KC(reduce, .op = CA_OP_AVG, .dt = CA_F32, .outer = 1, .len = 0, .inner = 2, .x = NULL, .y = y,
          .beta = 0));
    assert_true(isnan(y[0]) && isnan(y[1]));
    assert_int_equal(KC(reduce, .op = CA_OP_MAX, .dt = CA_F32, .outer = 1, .len = 0, .inner = 1, .x = x,
                        .y = y, .beta = 0), CA_ERR_INVALID);
    assert_int_equal(KC(reduce, .op = CA_OP_SUM, .dt = CA_I32, .outer = 1, .len = 1, .inner = 1, .x = x,
                        .y = y, .beta = 0), CA_ERR_UNSUPPORTED);
    /* a long sum stays accurate */
    int64_t big = 1 << 20;
    float *ones = malloc((size_t)big * sizeof *ones);
    for (int64_t i = 0; i < big; i++) ones[i] = 0.1f;
    OK(KC(reduce, .op = CA_OP_SUM, .dt = CA_F32, .outer = 1, .len = big, .inner = 1, .x = ones, .y = y,
          .beta = 0));
    assert_true(fabs(y[0] - 0.1f * (double)big) < 1e-5 * 0.1 * (double)big);
    OK(KC(reduce, .op = CA_OP_SUM, .dt = CA_F32, .outer = 1, .len = big / 2, .inner = 2, .x = ones, .y = y,
          .beta = 0));
    assert_true(fabs(y[1] - 0.1f * (double)big / 2) < 1e-5 * 0.1 * (double)big);
    free(ones);
}

static void test_argmax(void **state) {
    const int64_t shapes[][2] = {{1, 1}, {7, 13}, {3, 1031}, {2, 4099}};
    for (int s = 0; s < NELEM(shapes); s++)
        for (int d = 0; d < NELEM(FLOATS); d++) {
            ca_dtype dt = FLOATS[d];
            int64_t rows = shapes[s][0], cols = shapes[s][1];
            void *x = mk_rand(dt, rows * cols, -5, 5);
            int64_t *idx = malloc((size_t)rows * sizeof *idx);
            OK(KC(argmax, .dt = dt, .rows = rows, .cols = cols, .x = x, .idx = idx));
            for (int64_t r = 0; r < rows; r++) {
                int64_t best = 0;
                for (int64_t c = 1; c < cols; c++)
                    if (get(dt, x, r * cols + c) > get(dt, x, r * cols + best)) best = c;
                assert_int_equal(idx[r], best);
            }
            free(x);
            free(idx);
        }
    float t[8] = {1, 3, 3, 2, /* */ 1, NAN, 5, NAN};
    int64_t idx[2];
    OK(KC(argmax, .dt = CA_F32, .rows = 2, .cols = 4, .x = t, .idx = idx));
    assert_int_equal(idx[0], 1);  /* first of the ties */
    assert_int_equal(idx[1], 1);  /* first NaN */
    assert_int_equal(KC(argmax, .dt = CA_F32, .rows = 1, .cols = 0, .x = t, .idx = idx), CA_ERR_INVALID);
}

/* ------------------------------------------------------------ softmax */

static const int64_t ROWSHAPES[][2] = {{1, 1}, {7, 13}, {13, 7}, {3, 257}, {2, 1031}, {1, 4099}};

static void test_softmax(void **state) {
    for (int s = 0; s < NELEM(ROWSHAPES); s++)
        for (int d = 0; d < NELEM(FLOATS); d++)
            for (int lg = 0; lg < 2; lg++) {
                ca_dtype dt = FLOATS[d];
                int64_t rows = ROWSHAPES[s][0], cols = ROWSHAPES[s][1], n = rows * cols;
                void *x = mk_rand(dt, n, -6, 6), *y = mk(dt, n);
                set(dt, x, 0, 60.0);  /* large logits must not overflow */
                double *ref = malloc((size_t)n * sizeof *ref);
                for (int64_t r = 0; r < rows; r++) {
                    double m = -INFINITY, sum = 0;
                    for (int64_t c = 0; c < cols; c++) m = fmax(m, get(dt, x, r * cols + c));
                    for (int64_t c = 0; c < cols; c++) sum += exp(get(dt, x, r * cols + c) - m);
                    for (int64_t c = 0; c < cols; c++) {
                        double v = get(dt, x, r * cols + c) - m;
                        ref[r * cols + c] = lg ? v - log(sum) : exp(v) / sum;
                    }
                }
                OK(KC(softmax, .log = lg, .dt = dt, .rows = rows, .cols = cols, .x = x, .y = y));
                check_close(lg ? "log_softmax" : "softmax", dt, y, ref, n, tol_of(dt), lg ? 1e-5 : 1e-7);
                /* backward with beta 0 (dx NaN) and 0.5, from the kernel's own y */
                for (int b = 0; b < 2; b++) {
                    float beta = b ? 0.5f : 0.0f;
                    void *dy = mk_rand(dt, n, -1, 1), *dx = mk_rand(dt, n, -1, 1);
                    if (!b) fill_nan(dt, dx, n);
                    for (int64_t r = 0; r < rows; r++) {
                        double acc = 0;
                        for (int64_t c = 0; c < cols; c++) {
                            int64_t i = r * cols + c;
                            acc += lg ? get(dt, dy, i) : get(dt, dy, i) * get(dt, y, i);
                        }
                        for (int64_t c = 0; c < cols; c++) {
                            int64_t i = r * cols + c;
                            double yv = get(dt, y, i), g = get(dt, dy, i);
                            double v = lg ? g - exp(yv) * acc : yv * (g - acc);
                            ref[i] = (b ? beta * get(dt, dx, i) : 0) + v;
                        }
                    }
                    OK(KC(softmax_backward, .log = lg, .dt = dt, .rows = rows, .cols = cols, .y = y, .dy = dy,
                          .dx = dx, .beta = beta));
                    check_close(lg ? "log_softmax_backward" : "softmax_backward", dt, dx, ref, n,
                                tol_of(dt) * 2, 1e-5);
                    /* in place: dx == dy */
                    if (dt == CA_F32 && !b) {
                        void *dx2 = mk(dt, n);
                        memcpy(dx2, dy, (size_t)n * 4);
                        OK(KC(softmax_backward, .log = lg, .dt = dt, .rows = rows, .cols = cols, .y = y,
                              .dy = dx2, .dx = dx2, .beta = 0));
                        check_close("softmax_backward in place", dt, dx2, ref, n, 4e-5, 1e-5);
                        free(dx2);
                    }
                    free(dy);
                    free(dx);
                }
                free(x);
                free(y);
                free(ref);
            }
    float ninf[3] = {-INFINITY, -INFINITY, 0}, out[3];
    OK(KC(softmax, .log = false, .dt = CA_F32, .rows = 1, .cols = 3, .x = ninf, .y = out));
    assert_true(out[0] == 0 && out[1] == 0 && out[2] == 1);
}

/* ------------------------------------------------------------ cross-entropy */

static void test_cross_entropy(void **state) {
    const int64_t ignore = -100;
    for (int s = 0; s < NELEM(ROWSHAPES); s++)
        for (int d = 0; d < NELEM(FLOATS); d++)
            for (int li = 0; li < 2; li++) {
                ca_dtype dt = FLOATS[d], ldt = li ? CA_I64 : CA_I32;
                int64_t rows = ROWSHAPES[s][0], cols = ROWSHAPES[s][1], n = rows * cols;
                void *x = mk_rand(dt, n, -4, 4);
                void *lab = mk(ldt, rows);
                for (int64_t r = 0; r < rows; r++)
                    set(ldt, lab, r, (r % 3 == 2) ? (double)ignore : (double)((r * 7 + 3) % cols));
                double total = 0, cnt = 0;
                double *lse = malloc((size_t)rows * sizeof *lse);
                for (int64_t r = 0; r < rows; r++) {
                    double m = -INFINITY, sum = 0;
                    for (int64_t c = 0; c < cols; c++) m = fmax(m, get(dt, x, r * cols + c));
                    for (int64_t c = 0; c < cols; c++) sum += exp(get(dt, x, r * cols + c) - m);
                    lse[r] = m + log(sum);
                    int64_t l = (int64_t)get(ldt, lab, r);
                    if (l == ignore) continue;
                    total += lse[r] - get(dt, x, r * cols + l);
                    cnt++;
                }
                float loss, count, *klse = malloc((size_t)rows * sizeof *klse);
                OK(KC(cross_entropy, .dt = dt, .rows = rows, .cols = cols, .logits = x, .label_dt = ldt,
                      .labels = lab, .ignore_index = ignore, .loss = &loss, .lse = klse, .count = &count));
                assert_true(count == (float)cnt);
                if (cnt) assert_true(fabs(loss - total / cnt) <= 1e-5 * fabs(total / cnt) + 1e-6);
                else assert_true(isnan(loss));
                check_close("cross_entropy lse", CA_F32, klse, lse, rows, 1e-6, 1e-6);
                for (int b = 0; b < 2; b++) {
                    float beta = b ? 0.5f : 0.0f, dloss = 0.7f;
                    void *dx = mk_rand(dt, n, -1, 1);
                    if (!b) fill_nan(dt, dx, n);
                    double *ref = malloc((size_t)n * sizeof *ref);
                    for (int64_t r = 0; r < rows; r++) {
                        int64_t l = (int64_t)get(ldt, lab, r);
                        for (int64_t c = 0; c < cols; c++) {
                            int64_t i = r * cols + c;
                            double g = l == ignore ? 0
                                       : dloss / cnt * (exp(get(dt, x, i) - lse[r]) - (c == l ? 1 : 0));
                            ref[i] = (b ? beta * get(dt, dx, i) : 0) + g;
                        }
                    }
                    OK(KC(cross_entropy_backward, .dt = dt, .rows = rows, .cols = cols, .logits = x,
                          .lse = klse, .label_dt = ldt, .labels = lab, .ignore_index = ignore,
                          .dloss = &dloss, .count = &count, .dlogits = dx, .beta = beta));
                    check_close("cross_entropy_backward", dt, dx, ref, n, tol_of(dt), 1e-6);
                    free(dx);
                    free(ref);
                }
                free(x);
                free(lab);
                free(lse);
                free(klse);
            }
}

static void test_cross_entropy_bad_labels(void **state) {
    float x[4 * 7] = {0}, loss = -1, lse[4], count = -1, dloss = 1, dx[4 * 7];
    int32_t l32[4] = {0, 2, 1, 9};
    int64_t l64[4] = {0, -5, 1, 2};
    assert_int_equal(KC(cross_entropy, .dt = CA_F32, .rows = 4, .cols = 7, .logits = x, .label_dt = CA_I32,
                        .labels = l32, .ignore_index = -100, .loss = &loss, .lse = lse, .count = &count),
                     CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "row 3"));
    assert_non_null(strstr(ca_last_error(), "label 9"));
    assert_true(loss == -1 && count == -1);  /* nothing written */
    assert_int_equal(KC(cross_entropy, .dt = CA_F32, .rows = 4, .cols = 7, .logits = x, .label_dt = CA_I64,
                        .labels = l64, .ignore_index = -100, .loss = &loss, .lse = lse, .count = &count),
                     CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "row 1"));
    assert_non_null(strstr(ca_last_error(), "label -5"));
    count = 3;
    assert_int_equal(KC(cross_entropy_backward, .dt = CA_F32, .rows = 4, .cols = 7, .logits = x, .lse = lse,
                        .label_dt = CA_I32, .labels = l32, .ignore_index = -100, .dloss = &dloss,
                        .count = &count, .dlogits = dx, .beta = 0), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "row 3"));
    /* -5 is fine when it is the ignore_index; every row ignored gives NaN */
    int64_t all[2] = {-5, -5};
    OK(KC(cross_entropy, .dt = CA_F32, .rows = 2, .cols = 7, .logits = x, .label_dt = CA_I64, .labels = all,
          .ignore_index = -5, .loss = &loss, .lse = lse, .count = &count));
    assert_true(isnan(loss) && count == 0);
    OK(KC(cross_entropy_backward, .dt = CA_F32, .rows = 2, .cols = 7, .logits = x, .lse = lse,
          .label_dt = CA_I64, .labels = all, .ignore_index = -5, .dloss = &dloss, .count = &count,
          .dlogits = dx, .beta = 0));
    for (int i = 0; i < 14; i++) assert_true(dx[i] == 0);
    assert_int_equal(KC(cross_entropy, .dt = CA_F32, .rows = 4, .cols = 7, .logits = x, .label_dt = CA_F32,
                        .labels = l32, .ignore_index = -100, .loss = &loss, .lse = lse, .count = &count),
                     CA_ERR_UNSUPPORTED);
}

/* ------------------------------------------------------------ layer norm */

static void test_layer_norm(void **state) {
    const int64_t shapes[][2] = {{1, 1}, {7, 13}, {3, 257}, {2, 1031}, {5, 16}};
    for (int s = 0; s < NELEM(shapes); s++)
        for (int d = 0; d < NELEM(FLOATS); d++)
            for (int aff = 0; aff < 4; aff++) {
                ca_dtype dt = FLOATS[d];
                int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
                const float eps = 1e-5f;
                void *x = mk_rand(dt, n, -3, 5);
                void *g = (aff & 1) ? mk_rand(dt, cols, 0.5, 1.5) : NULL;
                void *bb = (aff & 2) ? mk_rand(dt, cols, -1, 1) : NULL;
                void *y = mk(dt, n);
                float *mean = malloc((size_t)rows * 4), *rstd = malloc((size_t)rows * 4);
                double *ref = malloc((size_t)n * sizeof *ref), *rm = malloc((size_t)rows * 8),
                       *rr = malloc((size_t)rows * 8);
                for (int64_t r = 0; r < rows; r++) {
                    double mu = 0, var = 0;
                    for (int64_t c = 0; c < cols; c++) mu += get(dt, x, r * cols + c);
                    mu /= (double)cols;
                    for (int64_t c = 0; c < cols; c++) var += pow(get(dt, x, r * cols + c) - mu, 2);
                    var /= (double)cols;
                    rm[r] = mu;
                    rr[r] = 1 / sqrt(var + eps);
                    for (int64_t c = 0; c < cols; c++)
                        ref[r * cols + c] = (get(dt, x, r * cols + c) - mu) * rr[r] *
                                                (g ? get(dt, g, c) : 1) + (bb ? get(dt, bb, c) : 0);
                }
                OK(KC(layer_norm, .dt = dt, .rows = rows, .cols = cols, .x = x, .gamma = g, .beta_ = bb,
                      .eps = eps, .y = y, .mean = mean, .rstd = rstd));
                check_close("layer_norm y", dt, y, ref, n, tol_of(dt) * 2, 1e-4);
                check_close("layer_norm mean", CA_F32, mean, rm, rows, 1e-5, 1e-6);
                check_close("layer_norm rstd", CA_F32, rstd, rr, rows, 1e-4, 1e-6);
                /* backward: dx (beta 0 and 0.5), dgamma/dbeta overwritten then accumulated */
                for (int b = 0; b < 2; b++) {
                    float beta = b ? 0.5f : 0.0f;
                    void *dy = mk_rand(dt, n, -1, 1), *dx = mk_rand(dt, n, -1, 1);
                    if (!b) fill_nan(dt, dx, n);
                    void *dg = g ? mk_rand(dt, cols, -1, 1) : NULL;
                    void *db = bb ? mk_rand(dt, cols, -1, 1) : NULL;
                    double *rdx = malloc((size_t)n * 8), *rdg = calloc((size_t)cols, 8),
                           *rdb = calloc((size_t)cols, 8);
                    for (int64_t c = 0; c < cols && b; c++) {
                        if (dg) rdg[c] = get(dt, dg, c);
                        if (db) rdb[c] = get(dt, db, c);
                    }
                    for (int64_t r = 0; r < rows; r++) {
                        double c1 = 0, c2 = 0;
                        for (int64_t c = 0; c < cols; c++) {
                            int64_t i = r * cols + c;
                            double xh = (get(dt, x, i) - rm[r]) * rr[r];
                            double gd = get(dt, dy, i) * (g ? get(dt, g, c) : 1);
                            c1 += gd;
                            c2 += gd * xh;
                            rdg[c] += get(dt, dy, i) * xh;
                            rdb[c] += get(dt, dy, i);
                        }
                        c1 /= (double)cols;
                        c2 /= (double)cols;
                        for (int64_t c = 0; c < cols; c++) {
                            int64_t i = r * cols + c;
                            double xh = (get(dt, x, i) - rm[r]) * rr[r];
                            double gd = get(dt, dy, i) * (g ? get(dt, g, c) : 1);
                            rdx[i] = (b ? beta * get(dt, dx, i) : 0) + rr[r] * (gd - c1 - xh * c2);
                        }
                    }
                    OK(KC(layer_norm_backward, .dt = dt, .rows = rows, .cols = cols, .x = x, .gamma = g,
                          .mean = mean, .rstd = rstd, .dy = dy, .dx = dx, .beta = beta, .dgamma = dg,
                          .dbeta_ = db, .accumulate_params = b == 1));
                    /* dx has cancellation (gd - c1 - xh c2): compare against its scale */
                    check_close("layer_norm_backward dx", dt, dx, rdx, n, tol_of(dt) * 4,
                                (dt == CA_F32 ? 1e-4 : 0.05) * (cols > 1 ? 1 : 0) + 1e-5);
                    if (dg) check_close("layer_norm_backward dgamma", dt, dg, rdg, cols, tol_of(dt) * 4, 1e-3 * rows);
                    if (db) check_close("layer_norm_backward dbeta", dt, db, rdb, cols, tol_of(dt) * 4, 1e-4 * rows);
                    free(dy);
                    free(dx);
                    free(dg);
                    free(db);
                    free(rdx);
                    free(rdg);
                    free(rdb);
                }
                free(x);
                free(g);
                free(bb);
                free(y);
                free(mean);
                free(rstd);
                free(ref);
                free(rm);
                free(rr);
            }
}

/* ------------------------------------------------------------ embedding */

static void test_embedding(void **state) {
    const ca_dtype dts[] = {CA_F32, CA_F16, CA_BF16, CA_I32, CA_U8};
    const int64_t V = 11, dims[] = {1, 13, 1031};
    for (int d = 0; d < NELEM(dts); d++)
        for (int di = 0; di < NELEM(dims); di++)
            for (int li = 0; li < 2; li++) {
                ca_dtype dt = dts[d], ldt = li ? CA_I64 : CA_I32;
                int64_t dim = dims[di], n = 17;
                void *table = mk(dt, V * dim);
                for (int64_t i = 0; i < V * dim; i++) set(dt, table, i, (double)(i % 97));
                void *idx = mk(ldt, n);
                for (int64_t i = 0; i < n; i++) set(ldt, idx, i, (double)((i * 5) % V));
                void *y = mk(dt, n * dim);
                OK(KC(embedding, .dt = dt, .n = n, .rows = V, .dim = dim, .table = table, .idx_dt = ldt,
                      .idx = idx, .y = y));
                size_t es = ca_dtype_size(dt);
                for (int64_t i = 0; i < n; i++) {
                    int64_t v = (int64_t)get(ldt, idx, i);
                    assert_memory_equal((char *)y + (size_t)(i * dim) * es,
                                        (char *)table + (size_t)(v * dim) * es, (size_t)dim * es);
                }
                if (ca_dtype_is_float(dt)) {
                    /* backward: repeated indices add up */
                    void *dy = mk_rand(dt, n * dim, -1, 1);
                    void *dt_ = mk_rand(dt, V * dim, -1, 1);
                    double *ref = malloc((size_t)(V * dim) * 8);
                    for (int64_t i = 0; i < V * dim; i++) ref[i] = get(dt, dt_, i);
                    for (int64_t i = 0; i < n; i++) {
                        int64_t v = (int64_t)get(ldt, idx, i);
                        for (int64_t c = 0; c < dim; c++) ref[v * dim + c] += get(dt, dy, i * dim + c);
                    }
                    OK(KC(embedding_backward, .dt = dt, .n = n, .rows = V, .dim = dim, .idx_dt = ldt,
                          .idx = idx, .dy = dy, .dtable = dt_));
                    /* half tables: the f32 sum rounded once (tests/test_cpu_nn_threads.c: bit for bit) */
                    check_close("embedding_backward", dt, dt_, ref, V * dim, tol_of(dt) * 2,
                                dt == CA_F32 ? 1e-5 : 2 * tol_of(dt));
                    free(dy);
                    free(dt_);
                    free(ref);
                }
                free(table);
                free(idx);
                free(y);
            }
    float table[6] = {1, 2, 3, 4, 5, 6}, y[6], dtab[6] = {0}, dy[6] = {1, 1, 1, 1, 1, 1};
    int32_t bad[3] = {0, 1, -2}, past[3] = {2, 3, 0};     /* the table has 3 rows */
    assert_int_equal(KC(embedding, .dt = CA_F32, .n = 3, .rows = 3, .dim = 2, .table = table,
                        .idx_dt = CA_I32, .idx = bad, .y = y), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "-2"));
    assert_int_equal(KC(embedding, .dt = CA_F32, .n = 3, .rows = 3, .dim = 2, .table = table,
                        .idx_dt = CA_I32, .idx = past, .y = y), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "index 3 at position 1"));
    assert_int_equal(KC(embedding_backward, .dt = CA_F32, .n = 3, .rows = 3, .dim = 2, .idx_dt = CA_I32,
                        .idx = bad, .dy = dy, .dtable = dtab), CA_ERR_INVALID);
    assert_int_equal(KC(embedding_backward, .dt = CA_F32, .n = 3, .rows = 3, .dim = 2, .idx_dt = CA_I32,
                        .idx = past, .dy = dy, .dtable = dtab), CA_ERR_INVALID);
    for (int i = 0; i < 6; i++) assert_true(dtab[i] == 0);  /* nothing written */
    assert_int_equal(KC(embedding, .dt = CA_F32, .n = 3, .rows = 3, .dim = 2, .table = table,
                        .idx_dt = CA_F32, .idx = bad, .y = y), CA_ERR_UNSUPPORTED);
}

/* ------------------------------------------------------------ optimizers */

static const int64_t OPT_SIZES[] = {1, 7, 257, 1031, 3000};
#define NT NELEM(OPT_SIZES)

typedef struct opt_set {
    float *p[NT], *m[NT], *v[NT];
    void *g[NT];
    double *rp[NT], *rm[NT], *rv[NT];
    /* the same buffers as the kernel's pointer arrays */
    void *pv[NT], *mv[NT], *vv[NT];
    const void *gv[NT];
} opt_set;

static void opt_init(opt_set *o, ca_dtype gdt) {
    for (int i = 0; i < NT; i++) {
        int64_t n = OPT_SIZES[i];
        o->p[i] = mk_rand(CA_F32, n, -1, 1);
        o->m[i] = mk_rand(CA_F32, n, -0.1, 0.1);
        o->v[i] = mk_rand(CA_F32, n, 0, 0.01);
        o->g[i] = mk(gdt, n);
        o->rp[i] = malloc((size_t)n * 8);
        o->rm[i] = malloc((size_t)n * 8);
        o->rv[i] = malloc((size_t)n * 8);
        o->pv[i] = o->p[i];
        o->mv[i] = o->m[i];
        o->vv[i] = o->v[i];
        o->gv[i] = o->g[i];
        for (int64_t j = 0; j < n; j++) {
            o->rp[i][j] = o->p[i][j];
            o->rm[i][j] = o->m[i][j];
            o->rv[i][j] = o->v[i][j];
        }
    }
}

static void opt_free(opt_set *o) {
    for (int i = 0; i < NT; i++) {
        free(o->p[i]);
        free(o->m[i]);
        free(o->v[i]);
        free(o->g[i]);
        free(o->rp[i]);
        free(o->rm[i]);
        free(o->rv[i]);
    }
}

static void test_adamw(void **state) {
    const ca_dtype gdts[] = {CA_F32, CA_F16, CA_BF16};
    for (int gi = 0; gi < 3; gi++)
        for (int wdi = 0; wdi < 2; wdi++) {
            ca_dtype gdt = gdts[gi];
            opt_set o;
            opt_init(&o, gdt);
            int64_t numel[NT];
            for (int i = 0; i < NT; i++) numel[i] = OPT_SIZES[i];
            ca_tensor_list t = {.count = NT, .param = o.pv, .grad = o.gv,
                                .state1 = o.mv, .state2 = o.vv,
                                .numel = numel, .grad_dtype = gdt};
            /* the kernel gets floats: the reference uses the same rounded values */
            const double lr = (float)1e-2, b1 = (float)0.9, b2 = (float)0.999, eps = (float)1e-8,
                         wd = wdi ? (float)0.1 : 0.0, gs = 0.5;
            for (int step = 1; step <= 5; step++) {
                double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
                for (int i = 0; i < NT; i++)
                    for (int64_t j = 0; j < numel[i]; j++) set(gdt, o.g[i], j, urand(-2, 2));
                ca_adamw_args a = {.lr = (float)lr, .beta1 = (float)b1, .beta2 = (float)b2,
                                   .eps = (float)eps, .weight_decay = (float)wd,
                                   .bias_correction1 = (float)bc1, .bias_correction2 = (float)bc2,
                                   .grad_scale = (float)gs};
                OK(KC_LIST(adamw, &t, &a));
                for (int i = 0; i < NT; i++)
                    for (int64_t j = 0; j < numel[i]; j++) {
                        double g = get(gdt, o.g[i], j) * gs;
                        double p = o.rp[i][j] * (1 - lr * wd);
                        o.rm[i][j] = b1 * o.rm[i][j] + (1 - b1) * g;
                        o.rv[i][j] = b2 * o.rv[i][j] + (1 - b2) * g * g;
                        double denom = sqrt(o.rv[i][j]) / sqrt(bc2) + eps;
                        o.rp[i][j] = p - lr / bc1 * o.rm[i][j] / denom;
                    }
                for (int i = 0; i < NT; i++) {
                    check_close("adamw param", CA_F32, o.p[i], o.rp[i], numel[i], 1e-5, 1e-6);
                    check_close("adamw exp_avg", CA_F32, o.m[i], o.rm[i], numel[i], 1e-5, 1e-7);
                    check_close("adamw exp_avg_sq", CA_F32, o.v[i], o.rv[i], numel[i], 1e-5, 1e-9);
                }
            }
            opt_free(&o);
        }
    ca_tensor_list empty = {.count = 0};
    ca_adamw_args a = {.lr = 1, .bias_correction1 = 1, .bias_correction2 = 1, .grad_scale = 1};
    OK(KC_LIST(adamw, &empty, &a));
    float p = 1, g = 1, m = 0, v = 0;
    void *pp[1] = {&p}, *mm[1] = {&m}, *vv[1] = {&v};
    const void *gg[1] = {&g};
    int64_t one = 1;
    ca_tensor_list t1 = {.count = 1, .param = pp, .grad = gg, .state1 = mm, .state2 = vv, .numel = &one,
                         .grad_dtype = CA_F32};
    a.bias_correction2 = 0;
    assert_int_equal(KC_LIST(adamw, &t1, &a), CA_ERR_INVALID);
    t1.state2 = NULL;
    a.bias_correction2 = 1;
    assert_int_equal(KC_LIST(adamw, &t1, &a), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "state2"));
}

static void test_sgd(void **state) {
    /* {momentum, dampening, weight_decay, nesterov} */
    const double cfg[][4] = {{0, 0, 0, 0}, {0, 0, 0.01, 0}, {0.9, 0, 0, 0}, {0.9, 0.1, 0.01, 0},
                             {0.9, 0, 0.01, 1}};
    const ca_dtype gdts[] = {CA_F32, CA_BF16};
    for (int c = 0; c < NELEM(cfg); c++)
        for (int gi = 0; gi < 2; gi++) {
            ca_dtype gdt = gdts[gi];
            opt_set o;
            opt_init(&o, gdt);
            int64_t numel[NT];
            for (int i = 0; i < NT; i++) numel[i] = OPT_SIZES[i];
            double mom = cfg[c][0], damp = cfg[c][1], wd = cfg[c][2], lr = 0.05, gs = 2.0;
            bool nest = cfg[c][3] != 0;
            ca_tensor_list t = {.count = NT, .param = o.pv, .grad = o.gv,
                                .state1 = mom ? o.mv : NULL, .numel = numel,
                                .grad_dtype = gdt};
            for (int step = 1; step <= 4; step++) {
                for (int i = 0; i < NT; i++)
                    for (int64_t j = 0; j < numel[i]; j++) set(gdt, o.g[i], j, urand(-1, 1));
                ca_sgd_args a = {.lr = (float)lr, .momentum = (float)mom, .dampening = (float)damp,
                                 .weight_decay = (float)wd, .nesterov = nest, .first_step = step == 1,
                                 .grad_scale = (float)gs};
                OK(KC_LIST(sgd, &t, &a));
                for (int i = 0; i < NT; i++)
                    for (int64_t j = 0; j < numel[i]; j++) {
                        double g = get(gdt, o.g[i], j) * gs + wd * o.rp[i][j];
                        if (mom) {
                            o.rm[i][j] = step == 1 ? g : mom * o.rm[i][j] + (1 - damp) * g;
                            g = nest ? g + mom * o.rm[i][j] : o.rm[i][j];
                        }
                        o.rp[i][j] -= lr * g;
                    }
                for (int i = 0; i < NT; i++) {
                    check_close("sgd param", CA_F32, o.p[i], o.rp[i], numel[i], 1e-5, 1e-6);
                    if (mom) check_close("sgd momentum", CA_F32, o.m[i], o.rm[i], numel[i], 1e-5, 1e-6);
                }
            }
            opt_free(&o);
        }
    ca_sgd_args bad = {.lr = 1, .momentum = 0, .nesterov = true, .grad_scale = 1};
    ca_tensor_list empty = {.count = 0};
    assert_int_equal(KC_LIST(sgd, &empty, &bad), CA_ERR_INVALID);
}

/* ------------------------------------------------------------ list utilities */

static void test_list_utils(void **state) {
    const ca_dtype dts[] = {CA_F32, CA_F16, CA_BF16};
    for (int d = 0; d < 3; d++) {
        ca_dtype dt = dts[d];
        void *x[NT];
        int64_t numel[NT];
        double ss = 0;
        for (int i = 0; i < NT; i++) {
            numel[i] = OPT_SIZES[i];
            x[i] = mk_rand(dt, numel[i], -2, 2);
            for (int64_t j = 0; j < numel[i]; j++) ss += pow(get(dt, x[i], j), 2);
        }
        ca_tensor_list t = {.count = NT, .param = x, .numel = numel, .grad_dtype = dt};
        float out = NAN;
        OK(KC(sum_squares, .t = &t, .out = &out, .beta = 0));
        assert_true(fabs(out - ss) <= 1e-5 * ss);
        out = 2;
        OK(KC(sum_squares, .t = &t, .out = &out, .beta = 0.5f));
        assert_true(fabs(out - (ss + 1)) <= 1e-5 * ss);

        /* scale_list, then unscale_check finds nothing and leaves found_inf alone */
        double **ref = malloc(NT * sizeof *ref);
        for (int i = 0; i < NT; i++) {
            ref[i] = malloc((size_t)numel[i] * 8);
            for (int64_t j = 0; j < numel[i]; j++) ref[i][j] = get(dt, x[i], j) * 4;
        }
        OK(KC(scale_list, .t = &t, .alpha = 4.0f));
        for (int i = 0; i < NT; i++) check_close("scale_list", dt, x[i], ref[i], numel[i], tol_of(dt), 0);
        for (int i = 0; i < NT; i++)
            for (int64_t j = 0; j < numel[i]; j++) ref[i][j] = get(dt, x[i], j) * 0.125;
        float found = 0;
        OK(KC(unscale_check, .t = &t, .inv_scale = 0.125f, .found_inf = &found));
        assert_true(found == 0);
        for (int i = 0; i < NT; i++) check_close("unscale_check", dt, x[i], ref[i], numel[i], tol_of(dt), 0);
        found = 1;  /* never reset to 0 */
        OK(KC(unscale_check, .t = &t, .inv_scale = 1.0f, .found_inf = &found));
        assert_true(found == 1);
        /* Inf in the middle of tensor 2, NaN at the end of tensor 4 */
        found = 0;
        set(dt, x[2], 100, INFINITY);
        OK(KC(unscale_check, .t = &t, .inv_scale = 0.5f, .found_inf = &found));
        assert_true(found == 1);
        set(dt, x[2], 100, 1.0);
        found = 0;
        set(dt, x[4], numel[4] - 1, NAN);
        OK(KC(unscale_check, .t = &t, .inv_scale = 0.5f, .found_inf = &found));
        assert_true(found == 1);
        set(dt, x[4], numel[4] - 1, 1.0);
        found = 0;
        OK(KC(unscale_check, .t = &t, .inv_scale = 0.5f, .found_inf = &found));
        assert_true(found == 0);
        /* overflow by the scale itself (f16: finite in f32, Inf once stored) */
        set(dt, x[0], 0, dt == CA_F16 ? 1000.0 : 3e38);
        OK(KC(unscale_check, .t = &t, .inv_scale = dt == CA_F16 ? 1e5f : 10.0f, .found_inf = &found));
        assert_true(found == 1);

        /* clamp keeps NaN */
        set(dt, x[1], 3, NAN);
        OK(KC(clamp_list, .t = &t, .lo = -0.25f, .hi = 0.5f));
        for (int i = 0; i < NT; i++)
            for (int64_t j = 0; j < numel[i]; j++) {
                double v = get(dt, x[i], j);
                if (i == 1 && j == 3) assert_true(isnan(v));
                else assert_true(v >= -0.25 && v <= 0.5);
            }
        assert_int_equal(KC(clamp_list, .t = &t, .lo = 1.0f, .hi = 0.0f), CA_ERR_INVALID);
        for (int i = 0; i < NT; i++) {
            free(x[i]);
            free(ref[i]);
        }
        free(ref);
    }
    float f = 0;
    assert_int_equal(KC(unscale_check, .t = NULL, .inv_scale = 1.0f, .found_inf = &f), CA_ERR_INVALID);
    ca_tensor_list bad = {.count = 1, .param = NULL, .numel = NULL, .grad_dtype = CA_F32};
    assert_int_equal(KC(sum_squares, .t = &bad, .out = &f, .beta = 0), CA_ERR_INVALID);
    bad.grad_dtype = CA_I64;
    assert_int_equal(KC(scale_list, .t = &bad, .alpha = 1.0f), CA_ERR_UNSUPPORTED);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_unary_special),
        cmocka_unit_test(test_unary_backward),
        cmocka_unit_test(test_binary),
        cmocka_unit_test(test_axpby),
        cmocka_unit_test(test_reduce),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_cross_entropy_bad_labels),
        cmocka_unit_test(test_layer_norm),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_list_utils),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
