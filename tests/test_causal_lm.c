/* Decoder LMs without Python: config.json values and refusals (with the file and key), the
 * generation config, the shifted loss with ignored labels on a hand example, the sliding-window
 * refusal, config.json written and read back, and a checkpoint load that fails changing nothing.
 * tests/test_causal_lm_parity.sh checks the numbers against transformers. */
#include "test_util.h"

static char g_tmp[] = "/tmp/caccel-causal-lm-XXXXXX";

static const char *path_of(const char *name) {
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", g_tmp, name);
    return p;
}

static void write_text(const char *name, const char *text) {
    FILE *f = fopen(path_of(name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

static int setup(void **state) {
    (void)state;
    return mkdtemp(g_tmp) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    t_rm_tree(g_tmp);
    return 0;
}

#define TINY "\"vocab_size\": 16, \"hidden_size\": 8, \"intermediate_size\": 12, \"num_hidden_layers\": 1, " \
             "\"num_attention_heads\": 2"

static ca_status load_text(const char *text, ca_causal_lm_config *c) {
    unlink(path_of("generation_config.json"));
    write_text("config.json", text);
    return ca_causal_lm_config_load(g_tmp, c);
}

static void test_config(void **state) {
    (void)state;
    ca_causal_lm_config c;
    T_OK(load_text("{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], " TINY
                   ", \"num_key_value_heads\": 1, \"rope_theta\": 500000.0, \"eos_token_id\": [5, 6], "
                   "\"tie_word_embeddings\": true, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}}",
                   &c));
    assert_int_equal(c.family, CA_CAUSAL_LM_LLAMA);
    assert_int_equal(c.num_key_value_heads, 1);
    assert_int_equal(c.max_position_embeddings, 2048);           /* LlamaConfig's default */
    assert_true(c.rope_theta == 500000.0 && c.rope_scaling_factor == 4.0);
    assert_string_equal(c.rope_scaling_type, "linear");
    assert_true(c.tie_word_embeddings && !c.qkv_bias);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.eos_token_ids[1], 6);
    assert_int_equal(c.bos_token_id, 1);
    assert_false(c.has_generation_config);
    assert_int_equal(c.gen_n_eos, 2);                             /* from the model config */
    write_text("generation_config.json", "{\"bos_token_id\": 3, \"eos_token_id\": 4, \"max_length\": 64, "
                                         "\"temperature\": 0.7, \"top_k\": 10, \"do_sample\": true}");
    T_OK(ca_causal_lm_config_load(path_of("config.json"), &c));
    assert_true(c.has_generation_config && c.do_sample);
    assert_int_equal(c.gen_bos_token_id, 3);
    assert_int_equal(c.gen_n_eos, 1);
    assert_int_equal(c.gen_eos_token_ids[0], 4);
    assert_int_equal(c.max_length, 64);
    assert_int_equal(c.top_k, 10);
    assert_true(c.temperature == 0.7);
    /* Qwen2: q/k/v biases, kv heads default to the heads */
    T_OK(load_text("{\"model_type\": \"qwen2\", " TINY "}", &c));
    assert_true(c.family == CA_CAUSAL_LM_QWEN2 && c.qkv_bias && !c.o_bias && c.num_key_value_heads == 2);
    assert_int_equal(c.n_eos, 0);
    T_OK(load_text("{\"model_type\": \"mistral\", " TINY ", \"sliding_window\": null}", &c));
    assert_int_equal(c.sliding_window, 0);
}

/* Each refusal names the file and the key. */
static void test_config_refusals(void **state) {
    (void)state;
    static const struct {
        const char *json, *words;
        ca_status st;
    } cases[] = {
        {"{\"model_type\": \"gpt_neox\", " TINY "}", "\"model_type\" is \"gpt_neox\"", CA_ERR_UNSUPPORTED},
        {"{" TINY "}", "\"model_type\" is missing", CA_ERR_UNSUPPORTED},
        {"{\"model_type\": \"llama\", \"architectures\": [\"MistralForCausalLM\"], " TINY "}",
         "\"architectures\"[0] is 'MistralForCausalLM'", CA_ERR_UNSUPPORTED},
        {"{\"model_type\": \"llama\", " TINY ", \"rope_scaling\": {\"type\": \"longrope\", \"factor\": 4.0}}",
         "rope_scaling type \"longrope\" is not supported yet", CA_ERR_INVALID},
        {"{\"model_type\": \"llama\", " TINY ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}",
         "rope_scaling type \"llama3\" needs \"low_freq_factor\"", CA_ERR_INVALID},
        {"{\"model_type\": \"llama\", " TINY ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
         "\"low_freq_factor\": 4.0, \"high_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192}}",
         "\"low_freq_factor\" 4 is not below \"high_freq_factor\" 1", CA_ERR_INVALID},
        {"{\"model_type\": \"llama\", " TINY ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 0.5}}",
         "rope_scaling \"factor\" is 0.5", CA_ERR_INVALID},
        {"{\"model_type\": \"mistral\", " TINY ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}",
         "rope_scaling type \"linear\" is not supported yet", CA_ERR_INVALID},
        {"{\"model_type\": \"llama\", " TINY ", \"num_key_value_heads\": 3}",
         "\"num_key_value_heads\" 3 does not divide \"num_attention_heads\" 2", CA_ERR_INVALID},
        {"{\"model_type\": \"llama\", " TINY ", \"hidden_size\": 6}",
         "\"hidden_size\" 6 is not \"num_attention_heads\" 2 heads of an even size", CA_ERR_INVALID},
        {"{\"model_type\": \"llama\", " TINY ", \"vocab_size\": 0}", "\"vocab_size\" is 0", CA_ERR_INVALID},
        {"{\"model_type\": \"llama\", " TINY ", \"num_hidden_layers\": 1001}",
         "\"num_hidden_layers\" is 1001; at most 1000", CA_ERR_INVALID},
        {"{\"model_type\": \"llama\", " TINY ", \"intermediate_size\": 1099511627776}",
         "\"intermediate_size\" 1099511627776 makes a weight larger than", CA_ERR_INVALID},
        {"{\"model_type\": \"llama\", " TINY ", \"hidden_act\": \"gelu\"}", "\"hidden_act\" is \"gelu\"",
         CA_ERR_UNSUPPORTED},
        {"{\"model_type\": \"llama\", " TINY ", \"head_dim\": 8}", "\"head_dim\" 8 is not", CA_ERR_UNSUPPORTED},
        {"{\"model_type\": \"llama\", " TINY ", \"mlp_bias\": true}", "\"mlp_bias\" true", CA_ERR_UNSUPPORTED},
        {"{\"model_type\": \"llama\", " TINY ", \"pad_token_id\": 16}", "\"pad_token_id\" 16 is not below",
         CA_ERR_INVALID},
        {"{\"model_type\": \"llama\", " TINY ", \"eos_token_id\": \"x\"}", "\"eos_token_id\" is \"x\"",
         CA_ERR_INVALID},
        {"{\"model_type\": \"llama\", " TINY ", \"tie_word_embeddings\": 1}", "\"tie_word_embeddings\" is 1",
         CA_ERR_INVALID},
        {"[1]", "not a JSON object", CA_ERR_INVALID},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ca_causal_lm_config c;
        ca_status s = load_text(cases[i].json, &c);
        const char *e = ca_last_error();
        if (s != cases[i].st || !strstr(e, cases[i].words) || !strstr(e, path_of("config.json")))
            fail_msg("case %zu: %s -> %s: %s", i, cases[i].json, ca_status_name(s), e);
    }
    ca_causal_lm_config c;
    write_text("generation_config.json", "{\"top_k\": -1}");
    write_text("config.json", "{\"model_type\": \"llama\", " TINY "}");
    assert_int_equal(ca_causal_lm_config_load(g_tmp, &c), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "generation_config.json': \"top_k\" is -1"));
    unlink(path_of("generation_config.json"));
    /* a config made by hand is checked by create the same way */
    ca_causal_lm_config_default(CA_CAUSAL_LM_MISTRAL, &c);
    c.num_key_value_heads = 5;
    ca_module *m = (ca_module *)&c;
    assert_int_equal(ca_causal_lm_create(&c, &m), CA_ERR_INVALID);
    assert_null(m);
    assert_non_null(strstr(ca_last_error(), "MistralForCausalLM: \"num_key_value_heads\" 5"));
}

