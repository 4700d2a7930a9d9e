/* LoRA (caccel/lora.h): target matching against PEFT's own rules, config refusals, the wrapped
 * layer's names, frozen base and finite-difference gradients, merge/unmerge round trips, the
 * adapter files' round trip and refusals, and merge-weights on files. tests/test_lora_peft.sh
 * compares all of it with PEFT itself. */
#include "test_util.h"

static char g_tmp[] = "/tmp/caccel-lora-XXXXXX";

static int setup(void **state) {
    (void)state;
    return mkdtemp(g_tmp) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ca_scope_release_all();
    t_rm_tree(g_tmp);
    return 0;
}

static const char *sub(const char *name) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_tmp, name);
    return p[k];
}

/* Sequential: fc1 Linear(6, 5), act Tanh (smooth, for finite differences), fc2 Linear(5, 4), norm LayerNorm(4). */
static ca_module *small_model(uint64_t seed) {
    ca_manual_seed(seed);
    ca_module *m, *l;
    T_OK(ca_sequential_create(&m));
    T_OK(ca_linear_create(6, 5, true, &l));
    T_OK(ca_module_add(m, "fc1", l));
    T_OK(ca_tanh_create(&l));
    T_OK(ca_module_add(m, "act", l));
    T_OK(ca_linear_create(5, 4, true, &l));
    T_OK(ca_module_add(m, "fc2", l));
    T_OK(ca_layer_norm_create(4, 0, &l));
    T_OK(ca_module_add(m, "norm", l));
    return m;
}

static const char *const FC[] = {"fc1", "fc2"};

static ca_lora_config cfg_fc(bool init) {
    ca_lora_config c;
    ca_lora_config_init(&c);
    c.r = 3;
    c.lora_alpha = 6;
    c.target_modules = FC;
    c.n_target_modules = 2;
    c.init_lora_weights = init;
    return c;
}

static float *forward_host(ca_module *m, ca_tensor *x) {
    float *h = NULL;
    CA_SCOPE {
        CA_NO_GRAD { h = t_host(T_NN(ca_module_forward(m, x))); }
    }
    return h;
}

static double max_rel(const float *a, const float *b, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return d / fmax(s, 1e-30);
}

/* Expected matches computed once with peft 0.10's check_target_module_exists on these names. */
static void test_matching(void **state) {
    (void)state;
    static const char *const names[] = {"query", "encoder.layer.0.attention.self.query",
        "encoder.layer.0.attention.self.value", "encoder.layer.1.attention.self.key",
        "encoder.layer.0.attention.output.dense", "encoder.layer.0.intermediate.dense",
        "model.layers.0.self_attn.q_proj", "model.layers.10.mlp.up_proj", "xquery", "a.subquery",
        "transformer.h.0.attn.c_attn", "pooler.dense", "encoder.layer.0.attention.self"};
    static const struct { const char *list[2]; const char *regex; const char *want; } cases[] = {
        {{"query", "value"}, NULL, "1110000000000"},
        {{"dense"}, NULL, "0000110000010"},
        {{"self.query"}, NULL, "0100000000000"},
        {{"attention.self"}, NULL, "0000000000001"},
        {{"c_attn"}, NULL, "0000000000100"},
        {{NULL}, ".*\\.(query|value)", "0110000000000"},
        {{NULL}, "encoder\\.layer\\.[01]\\..*dense", "0000110000000"},
        {{NULL}, "model\\.layers\\.\\d+\\.(self_attn\\.q_proj|mlp\\.up_proj)", "0000001100000"},
        {{NULL}, "query", "1000000000000"},
        {{NULL}, ".*self", "0000000000001"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ca_lora_config cfg;
        ca_lora_config_init(&cfg);
        cfg.target_regex = cases[c].regex;
        cfg.target_modules = cases[c].regex ? NULL : cases[c].list;
        cfg.n_target_modules = cases[c].regex ? 0 : (cases[c].list[1] ? 2 : 1);
        for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
            bool m;
            T_OK(ca_lora_target_matches(&cfg, names[i], &m));
            if (m != (cases[c].want[i] == '1'))
                fail_msg("case %zu, name '%s': %d, PEFT says %c", c, names[i], m, cases[c].want[i]);
        }
    }
}

