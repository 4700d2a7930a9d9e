/* Activation checkpointing: gradients with recomputation equal those without (bit for bit on the
 * CPU), dropout masks are replayed, the saved activations shrink, and misuse is refused. */
#include "test_util.h"

#include <caccel/bert.h>

/* Every parameter's gradient (and the input's, when given) concatenated on the host. */
typedef struct grads {
    float *v;
    size_t n;
} grads;

static void grads_add(grads *g, const ca_tensor *t) {
    if (!t) fail_msg("a tensor got no gradient");
    size_t k = (size_t)ca_tensor_numel(t);
    float *h = t_host(t);
    g->v = realloc(g->v, (g->n + k) * sizeof *g->v);
    memcpy(g->v + g->n, h, k * sizeof *h);
    g->n += k;
    free(h);
}

static grads module_grads(ca_module *m, const ca_tensor *x) {
    grads g = {0};
    for (int i = 0; i < ca_module_num_params(m); i++) grads_add(&g, ca_tensor_grad(ca_module_param_at(m, i)));
    if (x) grads_add(&g, ca_tensor_grad(x));
    return g;
}

static void assert_same(const grads *a, const grads *b, const char *what) {
    assert_int_equal(a->n, b->n);
    for (size_t i = 0; i < a->n; i++)
        if (memcmp(&a->v[i], &b->v[i], sizeof(float)) != 0)
            fail_msg("%s: gradient %zu differs: %.9g without checkpointing, %.9g with", what, i, a->v[i], b->v[i]);
}

static bool any_nonzero(const grads *g) {
    for (size_t i = 0; i < g->n; i++)
        if (g->v[i] != 0) return true;
    return false;
}

/* Sequential of `depth` blocks Sequential(Linear(w, w), GELU[, Dropout(p)]). */
static ca_module *deep_mlp_p(int depth, int64_t w, double p) {
    ca_manual_seed(3);
    ca_module *root, *blk, *l;
    T_OK(ca_sequential_create(&root));
    for (int i = 0; i < depth; i++) {
        T_OK(ca_sequential_create(&blk));
        T_OK(ca_linear_create(w, w, true, &l));
        T_OK(ca_module_add(blk, NULL, l));
        T_OK(ca_gelu_create(&l));
        T_OK(ca_module_add(blk, NULL, l));
        if (p > 0) {
            T_OK(ca_dropout_create(p, &l));
            T_OK(ca_module_add(blk, NULL, l));
        }
        T_OK(ca_module_add(root, NULL, blk));
    }
    return root;
}

static ca_module *deep_mlp(int depth, int64_t w) { return deep_mlp_p(depth, w, 0); }

/* loss = sum(model(x) * w) for a fixed w; returns the gradients of every parameter and of x. */
static grads mlp_step(ca_module *m, int64_t batch, int64_t w) {
    grads g = {0};
    CA_SCOPE {
        uint64_t seed = 11;
        ca_tensor *x = t_randn(&seed, CA_SHAPE(batch, w), -1, 1, 0);
        ca_tensor *wt = t_randn(&seed, CA_SHAPE(batch, w), -1, 1, 0);
        ca_tensor_set_requires_grad(x, true);
        ca_module_zero_grad(m);
        T_OK(ca_autograd_backward(ca_sum(ca_mul(ca_module_forward(m, x), wt))));
        g = module_grads(m, x);
    }
    return g;
}

static void test_mlp_gradients_bit_identical(void **state) {
    (void)state;
    ca_module *m = deep_mlp(6, 32);
    grads plain = mlp_step(m, 16, 32);
    int marked = 0;
    T_OK(ca_module_checkpoint_layers(m, true, &marked));
    assert_int_equal(marked, 6);
    assert_true(ca_module_checkpointing(ca_module_child(m, "3")));
    assert_false(ca_module_checkpointing(m));
    grads ck = mlp_step(m, 16, 32);
    assert_true(any_nonzero(&plain));
    assert_same(&plain, &ck, "MLP");
    free(plain.v);
    free(ck.v);
    ca_module_destroy(m);
}

/* ------------------------------------------------------------------ a block with dropout */

typedef struct drop_block {
    ca_module *fc1, *fc2;
    double p;
} drop_block;

/* fc2(dropout(gelu(fc1(x)))) + dropout(x): two draws from the generator per call. */
static ca_tensor *drop_forward(const drop_block *d, ca_tensor *x) {
    ca_tensor *h = ca_dropout(ca_gelu(ca_module_forward(d->fc1, x)), d->p, true);
    return ca_add(ca_module_forward(d->fc2, h), ca_dropout(x, d->p, true));
}

