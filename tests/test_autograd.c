/* The tape's rules (accumulation, no_grad, detach, hooks, handed-over gradients, padding_idx, weight tying). The
 * finite-difference checks of every op, on every device, are rows of tests/test_ops.c. */
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

/* The loss against a naive reference: the mean of -log softmax at the labels, ignoring -100 (its
 * gradient checks are rows of tests/test_ops.c). */
static void test_cross_entropy(void **state) {
    uint64_t s = 7;
    CA_SCOPE {
        int64_t lab64[6] = {0, 4, 2, -100, 3, 1};
        ca_tensor *in[2] = {leaf(&s, CA_SHAPE(6, 5), -2, 2, 0),
                            ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(6), lab64)};
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

/* ------------------------------------------------------------------ saved activations */

enum { CHAIN = 8, ROWS = 256, WIDTH = 64 };
static size_t live_at_hook[CHAIN];
static ca_tensor *chain_mid, *chain_kept;

/* Each layer's weight hook fires once its linear's backward has run: the live bytes then. */
static void record_live(ca_tensor *w, void *ctx) {
    (void)w;
    ca_allocator_stats st;
    T_OK(ca_device_memory_stats(ca_cpu_device(), &st));
    live_at_hook[(intptr_t)ctx] = st.allocated;
}

/* 8 linear + gelu layers; keeps (for the test to look at) a middle linear's output and a detached
 * view of a middle gelu's. */
static ca_tensor *chain_forward(ca_module *self, ca_tensor *h, void *ctx) {
    (void)self;
    ca_tensor **w = ctx;
    for (int i = 0; i < CHAIN; i++) {
        ca_tensor *z = ca_linear(h, w[i], NULL);
        h = ca_gelu(z);
        if (i == 2) chain_mid = z;
        if (i == CHAIN / 2) chain_kept = ca_detach(h);
    }
    return h;
}

/* Backward frees the activations of a module's forward once the last node reading them has run, as
 * torch does without retain_graph: over a chain of 8 linear + gelu layers the live bytes fall as
 * backward reaches the first layers (before: every activation stayed until the scope ended, and the
 * live bytes only grew with the weights' gradients). What the program holds keeps its values: the
 * loss, the module's output and a detached view of a middle activation; a freed one says why when
 * read, and a second backward through the freed graph is refused naming the op. */
static void test_backward_frees_saved_activations(void **state) {
    uint64_t seed = 41;
    ca_tensor *w[CHAIN];
    ca_module *m;
    T_OK(ca_module_create("Chain", chain_forward, w, NULL, &m));
    CA_SCOPE {
        ca_tensor *x = t_randn(&seed, CA_SHAPE(ROWS, WIDTH), -1, 1, 0);
        for (int i = 0; i < CHAIN; i++) {
            w[i] = leaf(&seed, CA_SHAPE(WIDTH, WIDTH), -0.2f, 0.2f, 0);
            ca_tensor_set_grad_hook(w[i], record_live, (void *)(intptr_t)i);
        }
        ca_tensor *y = T_NN(ca_module_forward(m, x)), *loss = ca_mean(y);
        size_t act = (size_t)ROWS * WIDTH * sizeof(float), wgrad = (size_t)WIDTH * WIDTH * sizeof(float);
        float *before = t_host(chain_kept), *out = t_host(y);
        T_OK(ca_autograd_backward(loss));
        /* from the last layer's hook to the first's, 7 layers' activations (2 each) went and 7 weight
         * gradients came; before, the bytes grew by the gradients */
        assert_true(live_at_hook[CHAIN - 1] > live_at_hook[0]);
        assert_true(live_at_hook[CHAIN - 1] - live_at_hook[0] >= (CHAIN - 2) * 2 * act - (CHAIN - 1) * wgrad);
        double l;
        T_OK(ca_tensor_item(loss, &l));
        float *after = t_host(chain_kept), *out_after = t_host(y);
        assert_memory_equal(before, after, act);                 /* a view outside the tape */
        assert_memory_equal(out, out_after, act);                /* the module's result */
        free(before);
        free(after);
        free(out);
        free(out_after);
        float *buf = malloc(act);
        assert_int_equal(ca_tensor_to_host(chain_mid, buf, act), CA_ERR_STATE);
        assert_non_null(strstr(ca_last_error(), "freed by backward"));
        free(buf);
        assert_int_equal(ca_autograd_backward(loss), CA_ERR_STATE);
        assert_non_null(strstr(ca_last_error(), "already run by an earlier backward"));
        assert_non_null(strstr(ca_last_error(), "mean"));
    }
    ca_module_destroy(m);
}

/* The "addcount" device: the CPU's, with its binary adds counted (the split test below). */
static const ca_kernels *cpu_k;
static int binary_adds;
static ca_status count_binary(void *dev, const ca_binary_args *a) {
    if (a->op == CA_BINARY_ADD) binary_adds++;
    return cpu_k->binary(dev, a);
}
static ca_device *addcount_device(void) {
    static ca_kernels k;
    static ca_device_ops ops;
    static const ca_device_ops *list[1];
    static ca_plugin p;
    static ca_device *dev;
    if (dev) return dev;
    ops = *ca_device_ops_of(ca_cpu_device());
    cpu_k = ops.kernels;
    k = *cpu_k;
    k.binary = count_binary;
    ops.name = "addcount";
    ops.kernels = &k;
    list[0] = &ops;
    p = (ca_plugin){.struct_size = sizeof p, .abi_version = ops.abi_version, .name = "addcount", .version = "test",
                    .num_devices = 1, .devices = list};
    T_OK(ca_register_plugin(&p, "test_autograd"));
    T_OK(ca_device_open("addcount", 0, NULL, &dev));
    return dev;
}

/* dx of sum over parts j of sum(w_j * part_j(2 x)), x [2, 3, 8] split along the last dim, with `uses`
 * picking the parts that enter the loss (bit j), `whole` adding sum(w * 2 x) itself, and a second split of
 * other sizes when `again`; every weight an integer, so the expected gradient is exact. Returns the binary
 * adds the backward ran. */
static int split_grads(int uses, bool whole, bool again) {
    ca_device *dev = addcount_device();
    int64_t shape[3] = {2, 3, 8}, n = 48, sizes[3] = {2, 4, 2}, sizes2[2] = {5, 3};
    float xv[48], want[48] = {0};
    for (int64_t i = 0; i < n; i++) xv[i] = (float)(i % 7) - 3.0f;
    int adds = -1;
    CA_SCOPE {
        ca_tensor *x = T_NN(ca_from_host(dev, CA_F32, 3, shape, xv));
        ca_tensor_set_requires_grad(x, true);
        ca_tensor *y = T_NN(ca_mul_scalar(x, 2.0)), *p[3], *q[2], *loss = NULL;
        T_OK(ca_split(y, 2, 3, sizes, p));
        T_OK(ca_split(y, -1, 2, sizes2, q));
        /* weight of element (r, c) of part j: j + 1 + c, at column c0 + c of y */
        for (int j = 0, c0 = 0; j < 3; c0 += (int)sizes[j++]) {
            if (!(uses >> j & 1)) continue;
            float w[24];   /* 6 rows of the widest part */
            for (int r = 0; r < 6; r++)
                for (int c = 0; c < sizes[j]; c++) {
                    w[r * sizes[j] + c] = (float)(j + 1 + c);
                    want[r * 8 + c0 + c] += 2.0f * (float)(j + 1 + c);
                }
            ca_tensor *wt = T_NN(ca_from_host(dev, CA_F32, 3, (int64_t[]){2, 3, sizes[j]}, w));
            ca_tensor *term = T_NN(ca_sum(ca_mul(p[j], wt)));
            loss = loss ? T_NN(ca_add(loss, term)) : term;
        }
        if (again) {   /* the second split's first part, weight 10 */
            float w[30];
            for (int i = 0; i < 30; i++) w[i] = 10.0f;
            for (int r = 0; r < 6; r++)
                for (int c = 0; c < 5; c++) want[r * 8 + c] += 20.0f;
            ca_tensor *wt = T_NN(ca_from_host(dev, CA_F32, 3, (int64_t[]){2, 3, 5}, w));
            ca_tensor *term = T_NN(ca_sum(ca_mul(q[0], wt)));
            loss = loss ? T_NN(ca_add(loss, term)) : term;
        }
        if (whole) {   /* y itself, weight -1 */
            for (int64_t i = 0; i < n; i++) want[i] -= 2.0f;
            ca_tensor *term = T_NN(ca_sum(ca_mul_scalar(y, -1.0)));
            loss = loss ? T_NN(ca_add(loss, term)) : term;
        }
        binary_adds = 0;
        T_OK(ca_autograd_backward(loss));
        adds = binary_adds;
        float *g = t_host(ca_tensor_grad(x));
        for (int64_t i = 0; i < n; i++)
            if (g[i] != want[i]) fail_msg("uses %d whole %d again %d: dx[%lld] = %g, want %g", uses, whole, again,
                                          (long long)i, g[i], want[i]);
        free(g);
    }
    return adds;
}

/* The parts of one ca_split write disjoint regions of its input's gradient: after the first part's
 * zeros, each later part copies into its region instead of adding (a sum into a temporary and a copy
 * back). A region another use of the input (or another split of it) has written is still added to. */
static void test_split_parts_copy(void **state) {
    (void)state;
    assert_int_equal(split_grads(7, false, false), 0);   /* q, k and v: no add */
    assert_int_equal(split_grads(5, false, false), 0);   /* a part unused: its region stays zero */
    split_grads(7, true, false);                         /* the input used whole as well */
    split_grads(3, false, true);                         /* two splits of one input, overlapping regions */
    split_grads(6, true, true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_padding),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_gradients_handed_over),
        cmocka_unit_test(test_accumulation_and_zero_grad),
        cmocka_unit_test(test_no_grad_and_detach),
        cmocka_unit_test(test_grad_hook_fires_once_when_final),
        cmocka_unit_test(test_errors_propagate_through_chains),
        cmocka_unit_test(test_backward_frees_saved_activations),
        cmocka_unit_test(test_split_parts_copy),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