static void expect_refusal(ca_module *m, const ca_lora_config *c, const char *msg) {
    int n = -1;
    assert_int_equal(ca_lora_apply(m, c, &n), CA_ERR_INVALID);
    if (!strstr(ca_last_error(), msg)) fail_msg("'%s' does not say '%s'", ca_last_error(), msg);
    assert_int_equal(n, 0);
    assert_string_equal(ca_module_type(ca_module_child(m, "fc1")), "Linear");     /* unchanged */
    assert_int_equal(ca_module_num_params(m), 6);
}

static void test_config_refusals(void **state) {
    (void)state;
    ca_module *m = small_model(1);
    ca_lora_config c = cfg_fc(true);
    c.r = 0;
    expect_refusal(m, &c, "\"r\" is 0");
    c = cfg_fc(true);
    c.lora_dropout = 1;
    expect_refusal(m, &c, "\"lora_dropout\" is 1");
    c = cfg_fc(true);
    c.bias = "all";
    expect_refusal(m, &c, "\"bias\" is \"all\"");
    c = cfg_fc(true);
    c.target_regex = "fc.";
    expect_refusal(m, &c, "exactly one of");
    c = cfg_fc(true);
    c.target_modules = NULL;
    c.n_target_modules = 0;
    c.target_regex = "fc(";
    expect_refusal(m, &c, "does not compile");
    c.target_regex = "fc1|norm";
    expect_refusal(m, &c, "'norm' is a LayerNorm");
    c.target_regex = "attn";
    expect_refusal(m, &c, "'attn' match no module");
    c.target_regex = "fc1";
    T_OK(ca_lora_apply(m, &c, NULL));
    int n = -1;
    assert_int_equal(ca_lora_apply(m, &c, &n), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "'fc1' already has an adapter"));
    ca_module_destroy(m);
}

static void test_names_and_frozen(void **state) {
    (void)state;
    ca_module *m = small_model(1);
    ca_lora_config c = cfg_fc(true);
    int n = 0;
    T_OK(ca_lora_apply(m, &c, &n));
    assert_int_equal(n, 2);
    static const char *const want[] = {"fc1.weight", "fc1.bias", "fc1.lora_A.weight", "fc1.lora_B.weight",
        "fc2.weight", "fc2.bias", "fc2.lora_A.weight", "fc2.lora_B.weight", "norm.weight", "norm.bias"};
    assert_int_equal(ca_module_num_params(m), 10);
    for (int i = 0; i < 10; i++) {
        assert_string_equal(ca_module_param_name(m, i), want[i]);
        assert_int_equal(ca_tensor_requires_grad(ca_module_param_at(m, i)), strstr(want[i], "lora_") != NULL);
    }
    assert_string_equal(ca_module_type(ca_module_child(m, "fc1")), "lora.Linear");
    const int64_t *sa = ca_tensor_shape(ca_module_param(m, "fc1.lora_A.weight"));
    const int64_t *sb = ca_tensor_shape(ca_module_param(m, "fc1.lora_B.weight"));
    assert_true(sa[0] == 3 && sa[1] == 6 && sb[0] == 5 && sb[1] == 3);
    /* PEFT's init: B = 0, so the wrapped model computes what the base did */
    float *b = t_host(ca_module_param(m, "fc2.lora_B.weight"));
    for (int i = 0; i < 12; i++) assert_true(b[i] == 0.0f);
    free(b);
    float *a = t_host(ca_module_param(m, "fc1.lora_A.weight"));
    for (int i = 0; i < 18; i++) assert_true(fabsf(a[i]) <= 1 / sqrtf(6.0f) && a[i] != 0);
    free(a);
    ca_module_destroy(m);
}

typedef struct fd_ctx { ca_module *m; ca_tensor *x; const float *w; } fd_ctx;

static double loss_host(fd_ctx *f) {
    float *y = forward_host(f->m, f->x);
    double s = 0;
    for (int i = 0; i < 8 * 4; i++) s += (double)y[i] * f->w[i];
    free(y);
    return s;
}

