/* Finite-difference gradient checks for every differentiable op, and the tape's rules (accumulation, no_grad, detach, hooks). */
#include "test_util.h"
#include "gradcheck_util.h"

/* d/dx_j of sum(w * f(x)), analytically (backward) and by central differences. */
static void gradcheck(const char *name, op_fn f, void *ctx, int nin, ca_tensor **in, const gc_opts *o) {
    uint64_t seed = 0x9e3779b97f4a7c15ULL;
    if (o->reset_rng) ca_rng_set_state(7, 0);
    ca_tensor *out = f(in, ctx);
    if (!out) fail_msg("%s: forward failed: %s", name, ca_last_error());
    int64_t n_out = ca_tensor_numel(out);
    float *w = malloc((size_t)n_out * sizeof *w);
    for (int64_t i = 0; i < n_out; i++) w[i] = t_randf(&seed, -1.0f, 1.0f);
    ca_tensor *wt = ca_from_host(ca_cpu_device(), CA_F32, ca_tensor_ndim(out), ca_tensor_shape(out), w);
    wt = ca_cast(wt, ca_tensor_dtype(out));
    for (int i = 0; i < nin; i++) ca_tensor_zero_grad(in[i]);
    T_OK(ca_autograd_backward_with(out, wt));

    for (int i = 0; i < nin; i++) {
        if (!ca_tensor_requires_grad(in[i])) continue;
        ca_tensor *g = ca_tensor_grad(in[i]);
        if (!g) fail_msg("%s: input %d got no gradient", name, i);
        float *ga = t_host(g);
        int64_t n = ca_tensor_numel(in[i]);
        float *x = t_host(in[i]);
        int64_t stride = n > 48 ? n / 48 : 1;       /* sample large inputs */
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
    }
    free(w);
}

static ca_tensor *leaf(uint64_t *s, int ndim, const int64_t *shape, float lo, float hi, float gap) {
    ca_tensor *t = t_randn(s, ndim, shape, lo, hi, gap);
    ca_tensor_set_requires_grad(t, true);
    return t;
}

/* ------------------------------------------------------------------ ops */

static void test_matmul(void **state) {
    uint64_t s = 1;
    CA_SCOPE {
        ca_tensor *in[3];
        in[0] = leaf(&s, CA_SHAPE(5, 7), -1, 1, 0);
        in[1] = leaf(&s, CA_SHAPE(7, 3), -1, 1, 0);
        gradcheck("matmul", f_matmul, NULL, 2, in, &SMOOTH);
        in[0] = leaf(&s, CA_SHAPE(7, 5), -1, 1, 0);          /* A^T: a transposed view fed to GEMM */
        gradcheck("matmul(A^T, B)", f_matmul_t, NULL, 2, in, &SMOOTH);
        in[0] = leaf(&s, CA_SHAPE(5, 7), -1, 1, 0);
        in[1] = leaf(&s, CA_SHAPE(3, 7), -1, 1, 0);
        gradcheck("matmul(A, B^T)", f_matmul_bt, NULL, 2, in, &SMOOTH);
        in[0] = leaf(&s, CA_SHAPE(2, 4, 3), -1, 1, 0);       /* batched */
        in[1] = leaf(&s, CA_SHAPE(2, 3, 5), -1, 1, 0);
        gradcheck("matmul batched", f_matmul, NULL, 2, in, &SMOOTH);
    }
}

static void test_matmul_broadcast(void **state) {
    static const struct { int na, nb; int64_t a[4], b[4]; } cases[] = {
        {4, 4, {2, 3, 4, 5}, {2, 3, 5, 2}},          /* [B,H,T,D] x [B,H,D,S] */
        {4, 3, {2, 1, 4, 5}, {3, 5, 2}},             /* both broadcast */
        {3, 2, {2, 4, 5}, {5, 3}},                   /* a weight matrix on the right */
        {2, 3, {4, 5}, {2, 5, 3}},                   /* a matrix on the left */
    };
    uint64_t s = 21;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) CA_SCOPE {
        ca_tensor *in[2] = {leaf(&s, cases[c].na, cases[c].a, -1, 1, 0), leaf(&s, cases[c].nb, cases[c].b, -1, 1, 0)};
        gradcheck("matmul broadcast", f_matmul, NULL, 2, in, &SMOOTH);
    }
    CA_SCOPE {
        ca_tensor *in[1] = {leaf(&s, CA_SHAPE(3, 1), -1, 1, 0)};
        gradcheck("expand", f_expand, NULL, 1, in, &SMOOTH);
    }
}

