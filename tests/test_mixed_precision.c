/* Mixed precision on one process: the autocast policy, per-step weight copies, fp16 loss scaling (skip on overflow, growth), clipping after unscaling. */
#include "test_util.h"
#include "tensor/tensor_impl.h"   /* to see the cached low-precision copy */

static ca_accelerator *make_acc(const char *mp) {
    char *argv[] = {"test", "--cpu", "--mixed_precision", (char *)mp, NULL};
    ca_accelerator *acc;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 4, .argv = argv}, &acc));
    return acc;
}

static ca_module *mlp(void) {
    ca_module *seq, *l;
    T_OK(ca_sequential_create(&seq));
    T_OK(ca_linear_create(6, 8, true, &l)); T_OK(ca_module_add(seq, "fc1", l));
    T_OK(ca_relu_create(&l));               T_OK(ca_module_add(seq, "relu", l));
    T_OK(ca_layer_norm_create(8, 0, &l));   T_OK(ca_module_add(seq, "norm", l));
    T_OK(ca_linear_create(8, 3, true, &l)); T_OK(ca_module_add(seq, "fc2", l));
    return seq;
}

static ca_tensor *data_x(ca_device *dev) {
    uint64_t s = 3;
    float x[4 * 6];
    for (int i = 0; i < 24; i++) x[i] = t_randf(&s, -1, 1);
    return ca_from_host(dev, CA_F32, CA_SHAPE(4, 6), x);
}

static ca_tensor *data_y(ca_device *dev) {
    int64_t y[4] = {0, 2, 1, 2};
    return ca_from_host(dev, CA_I64, CA_SHAPE(4), y);
}

/* Which ops run in low precision, and that gradients reach the optimizer in f32. */
static void test_autocast_policy(void **state) {
    ca_accelerator *acc = make_acc("bf16");
    ca_module *m = mlp();
    T_OK(ca_prepare(acc, m, NULL, NULL));
    ca_device *dev = ca_accelerator_device(acc);
    CA_SCOPE {
        ca_tensor *x = data_x(dev);
        ca_tensor *h = ca_module_forward(ca_module_child(m, "fc1"), x);
        /* a child called on its own is outside the prepared forward: plain f32 */
        assert_int_equal(ca_tensor_dtype(h), CA_F32);
        ca_tensor *logits = T_NN(ca_module_forward(m, x));
        assert_int_equal(ca_tensor_dtype(logits), CA_BF16);      /* linear: low precision */
        ca_tensor *p = ca_softmax(logits);
        assert_int_equal(ca_tensor_dtype(p), CA_BF16);           /* outside autocast: the input's dtype */
        ca_tensor *loss = T_NN(ca_cross_entropy(logits, data_y(dev)));
        assert_int_equal(ca_tensor_dtype(loss), CA_F32);         /* losses in f32 */
        T_OK(ca_backward(acc, loss));
        for (int i = 0; i < ca_module_num_params(m); i++) {
            ca_tensor *g = ca_tensor_grad(ca_module_param_at(m, i));
            assert_non_null(g);
            assert_int_equal(ca_tensor_dtype(g), CA_F32);        /* master gradients in f32 */
            assert_int_equal(ca_tensor_dtype(ca_module_param_at(m, i)), CA_F32);
        }
    }
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
}

/* The low-precision weight is made once per step, not once per use, and again after a step. */
static void test_weight_copy_once_per_step(void **state) {
    ca_accelerator *acc = make_acc("bf16");
    ca_module *m = mlp();
    ca_optimizer *opt;
    T_OK(ca_sgd_create(m, &(ca_sgd_opts){.lr = 0.1}, &opt));
    T_OK(ca_prepare(acc, m, opt, NULL));
    ca_device *dev = ca_accelerator_device(acc);
    ca_tensor *w = ca_module_param(m, "fc1.weight");
    uint16_t before[48], again[48], after[48];
    CA_SCOPE {
        ca_tensor *x = data_x(dev);
        T_OK(ca_backward(acc, ca_cross_entropy(ca_module_forward(m, x), data_y(dev))));
        /* the cached copy equals the weight rounded to bf16 */
        T_OK(ca_tensor_to_host(ca_cast(w, CA_BF16), before, sizeof before));
        ca_tensor *copy = w->lowp;
        uint64_t made = w->lowp_version;
        assert_non_null(copy);
        assert_int_equal(ca_tensor_dtype(copy), CA_BF16);
        T_OK(ca_tensor_to_host(copy, again, sizeof again));
        assert_memory_equal(before, again, sizeof before);
        ca_module_forward(m, x);                          /* a second use: the same copy, not remade */
        assert_ptr_equal(w->lowp, copy);
        assert_int_equal(w->lowp_version, made);
        T_OK(ca_optimizer_step(opt));
        ca_optimizer_zero_grad(opt);
        T_OK(ca_tensor_to_host(ca_cast(w, CA_BF16), after, sizeof after));
        assert_memory_not_equal(before, after, sizeof before);
        assert_int_not_equal(w->version, made);           /* the step made the copy stale */
        /* the forward after the step uses the new weights: its output matches a manual bf16 linear */
        ca_tensor *y = ca_module_forward(ca_module_child(m, "fc1"), x);
        CA_NO_GRAD {
            ca_tensor *yl = ca_linear(ca_cast(x, CA_BF16), ca_cast(w, CA_BF16),
                                      ca_cast(ca_module_param(m, "fc1.bias"), CA_BF16));
            float *a = t_host(y), *b = t_host(ca_cast(yl, CA_F32));
            for (int i = 0; i < 32; i++) assert_float_equal(a[i], b[i], 0.02f * (1 + fabsf(b[i])));
            free(a); free(b);
        }
        ca_module_forward(m, x);
        assert_int_equal(w->lowp_version, w->version);    /* remade once for the new step */
    }
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
}

