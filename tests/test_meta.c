/* Deferred initialisation (ca_init_empty_weights, the meta device): a model built without storage
 * and materialised has the eager build's values bit for bit, takes the same RNG counters, and any
 * use of it before that is refused naming the parameter. The sharded (ZeRO-3) materialisation is
 * tested across processes by tests/test_meta_ranks.sh. */
#include "test_util.h"

typedef ca_module *(*builder)(void);

static ca_module *layers(void) {
    ca_module *m, *l;
    T_OK(ca_sequential_create(&m));
    T_OK(ca_embedding_create_ex(11, 6, 2, &l));
    T_OK(ca_module_add(m, "emb", l));
    T_OK(ca_linear_create(6, 5, true, &l));
    T_OK(ca_module_add(m, "fc1", l));
    T_OK(ca_layer_norm_create(5, 0, &l));
    T_OK(ca_module_add(m, "ln", l));
    T_OK(ca_rms_norm_create(5, 0, &l));
    T_OK(ca_module_add(m, "rms", l));
    T_OK(ca_embedding_create(4, 3, &l));
    T_OK(ca_module_add(m, "emb2", l));
    return m;
}

static ca_module *bert(void) {
    ca_bert_config c = {.vocab_size = 20, .hidden_size = 8, .num_hidden_layers = 2, .num_attention_heads = 2,
                        .intermediate_size = 16, .hidden_act = "gelu", .hidden_dropout_prob = 0.1,
                        .attention_probs_dropout_prob = 0.1, .max_position_embeddings = 16,
                        .type_vocab_size = 2, .layer_norm_eps = 1e-12, .pad_token_id = 0, .num_labels = 3};
    ca_module *m;
    T_OK(ca_bert_for_sequence_classification_create(&c, 3, &m));
    return m;
}

static ca_module *llama(void) {
    ca_causal_lm_config c;
    ca_causal_lm_config_default(CA_CAUSAL_LM_LLAMA, &c);
    c.vocab_size = 40;
    c.hidden_size = 16;
    c.intermediate_size = 24;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    ca_module *m;
    T_OK(ca_causal_lm_create(&c, &m));
    return m;
}

static void *bytes_of(ca_tensor *t) {
    void *h = malloc(ca_tensor_nbytes(t) + 1);
    T_OK(ca_tensor_to_host(t, h, ca_tensor_nbytes(t)));
    return h;
}

/* Every parameter of b holds a's bytes. */
static void same_params(ca_module *a, ca_module *b) {
    for (int i = 0; i < ca_module_num_params(a); i++) {
        ca_tensor *x = ca_module_param_at(a, i), *y = ca_module_param_at(b, i);
        void *hx = bytes_of(x), *hy = bytes_of(y);
        if (memcmp(hx, hy, ca_tensor_nbytes(x)) != 0) fail_msg("%s differs", ca_module_param_name(b, i));
        free(hx);
        free(hy);
    }
}

/* Built eagerly and under ca_init_empty_weights from the same seed: the same RNG position after
 * the build, and after ca_module_materialize the same bytes in every parameter. */
static void check_equal(builder build) {
    ca_manual_seed(7);
    ca_module *eager = build();
    uint64_t seed_e, off_e, seed_m, off_m;
    ca_rng_get_state(&seed_e, &off_e);
    ca_manual_seed(7);
    T_OK(ca_init_empty_weights(true));
    ca_module *meta = build();
    T_OK(ca_init_empty_weights(false));
    ca_rng_get_state(&seed_m, &off_m);
    assert_int_equal(off_e, off_m);
    assert_true(ca_module_is_meta(meta));
    assert_false(ca_module_is_meta(eager));
    int n = ca_module_num_params(eager);
    assert_int_equal(n, ca_module_num_params(meta));
    for (int i = 0; i < n; i++) assert_true(ca_tensor_is_meta(ca_module_param_at(meta, i)));
    T_OK(ca_module_materialize(meta));
    assert_false(ca_module_is_meta(meta));
    for (int i = 0; i < n; i++) {
        ca_tensor *a = ca_module_param_at(eager, i), *b = ca_module_param_at(meta, i);
        assert_string_equal(ca_module_param_name(eager, i), ca_module_param_name(meta, i));
        void *ha = bytes_of(a), *hb = bytes_of(b);
        if (memcmp(ha, hb, ca_tensor_nbytes(a)) != 0) fail_msg("%s differs", ca_module_param_name(meta, i));
        free(ha);
        free(hb);
    }
    ca_module_destroy(eager);
    ca_module_destroy(meta);
}

static void test_layers_equal(void **state) {
    (void)state;
    check_equal(layers);
}

static void test_bert_equal(void **state) {
    (void)state;
    check_equal(bert);
}

static void test_llama_equal(void **state) {
    (void)state;
    check_equal(llama);
}