static ca_tensor *ids_tensor(int64_t b, int64_t t, const int64_t *v) {
    return T_NN(ca_from_host(ca_cpu_device(), CA_I64, 2, (int64_t[]){b, t}, v));
}

/* transformers' loss: logits[:, :-1] against labels[:, 1:], -100 ignored, the mean of the rest. */
static void test_loss(void **state) {
    (void)state;
    const float ln3 = logf(3), ln4 = logf(4);
    float lg[2 * 3 * 2] = {0, ln3, 5, 5, 9, -9,     /* row 0: positions 0, 1, 2 */
                           0, 0, ln4, 0, -9, 9};    /* row 1 */
    int64_t labels[6] = {-100, 1, -100, 0, -100, 0};
    ca_tensor *logits = T_NN(ca_from_host(ca_cpu_device(), CA_F32, 3, (int64_t[]){2, 3, 2}, lg));
    ca_tensor_set_requires_grad(logits, true);
    ca_tensor *loss = T_NN(ca_causal_lm_loss(logits, ids_tensor(2, 3, labels)));
    double v;
    T_OK(ca_tensor_item(loss, &v));
    /* counted: row 0 position 0 -> label 1 (p 3/4), row 1 position 1 -> label 0 (p 4/5) */
    assert_float_equal(v, (-log(0.75) - log(0.8)) / 2, 1e-6);
    T_OK(ca_autograd_backward(loss));
    float *g = t_host(T_NN(ca_tensor_grad(logits)));
    const float want[12] = {0.125f, -0.125f, 0, 0, 0, 0, 0, 0, -0.1f, 0.1f, 0, 0};
    for (int i = 0; i < 12; i++) assert_float_equal(g[i], want[i], 1e-6);
    free(g);
    /* shapes that do not match, and a sequence of one token, are refused */
    assert_null(ca_causal_lm_loss(logits, ids_tensor(3, 2, labels)));
    assert_non_null(strstr(ca_last_error(), "ca_causal_lm_loss"));
    assert_null(ca_causal_lm_loss(T_NN(ca_narrow(logits, 1, 0, 1)), ids_tensor(2, 1, labels)));
    ca_scope_release_all();
}

