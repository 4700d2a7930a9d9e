/* Frozen parameters (requires_grad false), one process: the module helpers (PEFT's
 * print_trainable_parameters line), no optimizer state and no step for a frozen parameter (also one
 * frozen after the optimizer was made), clipping over the trainable gradients only, a bf16 frozen
 * base under bf16 mixed precision with an f32 adapter, save_state/load_state keeping requires_grad
 * and the optimizer state (ca_save_model writing every parameter), activation checkpointing over a
 * frozen layer, and the refusal of a trainable set changed after ca_prepare. The
 * multi-process side (DDP and ZeRO buckets and shards) is tests/test_frozen_ranks.sh. */
#include "test_util.h"

static char *argv_cpu[] = {"test", "--cpu", NULL};

/* fc1 Linear(8, 16) (144 parameters), tanh, fc2 Linear(16, 3) (51). */
static ca_module *mlp(void) {
    ca_module *m, *l;
    T_OK(ca_sequential_create(&m));
    T_OK(ca_linear_create(8, 16, true, &l)); T_OK(ca_module_add(m, "fc1", l));
    T_OK(ca_tanh_create(&l));                T_OK(ca_module_add(m, "act", l));
    T_OK(ca_linear_create(16, 3, true, &l)); T_OK(ca_module_add(m, "fc2", l));
    return m;
}

static ca_tensor *batch_x(uint64_t seed) {
    float x[4 * 8];
    for (int i = 0; i < 4 * 8; i++) x[i] = t_randf(&seed, -1, 1);
    return ca_from_host(ca_cpu_device(), CA_F32, CA_SHAPE(4, 8), x);
}

static ca_tensor *loss_of(ca_module *m, uint64_t seed) {
    ca_tensor *y = ca_module_forward(m, batch_x(seed));
    return ca_mean(ca_mul(y, y));
}

static void *host_copy(ca_tensor *t) {
    void *h = malloc(ca_tensor_nbytes(t));
    T_OK(ca_tensor_to_host(t, h, ca_tensor_nbytes(t)));
    return h;
}

static void assert_unchanged(ca_tensor *t, const void *before) {
    void *now = host_copy(t);
    assert_memory_equal(now, before, ca_tensor_nbytes(t));
    free(now);
}

static void assert_changed(ca_tensor *t, const void *before) {
    void *now = host_copy(t);
    assert_true(memcmp(now, before, ca_tensor_nbytes(t)) != 0);
    free(now);
}

static void test_module_helpers(void **state) {
    (void)state;
    ca_manual_seed(1);
    ca_module *m = mlp();
    int64_t t, a;
    ca_module_get_nb_trainable_parameters(m, &t, &a);
    assert_int_equal(t, 195);
    assert_int_equal(a, 195);
    T_OK(ca_module_requires_grad(ca_module_child(m, "fc1"), false));
    assert_false(ca_tensor_requires_grad(ca_module_param(m, "fc1.weight")));
    assert_true(ca_tensor_requires_grad(ca_module_param(m, "fc2.bias")));
    assert_int_equal(ca_module_num_trainable_params(m), 51);
    assert_int_equal(ca_module_trainable_bytes(m), 51 * 4);
    char buf[160];
    ca_module_trainable_summary(m, buf, sizeof buf);
    assert_string_equal(buf, "trainable params: 51 || all params: 195 || trainable%: 26.1538");
    assert_int_equal(ca_module_requires_grad(NULL, true), CA_ERR_INVALID);
    ca_module_destroy(m);
    /* thousands separators, as Python's "{:,d}" */
    ca_module *big;
    T_OK(ca_linear_create(1000, 1000, true, &big));
    T_OK(ca_module_requires_grad(big, false));
    ca_module_trainable_summary(big, buf, sizeof buf);
    assert_string_equal(buf, "trainable params: 0 || all params: 1,001,000 || trainable%: 0.0000");
    ca_module_destroy(big);
}