static void test_attention(void **state) {
    uint64_t s = 22;
    CA_SCOPE {
        float addm[2 * 5];
        uint8_t keep[2 * 5] = {1, 1, 1, 0, 0, 1, 1, 1, 1, 1};   /* key padding: batch 0 has 3 keys */
        for (int i = 0; i < 10; i++) addm[i] = keep[i] ? 0.1f * (float)i : -INFINITY;
        ca_tensor *fmask = ca_from_host(ca_cpu_device(), CA_F32, CA_SHAPE(2, 1, 1, 5), addm);
        ca_tensor *bmask = ca_from_host(ca_cpu_device(), CA_U8, CA_SHAPE(2, 1, 1, 5), keep);
        sdpa_ctx cases[] = {
            {NULL, false, 0, 0}, {NULL, true, 0, 0}, {fmask, false, 0, 0.7}, {bmask, true, 0, 0},
            {bmask, false, 0.3, 0},
        };
        const char *names[] = {"sdpa", "sdpa causal", "sdpa additive mask", "sdpa key padding + causal",
                               "sdpa dropout"};
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            ca_tensor *in[3] = {leaf(&s, CA_SHAPE(2, 2, 5, 3), -1, 1, 0), leaf(&s, CA_SHAPE(2, 2, 5, 3), -1, 1, 0),
                                leaf(&s, CA_SHAPE(2, 2, 5, 4), -1, 1, 0)};
            gc_opts o = SMOOTH;
            o.reset_rng = cases[c].p > 0;
            gradcheck(names[c], f_sdpa, &cases[c], 3, in, &o);
        }
        sdpa_ctx cross = {NULL, true, 0, 0};     /* Tq != Tk, more rows than one block of the kernel */
        ca_tensor *in[3] = {leaf(&s, CA_SHAPE(1, 1, 70, 2), -1, 1, 0), leaf(&s, CA_SHAPE(1, 1, 66, 2), -1, 1, 0),
                            leaf(&s, CA_SHAPE(1, 1, 66, 3), -1, 1, 0)};
        gradcheck("sdpa causal, 70 queries, 66 keys", f_sdpa, &cross, 3, in, &SMOOTH);
        sdpa_ctx cross_drop = {NULL, true, 0.2, 0};   /* dropout words across row blocks */
        gc_opts o = SMOOTH;
        o.reset_rng = true;
        gradcheck("sdpa causal dropout, 70 queries, 66 keys", f_sdpa, &cross_drop, 3, in, &o);
    }
}