static ca_status drop_fn(void *ctx, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out) {
    (void)n_in;
    (void)n_out;
    out[0] = drop_forward(ctx, in[0]);
    return out[0] ? CA_OK : ca_last_status();
}

static grads drop_step(drop_block *d, bool checkpoint, uint64_t start, uint64_t *rng_after_forward,
                       uint64_t *rng_after_backward) {
    grads g = {0};
    ca_rng_set_state(99, start);
    CA_SCOPE {
        uint64_t seed = 5, unused;
        ca_tensor *x = t_randn(&seed, CA_SHAPE(8, 16), -1, 1, 0);
        ca_tensor_set_requires_grad(x, true);
        ca_tensor_zero_grad(x);
        ca_tensor_zero_grad(ca_module_param(d->fc1, "weight"));
        ca_tensor_zero_grad(ca_module_param(d->fc1, "bias"));
        ca_tensor_zero_grad(ca_module_param(d->fc2, "weight"));
        ca_tensor_zero_grad(ca_module_param(d->fc2, "bias"));
        ca_tensor *h = x;
        for (int i = 0; i < 3; i++) {   /* three blocks sharing weights, each with its own masks */
            if (checkpoint) T_OK(ca_checkpoint(drop_fn, d, 1, &h, 1, &h));
            else h = drop_forward(d, h);
        }
        ca_rng_get_state(&unused, rng_after_forward);
        T_OK(ca_autograd_backward(ca_sum(ca_mul(h, h))));
        ca_rng_get_state(&unused, rng_after_backward);
        grads_add(&g, ca_tensor_grad(ca_module_param(d->fc1, "weight")));
        grads_add(&g, ca_tensor_grad(ca_module_param(d->fc1, "bias")));
        grads_add(&g, ca_tensor_grad(ca_module_param(d->fc2, "weight")));
        grads_add(&g, ca_tensor_grad(ca_module_param(d->fc2, "bias")));
        grads_add(&g, ca_tensor_grad(x));
    }
    return g;
}

static void test_dropout_masks_replayed(void **state) {
    (void)state;
    ca_manual_seed(4);
    drop_block d = {.p = 0.5};
    T_OK(ca_linear_create(16, 32, true, &d.fc1));
    T_OK(ca_linear_create(32, 16, true, &d.fc2));
    uint64_t f0, b0, f1, b1;
    grads plain = drop_step(&d, false, 1000, &f0, &b0);
    grads ck = drop_step(&d, true, 1000, &f1, &b1);
    grads other = drop_step(&d, false, 5000, &b0, &b0);   /* other masks: other gradients */
    assert_true(f0 > 1000);                   /* dropout drew from the generator */
    assert_int_equal(f0, f1);
    assert_int_equal(b1, f1);                 /* the replay leaves the generator where forward did */
    assert_same(&plain, &ck, "dropout block");
    assert_int_equal(other.n, plain.n);
    assert_true(memcmp(other.v, plain.v, plain.n * sizeof *plain.v) != 0);
    free(other.v);
    free(plain.v);
    free(ck.v);
    ca_module_destroy(d.fc1);
    ca_module_destroy(d.fc2);
}

/* ------------------------------------------------------------------ several inputs and outputs */

typedef struct two_out {
    ca_tensor *w;
} two_out;

/* (a, b, mask) -> (relu(a @ w) * mask, tanh(a @ w + b)) with a and b requiring grad. */
static ca_status two_fn(void *ctx, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out) {
    assert_int_equal(n_in, 3);
    assert_int_equal(n_out, 2);
    two_out *t = ctx;
    ca_tensor *h = ca_matmul(in[0], t->w);
    out[0] = ca_mul(ca_relu(h), in[2]);
    out[1] = ca_tanh(ca_add(h, in[1]));
    return out[0] && out[1] ? CA_OK : ca_last_status();
}