/* d loss / d p[i] by central differences in f32 (eps 1e-2; the loss is piecewise smooth). */
static double numeric(fd_ctx *f, ca_tensor *p, int64_t i) {
    int64_t n = ca_tensor_numel(p);
    float *h = t_host(p), keep = h[i];
    double eps = 1e-2, l[2];
    for (int k = 0; k < 2; k++) {
        h[i] = keep + (float)(k ? -eps : eps);
        T_OK(ca_tensor_copy_from_host(p, h, (size_t)n * sizeof *h));
        l[k] = loss_host(f);
    }
    h[i] = keep;
    T_OK(ca_tensor_copy_from_host(p, h, (size_t)n * sizeof *h));
    free(h);
    return (l[0] - l[1]) / (2 * eps);
}

static void test_gradients(void **state) {
    (void)state;
    ca_module *m = small_model(2);
    ca_lora_config c = cfg_fc(false);      /* B random: gradients reach A through B */
    c.lora_alpha = 5;
    T_OK(ca_lora_apply(m, &c, NULL));
    ca_module_train(m, false);
    uint64_t seed = 11;
    float w[32];
    for (int i = 0; i < 32; i++) w[i] = t_randf(&seed, -1, 1);
    CA_SCOPE {
        ca_tensor *x = t_randn(&seed, 2, (int64_t[]){8, 6}, -1, 1, 0);
        ca_tensor *wt = ca_from_host(ca_cpu_device(), CA_F32, 2, (int64_t[]){8, 4}, w);
        T_OK(ca_autograd_backward(ca_sum(ca_mul(ca_module_forward(m, x), wt))));
        int n = ca_module_num_params(m);
        for (int i = 0; i < n; i++) {
            const char *name = ca_module_param_name(m, i);
            bool lora = strstr(name, "lora_") != NULL;
            if ((ca_tensor_grad(ca_module_param_at(m, i)) != NULL) != lora)
                fail_msg("%s: gradient %s", name, lora ? "missing" : "present on a frozen parameter");
        }
        fd_ctx f = {m, x, w};
        static const char *const ps[] = {"fc1.lora_A.weight", "fc1.lora_B.weight", "fc2.lora_A.weight",
                                         "fc2.lora_B.weight"};
        for (int k = 0; k < 4; k++) {
            ca_tensor *p = ca_module_param(m, ps[k]);
            float *g = t_host(ca_tensor_grad(p));
            for (int64_t i = 0; i < ca_tensor_numel(p); i += 2) {
                double num = numeric(&f, p, i);
                if (fabs(num - g[i]) > 2e-3 + 2e-2 * fabs(num))
                    fail_msg("%s[%lld]: backward %g, finite differences %g", ps[k], (long long)i, g[i], num);
            }
            free(g);
        }
    }
    ca_module_destroy(m);
}