/* The loss reads the logits [B, T, V] where an output layer wrote them: no copy of logits[:, :-1] in the
 * forward, and in the backward only the logits' own gradient (no scatter of a [B, T - 1, V] gradient into
 * zeros), which the layer's backward reads. */
static void test_loss_no_logits_copy(void **state) {
    (void)state;
    const int64_t b = 2, t = 64, d = 8, v = 1000;
    ca_device *dev = ca_cpu_device();
    ca_tensor *h = T_NN(ca_rand_normal(dev, CA_F32, 3, (int64_t[]){b, t, d}, 0.0f, 1.0f));
    ca_tensor *w = T_NN(ca_rand_normal(dev, CA_F32, 2, (int64_t[]){v, d}, 0.0f, 1.0f));
    ca_tensor_set_requires_grad(w, true);
    int64_t *lab = malloc((size_t)(b * t) * sizeof *lab);
    for (int64_t i = 0; i < b * t; i++) lab[i] = (i * 37) % v;
    ca_tensor *labels = ids_tensor(b, t, lab);
    free(lab);
    ca_tensor *logits = T_NN(ca_linear(h, w, NULL));
    size_t bytes = ca_tensor_nbytes(logits);
    ca_allocator_stats st0, st1;
    T_OK(ca_device_memory_stats(dev, &st0));
    T_OK(ca_device_reset_peak_stats(dev));
    ca_tensor *loss = T_NN(ca_causal_lm_loss(logits, labels));
    T_OK(ca_device_memory_stats(dev, &st1));
    assert_true(st1.peak_allocated - st0.allocated < bytes / 4);   /* the labels and the rows' lse */
    T_OK(ca_autograd_backward(loss));
    T_OK(ca_device_memory_stats(dev, &st1));
    assert_true(st1.peak_allocated - st0.allocated < bytes + bytes / 4);   /* + the logits' gradient */
    ca_scope_release_all();
}