/* A forward, or a read of a parameter, before the values exist: refused, naming the parameter. */
static void test_refused(void **state) {
    (void)state;
    T_OK(ca_init_empty_weights(true));
    assert_true(ca_init_empty_weights_enabled());
    ca_module *m = layers();
    T_OK(ca_init_empty_weights(false));
    assert_false(ca_init_empty_weights_enabled());
    ca_module *fc = ca_module_child(m, "fc1");
    ca_scope *sc = ca_scope_begin();
    ca_tensor *x = T_NN(ca_zeros(ca_cpu_device(), CA_F32, 2, (int64_t[]){2, 6}));
    assert_null(ca_module_forward(fc, x));
    assert_int_equal(ca_last_status(), CA_ERR_STATE);
    assert_non_null(strstr(ca_last_error(), "parameter weight has no storage"));
    assert_non_null(strstr(ca_last_error(), "ca_init_empty_weights"));
    float h[30];
    assert_int_equal(ca_tensor_to_host(ca_module_param(m, "fc1.weight"), h, sizeof h), CA_ERR_STATE);
    assert_non_null(strstr(ca_last_error(), "'fc1.weight' has no storage"));
    ca_scope_end(sc);
    ca_clear_error();
    T_OK(ca_module_materialize(m));   /* then it runs */
    sc = ca_scope_begin();
    x = T_NN(ca_zeros(ca_cpu_device(), CA_F32, 2, (int64_t[]){2, 6}));
    T_NN(ca_module_forward(fc, x));
    ca_scope_end(sc);
    ca_module_destroy(m);
}

/* ca_load_model into a meta model (no accelerator): each parameter gets its memory and the file's
 * values, no initialisation run; the result equals the eager model saved. */
static void test_load_into_meta(void **state) {
    (void)state;
    char dir[] = "/tmp/caccel-meta-XXXXXX";
    assert_non_null(mkdtemp(dir));
    ca_manual_seed(3);
    ca_module *eager = layers();
    T_OK(ca_save_model(NULL, eager, dir, 0));
    T_OK(ca_init_empty_weights(true));
    ca_module *meta = layers();
    T_OK(ca_init_empty_weights(false));
    T_OK(ca_load_model(NULL, meta, dir));
    assert_false(ca_module_is_meta(meta));
    same_params(eager, meta);
    ca_module_destroy(eager);
    ca_module_destroy(meta);
    t_rm_tree(dir);
}

/* A BERT classifier of seed 5 saved into a new directory dir (a mkdtemp template); the seed is then 9,
 * so a model built next differs from it until loaded. */
static ca_module *saved_bert(char *dir) {
    assert_non_null(mkdtemp(dir));
    ca_manual_seed(5);
    ca_module *eager = bert();
    T_OK(ca_save_model(NULL, eager, dir, 0));
    ca_manual_seed(9);
    return eager;
}

/* A pretrained BERT loaded into a classifier built under ca_init_empty_weights equals the model saved. */
static void test_bert_pretrained_into_meta(void **state) {
    (void)state;
    char dir[] = "/tmp/caccel-meta-XXXXXX";
    ca_module *eager = saved_bert(dir);
    T_OK(ca_init_empty_weights(true));
    ca_module *meta = bert();
    T_OK(ca_init_empty_weights(false));
    T_OK(ca_bert_load_pretrained(meta, dir, NULL));
    assert_false(ca_module_is_meta(meta));
    same_params(eager, meta);
    ca_module_destroy(eager);
    ca_module_destroy(meta);
    t_rm_tree(dir);
}

/* A pretrained BERT loaded while ca_init_empty_weights is still on is deferred: the classifier stays
 * meta (nothing read yet) and materialises, reading the file then, to the eager load's values. */
static void test_bert_pretrained_deferred(void **state) {
    (void)state;
    char dir[] = "/tmp/caccel-meta-XXXXXX";
    ca_module *eager = saved_bert(dir);
    ca_module *loaded = bert();
    T_OK(ca_bert_load_pretrained(loaded, dir, NULL));   /* the eager load: the classifier head is seed 9's */
    ca_manual_seed(9);
    T_OK(ca_init_empty_weights(true));
    ca_module *meta = bert();
    T_OK(ca_bert_load_pretrained(meta, dir, NULL));
    T_OK(ca_init_empty_weights(false));
    assert_true(ca_module_is_meta(meta));
    for (int i = 0; i < ca_module_num_params(meta); i++) assert_true(ca_tensor_is_meta(ca_module_param_at(meta, i)));
    T_OK(ca_module_materialize(meta));
    assert_false(ca_module_is_meta(meta));
    same_params(loaded, meta);
    ca_module_destroy(eager);
    ca_module_destroy(loaded);
    ca_module_destroy(meta);
    t_rm_tree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layers_equal),
        cmocka_unit_test(test_bert_equal),
        cmocka_unit_test(test_llama_equal),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_load_into_meta),
        cmocka_unit_test(test_bert_pretrained_into_meta),
        cmocka_unit_test(test_bert_pretrained_deferred),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_shutdown();
    return rc;
}