static void test_join_and_select(void **state) {
    uint64_t s = 23;
    CA_SCOPE {
        ca_tensor *in[6];
        for (int i = 0; i < 6; i++) in[i] = leaf(&s, CA_SHAPE(2, 1 + i % 3, 3), -1, 1, 0);
        int three = 3, six = 6;
        gradcheck("concat", f_concat, &three, 3, in, &SMOOTH);
        gradcheck("concat of 6 (chained nodes)", f_concat, &six, 6, in, &SMOOTH);
        for (int i = 0; i < 3; i++) in[i] = leaf(&s, CA_SHAPE(2, 3), -1, 1, 0);
        int d0 = 0, d2 = 2;
        gradcheck("stack dim 0", f_stack, &d0, 3, in, &SMOOTH);
        gradcheck("stack dim 2", f_stack, &d2, 3, in, &SMOOTH);
        in[0] = leaf(&s, CA_SHAPE(6, 4), -1, 1, 0);
        gradcheck("split", f_split, NULL, 1, in, &SMOOTH);
        int64_t idx[5] = {3, 0, 3, 2, 3};
        in[0] = leaf(&s, CA_SHAPE(2, 4, 3), -1, 1, 0);
        in[1] = ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(5), idx);
        gradcheck("index_select", f_index_select, NULL, 2, in, &SMOOTH);
        int32_t gidx[2 * 2 * 3] = {3, 0, 3, 1, 1, 2, 0, 0, 0, 2, 3, 3};   /* x [2, 4, 3] -> [2, 2, 3] */
        in[1] = ca_from_host(ca_cpu_device(), CA_I32, CA_SHAPE(2, 2, 3), gidx);
        gradcheck("gather", f_gather, NULL, 2, in, &SMOOTH);
        uint8_t c[3] = {1, 0, 1};
        in[0] = leaf(&s, CA_SHAPE(3, 4), -1, 1, 0);
        in[1] = leaf(&s, CA_SHAPE(4), -1, 1, 0);
        in[2] = ca_from_host(ca_cpu_device(), CA_U8, CA_SHAPE(3, 1), c);
        gradcheck("where", f_where, NULL, 3, in, &SMOOTH);
        in[1] = in[2];
        gradcheck("masked_fill", f_masked_fill, NULL, 2, in, &SMOOTH);
    }
}

static void test_rms_norm(void **state) {
    uint64_t s = 24;
    CA_SCOPE {
        ca_tensor *in[2] = {leaf(&s, CA_SHAPE(3, 2, 6), -2, 2, 0), leaf(&s, CA_SHAPE(6), 0.5f, 1.5f, 0)};
        gradcheck("rms_norm", f_rms_norm, NULL, 2, in, &SMOOTH);
        gradcheck("rms_norm without weight", f_rms_norm_plain, NULL, 1, in, &SMOOTH);
    }
}

/* Rows looked up at padding_idx give the table no gradient; a gradient already
 * in that row (from another use of the table) stays. */
static void test_embedding_padding(void **state) {
    uint64_t s = 25;
    CA_SCOPE {
        ca_tensor *table = leaf(&s, CA_SHAPE(5, 3), -1, 1, 0);
        int64_t idx[6] = {0, 2, 0, 4, 2, 2};
        ca_tensor *ix = ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(6), idx);
        int64_t other[1] = {2};
        ca_tensor *ox = ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(1), other);
        /* loss = sum(emb_pad(idx)) + 5 * sum(emb(2)): row 2 gets 5 from the plain lookup only */
        ca_tensor *loss = ca_add(ca_sum(ca_embedding_ex(ix, table, 2)),
                                 ca_mul_scalar(ca_sum(ca_embedding(ox, table)), 5.0));
        T_OK(ca_autograd_backward(loss));
        float *g = t_host(ca_tensor_grad(table));
        float want[5] = {2, 0, 5, 0, 1};
        for (int r = 0; r < 5; r++)
            for (int c = 0; c < 3; c++) assert_float_equal(g[r * 3 + c], want[r], 1e-6);
        free(g);
        ca_tensor_zero_grad(table);     /* the first write of a pass (beta 0) zeroes the row too */
        T_OK(ca_autograd_backward(ca_sum(ca_embedding_ex(ix, table, 0))));
        g = t_host(ca_tensor_grad(table));
        for (int c = 0; c < 3; c++) assert_float_equal(g[c], 0.0f, 0.0);
        assert_float_equal(g[2 * 3], 3.0f, 1e-6);
        free(g);
        int64_t seq[4] = {2, 0, 4, 2};      /* weight tying: both uses add into one gradient */
        ca_tensor *tied[2] = {table, ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(4), seq)};
        gradcheck("embedding tied to the output layer", f_tied, NULL, 2, tied, &SMOOTH);
        assert_null(ca_embedding_ex(ix, table, 5));
        assert_non_null(strstr(ca_last_error(), "padding_idx 5"));
    }
}