static ca_module *tiny_model(const char *json) {
    ca_causal_lm_config c;
    T_OK(load_text(json, &c));
    ca_module *m;
    T_OK(ca_causal_lm_create(&c, &m));
    return m;
}

/* A window shorter than the sequence is refused by name; one as long is plain causal attention. */
static void test_sliding_window(void **state) {
    (void)state;
    ca_module *m = tiny_model("{\"model_type\": \"mistral\", " TINY ", \"sliding_window\": 4}");
    const int64_t ids[5] = {1, 2, 3, 4, 5};
    ca_tensor *logits;
    assert_int_equal(ca_causal_lm_forward(m, ids_tensor(1, 5, ids), NULL, NULL, &logits), CA_ERR_INVALID);
    assert_null(logits);
    assert_non_null(strstr(ca_last_error(), "sequence length 5 is longer than sliding_window 4"));
    T_OK(ca_causal_lm_forward(m, ids_tensor(1, 4, ids), NULL, NULL, &logits));
    assert_int_equal(ca_tensor_shape(logits)[2], 16);
    /* a token id past the vocabulary, a negative position, a mask of another shape */
    const int64_t bad[2] = {3, 16}, neg[2] = {0, -1};
    assert_int_not_equal(ca_causal_lm_forward(m, ids_tensor(1, 2, bad), NULL, NULL, &logits), CA_OK);
    assert_non_null(strstr(ca_last_error(), "index 16 at position 1 is outside the table's 16 rows"));
    assert_int_equal(ca_causal_lm_forward(m, ids_tensor(1, 2, ids), NULL, ids_tensor(1, 2, neg), &logits),
                     CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "position_ids[1] is -1"));
    assert_int_equal(ca_causal_lm_forward(m, ids_tensor(1, 2, ids), ids_tensor(2, 1, ids), NULL, &logits),
                     CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "attention_mask must be [batch, length] as input_ids"));
    ca_module_destroy(m);
    /* Qwen2's window applies only with use_sliding_window */
    m = tiny_model("{\"model_type\": \"qwen2\", " TINY ", \"sliding_window\": 4}");
    T_OK(ca_causal_lm_forward(m, ids_tensor(1, 5, ids), NULL, NULL, &logits));
    ca_module_destroy(m);
    m = tiny_model("{\"model_type\": \"qwen2\", " TINY ", \"sliding_window\": 4, \"use_sliding_window\": true}");
    assert_int_equal(ca_causal_lm_forward(m, ids_tensor(1, 5, ids), NULL, NULL, &logits), CA_ERR_INVALID);
    ca_module_destroy(m);
    ca_scope_release_all();
}

/* Parameter names are the state dict's; config.json written is read back the same; a checkpoint
 * missing a tensor or of another shape is refused without changing the model. */