static grads two_step(two_out *t, bool checkpoint, int use) {
    grads g = {0};
    CA_SCOPE {
        uint64_t seed = 8;
        ca_tensor *a0 = t_randn(&seed, CA_SHAPE(4, 6), -1, 1, 0);
        ca_tensor *b = t_randn(&seed, CA_SHAPE(4, 5), -1, 1, 0);
        ca_tensor *mask = t_randn(&seed, CA_SHAPE(4, 5), 0, 1, 0);
        ca_tensor_set_requires_grad(a0, true);
        ca_tensor_set_requires_grad(b, true);
        ca_tensor_zero_grad(t->w);
        ca_tensor *a = ca_mul(a0, a0);             /* an input with history */
        ca_tensor *in[3] = {a, b, mask}, *out[2];
        if (checkpoint) T_OK(ca_checkpoint(two_fn, t, 3, in, 2, out));
        else T_OK(two_fn(t, 3, in, 2, out));
        assert_false(ca_tensor_requires_grad(mask));
        ca_tensor *loss = use == 0 ? ca_sum(out[0]) : use == 1 ? ca_sum(out[1])
                                   : ca_add(ca_sum(out[0]), ca_mul(ca_sum(out[1]), ca_sum(a0) /* a0 used outside too */));
        T_OK(ca_autograd_backward(loss));
        grads_add(&g, ca_tensor_grad(t->w));
        grads_add(&g, ca_tensor_grad(a0));
        if (use != 0) grads_add(&g, ca_tensor_grad(b));
    }
    return g;
}

static void test_several_inputs_and_outputs(void **state) {
    (void)state;
    two_out t;
    uint64_t seed = 21;
    CA_SCOPE {
        T_OK(ca_parameter_create(ca_cpu_device(), CA_F32, CA_SHAPE(6, 5), &t.w));
        T_OK(ca_tensor_copy_(t.w, t_randn(&seed, CA_SHAPE(6, 5), -1, 1, 0)));
    }
    for (int use = 0; use < 3; use++) {
        grads plain = two_step(&t, false, use), ck = two_step(&t, true, use);
        assert_same(&plain, &ck, use == 0 ? "first output" : use == 1 ? "second output" : "both outputs");
        free(plain.v);
        free(ck.v);
    }
    ca_tensor_free(t.w);
}

/* ------------------------------------------------------------------ nesting, no_grad, hooks */

static ca_status inner_fn(void *ctx, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out) {
    (void)n_in;
    (void)n_out;
    out[0] = ca_tanh(ca_matmul(in[0], ctx));
    return out[0] ? CA_OK : ca_last_status();
}

static ca_status outer_fn(void *ctx, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out) {
    (void)n_in;
    ca_tensor *h = in[0];
    for (int i = 0; i < 2; i++)
        if (ca_checkpoint(inner_fn, ctx, 1, &h, n_out, &h) != CA_OK) return ca_last_status();
    out[0] = ca_mul(h, in[0]);
    return out[0] ? CA_OK : ca_last_status();
}

static int hook_calls;
static float hook_seen;

static void hook(ca_tensor *leaf, void *ctx) {
    (void)ctx;
    hook_calls++;
    float *g = t_host(ca_tensor_grad(leaf));
    hook_seen = g[0];
    free(g);
}

static float nested_step(ca_tensor *w, bool checkpoint) {
    float g0 = 0;
    CA_SCOPE {
        uint64_t seed = 2;
        ca_tensor *x = t_randn(&seed, CA_SHAPE(3, 4), -1, 1, 0), *y;
        ca_tensor_zero_grad(w);
        hook_calls = 0;
        if (checkpoint) T_OK(ca_checkpoint(outer_fn, w, 1, &x, 1, &y));
        else T_OK(outer_fn(w, 1, &x, 1, &y));
        /* w is also used after the region: its hook must wait for the recompute */
        T_OK(ca_autograd_backward(ca_sum(ca_matmul(y, w))));
        assert_int_equal(hook_calls, 1);
        float *g = t_host(ca_tensor_grad(w));
        g0 = g[0];
        free(g);
        assert_true(hook_seen == g0);
    }
    return g0;
}

static void test_nested_and_hooks(void **state) {
    (void)state;
    ca_tensor *w;
    uint64_t seed = 6;
    CA_SCOPE {
        T_OK(ca_parameter_create(ca_cpu_device(), CA_F32, CA_SHAPE(4, 4), &w));
        T_OK(ca_tensor_copy_(w, t_randn(&seed, CA_SHAPE(4, 4), -1, 1, 0)));
    }
    ca_tensor_set_grad_hook(w, hook, NULL);
    float plain = nested_step(w, false), ck = nested_step(w, true);
    if (memcmp(&plain, &ck, sizeof plain) != 0) fail_msg("nested: %.9g without, %.9g with", plain, ck);
    CA_SCOPE CA_NO_GRAD {   /* under no_grad the function just runs */
        uint64_t s2 = 3;
        ca_tensor *x = t_randn(&s2, CA_SHAPE(3, 4), -1, 1, 0), *y;
        T_OK(ca_checkpoint(outer_fn, w, 1, &x, 1, &y));
        assert_false(ca_tensor_requires_grad(y));
    }
    ca_tensor_free(w);
}