static void test_linear(void **state) {
    uint64_t s = 2;
    CA_SCOPE {
        ca_tensor *in[3];
        in[0] = leaf(&s, CA_SHAPE(6, 5), -1, 1, 0);
        in[1] = leaf(&s, CA_SHAPE(4, 5), -1, 1, 0);
        in[2] = leaf(&s, CA_SHAPE(4), -1, 1, 0);
        gradcheck("linear", f_linear, NULL, 3, in, &SMOOTH);
        gradcheck("linear without bias", f_linear_nb, NULL, 2, in, &SMOOTH);
        in[0] = leaf(&s, CA_SHAPE(2, 3, 5), -1, 1, 0);       /* leading dims flattened */
        gradcheck("linear 3-D input", f_linear, NULL, 3, in, &SMOOTH);
    }
}

static void test_binary_broadcast(void **state) {
    static const struct { const char *name; op_fn f; } ops[] = {
        {"add", f_add}, {"sub", f_sub}, {"mul", f_mul}, {"div", f_div},
    };
    /* same shape; row vector; column; scalar; leading dims */
    static const int64_t sa[][3] = {{3, 4, 0}, {3, 4, 0}, {3, 4, 0}, {3, 4, 0}, {2, 3, 4}};
    static const int64_t sb[][3] = {{3, 4, 0}, {4, 0, 0}, {3, 1, 0}, {1, 0, 0}, {3, 1, 0}};
    static const int na[] = {2, 2, 2, 2, 3}, nb[] = {2, 1, 2, 1, 2};
    uint64_t s = 3;
    for (size_t o = 0; o < 4; o++)
        for (size_t k = 0; k < 5; k++) CA_SCOPE {
            ca_tensor *in[2] = {leaf(&s, na[k], sa[k], -2, 2, 0.3f), leaf(&s, nb[k], sb[k], 0.5f, 2, 0)};
            gradcheck(ops[o].name, ops[o].f, NULL, 2, in, &SMOOTH);
            ca_tensor *sw[2] = {in[1], in[0]};                  /* broadcast on the left operand */
            if (ops[o].f == f_div) {
                ca_tensor *pos = leaf(&s, na[k], sa[k], 0.5f, 2, 0);
                sw[1] = pos;
            }
            gradcheck(ops[o].name, ops[o].f, NULL, 2, sw, &SMOOTH);
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
        gradcheck("add_scalar", f_add_scalar, NULL, 1, in, &SMOOTH);
        gradcheck("mul_scalar", f_mul_scalar, NULL, 1, in, &SMOOTH);
        gradcheck("pow_scalar", f_pow, NULL, 1, in, &SMOOTH);
    }
}

static void test_reductions(void **state) {
    uint64_t s = 5;
    CA_SCOPE {
        ca_tensor *in[1] = {leaf(&s, CA_SHAPE(3, 4, 5), -1, 1, 0)};
        gradcheck("sum", f_sum, NULL, 1, in, &SMOOTH);
        gradcheck("mean", f_mean, NULL, 1, in, &SMOOTH);
        for (int d = -1; d < 3; d++) {
            gradcheck("sum_dim", f_sum_dim, &d, 1, in, &SMOOTH);
            gradcheck("mean_dim keepdim", f_mean_dim, &d, 1, in, &SMOOTH);
        }
    }
}

static void test_softmax_family(void **state) {
    uint64_t s = 6;
    CA_SCOPE {
        ca_tensor *in[1] = {leaf(&s, CA_SHAPE(4, 7), -3, 3, 0)};
        gradcheck("softmax", f_softmax, NULL, 1, in, &SMOOTH);
        gradcheck("log_softmax", f_log_softmax, NULL, 1, in, &SMOOTH);
    }
}