static void test_names_save_load(void **state) {
    (void)state;
    ca_module *m = tiny_model("{\"model_type\": \"llama\", " TINY ", \"num_key_value_heads\": 1, "
                              "\"tie_word_embeddings\": true, \"attention_bias\": true, "
                              "\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}");
    assert_int_equal(ca_module_num_params(m), 1 + 13 + 1);   /* embed, a layer (4 biases), norm */
    assert_string_equal(ca_module_param_name(m, 0), "model.embed_tokens.weight");
    assert_non_null(ca_module_param(m, "model.layers.0.self_attn.k_proj.bias"));
    assert_int_equal(ca_tensor_shape(ca_module_param(m, "model.layers.0.self_attn.k_proj.weight"))[0], 4);
    assert_null(ca_module_param(m, "lm_head.weight"));
    char dir[600];
    snprintf(dir, sizeof dir, "%s/saved", g_tmp);
    assert_int_equal(mkdir(dir, 0755), 0);
    T_OK(ca_causal_lm_save_config(m, dir));
    T_OK(ca_save_model(NULL, m, dir, 0));
    ca_causal_lm_config back;
    T_OK(ca_causal_lm_config_load(dir, &back));
    const ca_causal_lm_config *c = ca_causal_lm_module_config(m);
    assert_true(back.tie_word_embeddings && back.qkv_bias && back.o_bias && back.num_key_value_heads == 1);
    assert_string_equal(back.rope_scaling_type, "dynamic");
    assert_true(back.rope_scaling_factor == 2.0 && back.rms_norm_eps == c->rms_norm_eps);
    assert_true(back.has_generation_config && back.gen_bos_token_id == 1 && back.gen_eos_token_ids[0] == 2);
    ca_module *m2;
    T_OK(ca_causal_lm_create(&back, &m2));
    ca_causal_lm_load_info info;
    T_OK(ca_causal_lm_load_pretrained(m2, dir, &info));
    assert_int_equal(info.loaded, 15);
    assert_int_equal(info.unused, 0);
    assert_int_equal(info.files, 1);
    /* a model with another kv-head count: the shapes differ, nothing is written */
    ca_module *m3 = tiny_model("{\"model_type\": \"llama\", " TINY ", \"tie_word_embeddings\": true, "
                               "\"attention_bias\": true}");
    float *before = t_host(ca_module_param_at(m3, 0));
    assert_int_equal(ca_causal_lm_load_pretrained(m3, dir, NULL), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "'model.layers.0.self_attn.k_proj.weight' has shape [4, 8]; the "
                                            "model's parameter is [8, 8]"));
    float *after = t_host(ca_module_param_at(m3, 0));
    assert_memory_equal(before, after, 16 * 8 * sizeof(float));
    free(before);
    free(after);
    ca_module_destroy(m3);
    /* an untied model needs lm_head.weight, which the tied file lacks */
    m3 = tiny_model("{\"model_type\": \"llama\", " TINY ", \"num_key_value_heads\": 1, \"attention_bias\": true}");
    assert_int_equal(ca_causal_lm_load_pretrained(m3, dir, NULL), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "tensor 'lm_head.weight' is missing"));
    assert_int_equal(ca_causal_lm_load_pretrained(m3, g_tmp, NULL), CA_ERR_NOT_FOUND);
    ca_module_destroy(m3);
    ca_module_destroy(m2);
    ca_module_destroy(m);
    ca_scope_release_all();
}

/* Llama 3.1's rope_scaling (llama3): read with its keys, written back the same, and used: position 0
 * gives the unscaled model's logits (angle 0), later positions differ (the long wavelengths are
 * divided by the factor). */
static void test_rope_llama3(void **state) {
    (void)state;
    ca_module *m = tiny_model("{\"model_type\": \"llama\", " TINY ", \"max_position_embeddings\": 64, "
                              "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                              "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 4}}");
    const ca_causal_lm_config *c = ca_causal_lm_module_config(m);
    assert_string_equal(c->rope_scaling_type, "llama3");
    assert_true(c->rope_low_freq_factor == 1.0 && c->rope_high_freq_factor == 4.0);
    assert_int_equal(c->rope_original_max_position_embeddings, 4);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/llama3", g_tmp);
    assert_int_equal(mkdir(dir, 0755), 0);
    T_OK(ca_causal_lm_save_config(m, dir));
    T_OK(ca_save_model(NULL, m, dir, 0));
    ca_causal_lm_config back;
    T_OK(ca_causal_lm_config_load(dir, &back));
    assert_string_equal(back.rope_scaling_type, "llama3");
    assert_true(back.rope_scaling_factor == 8.0 && back.rope_high_freq_factor == 4.0);
    assert_int_equal(back.rope_original_max_position_embeddings, 4);
    ca_module *plain = tiny_model("{\"model_type\": \"llama\", " TINY ", \"max_position_embeddings\": 64}");
    T_OK(ca_causal_lm_load_pretrained(plain, dir, NULL));
    const int64_t ids[6] = {1, 2, 3, 4, 5, 6};
    ca_tensor *a, *b;
    T_OK(ca_causal_lm_forward(m, ids_tensor(1, 6, ids), NULL, NULL, &a));
    T_OK(ca_causal_lm_forward(plain, ids_tensor(1, 6, ids), NULL, NULL, &b));
    float *ha = t_host(a), *hb = t_host(b);
    assert_memory_equal(ha, hb, 16 * sizeof(float));              /* position 0 */
    double diff = 0;
    for (int i = 16; i < 6 * 16; i++) diff = fmax(diff, fabs((double)ha[i] - hb[i]));
    assert_true(diff > 1e-6);
    free(ha);
    free(hb);
    ca_module_destroy(plain);
    ca_module_destroy(m);
    ca_scope_release_all();
}