/* ------------------------------------------------------------------ misuse */

static ca_tensor *captured;

static ca_status capture_fn(void *ctx, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out) {
    (void)ctx;
    (void)n_in;
    (void)n_out;
    out[0] = ca_add(in[0], captured);
    return out[0] ? CA_OK : ca_last_status();
}

static int draws;

static ca_status flaky_fn(void *ctx, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out) {
    (void)ctx;
    (void)n_in;
    (void)n_out;
    out[0] = ca_dropout(in[0], draws++ == 0 ? 0.5 : 0.0, true);   /* draws only the first time */
    return out[0] ? CA_OK : ca_last_status();
}

static void test_misuse_refused(void **state) {
    (void)state;
    CA_SCOPE {
        uint64_t seed = 1;
        ca_tensor *x = t_randn(&seed, CA_SHAPE(8), -1, 1, 0), *y[9];
        ca_tensor_set_requires_grad(x, true);
        captured = ca_mul(x, x);
        assert_int_equal(ca_checkpoint(capture_fn, NULL, 1, &x, 1, y), CA_ERR_INVALID);
        assert_non_null(strstr(ca_last_error(), "not among its inputs"));
        assert_int_equal(ca_checkpoint(capture_fn, NULL, 1, &x, 9, y), CA_ERR_INVALID);
        assert_non_null(strstr(ca_last_error(), "at most 8"));
        assert_int_equal(ca_checkpoint(NULL, NULL, 1, &x, 1, y), CA_ERR_INVALID);
        draws = 0;
        T_OK(ca_checkpoint(flaky_fn, NULL, 1, &x, 1, y));
        assert_int_equal(ca_autograd_backward(ca_sum(y[0])), CA_ERR_STATE);
        assert_non_null(strstr(ca_last_error(), "must be deterministic"));
        assert_int_equal(ca_module_set_checkpointing(NULL, true), CA_ERR_INVALID);
    }
    ca_clear_error();
}

/* ------------------------------------------------------------------ memory */

/* Bytes the allocator still holds after forward (the saved activations) and its peak over the step. */
static void mlp_memory(ca_module *m, size_t *saved, size_t *peak) {
    ca_device *dev = ca_cpu_device();
    ca_allocator_stats st;
    CA_SCOPE {
        uint64_t seed = 4;
        ca_tensor *x = t_randn(&seed, CA_SHAPE(64, 256), -1, 1, 0);
        /* no zero_grad: the parameters' gradients stay allocated (accumulating), so `before` counts
         * them and the peak over it is the activations' and the backward's own */
        T_OK(ca_device_memory_stats(dev, &st));
        size_t before = st.allocated;
        T_OK(ca_device_reset_peak_stats(dev));
        ca_tensor *y = ca_module_forward(m, x);
        ca_tensor *loss = ca_mean(ca_mul(y, y));
        T_OK(ca_device_memory_stats(dev, &st));
        *saved = st.allocated - before;
        T_OK(ca_autograd_backward(loss));
        T_OK(ca_device_memory_stats(dev, &st));
        *peak = st.peak_allocated - before;
    }
}

static void test_saved_activations_shrink(void **state) {
    (void)state;
    ca_module *m = deep_mlp(8, 256);
    size_t saved0, peak0, saved1, peak1;
    mlp_memory(m, &saved0, &peak0);          /* gradients of the parameters exist from here on */
    mlp_memory(m, &saved0, &peak0);
    T_OK(ca_module_checkpoint_layers(m, true, NULL));
    mlp_memory(m, &saved1, &peak1);
    print_message("saved activations: %zu bytes without checkpointing, %zu with; peak %zu / %zu\n", saved0, saved1,
                  peak0, peak1);
    /* without: each block keeps its linear output and its GELU output; with: only block outputs */
    assert_true(saved1 * 3 < saved0 * 2);
    assert_true(peak1 < peak0);
    /* each intermediate gradient is freed once its node has run (ca_grad_release): the backward
     * holds the saved activations and the gradients in flight, not every gradient of the pass
     * (which took the peak to 2.1x the saved activations) */
    assert_true(peak0 * 2 < saved0 * 3);
    ca_module_destroy(m);
}

