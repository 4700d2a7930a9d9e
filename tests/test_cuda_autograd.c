/* Gradient checks through the public ops API on the cuda device: finite differences, and the same forward and backward on the CPU. */
#include "test_cuda_util.h"
#include "gradcheck_util.h"

static ca_device *G;

#ifdef TC_XLA
#define TC_TOL(t) 0.0f   /* the xla device runs the cpu kernels: bit-identical */
#else
#define TC_TOL(t) (t)
#endif

/* Copies of the inputs on device dev (labels and indices too). */
static void inputs_on(ca_tensor **in, int nin, ca_device *dev, ca_tensor **out) {
    for (int i = 0; i < nin; i++) {
        ca_tensor *t = NULL;
        T_OK(ca_tensor_to_device(in[i], dev, &t));
        ca_tensor_set_requires_grad(t, ca_tensor_requires_grad(in[i]));
        out[i] = t;
    }
}

/* d/dx_j of sum(w * f(x)) on the GPU: backward against central differences,
 * and outputs and gradients against the CPU's. `in` are CPU tensors. */
static void gradcheck(const char *name, op_fn f, void *ctx, int nin, ca_tensor **in_cpu, const gc_opts *o) {
    ca_tensor *in[4], *cin[4];
    inputs_on(in_cpu, nin, G, in);
    inputs_on(in_cpu, nin, ca_cpu_device(), cin);
    uint64_t seed = 0x9e3779b97f4a7c15ULL;
    if (o->reset_rng) ca_rng_set_state(7, 0);
    ca_tensor *out = f(in, ctx);
    if (!out) fail_msg("%s: forward on the GPU failed: %s", name, ca_last_error());
    if (o->reset_rng) ca_rng_set_state(7, 0);
    ca_tensor *cout = f(cin, ctx);
    if (!cout) fail_msg("%s: forward on the CPU failed: %s", name, ca_last_error());
    assert_true(ca_tensor_device(out) == G);
    int64_t n_out = ca_tensor_numel(out);
    float *w = malloc((size_t)n_out * sizeof *w);
    for (int64_t i = 0; i < n_out; i++) w[i] = t_randf(&seed, -1.0f, 1.0f);
    float *go = t_host(ca_cast(ca_detach(out), CA_F32)), *co = t_host(ca_cast(ca_detach(cout), CA_F32));
    for (int64_t i = 0; i < n_out; i++)
        if (fabsf(go[i] - co[i]) > TC_TOL(1e-4f + 1e-4f * fabsf(co[i])))
            fail_msg("%s: output %lld: gpu %.7g, cpu %.7g", name, (long long)i, go[i], co[i]);
    free(go);
    free(co);
    ca_tensor *wt = ca_cast(ca_from_host(G, CA_F32, ca_tensor_ndim(out), ca_tensor_shape(out), w), ca_tensor_dtype(out));
    ca_tensor *cwt = ca_cast(ca_from_host(ca_cpu_device(), CA_F32, ca_tensor_ndim(out), ca_tensor_shape(out), w),
                             ca_tensor_dtype(out));
    T_OK(ca_autograd_backward_with(out, wt));
    T_OK(ca_autograd_backward_with(cout, cwt));

    for (int i = 0; i < nin; i++) {
        if (!ca_tensor_requires_grad(in[i])) continue;
        ca_tensor *g = ca_tensor_grad(in[i]), *cg = ca_tensor_grad(cin[i]);
        if (!g) fail_msg("%s: input %d got no gradient on the GPU", name, i);
        assert_true(ca_tensor_device(g) == G);
        float *ga = t_host(g), *gc = t_host(cg);
        int64_t n = ca_tensor_numel(in[i]);
        for (int64_t j = 0; j < n; j++)
            if (fabsf(ga[j] - gc[j]) > TC_TOL(1e-4f + 1e-3f * fabsf(gc[j])))
                fail_msg("%s: d/d input%d[%lld]: gpu %.7g, cpu %.7g", name, i, (long long)j, ga[j], gc[j]);
        float *x = t_host(in[i]);
        int64_t stride = n > 48 ? n / 48 : 1;
        for (int64_t j = 0; j < n; j += stride) {
            float orig = x[j];
            x[j] = orig + (float)o->eps;
            T_OK(ca_tensor_copy_from_host(in[i], x, ca_tensor_nbytes(in[i])));
            double lp = eval_loss(f, ctx, in, w, o);
            x[j] = orig - (float)o->eps;
            T_OK(ca_tensor_copy_from_host(in[i], x, ca_tensor_nbytes(in[i])));
            double lm = eval_loss(f, ctx, in, w, o);
            x[j] = orig;
            T_OK(ca_tensor_copy_from_host(in[i], x, ca_tensor_nbytes(in[i])));
            double num = (lp - lm) / (2 * o->eps);
            double err = fabs(num - ga[j]);
            if (err > o->atol + o->rtol * fabs(num))
                fail_msg("%s: d/d input%d[%lld]: backward %.6g, finite difference %.6g (|diff| %.3g)", name, i,
                         (long long)j, ga[j], num, err);
        }
        free(x);
        free(ga);
        free(gc);
    }
    free(w);
    for (int i = 0; i < nin; i++) {
        ca_tensor_free(in[i]);
        ca_tensor_free(cin[i]);
    }
}