#define GPT2_TINY "\"model_type\": \"gpt2\", \"vocab_size\": 16, \"n_embd\": 8, \"n_layer\": 1, \"n_head\": 2, " \
                  "\"n_positions\": 4"

/* GPT-2: GPT2Config's n_* keys, Conv1D weights kept [in, out], learned positions bounded by
 * n_positions, refusals naming GPT-2's keys. */
static void test_gpt2(void **state) {
    (void)state;
    ca_causal_lm_config c;
    T_OK(load_text("{" GPT2_TINY "}", &c));
    assert_true(c.family == CA_CAUSAL_LM_GPT2 && c.tie_word_embeddings && c.scale_attn_weights);
    assert_int_equal(c.intermediate_size, 32);                   /* n_inner null: 4 * n_embd */
    assert_int_equal(c.bos_token_id, 50256);
    assert_string_equal(c.activation_function, "gelu_new");
    assert_true(c.rms_norm_eps == 1e-5);
    ca_module *m;
    T_OK(ca_causal_lm_create(&c, &m));
    const int64_t *w = ca_tensor_shape(T_NN(ca_module_param(m, "transformer.h.0.attn.c_attn.weight")));
    assert_true(w[0] == 8 && w[1] == 24);
    w = ca_tensor_shape(T_NN(ca_module_param(m, "transformer.h.0.mlp.c_proj.weight")));
    assert_true(w[0] == 32 && w[1] == 8);
    assert_null(ca_module_param(m, "lm_head.weight"));
    const int64_t ids[5] = {1, 2, 3, 4, 5};
    ca_tensor *logits;
    assert_int_equal(ca_causal_lm_forward(m, ids_tensor(1, 5, ids), NULL, NULL, &logits), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "position 4 is not below n_positions 4"));
    T_OK(ca_causal_lm_forward(m, ids_tensor(1, 4, ids), NULL, NULL, &logits));
    assert_int_equal(ca_tensor_shape(logits)[2], 16);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/gpt2", g_tmp);
    assert_int_equal(mkdir(dir, 0755), 0);
    T_OK(ca_causal_lm_save_config(m, dir));
    ca_causal_lm_config back;
    T_OK(ca_causal_lm_config_load(dir, &back));
    assert_true(back.family == CA_CAUSAL_LM_GPT2 && back.hidden_size == 8 && back.max_position_embeddings == 4);
    ca_module_destroy(m);
    static const struct {
        const char *json, *words;
    } bad[] = {
        {"{" GPT2_TINY ", \"n_head\": 3}", "\"n_embd\" 8 is not \"n_head\" 3 heads"},
        {"{" GPT2_TINY ", \"activation_function\": \"gelu_10\"}", "\"activation_function\" is \"gelu_10\""},
        {"{" GPT2_TINY ", \"add_cross_attention\": true}", "\"add_cross_attention\" true"},
        {"{" GPT2_TINY ", \"n_layer\": 0}", "\"n_layer\" is 0"},
        {"{" GPT2_TINY ", \"architectures\": [\"LlamaForCausalLM\"]}", "\"architectures\"[0] is 'LlamaForCausalLM'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (load_text(bad[i].json, &c) == CA_OK || !strstr(ca_last_error(), bad[i].words))
            fail_msg("case %zu: %s: %s", i, bad[i].json, ca_last_error());
    ca_scope_release_all();
}

/* Gradients of the loss over every parameter (host copies, concatenated). */
static float *all_grads(ca_module *m, ca_tensor *x, ca_tensor *labels, size_t *n, int64_t *live) {
    ca_module_zero_grad(m);
    ca_tensor *logits = T_NN(ca_module_forward(m, x));
    ca_tensor *loss = T_NN(ca_causal_lm_loss(logits, labels));
    *live = ca_scope_live_tensors();       /* what the forward keeps for backward */
    T_OK(ca_autograd_backward(loss));
    size_t total = (size_t)ca_module_param_count(m), off = 0;
    float *g = malloc(total * sizeof *g);
    for (int i = 0; i < ca_module_num_params(m); i++) {
        ca_tensor *gi = T_NN(ca_tensor_grad(ca_module_param_at(m, i)));
        T_OK(ca_tensor_to_host(gi, g + off, ca_tensor_nbytes(gi)));
        off += (size_t)ca_tensor_numel(gi);
    }
    *n = total;
    ca_scope_release_all();
    return g;
}

/* ca_module_checkpoint_layers marks each decoder layer (GPT-2 block), and the model's forward
 * recomputes them in backward: the same gradients, with the padding mask passed through. */
static void test_activation_checkpointing(void **state) {
    (void)state;
    static const char *const configs[] = {
        "{\"model_type\": \"llama\", " TINY ", \"num_hidden_layers\": 2, \"num_key_value_heads\": 1}",
        "{" GPT2_TINY ", \"n_layer\": 2}",
    };
    for (int k = 0; k < 2; k++) {
        ca_module *m = tiny_model(configs[k]);
        ca_module_train(m, false);            /* GPT-2's dropouts would draw other numbers each run */
        int64_t v[2 * 2 * 4] = {1, 2, 3, 4, 1, 1, 1, 1, 5, 6, 7, 0, 1, 1, 1, 0};   /* [B, 2, T]: ids, mask */
        int64_t lab[8] = {1, 2, 3, 4, 5, 6, 7, -100};
        ca_tensor *x = T_NN(ca_from_host(ca_cpu_device(), CA_I64, 3, (int64_t[]){2, 2, 4}, v));
        ca_tensor_keep(x);
        ca_tensor *labels = ids_tensor(2, 4, lab);
        ca_tensor_keep(labels);
        size_t n, n2;
        int64_t live, live_ckpt;
        float *plain = all_grads(m, x, labels, &n, &live);
        int marked = 0;
        T_OK(ca_module_checkpoint_layers(m, true, &marked));
        assert_int_equal(marked, 2);
        float *ckpt = all_grads(m, x, labels, &n2, &live_ckpt);
        assert_int_equal(n, n2);
        if (live_ckpt >= live) fail_msg("model %d: %lld tensors kept with checkpointing, %lld without", k,
                                        (long long)live_ckpt, (long long)live);
        for (size_t i = 0; i < n; i++)
            if (fabsf(plain[i] - ckpt[i]) > 1e-6f) fail_msg("model %d: gradient %zu: %g vs %g", k, i, plain[i], ckpt[i]);
        free(plain);
        free(ckpt);
        ca_tensor_free(x);
        ca_tensor_free(labels);
        ca_module_destroy(m);
    }
}

/* One AdamW step of the decoder on a [B, T] batch drawn from *seed; returns the bytes in use just
 * before zero_grad. */
static size_t lm_step(ca_accelerator *acc, ca_module *m, ca_optimizer *opt, int64_t vocab, uint64_t *seed) {
    enum { B = 4, T = 16 };
    int64_t ids[B * T];
    for (int i = 0; i < B * T; i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int64_t)((*seed >> 33) % (uint64_t)vocab);
    }
    ca_allocator_stats st;
    CA_SCOPE {
        ca_device *dev = ca_accelerator_device(acc);
        ca_tensor *x = T_NN(ca_from_host(dev, CA_I64, CA_SHAPE(B, T), ids));
        ca_tensor *logits = T_NN(ca_module_forward(m, x));
        ca_tensor *loss = T_NN(ca_causal_lm_loss(logits, x));
        T_OK(ca_backward(acc, loss));
        T_OK(ca_optimizer_step(opt));
        T_OK(ca_device_memory_stats(dev, &st));
        ca_optimizer_zero_grad(opt);
    }
    return st.allocated;
}