/* AdamW over every parameter, fc1 frozen: state for fc2 only (2 x 51 f32), fc1 bit for bit. */
static void test_optimizer_no_state_no_step(void **state) {
    (void)state;
    ca_manual_seed(2);
    ca_module *m = mlp();
    T_OK(ca_module_requires_grad(ca_module_child(m, "fc1"), false));
    ca_optimizer *o;
    T_OK(ca_adamw_create(m, &(ca_adamw_opts){.lr = 0.05}, &o));
    void *w1 = host_copy(ca_module_param(m, "fc1.weight")), *w2 = host_copy(ca_module_param(m, "fc2.weight"));
    for (int step = 0; step < 3; step++) {
        CA_SCOPE {
            T_OK(ca_autograd_backward(loss_of(m, 10 + (uint64_t)step)));
            T_OK(ca_optimizer_step(o));
            ca_optimizer_zero_grad(o);
        }
    }
    assert_null(ca_tensor_grad(ca_module_param(m, "fc1.weight")));   /* autograd wrote none */
    assert_int_equal(ca_optimizer_state_bytes(o), 2 * 51 * 4);
    assert_int_equal(ca_optimizer_num_state(o), 4);
    const char *name = NULL;
    ca_optimizer_state_at(o, 0, &name);
    assert_string_equal(name, "state.2.exp_avg");   /* torch's numbering: the parameter's index */
    assert_unchanged(ca_module_param(m, "fc1.weight"), w1);
    assert_changed(ca_module_param(m, "fc2.weight"), w2);
    free(w1);
    free(w2);
    ca_optimizer_destroy(o);
    ca_module_destroy(m);
}

/* Frozen after the optimizer stepped, its gradient still there (no zero_grad): not stepped again,
 * as torch skips a parameter whose .grad is None (weight decay would move it otherwise). */
static void test_frozen_after_create(void **state) {
    (void)state;
    ca_manual_seed(3);
    ca_module *m = mlp();
    ca_optimizer *o;
    T_OK(ca_sgd_create(m, &(ca_sgd_opts){.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1}, &o));
    ca_tensor *w = ca_module_param(m, "fc2.weight");
    CA_SCOPE {
        T_OK(ca_autograd_backward(loss_of(m, 7)));
        T_OK(ca_optimizer_step(o));
    }
    ca_tensor_set_requires_grad(w, false);   /* the gradient stays defined */
    assert_non_null(ca_tensor_grad(w));
    void *before = host_copy(w);
    T_OK(ca_optimizer_step(o));
    assert_unchanged(w, before);
    free(before);
    ca_optimizer_destroy(o);
    ca_module_destroy(m);
}

/* Host gradient sum of squares of p. */
static double sumsq_grad(ca_tensor *p) {
    float *g = host_copy(ca_tensor_grad(p));
    double s = 0;
    for (int64_t i = 0; i < ca_tensor_numel(p); i++) s += (double)g[i] * g[i];
    free(g);
    return s;
}

/* A parameter frozen with its gradient still defined takes no part in clip_grad_norm: the norm is the
 * trainable gradients' only, and its gradient is not scaled. */
static void test_clip_ignores_frozen(void **state) {
    (void)state;
    ca_accelerator *acc;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv_cpu}, &acc));
    ca_manual_seed(4);
    ca_module *m = mlp();
    ca_optimizer *o;
    T_OK(ca_sgd_create(m, &(ca_sgd_opts){.lr = 0.1}, &o));
    T_OK(ca_prepare(acc, m, o, NULL));
    CA_SCOPE { T_OK(ca_backward(acc, ca_mul_scalar(loss_of(m, 9), 100.0))); }
    T_OK(ca_module_requires_grad(ca_module_child(m, "fc2"), true));   /* no-op: still trainable */
    ca_tensor *w1 = ca_module_param(m, "fc1.weight"), *b1 = ca_module_param(m, "fc1.bias");
    ca_tensor_set_requires_grad(w1, false);   /* gradient kept: only requires_grad says frozen */
    ca_tensor_set_requires_grad(b1, false);
    double want = sqrt(sumsq_grad(ca_module_param(m, "fc2.weight")) + sumsq_grad(ca_module_param(m, "fc2.bias")));
    void *g1 = host_copy(ca_tensor_grad(w1));
    double norm = 0;
    T_OK(ca_clip_grad_norm(acc, 1e-3, &norm));
    assert_true(fabs(norm - want) <= 1e-5 * want);
    assert_unchanged(ca_tensor_grad(w1), g1);
    double after = sqrt(sumsq_grad(ca_module_param(m, "fc2.weight")) + sumsq_grad(ca_module_param(m, "fc2.bias")));
    assert_true(fabs(after - 1e-3) <= 1e-6);
    free(g1);
    ca_optimizer_destroy(o);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
}

/* A base weight stored in bf16 and frozen, an f32 adapter beside it: y = x W^T + x A^T. */
typedef struct adapted { ca_tensor *w, *a; } adapted;

static ca_tensor *adapted_forward(ca_module *self, ca_tensor *x, void *ctx) {
    (void)self;
    adapted *p = ctx;
    return ca_add(ca_linear(x, p->w, NULL), ca_linear(x, p->a, NULL));
}