static void test_cross_entropy(void **state) {
    uint64_t s = 7;
    CA_SCOPE {
        int64_t lab64[6] = {0, 4, 2, -100, 3, 1};
        int32_t lab32[6] = {1, 1, 0, 4, 2, 3};
        ca_tensor *in[2] = {leaf(&s, CA_SHAPE(6, 5), -2, 2, 0),
                            ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(6), lab64)};
        gradcheck("cross_entropy ignore_index", f_ce, NULL, 2, in, &SMOOTH);
        ca_cross_entropy_opts sum = {.reduction = CA_REDUCTION_SUM};
        gradcheck("cross_entropy sum", f_ce, &sum, 2, in, &SMOOTH);
        ca_cross_entropy_opts ign = {.has_ignore_index = true, .ignore_index = 4};
        in[1] = ca_from_host(ca_cpu_device(), CA_I32, CA_SHAPE(6), lab32);
        gradcheck("cross_entropy i32 ignore 4", f_ce, &ign, 2, in, &SMOOTH);
        int64_t lab3[6] = {0, 4, -100, 2, 3, 1};      /* [2, 3, C] logits, [2, 3] labels */
        ca_tensor *in3[2] = {leaf(&s, CA_SHAPE(2, 3, 5), -2, 2, 0),
                             ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(2, 3), lab3)};
        gradcheck("cross_entropy 3-D logits", f_ce, NULL, 2, in3, &SMOOTH);
        /* reference value: mean of -log softmax at the labels, ignoring -100 */
        in[1] = ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(6), lab64);
        float *x = t_host(in[0]);
        double ref = 0;
        int cnt = 0;
        for (int r = 0; r < 6; r++) {
            if (lab64[r] < 0) continue;
            double m = -INFINITY, z = 0;
            for (int c = 0; c < 5; c++) m = fmax(m, x[r * 5 + c]);
            for (int c = 0; c < 5; c++) z += exp(x[r * 5 + c] - m);
            ref += -(x[r * 5 + lab64[r]] - m - log(z));
            cnt++;
        }
        assert_float_equal(ca_item(ca_cross_entropy(in[0], in[1])), ref / cnt, 1e-5);
        free(x);
    }
}

static void test_losses_and_norms(void **state) {
    uint64_t s = 8;
    CA_SCOPE {
        ca_tensor *in[3] = {leaf(&s, CA_SHAPE(3, 4), -2, 2, 0), leaf(&s, CA_SHAPE(3, 4), -2, 2, 0), NULL};
        gradcheck("mse_loss", f_mse, NULL, 2, in, &SMOOTH);
        gc_opts drop = SMOOTH;
        drop.reset_rng = true;
        gradcheck("dropout", f_dropout, NULL, 1, in, &drop);
        in[0] = leaf(&s, CA_SHAPE(5, 8), -2, 2, 0);
        in[1] = leaf(&s, CA_SHAPE(8), 0.5f, 1.5f, 0);
        in[2] = leaf(&s, CA_SHAPE(8), -1, 1, 0);
        gradcheck("layer_norm", f_layer_norm, NULL, 3, in, &SMOOTH);
        gradcheck("layer_norm without affine", f_layer_norm_plain, NULL, 1, in, &SMOOTH);
        int64_t idx[7] = {3, 0, 3, 9, 1, 3, 0};   /* repeats accumulate */
        ca_tensor *emb[2] = {leaf(&s, CA_SHAPE(10, 4), -1, 1, 0),
                             ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(7), idx)};
        gradcheck("embedding", f_embedding, NULL, 2, emb, &SMOOTH);
    }
}