static void test_merge_round_trip(void **state) {
    (void)state;
    ca_module *m = small_model(3);
    ca_lora_config c = cfg_fc(false);
    c.use_rslora = true;
    T_OK(ca_lora_apply(m, &c, NULL));
    ca_module_train(m, false);
    uint64_t seed = 5;
    CA_SCOPE {
        ca_tensor *x = t_randn(&seed, 2, (int64_t[]){8, 6}, -1, 1, 0);
        float *y0 = forward_host(m, x), *w0 = t_host(ca_module_param(m, "fc1.weight"));
        T_OK(ca_lora_merge(m));
        T_OK(ca_lora_merge(m));                       /* merged once only */
        float *y1 = forward_host(m, x), *w1 = t_host(ca_module_param(m, "fc1.weight"));
        assert_true(max_rel(y1, y0, 32) < 1e-5);
        assert_true(max_rel(w1, w0, 30) > 1e-3);      /* the weight moved */
        /* W1 - W0 = scaling B A with rslora's scaling alpha / sqrt(r) */
        float *a = t_host(ca_module_param(m, "fc1.lora_A.weight")), *b = t_host(ca_module_param(m, "fc1.lora_B.weight"));
        for (int o = 0; o < 5; o++)
            for (int i = 0; i < 6; i++) {
                double d = 0;
                for (int k = 0; k < 3; k++) d += (double)b[o * 3 + k] * a[k * 6 + i];
                assert_true(fabs(w1[o * 6 + i] - w0[o * 6 + i] - d * 6 / sqrt(3.0)) < 1e-5);
            }
        T_OK(ca_lora_unmerge(m));
        float *w2 = t_host(ca_module_param(m, "fc1.weight")), *y2 = forward_host(m, x);
        assert_true(max_rel(w2, w0, 30) < 1e-6);
        assert_true(max_rel(y2, y0, 32) < 1e-6);
        T_OK(ca_lora_merge_and_unload(m));
        assert_string_equal(ca_module_type(ca_module_child(m, "fc1")), "Linear");
        assert_int_equal(ca_module_num_params(m), 6);
        float *y3 = forward_host(m, x);
        assert_true(max_rel(y3, y0, 32) < 1e-5);
        assert_int_equal(ca_lora_merge(m), CA_ERR_INVALID);    /* no adapters left */
        free(y0), free(y1), free(y2), free(y3), free(w0), free(w1), free(w2), free(a), free(b);
    }
    ca_module_destroy(m);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void replace_in(const char *path, const char *from, const char *to) {
    char *t = read_text(path), out[8192];
    char *at = strstr(t, from);
    if (!at) fail_msg("'%s' is not in %s:\n%s", from, path, t);
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - t), t, to, at + strlen(from));
    write_file(path, out);
}

static void expect_load_refusal(const char *dir, ca_status want, const char *msg) {
    ca_module *m = small_model(4);
    assert_int_equal(ca_lora_load(m, dir), want);
    if (!strstr(ca_last_error(), msg)) fail_msg("'%s' does not say '%s'", ca_last_error(), msg);
    assert_string_equal(ca_module_type(ca_module_child(m, "fc1")), "Linear");   /* nothing applied */
    ca_module_destroy(m);
}

static void test_files(void **state) {
    (void)state;
    ca_module *m = small_model(4);
    ca_lora_config c = cfg_fc(false);
    c.task_type = "FEATURE_EXTRACTION";
    T_OK(ca_lora_apply(m, &c, NULL));
    ca_module_train(m, false);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", sub("adapter"));
    T_OK(ca_lora_save(m, dir));
    const char *cfg_text = read_text(sub("adapter/adapter_config.json"));
    assert_non_null(strstr(cfg_text, "\"peft_type\": \"LORA\""));
    assert_non_null(strstr(cfg_text, "\"task_type\": \"FEATURE_EXTRACTION\""));
    uint64_t seed = 9;
    CA_SCOPE {
        ca_tensor *x = t_randn(&seed, 2, (int64_t[]){8, 6}, -1, 1, 0);
        float *y0 = forward_host(m, x);
        ca_module *m2 = small_model(4);              /* the same base, no adapter: load wraps it */
        T_OK(ca_lora_load(m2, dir));
        ca_module_train(m2, false);
        float *y1 = forward_host(m2, x);
        assert_true(max_rel(y1, y0, 32) == 0);
        T_OK(ca_lora_load(m2, dir));                 /* into the wrapped model again */
        ca_module_destroy(m2);
        free(y0), free(y1);
    }
    /* refusals, each leaving the model as it was */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", dir, sub("bad"));
    assert_int_equal(system(cmd), 0);
    char bad_cfg[512];
    snprintf(bad_cfg, sizeof bad_cfg, "%s", sub("bad/adapter_config.json"));
    replace_in(bad_cfg, "\"LORA\"", "\"IA3\"");
    expect_load_refusal(sub("bad"), CA_ERR_UNSUPPORTED, "adapter_config.json': \"peft_type\" is \"IA3\"");
    replace_in(bad_cfg, "\"IA3\"", "\"LORA\"");
    replace_in(bad_cfg, "\"use_dora\": false", "\"use_dora\": true");
    expect_load_refusal(sub("bad"), CA_ERR_UNSUPPORTED, "\"use_dora\" is true");
    replace_in(bad_cfg, "\"use_dora\": true", "\"use_dora\": false");
    replace_in(bad_cfg, "\"r\": 3", "\"r\": 2");
    expect_load_refusal(sub("bad"), CA_ERR_INVALID, "tensor 'base_model.model.fc1.lora_A.weight' has shape [3, 6]");
    replace_in(bad_cfg, "\"r\": 2", "\"r\": 3");
    replace_in(bad_cfg, "\"fc2\"", "\"norm\"");
    expect_load_refusal(sub("bad"), CA_ERR_INVALID, "'norm' is a LayerNorm");
    replace_in(bad_cfg, "\"norm\"", "\"fc1\"");          /* targets fc1 only: fc2's tensors are extra */
    expect_load_refusal(sub("bad"), CA_ERR_INVALID, "tensor 'base_model.model.fc2.lora_A.weight' belongs to no layer");
    /* an adapter of fc1 only, loaded as an adapter of fc1 and fc2: fc2's tensors are missing */
    ca_module *m3 = small_model(4);
    ca_lora_config c1 = cfg_fc(true);
    c1.n_target_modules = 1;
    T_OK(ca_lora_apply(m3, &c1, NULL));
    T_OK(ca_lora_save(m3, sub("bad2")));
    ca_module_destroy(m3);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", sub("adapter/adapter_config.json"), sub("bad2/adapter_config.json"));
    assert_int_equal(system(cmd), 0);
    expect_load_refusal(sub("bad2"), CA_ERR_INVALID, "tensor 'base_model.model.fc2.lora_A.weight' is missing");
    expect_load_refusal(sub("none"), CA_ERR_NOT_FOUND, "none/adapter_config.json");
    ca_module_destroy(m);
}