static float *param_copy(ca_module *m) {
    int64_t n = ca_module_param_count(m), off = 0;
    float *h = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < ca_module_num_params(m); i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        T_OK(ca_tensor_to_host(p, h + off, ca_tensor_nbytes(p)));
        off += ca_tensor_numel(p);
    }
    return h;
}

/* An Inf in a gradient: the step is skipped (no parameter or state change) and the scale halves. */
static void test_fp16_overflow_skips_and_backs_off(void **state) {
    ca_accelerator *acc = make_acc("fp16");
    ca_module *m = mlp();
    ca_optimizer *opt;
    T_OK(ca_adamw_create(m, NULL, &opt));
    T_OK(ca_prepare(acc, m, opt, NULL));
    ca_device *dev = ca_accelerator_device(acc);
    ca_grad_scaler_state st;
    T_OK(ca_grad_scaler_get(acc, &st));
    assert_float_equal(st.scale, 65536.0, 0);
    int64_t n = ca_module_param_count(m);
    CA_SCOPE {
        T_OK(ca_backward(acc, ca_cross_entropy(ca_module_forward(m, data_x(dev)), data_y(dev))));
        /* the gradient is the scaled one: unscaled it matches an f32 backward within fp16 error */
        ca_tensor *g = ca_tensor_grad(ca_module_param(m, "fc2.bias"));
        float gb[3];
        T_OK(ca_tensor_to_host(g, gb, sizeof gb));
        assert_true(fabsf(gb[0]) > 100.0f);
        gb[1] = INFINITY;
        T_OK(ca_tensor_copy_from_host(g, gb, sizeof gb));
        float *before = param_copy(m);
        T_OK(ca_optimizer_step(opt));
        assert_true(ca_optimizer_step_was_skipped(opt));
        float *after = param_copy(m);
        assert_memory_equal(before, after, sizeof(float) * (size_t)n);
        assert_int_equal(ca_optimizer_steps(opt), 0);
        for (int i = 0; i < ca_optimizer_num_state(opt); i++) {      /* state untouched */
            float *s = t_host(ca_optimizer_state_at(opt, i, NULL));
            for (int64_t j = 0; j < ca_tensor_numel(ca_optimizer_state_at(opt, i, NULL)); j++)
                assert_float_equal(s[j], 0.0f, 0);
            free(s);
        }
        free(before);
        free(after);
    }
    T_OK(ca_grad_scaler_get(acc, &st));
    assert_float_equal(st.scale, 32768.0, 0);
    assert_int_equal(st.growth_tracker, 0);
    ca_optimizer_zero_grad(opt);
    CA_SCOPE {   /* the next clean step is applied */
        T_OK(ca_backward(acc, ca_cross_entropy(ca_module_forward(m, data_x(dev)), data_y(dev))));
        T_OK(ca_optimizer_step(opt));
        assert_false(ca_optimizer_step_was_skipped(opt));
        assert_int_equal(ca_optimizer_steps(opt), 1);
    }
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
}

/* growth_interval (2000) clean steps double the scale. */
static void test_fp16_growth_after_2000_clean_steps(void **state) {
    ca_accelerator *acc = make_acc("fp16");
    ca_module *m = mlp();
    ca_optimizer *opt;
    T_OK(ca_sgd_create(m, &(ca_sgd_opts){.lr = 1e-3}, &opt));
    T_OK(ca_prepare(acc, m, opt, NULL));
    ca_device *dev = ca_accelerator_device(acc);
    ca_tensor *x = ca_tensor_keep(data_x(dev)), *y = ca_tensor_keep(data_y(dev));
    ca_grad_scaler_state st;
    for (int i = 0; i < 2000; i++) {
        CA_SCOPE {
            T_OK(ca_backward(acc, ca_cross_entropy(ca_module_forward(m, x), y)));
            T_OK(ca_optimizer_step(opt));
            ca_optimizer_zero_grad(opt);
        }
        if (i == 1998) {
            T_OK(ca_grad_scaler_get(acc, &st));
            assert_float_equal(st.scale, 65536.0, 0);
            assert_int_equal(st.growth_tracker, 1999);
        }
    }
    T_OK(ca_grad_scaler_get(acc, &st));
    assert_float_equal(st.scale, 131072.0, 0);
    assert_int_equal(st.growth_tracker, 0);
    assert_int_equal(ca_optimizer_steps(opt), 2000);
    /* the state is plain numbers a checkpoint restores */
    T_OK(ca_grad_scaler_set(acc, &(ca_grad_scaler_state){.scale = 1024, .growth_tracker = 7}));
    T_OK(ca_grad_scaler_get(acc, &st));
    assert_true(st.scale == 1024 && st.growth_tracker == 7);
    assert_int_equal(ca_grad_scaler_set(acc, &(ca_grad_scaler_state){.scale = 0}), CA_ERR_INVALID);
    ca_tensor_free(x);
    ca_tensor_free(y);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
}