/* ------------------------------------------------------------------ BERT */

static grads bert_step(ca_module *m) {
    grads g = {0};
    ca_rng_set_state(17, 0);
    CA_SCOPE {
        int64_t ids[2 * 6] = {1, 5, 7, 2, 9, 3, 4, 4, 8, 11, 0, 0};
        float mask[2 * 6] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
        ca_bert_output o;
        ca_module_zero_grad(m);
        T_OK(ca_bert_forward(m, ca_from_host(ca_cpu_device(), CA_I64, CA_SHAPE(2, 6), ids),
                             ca_from_host(ca_cpu_device(), CA_F32, CA_SHAPE(2, 6), mask), NULL, &o));
        T_OK(ca_autograd_backward(ca_add(ca_sum(ca_mul(o.last_hidden_state, o.last_hidden_state)),
                                         ca_sum(o.pooler_output))));
        g = module_grads(m, NULL);
    }
    return g;
}

static void test_bert_layers(void **state) {
    (void)state;
    ca_bert_config c = {.vocab_size = 16, .hidden_size = 16, .num_hidden_layers = 3, .num_attention_heads = 2,
                        .intermediate_size = 32, .hidden_act = "gelu", .hidden_dropout_prob = 0.1,
                        .attention_probs_dropout_prob = 0.1, .max_position_embeddings = 8, .type_vocab_size = 2,
                        .layer_norm_eps = 1e-12, .pad_token_id = 0, .num_labels = 2};
    ca_manual_seed(1);
    ca_module *m;
    T_OK(ca_bert_model_create(&c, &m));
    ca_module_train(m, true);
    grads plain = bert_step(m);
    int marked = 0;
    T_OK(ca_module_checkpoint_layers(m, true, &marked));
    assert_int_equal(marked, 3);
    assert_true(ca_module_checkpointing(ca_module_child(m, "encoder.layer.2")));
    grads ck = bert_step(m);
    assert_same(&plain, &ck, "BERT");
    free(plain.v);
    free(ck.v);
    ca_module_destroy(m);
}

/* ------------------------------------------------------------------ the accelerator's key */

/* One bf16 step through a prepared model: the recompute must run under the forward's autocast. */
static grads accelerated_step(const char *const *settings, bool expect_marked) {
    static char *argv[] = {"test", "--cpu", NULL};
    ca_accelerator *acc;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv, .settings = settings}, &acc));
    ca_module *m = deep_mlp_p(4, 32, 0.25);
    T_OK(ca_prepare(acc, m, NULL, NULL));
    assert_int_equal(ca_module_checkpointing(ca_module_child(m, "2")), expect_marked);
    grads g = {0};
    ca_rng_set_state(23, 0);
    CA_SCOPE {
        uint64_t seed = 12;
        ca_tensor *x = t_randn(&seed, CA_SHAPE(16, 32), -1, 1, 0);
        ca_tensor *y = ca_module_forward(m, x);
        assert_int_equal(ca_tensor_dtype(y), CA_BF16);
        T_OK(ca_backward(acc, ca_mean(ca_cast(ca_mul(y, y), CA_F32))));
        g = module_grads(m, NULL);
    }
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
    return g;
}

static void test_fsdp_activation_checkpointing_key(void **state) {
    (void)state;
    const char *plain_cfg[] = {"mixed_precision=bf16", NULL};
    const char *ck_cfg[] = {"mixed_precision=bf16", "fsdp_config.fsdp_activation_checkpointing=true", NULL};
    grads plain = accelerated_step(plain_cfg, false), ck = accelerated_step(ck_cfg, true);
    assert_true(any_nonzero(&plain));
    assert_same(&plain, &ck, "bf16 MLP with dropout");
    free(plain.v);
    free(ck.v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_gradients_bit_identical),
        cmocka_unit_test(test_dropout_masks_replayed),
        cmocka_unit_test(test_several_inputs_and_outputs),
        cmocka_unit_test(test_nested_and_hooks),
        cmocka_unit_test(test_misuse_refused),
        cmocka_unit_test(test_saved_activations_shrink),
        cmocka_unit_test(test_bert_layers),
        cmocka_unit_test(test_fsdp_activation_checkpointing_key),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    ca_scope_release_all();
    return r;
}