static ca_tensor *leaf(uint64_t *s, int ndim, const int64_t *shape, float lo, float hi, float gap) {
    ca_tensor *t = t_randn(s, ndim, shape, lo, hi, gap);
    ca_tensor_set_requires_grad(t, true);
    return t;
}

/* ------------------------------------------------------------------ ops */

static void test_matmul_linear(void **state) {
    uint64_t s = 1;
    CA_SCOPE {
        ca_tensor *in[3];
        in[0] = leaf(&s, CA_SHAPE(5, 7), -1, 1, 0);
        in[1] = leaf(&s, CA_SHAPE(7, 3), -1, 1, 0);
        gradcheck("matmul", f_matmul, NULL, 2, in, &SMOOTH);
        in[0] = leaf(&s, CA_SHAPE(7, 5), -1, 1, 0);
        gradcheck("matmul(A^T, B)", f_matmul_t, NULL, 2, in, &SMOOTH);
        in[0] = leaf(&s, CA_SHAPE(5, 7), -1, 1, 0);
        in[1] = leaf(&s, CA_SHAPE(3, 7), -1, 1, 0);
        gradcheck("matmul(A, B^T)", f_matmul_bt, NULL, 2, in, &SMOOTH);
        in[0] = leaf(&s, CA_SHAPE(2, 4, 3), -1, 1, 0);
        in[1] = leaf(&s, CA_SHAPE(2, 3, 5), -1, 1, 0);
        gradcheck("matmul batched", f_matmul, NULL, 2, in, &SMOOTH);
        in[0] = leaf(&s, CA_SHAPE(6, 5), -1, 1, 0);
        in[1] = leaf(&s, CA_SHAPE(4, 5), -1, 1, 0);
        in[2] = leaf(&s, CA_SHAPE(4), -1, 1, 0);
        gradcheck("linear", f_linear, NULL, 3, in, &SMOOTH);
    }
}

static void test_binary_broadcast(void **state) {
    static const op_fn ops[] = {f_add, f_sub, f_mul, f_div};
    static const char *names[] = {"add", "sub", "mul", "div"};
    static const int64_t sa[][3] = {{3, 4, 0}, {3, 4, 0}, {2, 3, 4}};
    static const int64_t sb[][3] = {{4, 0, 0}, {3, 1, 0}, {3, 1, 0}};
    static const int na[] = {2, 2, 3}, nb[] = {1, 2, 2};
    uint64_t s = 3;
    for (int o = 0; o < 4; o++)
        for (int k = 0; k < 3; k++) CA_SCOPE {
            ca_tensor *in[2] = {leaf(&s, na[k], sa[k], -2, 2, 0.3f), leaf(&s, nb[k], sb[k], 0.5f, 2, 0)};
            gradcheck(names[o], ops[o], NULL, 2, in, &SMOOTH);
        }
}

static void test_unary(void **state) {
    static const struct { const char *name; unary_fn f; float lo, hi, gap; } ops[] = {
        {"neg", ca_neg, -2, 2, 0}, {"relu", ca_relu, -2, 2, 0.05f}, {"gelu", ca_gelu, -3, 3, 0},
        {"tanh", ca_tanh, -2, 2, 0}, {"sigmoid", ca_sigmoid, -3, 3, 0}, {"exp", ca_exp, -2, 2, 0},
        {"log", ca_log, 0.3f, 3, 0}, {"sqrt", ca_sqrt, 0.3f, 3, 0}, {"square", ca_square, -2, 2, 0},
        {"gelu_erf", ca_gelu_erf, -3, 3, 0}, {"silu", ca_silu, -3, 3, 0},
    };
    uint64_t s = 4;
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) CA_SCOPE {
        ca_tensor *in[1] = {leaf(&s, CA_SHAPE(13), ops[o].lo, ops[o].hi, ops[o].gap)};
        gradcheck(ops[o].name, f_unary, (void *)ops[o].f, 1, in, &SMOOTH);
    }
    CA_SCOPE {
        ca_tensor *in[1] = {leaf(&s, CA_SHAPE(4, 5), 0.3f, 2, 0)};
        gradcheck("pow_scalar", f_pow, NULL, 1, in, &SMOOTH);
        gradcheck("add/mul scalar", f_scalar, NULL, 1, in, &SMOOTH);
    }
}