static void test_bf16_frozen_base(void **state) {
    (void)state;
    const char *const settings[] = {"mixed_precision=bf16", NULL};
    ca_accelerator *acc;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv_cpu, .settings = settings}, &acc));
    adapted p;
    ca_module *m;
    T_OK(ca_module_create("Adapted", adapted_forward, &p, NULL, &m));
    ca_manual_seed(5);
    p.w = ca_tensor_keep(ca_rand_normal(ca_cpu_device(), CA_BF16, CA_SHAPE(3, 8), 0, 1));
    p.a = ca_tensor_keep(ca_rand_normal(ca_cpu_device(), CA_F32, CA_SHAPE(3, 8), 0, 0.1));
    assert_non_null(p.w);
    T_OK(ca_module_add_param(m, "base", p.w));
    T_OK(ca_module_add_param(m, "adapter", p.a));
    ca_tensor_set_requires_grad(p.w, false);
    ca_tensor_set_requires_grad(p.a, true);
    ca_optimizer *o;
    T_OK(ca_adamw_create(m, &(ca_adamw_opts){.lr = 0.01}, &o));
    T_OK(ca_prepare(acc, m, o, NULL));
    void *w0 = host_copy(p.w), *a0 = host_copy(p.a);
    for (int step = 0; step < 2; step++) {
        CA_SCOPE {
            ca_tensor *y = ca_module_forward(m, batch_x(20 + (uint64_t)step));
            T_OK(ca_backward(acc, ca_mean(ca_mul(y, y))));
            T_OK(ca_optimizer_step(o));
            ca_optimizer_zero_grad(o);
        }
    }
    assert_int_equal(ca_tensor_dtype(p.w), CA_BF16);
    assert_null(ca_tensor_grad(p.w));
    assert_unchanged(p.w, w0);
    assert_changed(p.a, a0);
    assert_int_equal(ca_optimizer_state_bytes(o), 2 * 24 * 4);   /* f32 moments of the adapter only */
    free(w0);
    free(a0);
    ca_optimizer_destroy(o);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
}

/* ------------------------------------------------------------------ checkpoints */

static char g_dir[256];

typedef struct run { ca_accelerator *acc; ca_module *m; ca_optimizer *o; } run;

static void run_open(run *r, bool freeze, const char *const *settings) {
    T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv_cpu, .settings = settings}, &r->acc));
    ca_manual_seed(6);
    r->m = mlp();
    if (freeze) T_OK(ca_module_requires_grad(ca_module_child(r->m, "fc1"), false));
    T_OK(ca_adamw_create(r->m, &(ca_adamw_opts){.lr = 0.02}, &r->o));
    T_OK(ca_prepare(r->acc, r->m, r->o, NULL));
}

static void run_steps(run *r, int from, int n) {
    for (int step = from; step < from + n; step++) {
        CA_SCOPE {
            T_OK(ca_backward(r->acc, loss_of(r->m, 30 + (uint64_t)step)));
            T_OK(ca_optimizer_step(r->o));
            ca_optimizer_zero_grad(r->o);
        }
    }
}

static void run_close(run *r) {
    ca_optimizer_destroy(r->o);
    ca_module_destroy(r->m);
    ca_accelerator_destroy(r->acc);
}

/* Saved with fc1 frozen, loaded into a run that froze nothing: fc1 is frozen again, the optimizer's
 * state (fc2's only) is back, and the next steps equal the uninterrupted run's bit for bit. */
static void test_checkpoint_roundtrip(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/caccel-frozen-XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(g_dir));
    char ck[300];
    snprintf(ck, sizeof ck, "%s/ck", g_dir);
    run a, b;
    run_open(&a, true, NULL);
    run_steps(&a, 0, 3);
    T_OK(ca_save_state(a.acc, ck));
    assert_int_equal(ca_optimizer_num_state(a.o), 4);
    run_steps(&a, 3, 2);
    run_open(&b, false, NULL);
    T_OK(ca_load_state(b.acc, ck));
    assert_false(ca_tensor_requires_grad(ca_module_param(b.m, "fc1.weight")));
    assert_false(ca_tensor_requires_grad(ca_module_param(b.m, "fc1.bias")));
    assert_true(ca_tensor_requires_grad(ca_module_param(b.m, "fc2.weight")));
    assert_int_equal(ca_optimizer_num_state(b.o), 4);
    assert_int_equal(ca_optimizer_steps(b.o), 3);
    run_steps(&b, 3, 2);
    for (int i = 0; i < ca_module_num_params(a.m); i++) {
        void *pa = host_copy(ca_module_param_at(a.m, i));
        assert_unchanged(ca_module_param_at(b.m, i), pa);
        free(pa);
    }
    /* ca_save_model writes every parameter, frozen or not: a model of other values loads all four */
    char md[300];
    snprintf(md, sizeof md, "%s/model", g_dir);
    assert_int_equal(mkdir(md, 0700), 0);
    T_OK(ca_save_model(a.acc, a.m, md, 0));
    ca_manual_seed(99);
    ca_module *c = mlp();
    T_OK(ca_load_model(a.acc, c, md));
    for (int i = 0; i < ca_module_num_params(a.m); i++) {
        void *pa = host_copy(ca_module_param_at(a.m, i));
        assert_unchanged(ca_module_param_at(c, i), pa);
        free(pa);
    }
    ca_module_destroy(c);
    run_close(&a);
    run_close(&b);
    t_rm_tree(g_dir);
}