/* Gradients of a run (scaled or not), after clip_grad_norm: fp16 unscales exactly once. */
static float *clipped_grads(const char *mp, double *norm) {
    ca_accelerator *acc = make_acc(mp);
    ca_manual_seed(9);
    ca_module *m;
    T_OK(ca_linear_create(6, 3, true, &m));
    ca_optimizer *opt;
    T_OK(ca_sgd_create(m, &(ca_sgd_opts){.lr = 0.5}, &opt));
    T_OK(ca_prepare(acc, m, opt, NULL));
    ca_device *dev = ca_accelerator_device(acc);
    CA_SCOPE {
        T_OK(ca_backward(acc, ca_cross_entropy(ca_module_forward(m, data_x(dev)), data_y(dev))));
        T_OK(ca_clip_grad_norm(acc, 0.1, norm));
        T_OK(ca_optimizer_step(opt));          /* must not unscale a second time */
    }
    float *p = param_copy(m);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
    return p;
}

static void test_fp16_clip_after_single_unscale(void **state) {
    double n32, n16;
    float *p32 = clipped_grads("no", &n32), *p16 = clipped_grads("fp16", &n16);
    assert_float_equal(n16, n32, 0.01 * n32);         /* the norm of unscaled gradients */
    for (int i = 0; i < 21; i++) assert_float_equal(p16[i], p32[i], 2e-3);
    free(p32);
    free(p16);
}

/* Options left 0 keep their defaults: {.growth_interval = 1} changes only
 * the interval (it used to be refused, init_scale 0 being invalid). */
static void test_scaler_partial_options(void **state) {
    ca_accelerator *acc = make_acc("fp16");
    T_OK(ca_grad_scaler_configure(acc, &(ca_grad_scaler_opts){.growth_interval = 1}));
    ca_module *m = mlp();
    ca_optimizer *opt;
    T_OK(ca_sgd_create(m, &(ca_sgd_opts){.lr = 1e-3}, &opt));
    T_OK(ca_prepare(acc, m, opt, NULL));
    ca_device *dev = ca_accelerator_device(acc);
    ca_grad_scaler_state st;
    T_OK(ca_grad_scaler_get(acc, &st));
    assert_float_equal(st.scale, 65536.0, 0);   /* default init_scale */
    CA_SCOPE {
        T_OK(ca_backward(acc, ca_cross_entropy(ca_module_forward(m, data_x(dev)), data_y(dev))));
        T_OK(ca_optimizer_step(opt));
    }
    T_OK(ca_grad_scaler_get(acc, &st));
    assert_float_equal(st.scale, 131072.0, 0);  /* one clean step, default growth_factor 2 */
    ca_optimizer_zero_grad(opt);
    CA_SCOPE {
        T_OK(ca_backward(acc, ca_cross_entropy(ca_module_forward(m, data_x(dev)), data_y(dev))));
        ca_tensor *g = ca_tensor_grad(ca_module_param(m, "fc2.bias"));
        float gb[3];
        T_OK(ca_tensor_to_host(g, gb, sizeof gb));
        gb[0] = INFINITY;
        T_OK(ca_tensor_copy_from_host(g, gb, sizeof gb));
        T_OK(ca_optimizer_step(opt));
    }
    T_OK(ca_grad_scaler_get(acc, &st));
    assert_float_equal(st.scale, 65536.0, 0);   /* overflow, default backoff_factor 0.5 */
    assert_int_equal(ca_grad_scaler_configure(acc, &(ca_grad_scaler_opts){.backoff_factor = 2}), CA_ERR_INVALID);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_autocast_policy),
        cmocka_unit_test(test_weight_copy_once_per_step),
        cmocka_unit_test(test_fp16_overflow_skips_and_backs_off),
        cmocka_unit_test(test_fp16_growth_after_2000_clean_steps),
        cmocka_unit_test(test_fp16_clip_after_single_unscale),
        cmocka_unit_test(test_scaler_partial_options),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
