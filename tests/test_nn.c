/* nn tests: module names and trees, PyTorch's default initialisation, optimizers against scalar references, schedules. */
#include "test_util.h"

static ca_module *mlp(void) {
    ca_module *seq, *l;
    T_OK(ca_sequential_create(&seq));
    T_OK(ca_linear_create(784, 256, true, &l)); T_OK(ca_module_add(seq, "fc1", l));
    T_OK(ca_relu_create(&l));                   T_OK(ca_module_add(seq, NULL, l));
    T_OK(ca_linear_create(256, 128, true, &l)); T_OK(ca_module_add(seq, "fc2", l));
    T_OK(ca_relu_create(&l));                   T_OK(ca_module_add(seq, NULL, l));
    T_OK(ca_linear_create(128, 10, true, &l));  T_OK(ca_module_add(seq, "fc3", l));
    return seq;
}

static void test_names_and_counts(void **state) {
    ca_manual_seed(0);
    ca_module *m = mlp();
    assert_int_equal(ca_module_num_params(m), 6);
    const char *want[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"};
    for (int i = 0; i < 6; i++) assert_string_equal(ca_module_param_name(m, i), want[i]);
    assert_int_equal(ca_module_param_count(m), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
    assert_non_null(ca_module_param(m, "fc2.bias"));
    assert_null(ca_module_param(m, "fc4.bias"));
    assert_string_equal(ca_module_type(ca_module_child(m, "fc3")), "Linear");
    assert_string_equal(ca_module_type(ca_module_child(m, "1")), "ReLU");   /* unnamed child: its index */
    ca_module *dup;
    T_OK(ca_relu_create(&dup));
    assert_int_equal(ca_module_add(m, "fc1", dup), CA_ERR_INVALID);     /* takes ownership on failure */
    /* nested names */
    ca_module *outer, *inner, *lin;
    T_OK(ca_sequential_create(&outer));
    T_OK(ca_sequential_create(&inner));
    T_OK(ca_layer_norm_create(8, 0, &lin));
    T_OK(ca_module_add(inner, NULL, lin));
    T_OK(ca_module_add(outer, "encoder", inner));
    assert_string_equal(ca_module_param_name(outer, 1), "encoder.0.bias");
    ca_module_destroy(outer);
    ca_module_destroy(m);
}

static void test_default_init(void **state) {
    ca_manual_seed(1);
    ca_module *l, *e, *ln;
    T_OK(ca_linear_create(400, 300, true, &l));
    float *w = t_host(ca_module_param(l, "weight"));
    double bound = 1.0 / sqrt(400.0), mx = 0, var = 0;
    for (int i = 0; i < 400 * 300; i++) {
        mx = fmax(mx, fabs(w[i]));
        var += (double)w[i] * w[i] / (400.0 * 300);
    }
    assert_true(mx <= bound && mx > 0.99 * bound);              /* U(-1/sqrt(in), 1/sqrt(in)) */
    assert_float_equal(var, bound * bound / 3, bound * bound * 0.03);
    free(w);
    T_OK(ca_embedding_create(1000, 64, &e));
    float *ew = t_host(ca_module_param(e, "weight"));
    double m = 0, v = 0;
    for (int i = 0; i < 64000; i++) m += ew[i] / 64000.0;
    for (int i = 0; i < 64000; i++) v += (ew[i] - m) * (ew[i] - m) / 64000.0;
    assert_true(fabs(m) < 0.02 && fabs(v - 1) < 0.03);           /* N(0, 1) */
    free(ew);
    T_OK(ca_layer_norm_create(5, 0, &ln));
    float *g = t_host(ca_module_param(ln, "weight")), *b = t_host(ca_module_param(ln, "bias"));
    for (int i = 0; i < 5; i++) { assert_float_equal(g[i], 1, 0); assert_float_equal(b[i], 0, 0); }
    free(g); free(b);
    /* the same seed gives the same weights */
    ca_module *l2;
    ca_manual_seed(1);
    T_OK(ca_linear_create(400, 300, true, &l2));
    float *w1 = t_host(ca_module_param(l, "weight")), *w2 = t_host(ca_module_param(l2, "weight"));
    assert_memory_equal(w1, w2, 400 * 300 * sizeof(float));
    free(w1); free(w2);
    ca_module_destroy(l); ca_module_destroy(l2); ca_module_destroy(e); ca_module_destroy(ln);
}

/* Runs `steps` optimizer steps on f(p) = sum(c * p^2) and compares with a scalar re-implementation. */
static void check_optimizer(bool adamw, const void *opts, int steps) {
    enum { N = 37 };
    float p0[N], c[N];
    uint64_t s = 11;
    for (int i = 0; i < N; i++) { p0[i] = t_randf(&s, -1, 1); c[i] = t_randf(&s, 0.5f, 2); }
    ca_tensor *p;
    T_OK(ca_parameter_create(ca_cpu_device(), CA_F32, CA_SHAPE(N), &p));
    T_OK(ca_tensor_copy_from_host(p, p0, sizeof p0));
    ca_optimizer *o;
    if (adamw) T_OK(ca_adamw_create_params(&p, 1, opts, &o));
    else T_OK(ca_sgd_create_params(&p, 1, opts, &o));
    double ref[N], m[N] = {0}, v[N] = {0};
    for (int i = 0; i < N; i++) ref[i] = p0[i];
    for (int t = 1; t <= steps; t++) {
        CA_SCOPE {
            ca_tensor *cc = ca_from_host(ca_cpu_device(), CA_F32, CA_SHAPE(N), c);
            T_OK(ca_autograd_backward(ca_sum(ca_mul(cc, ca_mul(p, p)))));
        }
        T_OK(ca_optimizer_step(o));
        ca_optimizer_zero_grad(o);
        for (int i = 0; i < N; i++) {
            double g = 2 * c[i] * ref[i];
            if (adamw) {
                const ca_adamw_opts *a = opts;
                double lr = a->lr, b1 = a->beta1, b2 = a->beta2, eps = a->eps, wd = a->weight_decay;
                ref[i] -= lr * wd * ref[i];
                m[i] = b1 * m[i] + (1 - b1) * g;
                v[i] = b2 * v[i] + (1 - b2) * g * g;
                ref[i] -= lr * (m[i] / (1 - pow(b1, t))) / (sqrt(v[i] / (1 - pow(b2, t))) + eps);
            } else {
                const ca_sgd_opts *o2 = opts;
                g += o2->weight_decay * ref[i];
                if (o2->momentum != 0) {
                    m[i] = t == 1 ? g : o2->momentum * m[i] + (1 - o2->dampening) * g;
                    g = o2->nesterov ? g + o2->momentum * m[i] : m[i];
                }
                ref[i] -= o2->lr * g;
            }
        }
    }
    float *got = t_host(p);
    for (int i = 0; i < N; i++) assert_float_equal(got[i], ref[i], 1e-4 * (1 + fabs(ref[i])));
    free(got);
    assert_int_equal(ca_optimizer_steps(o), steps);
    ca_optimizer_destroy(o);
    ca_tensor_free(p);
}

/* The transformer layers: PyTorch's names, padding row zero and without gradient, RMSNorm's weight. */
static void test_transformer_layers(void **state) {
    ca_manual_seed(3);
    ca_module *emb = NULL, *rms = NULL, *act = NULL;
    T_OK(ca_embedding_create_ex(6, 4, 1, &emb));
    T_OK(ca_rms_norm_create(4, 0, &rms));
    T_OK(ca_silu_create(&act));
    assert_string_equal(ca_module_param_name(emb, 0), "weight");
    assert_string_equal(ca_module_param_name(rms, 0), "weight");
    assert_string_equal(ca_module_type(act), "SiLU");
    CA_SCOPE {
        float *w = t_host(ca_module_param(emb, "weight"));
        for (int c = 0; c < 4; c++) assert_float_equal(w[4 + c], 0.0f, 0.0);
        assert_true(w[0] != 0.0f);
        free(w);
        int64_t idx[3] = {1, 2, 1};
        ca_tensor *x = ca_module_forward(emb, ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(3), idx));
        ca_tensor *y = T_NN(ca_module_forward(act, ca_module_forward(rms, x)));
        T_OK(ca_autograd_backward(ca_sum(y)));
        float *g = t_host(ca_tensor_grad(ca_module_param(emb, "weight")));
        for (int c = 0; c < 4; c++) assert_float_equal(g[4 + c], 0.0f, 0.0);
        bool any = false;
        for (int c = 0; c < 4; c++) any |= g[8 + c] != 0.0f;
        assert_true(any);
        free(g);
    }
    ca_module *bad;
    assert_int_equal(ca_embedding_create_ex(6, 4, 6, &bad), CA_ERR_INVALID);
    assert_null(bad);
    assert_non_null(strstr(ca_last_error(), "padding_idx must be in [0, 6)"));
    ca_module_destroy(emb);
    ca_module_destroy(rms);
    ca_module_destroy(act);
    T_OK(ca_gelu_erf_create(&act));
    assert_string_equal(ca_module_type(act), "GELU");
    ca_module_destroy(act);
}

static void test_adamw_matches_reference(void **state) {
    ca_adamw_opts a = {.lr = 0.05, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
    check_optimizer(true, &a, 25);
    ca_adamw_opts b = {.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay_set = true};
    check_optimizer(true, &b, 10);
}

static void test_sgd_matches_reference(void **state) {
    ca_sgd_opts plain = {.lr = 0.1};
    check_optimizer(false, &plain, 10);
    ca_sgd_opts mom = {.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-2};
    check_optimizer(false, &mom, 10);
    ca_sgd_opts nest = {.lr = 0.05, .momentum = 0.9, .nesterov = true};
    check_optimizer(false, &nest, 10);
    ca_optimizer *o;
    ca_tensor *p;
    T_OK(ca_parameter_create(ca_cpu_device(), CA_F32, CA_SHAPE(2), &p));
    ca_sgd_opts bad = {.lr = 0.1, .nesterov = true};
    assert_int_equal(ca_sgd_create_params(&p, 1, &bad, &o), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "Nesterov"));
    ca_tensor_free(p);
}

static void test_param_groups_and_defaults(void **state) {
    ca_tensor *a, *b;
    T_OK(ca_parameter_create(ca_cpu_device(), CA_F32, CA_SHAPE(3), &a));
    T_OK(ca_parameter_create(ca_cpu_device(), CA_F32, CA_SHAPE(4), &b));
    ca_optimizer *o;
    T_OK(ca_adamw_create_params(&a, 1, NULL, &o));
    assert_float_equal(ca_optimizer_get_lr(o, 0), 1e-3, 1e-12);     /* PyTorch's defaults */
    ca_adamw_opts g2 = {.lr = 0.5};
    T_OK(ca_optimizer_add_group(o, &b, 1, &g2));
    assert_int_equal(ca_optimizer_num_groups(o), 2);
    assert_float_equal(ca_optimizer_get_lr(o, 1), 0.5, 0);
    assert_int_equal(ca_optimizer_add_group(o, &a, 1, &g2), CA_ERR_INVALID);   /* already in a group */
    /* no gradients: nothing changes, state names for checkpoints */
    T_OK(ca_optimizer_step(o));
    assert_int_equal(ca_optimizer_num_state(o), 4);
    const char *name;
    assert_non_null(ca_optimizer_state_at(o, 3, &name));
    assert_string_equal(name, "state.1.exp_avg_sq");
    ca_optimizer_destroy(o);
    ca_tensor_free(a);
    ca_tensor_free(b);
}

static void test_schedules(void **state) {
    ca_lr_schedule lin = {.kind = CA_SCHED_LINEAR, .warmup_steps = 10, .total_steps = 110};
    assert_float_equal(ca_lr_schedule_factor(&lin, 0), 0.0, 1e-12);
    assert_float_equal(ca_lr_schedule_factor(&lin, 5), 0.5, 1e-12);
    assert_float_equal(ca_lr_schedule_factor(&lin, 10), 1.0, 1e-12);
    assert_float_equal(ca_lr_schedule_factor(&lin, 60), 0.5, 1e-12);
    assert_float_equal(ca_lr_schedule_factor(&lin, 500), 0.0, 1e-12);
    ca_lr_schedule cos = {.kind = CA_SCHED_COSINE, .warmup_steps = 0, .total_steps = 100, .min_lr_ratio = 0.1};
    assert_float_equal(ca_lr_schedule_factor(&cos, 0), 1.0, 1e-12);
    assert_float_equal(ca_lr_schedule_factor(&cos, 50), 0.1 + 0.9 * 0.5, 1e-12);
    assert_float_equal(ca_lr_schedule_factor(&cos, 100), 0.1, 1e-12);
    ca_lr_schedule con = {.kind = CA_SCHED_CONSTANT, .warmup_steps = 4};
    assert_float_equal(ca_lr_schedule_factor(&con, 2), 0.5, 1e-12);
    assert_float_equal(ca_lr_schedule_factor(&con, 400), 1.0, 1e-12);
    /* attached to an optimizer: advances once per real step */
    ca_tensor *p;
    T_OK(ca_parameter_create(ca_cpu_device(), CA_F32, CA_SHAPE(1), &p));
    ca_sgd_opts so = {.lr = 1.0};
    ca_optimizer *o;
    T_OK(ca_sgd_create_params(&p, 1, &so, &o));
    T_OK(ca_optimizer_set_schedule(o, &lin));
    assert_float_equal(ca_optimizer_get_lr(o, 0), 0.0, 1e-12);
    for (int i = 0; i < 5; i++) T_OK(ca_optimizer_step(o));
    assert_float_equal(ca_optimizer_get_lr(o, 0), 0.5, 1e-12);
    ca_lr_schedule bad = {.kind = CA_SCHED_COSINE, .total_steps = 0};
    assert_int_equal(ca_optimizer_set_schedule(o, &bad), CA_ERR_INVALID);
    ca_optimizer_destroy(o);
    ca_tensor_free(p);
}

/* Dropout is active in training mode only. */
static void test_train_eval_mode(void **state) {
    ca_module *d;
    T_OK(ca_dropout_create(0.5, &d));
    CA_SCOPE {
        ca_tensor *x = ca_full(ca_cpu_device(), CA_F32, CA_SHAPE(1000), 1.0);
        float *y = t_host(ca_module_forward(d, x));
        int zeros = 0;
        for (int i = 0; i < 1000; i++) {
            zeros += y[i] == 0;
            if (y[i] != 0) assert_float_equal(y[i], 2.0f, 1e-6);
        }
        assert_true(zeros > 400 && zeros < 600);
        free(y);
        ca_module_train(d, false);
        y = t_host(ca_module_forward(d, x));
        for (int i = 0; i < 1000; i++) assert_float_equal(y[i], 1.0f, 0);
        free(y);
    }
    ca_module_destroy(d);
}

/* A constructor that fails leaves *out NULL (include/caccel/status.h), never the caller's stale or
 * uninitialised pointer, which a cleanup path would then destroy. */
/* ca_tp_plan: Hugging Face's names with "*" for one dotted component, the first matching entry decides;
 * styles caccel does not split yet are refused naming them. */
static void test_tp_plan(void **state) {
    (void)state;
    ca_module *m;
    assert_int_equal(ca_sequential_create(&m), CA_OK);
    assert_int_equal(ca_tp_plan(m, "layers.*.mlp.up_proj", "colwise"), CA_OK);
    assert_int_equal(ca_tp_plan(m, "layers.*.mlp.*", "rowwise"), CA_OK);
    assert_int_equal(ca_tp_plan_match(m, "layers.0.mlp.up_proj", NULL), CA_TP_COLWISE);
    assert_int_equal(ca_tp_plan_match(m, "layers.12.mlp.down_proj", NULL), CA_TP_ROWWISE);
    assert_int_equal(ca_tp_plan_match(m, "layers.0.mlp", NULL), 0);            /* one component short */
    assert_int_equal(ca_tp_plan_match(m, "layers.0.mlp.up_proj.x", NULL), 0);  /* one too many */
    assert_int_equal(ca_tp_plan_match(m, "layers.0.attn.up_proj", NULL), 0);
    assert_int_equal(ca_tp_plan(m, "lm_head", "colwise_rep"), CA_ERR_UNSUPPORTED);
    assert_non_null(strstr(ca_last_error(), "style \"colwise_rep\" for \"lm_head\" is not supported yet"));
    assert_int_equal(ca_tp_plan(m, "", "colwise"), CA_ERR_INVALID);
    assert_int_equal(ca_tp_plan_match(m, "lm_head", NULL), 0);
    int parts = 0;
    assert_int_equal(ca_tp_plan_fused(m, "h.*.attn.c_attn", "colwise", 3), CA_OK);
    assert_int_equal(ca_tp_plan_match(m, "h.3.attn.c_attn", &parts), CA_TP_COLWISE);
    assert_int_equal(parts, 3);
    assert_int_equal(ca_tp_plan_fused(m, "x", "colwise", 0), CA_ERR_INVALID);
    assert_int_equal(ca_tp_plan(m, "norm", "sequence_parallel"), CA_OK);   /* a norm on each rank's tokens */
    assert_int_equal(ca_tp_plan_match(m, "norm", NULL), CA_TP_SEQUENCE);
    assert_int_equal(ca_tp_plan(m, "head", "colwise_gather_output"), CA_OK);   /* a decoder's lm_head */
    assert_int_equal(ca_tp_plan_match(m, "head", NULL), CA_TP_COLWISE_GATHER);
    ca_module_destroy(m);
}

/* Without a split (one process, or a module the plan did not name) the tied head is x weight^T and
 * ca_tp_cross_entropy is ca_cross_entropy, to the bit; Embedding "rowwise" is a plan entry like a Linear's. */
static void test_tp_vocab_unsplit(void **state) {
    (void)state;
    ca_module *e;
    assert_int_equal(ca_embedding_create(8, 4, &e), CA_OK);
    assert_int_equal(ca_tp_plan(e, "wte", "rowwise"), CA_OK);
    assert_int_equal(ca_tp_plan_match(e, "wte", NULL), CA_TP_ROWWISE);
    CA_SCOPE {
        ca_device *dev = ca_cpu_device();
        ca_tensor *x = ca_rand_normal(dev, CA_F32, CA_SHAPE(2, 3, 4), 0.0f, 1.0f);
        ca_tensor *y = ca_from_host(dev, CA_I64, CA_SHAPE(2, 3), (int64_t[]){7, 2, -100, 3, 5, 0});
        ca_tensor *w = ca_module_param(e, "weight");
        ca_tensor *a = ca_embedding_attend(e, x), *b = ca_linear(x, w, NULL);
        float ha[2 * 3 * 8], hb[2 * 3 * 8], la, lb;
        assert_int_equal(ca_tensor_to_host(a, ha, sizeof ha), CA_OK);
        assert_int_equal(ca_tensor_to_host(b, hb, sizeof hb), CA_OK);
        assert_memory_equal(ha, hb, sizeof ha);
        assert_int_equal(ca_tensor_to_host(ca_tp_cross_entropy(e, a, y), &la, sizeof la), CA_OK);
        assert_int_equal(ca_tensor_to_host(ca_cross_entropy(b, y), &lb, sizeof lb), CA_OK);
        assert_memory_equal(&la, &lb, sizeof la);
        assert_null(ca_tp_cross_entropy(NULL, a, y));
        assert_int_equal(ca_last_status(), CA_ERR_INVALID);
        assert_null(ca_embedding_attend(NULL, x));
        assert_int_equal(ca_last_status(), CA_ERR_INVALID);
        ca_clear_error();
    }
    ca_module_destroy(e);
}

static void test_failed_constructors_clear_out(void **state) {
    (void)state;
    static int stale_obj;
    void *stale = &stale_obj;
    ca_module *m = stale;
    assert_int_equal(ca_linear_create(0, 4, true, &m), CA_ERR_INVALID);
    assert_null(m);
    m = stale;
    assert_int_equal(ca_embedding_create(4, 0, &m), CA_ERR_INVALID);
    assert_null(m);
    m = stale;
    assert_int_equal(ca_embedding_create_ex(4, 4, 9, &m), CA_ERR_INVALID);   /* padding_idx out of range */
    assert_null(m);
    m = stale;
    assert_int_equal(ca_layer_norm_create(0, 1e-5, &m), CA_ERR_INVALID);
    assert_null(m);
    m = stale;
    assert_int_equal(ca_rms_norm_create(-1, 0, &m), CA_ERR_INVALID);
    assert_null(m);
    m = stale;
    assert_int_equal(ca_dropout_create(1.5, &m), CA_ERR_INVALID);
    assert_null(m);
    ca_optimizer *o = stale;
    assert_int_equal(ca_adamw_create(NULL, NULL, &o), CA_ERR_INVALID);
    assert_null(o);
    o = stale;
    assert_int_equal(ca_sgd_create_params(NULL, 2, NULL, &o), CA_ERR_INVALID);
    assert_null(o);
    ca_tensor *t = stale;
    assert_int_equal(ca_tensor_to_device(NULL, ca_cpu_device(), &t), CA_ERR_INVALID);
    assert_null(t);
    t = stale;
    assert_int_not_equal(ca_parameter_create(ca_cpu_device(), CA_F32, 1, (int64_t[]){-2}, &t), CA_OK);
    assert_null(t);
    ca_device *d = stale;
    assert_int_not_equal(ca_device_open("no-such-device", 0, NULL, &d), CA_OK);
    assert_null(d);
    ca_progress *p = stale;
    assert_int_equal(ca_progress_create(NULL, NULL, &p), CA_ERR_INVALID);
    assert_null(p);
}

/* A forward with a local (2x, 4 KiB), a view of its parameter and a result that is a view of another
 * local (x + 2x, reshaped). */
static ca_tensor *g_local, *g_param_view;

static ca_tensor *locals_forward(ca_module *self, ca_tensor *x, void *ctx) {
    (void)ctx;
    g_local = ca_mul_scalar(x, 2.0);
    g_param_view = ca_reshape(ca_module_param_at(self, 0), 1, (int64_t[]){1024});
    ca_tensor *sum = ca_add(ca_add(x, g_local), ca_reshape(g_param_view, 2, (int64_t[]){1, 1024}));
    return ca_reshape(sum, 2, (int64_t[]){32, 32});
}

/* Under no_grad a module's forward gives its locals' memory back when it returns (torch's reference
 * counts free an evaluation's intermediates as it goes; without this, every intermediate of the
 * forward lived to the scope's end): what stays is the result (a view of a local keeps that local's
 * values), the input and the parameters. A freed local read later says why. With grad on, the
 * locals stay for backward as before. */
static void test_no_grad_forward_frees_locals(void **state) {
    (void)state;
    ca_device *dev = ca_cpu_device();
    ca_module *m;
    T_OK(ca_module_create("Locals", locals_forward, NULL, NULL, &m));
    ca_tensor *w;
    T_OK(ca_parameter_create(dev, CA_F32, 1, (int64_t[]){1024}, &w));
    T_OK(ca_tensor_init_fill_(w, 0, 1024, 0.5));
    T_OK(ca_module_add_param(m, "w", w));
    const size_t bytes = 1024 * sizeof(float);
    for (int grad = 0; grad < 2; grad++) {
        CA_SCOPE {
            ca_tensor *x = T_NN(ca_full(dev, CA_F32, CA_SHAPE(1, 1024), 1.0));
            ca_allocator_stats before, after;
            T_OK(ca_device_memory_stats(dev, &before));
            ca_tensor *y;
            if (grad) {
                y = T_NN(ca_module_forward(m, x));
            } else {
                CA_NO_GRAD { y = T_NN(ca_module_forward(m, x)); }
            }
            T_OK(ca_device_memory_stats(dev, &after));
            /* no_grad: only the result's storage (x + 2x, then + w); grad: the two locals too */
            size_t held = after.allocated - before.allocated;
            if (grad ? held < 3 * bytes : held > bytes)
                fail_msg("grad %d: the forward left %zu bytes in use, the result is %zu", grad, held, bytes);
            float h[1024];
            T_OK(ca_tensor_to_host(y, h, sizeof h));
            assert_true(h[0] == 3.5f && h[1023] == 3.5f);
            T_OK(ca_tensor_to_host(x, h, sizeof h));                /* the input stays */
            T_OK(ca_tensor_to_host(g_param_view, h, sizeof h));     /* a view of a parameter stays */
            assert_true(h[0] == 0.5f);
            if (grad) {
                T_OK(ca_tensor_to_host(g_local, h, sizeof h));
            } else {
                assert_int_equal(ca_tensor_to_host(g_local, h, sizeof h), CA_ERR_STATE);
                assert_non_null(strstr(ca_last_error(), "under no_grad, freed when that forward returned"));
                ca_clear_error();
            }
        }
    }
    ca_module_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_counts),
        cmocka_unit_test(test_default_init),
        cmocka_unit_test(test_transformer_layers),
        cmocka_unit_test(test_adamw_matches_reference),
        cmocka_unit_test(test_sgd_matches_reference),
        cmocka_unit_test(test_param_groups_and_defaults),
        cmocka_unit_test(test_schedules),
        cmocka_unit_test(test_train_eval_mode),
        cmocka_unit_test(test_failed_constructors_clear_out),
        cmocka_unit_test(test_tp_plan),
        cmocka_unit_test(test_tp_vocab_unsplit),
        cmocka_unit_test(test_no_grad_forward_frees_locals),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