static void test_shape_ops(void **state) {
    uint64_t s = 9;
    CA_SCOPE {
        ca_tensor *in[2] = {leaf(&s, CA_SHAPE(2, 3, 4), -1, 1, 0), leaf(&s, CA_SHAPE(4, 6), -1, 1, 0)};
        gradcheck("reshape", f_reshape, NULL, 2, in, &SMOOTH);
        ca_tensor *sl[2] = {leaf(&s, CA_SHAPE(2, 3, 6), -1, 1, 0), leaf(&s, CA_SHAPE(2, 2, 3, 2), -1, 1, 0)};
        gradcheck("reshape of a strided slice (a view)", f_reshape_slice, NULL, 2, sl, &SMOOTH);
        in[1] = leaf(&s, CA_SHAPE(4, 3, 2), -1, 1, 0);
        gradcheck("transpose", f_transpose, NULL, 2, in, &SMOOTH);
        in[1] = leaf(&s, CA_SHAPE(2, 3, 3), -1, 1, 0);
        gradcheck("narrow", f_narrow, NULL, 2, in, &SMOOTH);
        gradcheck("contiguous", f_contig, NULL, 1, in, &SMOOTH);
        gradcheck("flatten", f_flatten, NULL, 1, in, &SMOOTH);
        ca_dtype f16 = CA_F16, bf16 = CA_BF16;
        gc_opts loose = {.eps = 0.05, .atol = 2e-2, .rtol = 5e-2};
        gradcheck("cast f16", f_cast, &f16, 1, in, &loose);
        gc_opts looser = {.eps = 0.1, .atol = 6e-2, .rtol = 1e-1};
        gradcheck("cast bf16", f_cast, &bf16, 1, in, &looser);
    }
}

/* A gradient nothing reads afterwards is handed over instead of copied (ca_grad_adopt). The sum
 * s = u + v gives its gradient to v and copies it for u; both then get more from w = u * v, so
 * a buffer shared by mistake would show in either. A chain of reshapes allocates no gradient
 * buffer per reshape. */
static void test_gradients_handed_over(void **state) {
    CA_SCOPE {
        ca_device *d = ca_cpu_device();
        float xv[6] = {1, -2, 3, 0.5f, -1.5f, 2}, cv[6] = {0.5f, 1, -1, 2, 0, 3};
        ca_tensor *x = T_NN(ca_from_host(d, CA_F32, CA_SHAPE(6), xv));
        ca_tensor *c = T_NN(ca_from_host(d, CA_F32, CA_SHAPE(6), cv));
        ca_tensor_set_requires_grad(x, true);
        ca_tensor *u = ca_mul_scalar(x, 2), *v = ca_mul_scalar(x, 3);
        ca_tensor *w = ca_mul(u, v), *s = ca_add(u, v);
        T_OK(ca_autograd_backward(ca_add(ca_sum(ca_mul(s, c)), ca_sum(w))));
        float *g = t_host(ca_tensor_grad(x));
        for (int i = 0; i < 6; i++) assert_float_equal(g[i], 5 * cv[i] + 12 * xv[i], 1e-5);   /* d/dx */
        free(g);

        ca_tensor *h = ca_mul_scalar(T_NN(ca_full(d, CA_F32, CA_SHAPE(64, 64), 1.0)), 1.0);
        ca_tensor_set_requires_grad(h, true);
        ca_tensor *r = ca_mul_scalar(h, 2.0);
        for (int i = 0; i < 8; i++) r = ca_reshape(r, CA_SHAPE(i % 2 ? 64 : 16, -1));
        ca_tensor *loss = ca_sum(r);
        ca_allocator_stats a, b;
        T_OK(ca_device_memory_stats(d, &a));
        T_OK(ca_autograd_backward(loss));
        T_OK(ca_device_memory_stats(d, &b));
        assert_int_equal(b.num_allocs - a.num_allocs, 3);   /* the seed, the sum's gradient, h's */
        g = t_host(ca_tensor_grad(h));
        for (int i = 0; i < 64 * 64; i++) assert_float_equal(g[i], 2.0f, 0);
        free(g);
    }
}

/* ------------------------------------------------------------------ tape rules */