static void test_reductions(void **state) {
    uint64_t s = 5;
    CA_SCOPE {
        ca_tensor *in[1] = {leaf(&s, CA_SHAPE(3, 4, 5), -1, 1, 0)};
        gradcheck("sum", f_sum, NULL, 1, in, &SMOOTH);
        gradcheck("mean", f_mean, NULL, 1, in, &SMOOTH);
        for (int d = 0; d < 3; d++) {
            gradcheck("sum_dim", f_sum_dim, &d, 1, in, &SMOOTH);
            gradcheck("mean_dim keepdim", f_mean_dim, &d, 1, in, &SMOOTH);
            /* ca_max_dim is values only (include/caccel/ops.h): no gradient to check */
        }
    }
}

static void test_nn(void **state) {
    uint64_t s = 6;
    CA_SCOPE {
        ca_tensor *in[3] = {leaf(&s, CA_SHAPE(4, 7), -3, 3, 0), NULL, NULL};
        gradcheck("softmax", f_softmax, NULL, 1, in, &SMOOTH);
        gradcheck("log_softmax", f_log_softmax, NULL, 1, in, &SMOOTH);
        int64_t lab64[6] = {0, 4, 2, -100, 3, 1};
        int32_t lab32[6] = {1, 1, 0, 4, 2, 3};
        in[0] = leaf(&s, CA_SHAPE(6, 5), -2, 2, 0);
        in[1] = ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(6), lab64);
        gradcheck("cross_entropy ignore_index", f_ce, NULL, 2, in, &SMOOTH);
        ca_cross_entropy_opts sum = {.reduction = CA_REDUCTION_SUM};
        gradcheck("cross_entropy sum", f_ce, &sum, 2, in, &SMOOTH);
        ca_cross_entropy_opts ign = {.has_ignore_index = true, .ignore_index = 4};
        in[1] = ca_from_host(ca_cpu_device(), CA_I32, CA_SHAPE(6), lab32);
        gradcheck("cross_entropy i32 ignore 4", f_ce, &ign, 2, in, &SMOOTH);
        in[0] = leaf(&s, CA_SHAPE(3, 4), -2, 2, 0);
        in[1] = leaf(&s, CA_SHAPE(3, 4), -2, 2, 0);
        gradcheck("mse_loss", f_mse, NULL, 2, in, &SMOOTH);
        gc_opts drop = SMOOTH;
        drop.reset_rng = true;       /* the same numbers on both devices: the same mask */
        gradcheck("dropout", f_dropout, NULL, 1, in, &drop);
        in[0] = leaf(&s, CA_SHAPE(5, 8), -2, 2, 0);
        in[1] = leaf(&s, CA_SHAPE(8), 0.5f, 1.5f, 0);
        in[2] = leaf(&s, CA_SHAPE(8), -1, 1, 0);
        gradcheck("layer_norm", f_layer_norm, NULL, 3, in, &SMOOTH);
        int64_t idx[7] = {3, 0, 3, 9, 1, 3, 0};
        ca_tensor *emb[2] = {leaf(&s, CA_SHAPE(10, 4), -1, 1, 0), ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(7), idx)};
        gradcheck("embedding", f_embedding, NULL, 2, emb, &SMOOTH);
    }
}

static void test_shape_ops(void **state) {
    uint64_t s = 9;
    CA_SCOPE {
        ca_tensor *in[2] = {leaf(&s, CA_SHAPE(2, 3, 4), -1, 1, 0), leaf(&s, CA_SHAPE(4, 3, 2), -1, 1, 0)};
        gradcheck("transpose", f_transpose, NULL, 2, in, &SMOOTH);
        in[1] = leaf(&s, CA_SHAPE(2, 3, 3), -1, 1, 0);
        gradcheck("narrow", f_narrow, NULL, 2, in, &SMOOTH);
        gradcheck("contiguous", f_contig, NULL, 1, in, &SMOOTH);
        ca_dtype f16 = CA_F16, bf16 = CA_BF16;
        gc_opts loose = {.eps = 0.05, .atol = 2e-2, .rtol = 5e-2};
        gradcheck("cast f16", f_cast, &f16, 1, in, &loose);
        gc_opts looser = {.eps = 0.1, .atol = 6e-2, .rtol = 1e-1};
        gradcheck("cast bf16", f_cast, &bf16, 1, in, &looser);
    }
}