/* Activation checkpointing of a model whose first layer is frozen: no gradient for it, the trainable
 * layer's gradient bit for bit that of the plain backward. */
static void test_checkpointing_frozen(void **state) {
    (void)state;
    ca_module *m[2];
    for (int k = 0; k < 2; k++) {
        ca_manual_seed(8);
        m[k] = mlp();
        T_OK(ca_module_requires_grad(ca_module_child(m[k], "fc1"), false));
    }
    T_OK(ca_module_set_checkpointing(m[1], true));
    for (int k = 0; k < 2; k++) CA_SCOPE { T_OK(ca_autograd_backward(loss_of(m[k], 12))); }
    for (int k = 0; k < 2; k++) {
        assert_null(ca_tensor_grad(ca_module_param(m[k], "fc1.weight")));
        assert_null(ca_tensor_grad(ca_module_param(m[k], "fc1.bias")));
    }
    void *g = host_copy(ca_tensor_grad(ca_module_param(m[0], "fc2.weight")));
    assert_unchanged(ca_tensor_grad(ca_module_param(m[1], "fc2.weight")), g);
    free(g);
    for (int k = 0; k < 2; k++) ca_module_destroy(m[k]);
}

/* ZeRO (here stage 2 on one process) lays its shards out at ca_prepare over the trainable
 * parameters: a parameter frozen after it is refused at the next backward, naming it; a checkpoint
 * with another trainable set is refused at load_state. */
static void test_refused_after_prepare(void **state) {
    (void)state;
    const char *const settings[] = {"distributed_type=DEEPSPEED", "deepspeed_config.zero_stage=2", NULL};
    run r;
    run_open(&r, false, settings);
    run_steps(&r, 0, 1);
    ca_tensor_set_requires_grad(ca_module_param(r.m, "fc2.bias"), false);
    CA_SCOPE {
        assert_int_equal(ca_backward(r.acc, loss_of(r.m, 1)), CA_ERR_STATE);
        assert_non_null(strstr(ca_last_error(), "parameter fc2.bias was frozen after ca_prepare"));
    }
    ca_clear_error();
    ca_tensor_set_requires_grad(ca_module_param(r.m, "fc2.bias"), true);
    run_steps(&r, 1, 1);
    run_close(&r);
    /* saved with fc1 frozen, loaded into a run that prepared fc1 trainable */
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/caccel-frozen-XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(g_dir));
    char ck[300];
    snprintf(ck, sizeof ck, "%s/ck", g_dir);
    run_open(&r, true, settings);
    run_steps(&r, 0, 1);
    T_OK(ca_save_state(r.acc, ck));
    run_close(&r);
    run_open(&r, false, settings);
    assert_int_equal(ca_load_state(r.acc, ck), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "parameter fc1.weight is frozen in the checkpoint and trainable in the "
                                            "prepared model"));
    ca_clear_error();
    assert_true(ca_tensor_requires_grad(ca_module_param(r.m, "fc1.weight")));
    run_close(&r);
    /* a sharded state dict of stage 2 holds the flat space: the trainable parameters only */
    const char *const sharded[] = {"distributed_type=FSDP", "fsdp_config.fsdp_sharding_strategy=SHARD_GRAD_OP",
                                   "fsdp_config.fsdp_state_dict_type=SHARDED_STATE_DICT", NULL};
    run_open(&r, true, sharded);
    run_steps(&r, 0, 1);
    snprintf(ck, sizeof ck, "%s/sharded", g_dir);
    assert_int_equal(ca_save_state(r.acc, ck), CA_ERR_UNSUPPORTED);
    assert_non_null(strstr(ca_last_error(), "shards the trainable parameters only; 2 of the model's 4 are frozen"));
    ca_clear_error();
    run_close(&r);
    t_rm_tree(g_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_module_helpers),
        cmocka_unit_test(test_optimizer_no_state_no_step),
        cmocka_unit_test(test_frozen_after_create),
        cmocka_unit_test(test_clip_ignores_frozen),
        cmocka_unit_test(test_bf16_frozen_base),
        cmocka_unit_test(test_checkpoint_roundtrip),
        cmocka_unit_test(test_checkpointing_frozen),
        cmocka_unit_test(test_refused_after_prepare),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