static void test_accumulation_and_zero_grad(void **state) {
    CA_SCOPE {
        ca_tensor *x = T_NN(ca_full(ca_cpu_device(), CA_F32, CA_SHAPE(3), 2.0));
        ca_tensor_set_requires_grad(x, true);
        T_OK(ca_autograd_backward(ca_sum(ca_mul(x, x))));       /* d/dx = 2x = 4 */
        T_OK(ca_autograd_backward(ca_sum(ca_mul_scalar(x, 3)))); /* + 3 */
        float *g = t_host(ca_tensor_grad(x));
        for (int i = 0; i < 3; i++) assert_float_equal(g[i], 7.0f, 1e-6);
        free(g);
        ca_tensor_zero_grad(x);
        assert_null(ca_tensor_grad(x));
        T_OK(ca_autograd_backward(ca_sum(x)));
        g = t_host(ca_tensor_grad(x));
        for (int i = 0; i < 3; i++) assert_float_equal(g[i], 1.0f, 1e-6);
        free(g);
        /* a non-scalar loss is refused with a message */
        assert_int_equal(ca_autograd_backward(ca_mul(x, x)), CA_ERR_INVALID);
        assert_non_null(strstr(ca_last_error(), "scalar"));
    }
}

static void test_no_grad_and_detach(void **state) {
    CA_SCOPE {
        ca_tensor *x = T_NN(ca_full(ca_cpu_device(), CA_F32, CA_SHAPE(2), 1.0));
        ca_tensor_set_requires_grad(x, true);
        ca_tensor *y = NULL;
        CA_NO_GRAD { y = ca_mul(x, x); }
        assert_false(ca_tensor_requires_grad(y));
        assert_true(ca_grad_enabled());
        ca_tensor *d = ca_detach(ca_mul(x, x));
        assert_false(ca_tensor_requires_grad(d));
        assert_int_equal(ca_autograd_backward(ca_sum(d)), CA_ERR_INVALID);
        /* a path through detach contributes nothing: d(sum(x + detach(x)))/dx = 1 */
        T_OK(ca_autograd_backward(ca_sum(ca_add(x, ca_detach(x)))));
        float *g = t_host(ca_tensor_grad(x));
        assert_float_equal(g[0], 1.0f, 1e-6);
        free(g);
    }
}

static int hook_calls;
static void count_hook(ca_tensor *leaf_t, void *ctx) {
    hook_calls++;
    /* when the hook runs, the gradient is final: both uses have been added */
    float *g = t_host(ca_tensor_grad(leaf_t));
    assert_float_equal(g[0], *(float *)ctx, 1e-6);
    free(g);
}

static void test_grad_hook_fires_once_when_final(void **state) {
    CA_SCOPE {
        ca_tensor *w = T_NN(ca_full(ca_cpu_device(), CA_F32, CA_SHAPE(1), 3.0));
        ca_tensor_set_requires_grad(w, true);
        float expect = 2 * 3.0f + 5.0f;      /* d(w*w + 5w)/dw */
        ca_tensor_set_grad_hook(w, count_hook, &expect);
        hook_calls = 0;
        T_OK(ca_autograd_backward(ca_sum(ca_add(ca_mul(w, w), ca_mul_scalar(w, 5)))));
        assert_int_equal(hook_calls, 1);
    }
}

static void test_errors_propagate_through_chains(void **state) {
    CA_SCOPE {
        ca_tensor *a = T_NN(ca_zeros(ca_cpu_device(), CA_F32, CA_SHAPE(2, 3)));
        ca_tensor *b = T_NN(ca_zeros(ca_cpu_device(), CA_F32, CA_SHAPE(4, 5)));
        ca_tensor *loss = ca_sum(ca_relu(ca_matmul(a, b)));   /* the matmul fails; NULL flows on */
        assert_null(loss);
        assert_int_equal(ca_autograd_backward(loss), CA_ERR_INVALID);
        assert_non_null(strstr(ca_last_error(), "matmul"));
        assert_non_null(strstr(ca_last_error(), "[2, 3]"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_broadcast),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_join_and_select),
        cmocka_unit_test(test_rms_norm),
        cmocka_unit_test(test_embedding_padding),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_binary_broadcast),
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_softmax_family),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_losses_and_norms),
        cmocka_unit_test(test_shape_ops),
        cmocka_unit_test(test_gradients_handed_over),
        cmocka_unit_test(test_accumulation_and_zero_grad),
        cmocka_unit_test(test_no_grad_and_detach),
        cmocka_unit_test(test_grad_hook_fires_once_when_final),
        cmocka_unit_test(test_errors_propagate_through_chains),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