/* The transformer ops: the same checks as tests/test_autograd.c, and the CPU's numbers. */
static void test_transformer_ops(void **state) {
    uint64_t s = 10;
    CA_SCOPE {
        ca_tensor *in[4];
        in[0] = leaf(&s, CA_SHAPE(2, 1, 4, 5), -1, 1, 0);
        in[1] = leaf(&s, CA_SHAPE(3, 5, 2), -1, 1, 0);
        gradcheck("matmul broadcast", f_matmul, NULL, 2, in, &SMOOTH);
        uint8_t keep[2 * 5] = {1, 1, 1, 0, 0, 1, 1, 1, 1, 1};
        sdpa_ctx cases[] = {{NULL, false, 0, 0}, {NULL, true, 0, 0}, {NULL, true, 0, 0}, {NULL, false, 0.3, 0}};
        for (int c = 0; c < 4; c++) {
            in[0] = leaf(&s, CA_SHAPE(2, 2, 5, 3), -1, 1, 0);
            in[1] = leaf(&s, CA_SHAPE(2, 2, 5, 3), -1, 1, 0);
            in[2] = leaf(&s, CA_SHAPE(2, 2, 5, 4), -1, 1, 0);
            in[3] = ca_from_host(ca_cpu_device(), CA_U8, CA_SHAPE(2, 1, 1, 5), keep);
            gc_opts o = SMOOTH;
            o.reset_rng = cases[c].p > 0;
            if (c == 0) gradcheck("sdpa", f_sdpa, &cases[c], 3, in, &o);
            else gradcheck("sdpa with key padding", f_sdpa_m, &cases[c], 4, in, &o);
        }
        for (int i = 0; i < 3; i++) in[i] = leaf(&s, CA_SHAPE(2, 1 + i, 3), -1, 1, 0);
        int three = 3, d0 = 0;
        gradcheck("concat", f_concat, &three, 3, in, &SMOOTH);
        for (int i = 0; i < 3; i++) in[i] = leaf(&s, CA_SHAPE(2, 3), -1, 1, 0);
        gradcheck("stack", f_stack, &d0, 3, in, &SMOOTH);
        in[0] = leaf(&s, CA_SHAPE(6, 4), -1, 1, 0);
        gradcheck("split", f_split, NULL, 1, in, &SMOOTH);
        int64_t idx[5] = {3, 0, 3, 2, 3};
        in[0] = leaf(&s, CA_SHAPE(2, 4, 3), -1, 1, 0);
        in[1] = ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(5), idx);
        gradcheck("index_select", f_index_select, NULL, 2, in, &SMOOTH);
        int32_t gidx[2 * 2 * 3] = {3, 0, 3, 1, 1, 2, 0, 0, 0, 2, 3, 3};
        in[1] = ca_from_host(ca_cpu_device(), CA_I32, CA_SHAPE(2, 2, 3), gidx);
        gradcheck("gather", f_gather, NULL, 2, in, &SMOOTH);
        uint8_t c3[3] = {1, 0, 1};
        in[0] = leaf(&s, CA_SHAPE(3, 4), -1, 1, 0);
        in[1] = leaf(&s, CA_SHAPE(4), -1, 1, 0);
        in[2] = ca_from_host(ca_cpu_device(), CA_U8, CA_SHAPE(3, 1), c3);
        gradcheck("where", f_where, NULL, 3, in, &SMOOTH);
        in[0] = leaf(&s, CA_SHAPE(3, 2, 6), -2, 2, 0);
        in[1] = leaf(&s, CA_SHAPE(6), 0.5f, 1.5f, 0);
        gradcheck("rms_norm", f_rms_norm, NULL, 2, in, &SMOOTH);
    }
}

int main(void) {
    ca_log_set_level(CA_LOG_WARNING);
    G = tc_open_or_skip("test_cuda_autograd");
    tc_dev = G;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_linear), cmocka_unit_test(test_binary_broadcast),
        cmocka_unit_test(test_unary),         cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_nn),            cmocka_unit_test(test_shape_ops),
        cmocka_unit_test(test_transformer_ops),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