static void test_merge_files(void **state) {
    (void)state;
    ca_module *m = small_model(6);
    ca_lora_config c = cfg_fc(false);
    T_OK(ca_lora_apply(m, &c, NULL));
    char base[512], ad[512];
    snprintf(base, sizeof base, "%s", sub("mbase"));
    snprintf(ad, sizeof ad, "%s", sub("madapter"));
    mkdir(base, 0777);
    T_OK(ca_lora_save(m, ad));
    ca_module *plain = small_model(6);
    T_OK(ca_save_model(NULL, plain, base, 0));
    write_file(sub("mbase/config.json"), "{\"model_type\": \"test\"}\n");
    T_OK(ca_lora_merge_files(ad, base, sub("mout")));
    T_OK(ca_lora_merge_and_unload(m));
    T_OK(ca_load_model(NULL, plain, sub("mout")));
    for (int i = 0; i < ca_module_num_params(m); i++) {
        float *a = t_host(ca_module_param_at(m, i)), *b = t_host(ca_module_param_at(plain, i));
        double r = max_rel(b, a, ca_tensor_numel(ca_module_param_at(m, i)));
        if (r > 1e-6) fail_msg("%s: merged files differ from the merged model by %g", ca_module_param_name(m, i), r);
        free(a), free(b);
    }
    assert_string_equal(read_text(sub("mout/config.json")), "{\"model_type\": \"test\"}\n");
    /* a base without the targeted tensor: refused, nothing written */
    ca_module *other;
    T_OK(ca_linear_create(6, 5, true, &other));
    char ob[512];
    snprintf(ob, sizeof ob, "%s", sub("obase"));
    mkdir(ob, 0777);
    T_OK(ca_save_model(NULL, other, ob, 0));
    ca_status st = ca_lora_merge_files(ad, ob, sub("oout"));
    if (st != CA_ERR_INVALID) fail_msg("%s: %s", ca_status_name(st), ca_last_error());
    assert_non_null(strstr(ca_last_error(), "tensor 'fc1.weight' is missing"));
    assert_int_not_equal(access(sub("oout/model.safetensors"), F_OK), 0);
    ca_module_destroy(other);
    ca_module_destroy(plain);
    ca_module_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matching),
        cmocka_unit_test(test_config_refusals),
        cmocka_unit_test(test_names_and_frozen),
        cmocka_unit_test(test_gradients),
        cmocka_unit_test(test_merge_round_trip),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_merge_files),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    ca_shutdown();
    return rc;
}