/* A decoder's training loop (GPT-2 and Llama, AdamW, through the accelerator) at a fixed shape:
 * every later step holds no more at its peak than the first and ends holding what the first ended
 * with (zero_grad gave the gradients back); no later step takes new memory from the device: GPT-2's
 * second step is served from what the first reserved. The Llama's second and third steps reserve a
 * 2 KiB block each (the cache serves a miss from a block of up to twice the size, so the gradients
 * of its 2 KiB k/v projections land in other blocks than in the first step), none after. */
static void test_later_steps_allocate_nothing_new(void **state) {
    (void)state;
    static const struct { const char *json; int settled; } models[] = {
        {"{\"model_type\": \"gpt2\", \"vocab_size\": 64, \"n_embd\": 32, \"n_layer\": 2, \"n_head\": 4, "
         "\"n_positions\": 16}", 1},
        {"{\"model_type\": \"llama\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 48, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2}", 3},
    };
    for (int k = 0; k < 2; k++) {
        char *argv[] = {"test_causal_lm", "--cpu", NULL};
        ca_accelerator *acc;
        T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv}, &acc));
        ca_device *dev = ca_accelerator_device(acc);
        ca_module *m = tiny_model(models[k].json);
        ca_optimizer *opt;
        T_OK(ca_adamw_create(m, NULL, &opt));
        T_OK(ca_prepare(acc, m, opt, NULL));
        size_t grad_bytes = 0;
        for (int i = 0; i < ca_module_num_params(m); i++) grad_bytes += ca_tensor_nbytes(ca_module_param_at(m, i));
        T_OK(ca_device_empty_cache(dev));
        T_OK(ca_device_reset_peak_stats(dev));
        uint64_t seed = 11;
        ca_allocator_stats first, settled = {0}, now;
        size_t held = lm_step(acc, m, opt, 64, &seed);
        T_OK(ca_device_memory_stats(dev, &first));
        if (held - first.allocated < grad_bytes)
            fail_msg("model %d: zero_grad and the step's end gave back %zu bytes, the gradients are %zu", k,
                     held - first.allocated, grad_bytes);
        if (models[k].settled == 1) settled = first;
        for (int step = 2; step <= 10; step++) {
            T_OK(ca_device_reset_peak_stats(dev));
            lm_step(acc, m, opt, 64, &seed);
            T_OK(ca_device_memory_stats(dev, &now));
            if (now.allocated != first.allocated || now.peak_allocated > first.peak_allocated)
                fail_msg("model %d, step %d: %zu bytes held after it (first step: %zu), %zu at its peak (%zu)", k,
                         step, now.allocated, first.allocated, now.peak_allocated, first.peak_allocated);
            if (step == models[k].settled) settled = now;
            if (step > models[k].settled &&
                (now.num_device_allocs != settled.num_device_allocs || now.reserved > settled.reserved))
                fail_msg("model %d, step %d: %llu raw allocations (step %d: %llu), %zu reserved (%zu)", k, step,
                         (unsigned long long)now.num_device_allocs, models[k].settled,
                         (unsigned long long)settled.num_device_allocs, now.reserved, settled.reserved);
        }
        if (settled.reserved > first.reserved + 4096)
            fail_msg("model %d: %zu bytes reserved after warm-up, %zu after the first step", k, settled.reserved,
                     first.reserved);
        ca_optimizer_destroy(opt);
        ca_module_destroy(m);
        ca_accelerator_destroy(acc);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_config_refusals),
        cmocka_unit_test(test_loss),
        cmocka_unit_test(test_loss_no_logits_copy),
        cmocka_unit_test(test_sliding_window),
        cmocka_unit_test(test_names_save_load),
        cmocka_unit_test(test_rope_llama3),
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_activation_checkpointing),
        cmocka_unit_test(test_later_steps_allocate_nothing_new),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
