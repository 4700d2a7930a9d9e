/* BERT's config.json (values, defaults, refusals with the file and key) and the check of a
 * model.safetensors against it, on small hand-written files. tests/test_minilm_files.sh runs the
 * real all-MiniLM-L6-v2 files through the same calls. */
#include "test_util.h"

#include <sys/resource.h>

static char g_tmp[] = "/tmp/caccel-bert-XXXXXX";

static const char *path_of(const char *name) {
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", g_tmp, name);
    return p;
}

static void write_file(const char *name, const void *data, size_t len) {
    FILE *f = fopen(path_of(name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void write_text(const char *name, const char *text) { write_file(name, text, strlen(text)); }

static int setup(void **state) {
    (void)state;
    return mkdtemp(g_tmp) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd);
}

/* A small BERT: 10 tokens, hidden 4, 2 layers, 2 heads, intermediate 8. */
static const char *SMALL =
    "{\"architectures\": [\"BertForSequenceClassification\"], \"model_type\": \"bert\","
    " \"vocab_size\": 10, \"hidden_size\": 4, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 2, \"intermediate_size\": 8, \"hidden_act\": \"gelu_new\","
    " \"max_position_embeddings\": 16, \"type_vocab_size\": 2, \"layer_norm_eps\": 1e-5,"
    " \"pad_token_id\": 1, \"hidden_dropout_prob\": 0.2, \"position_embedding_type\": \"absolute\","
    " \"id2label\": {\"0\": \"a\", \"1\": \"b\", \"2\": \"c\"}}";

static void test_config(void **state) {
    (void)state;
    write_text("config.json", SMALL);
    ca_bert_config c;
    T_OK(ca_bert_config_load(g_tmp, &c));                /* a directory */
    assert_int_equal(c.vocab_size, 10);
    assert_int_equal(c.hidden_size, 4);
    assert_int_equal(c.num_hidden_layers, 2);
    assert_int_equal(c.num_attention_heads, 2);
    assert_int_equal(c.intermediate_size, 8);
    assert_string_equal(c.hidden_act, "gelu_new");
    assert_int_equal(c.max_position_embeddings, 16);
    assert_int_equal(c.type_vocab_size, 2);
    assert_true(fabs(c.layer_norm_eps - 1e-5) < 1e-12);
    assert_true(fabs(c.hidden_dropout_prob - 0.2) < 1e-12);
    assert_true(fabs(c.attention_probs_dropout_prob - 0.1) < 1e-12);  /* default */
    assert_int_equal(c.pad_token_id, 1);
    assert_int_equal(c.num_labels, 3);
    assert_string_equal(c.architectures, "BertForSequenceClassification");
    /* BertConfig's defaults for absent keys */
    write_text("min.json", "{\"model_type\": \"bert\"}");
    T_OK(ca_bert_config_load(path_of("min.json"), &c));
    assert_int_equal(c.vocab_size, 30522);
    assert_int_equal(c.hidden_size, 768);
    assert_int_equal(c.num_hidden_layers, 12);
    assert_int_equal(c.intermediate_size, 3072);
    assert_string_equal(c.hidden_act, "gelu");
    assert_true(fabs(c.layer_norm_eps - 1e-12) < 1e-20);
    assert_int_equal(c.num_labels, 2);
    assert_string_equal(c.architectures, "");
}

static void expect_config_error(const char *text, ca_status s, const char *what) {
    write_text("bad.json", text);
    ca_bert_config c;
    assert_int_equal(ca_bert_config_load(path_of("bad.json"), &c), s);
    const char *msg = ca_last_error();
    if (!strstr(msg, path_of("bad.json")) || !strstr(msg, what))
        fail_msg("message '%s' lacks the file or '%s'", msg, what);
}

static void test_config_errors(void **state) {
    (void)state;
    expect_config_error("{\"model_type\": \"gpt2\"}", CA_ERR_UNSUPPORTED,
                        "\"model_type\" is \"gpt2\"");
    expect_config_error("{}", CA_ERR_UNSUPPORTED, "\"model_type\" is missing");
    expect_config_error("{\"model_type\": \"bert\", \"architectures\": [\"GPT2LMHeadModel\"]}",
                        CA_ERR_UNSUPPORTED, "\"architectures\"[0] is 'GPT2LMHeadModel'");
    expect_config_error("{\"model_type\": \"bert\", \"hidden_size\": \"384\"}", CA_ERR_INVALID,
                        "\"hidden_size\" is \"384\"");
    expect_config_error("{\"model_type\": \"bert\", \"num_hidden_layers\": 0}", CA_ERR_INVALID,
                        "\"num_hidden_layers\" is 0");
    expect_config_error("{\"model_type\": \"bert\", \"hidden_size\": 100, "
                        "\"num_attention_heads\": 12}",
                        CA_ERR_INVALID, "\"hidden_size\" 100 is not a multiple");
    expect_config_error("{\"model_type\": \"bert\", \"hidden_act\": \"swiglu\"}",
                        CA_ERR_UNSUPPORTED, "\"hidden_act\" is \"swiglu\"");
    expect_config_error("{\"model_type\": \"bert\", \"position_embedding_type\": "
                        "\"relative_key\"}",
                        CA_ERR_UNSUPPORTED, "\"position_embedding_type\" is \"relative_key\"");
    expect_config_error("{\"model_type\": \"bert\", \"layer_norm_eps\": -1}", CA_ERR_INVALID,
                        "\"layer_norm_eps\" is -1");
    /* json-c's words for these were "continue" (truncated) and "success" (JSON of another kind) */
    expect_config_error("{\"model_type\": \"bert\",", CA_ERR_INVALID,
                        "not valid JSON: unexpected end of input at byte 22");
    expect_config_error("", CA_ERR_INVALID, "not valid JSON: unexpected end of input at byte 0");
    expect_config_error("{} x", CA_ERR_INVALID, "not valid JSON: bytes after the value at byte 3");
    expect_config_error("[1]", CA_ERR_INVALID, "not a JSON object but a JSON array");
    ca_bert_config c;
    assert_int_equal(ca_bert_config_load(path_of("none.json"), &c), CA_ERR_NOT_FOUND);
    assert_non_null(strstr(ca_last_error(), path_of("none.json")));
}

/* What the reader bounds a model by: physical memory, or ulimit -v / -d when lower. */
static double memory_there_is(void) {
    double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (double)rl.rlim_cur < mem)
        mem = (double)rl.rlim_cur;
    if (getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (double)rl.rlim_cur < mem)
        mem = (double)rl.rlim_cur;
    return mem;
}

/* Sizes of 2^40 are refused when config.json is read, naming the key and the weight, before any
 * allocation of petabytes is tried; so are more layers than a model can have, and models whose
 * weights each fit but not all together. */
static void test_config_sizes(void **state) {
    (void)state;
    expect_config_error("{\"model_type\": \"bert\", \"hidden_size\": 384, \"num_attention_heads\": 12,"
                        " \"intermediate_size\": 1099511627776}", CA_ERR_INVALID,
                        "\"intermediate_size\" 1099511627776 makes a 1099511627776 x 384 weight "
                        "(encoder.layer.N.intermediate.dense.weight, 1.5 PiB in f32) larger than the ");
    assert_non_null(strstr(ca_last_error(), "of memory there is ("));
    expect_config_error("{\"model_type\": \"bert\", \"max_position_embeddings\": 1099511627776}",
                        CA_ERR_INVALID, "\"max_position_embeddings\" 1099511627776 makes a 1099511627776 x "
                        "768 weight (embeddings.position_embeddings.weight");
    expect_config_error("{\"model_type\": \"bert\", \"vocab_size\": 1099511627776}", CA_ERR_INVALID,
                        "\"vocab_size\" 1099511627776 makes a 1099511627776 x 768 weight "
                        "(embeddings.word_embeddings.weight");
    expect_config_error("{\"model_type\": \"bert\", \"hidden_size\": 1099511627776, "
                        "\"num_attention_heads\": 16}", CA_ERR_INVALID,
                        "\"hidden_size\" 1099511627776 makes a 30522 x 1099511627776 weight "
                        "(embeddings.word_embeddings.weight");
    expect_config_error("{\"model_type\": \"bert\", \"num_labels\": 1099511627776}", CA_ERR_INVALID,
                        "\"num_labels\" 1099511627776 makes a 1099511627776 x 768 weight (classifier.weight");
    expect_config_error("{\"model_type\": \"bert\", \"num_hidden_layers\": 1099511627776}", CA_ERR_INVALID,
                        "\"num_hidden_layers\" is 1099511627776; at most 1000 layers are supported");
    expect_config_error("{\"model_type\": \"bert\", \"hidden_size\": 8, \"num_attention_heads\": 64}",
                        CA_ERR_INVALID, "\"num_attention_heads\" 64 is more than \"hidden_size\" 8");
    expect_config_error("{\"model_type\": \"bert\", \"num_hidden_layers\": 4398046511104}", CA_ERR_INVALID,
                        "\"num_hidden_layers\" is 4398046511104; an integer in [1, 2^40] is needed");
    /* each weight an eighth of the memory there is, 1000 layers of them: the whole is refused */
    double mem = memory_there_is();
    long long h = 1024, inter = (long long)(mem / 8 / 4 / (double)h);
    char text[512], want[200];
    snprintf(text, sizeof text, "{\"model_type\": \"bert\", \"hidden_size\": %lld, \"intermediate_size\": "
             "%lld, \"num_attention_heads\": 16, \"num_hidden_layers\": 1000}", h, inter);
    snprintf(want, sizeof want, "1000 layers (\"num_hidden_layers\") of \"hidden_size\" 1024 and "
             "\"intermediate_size\" %lld make ", inter);
    expect_config_error(text, CA_ERR_INVALID, want);
    assert_non_null(strstr(ca_last_error(), "of memory there is ("));
    /* the same at 2 layers is a model the memory holds */
    snprintf(text, sizeof text, "{\"model_type\": \"bert\", \"hidden_size\": %lld, \"intermediate_size\": "
             "%lld, \"num_attention_heads\": 16, \"num_hidden_layers\": 2}", h, inter / 4);
    write_text("ok.json", text);
    ca_bert_config c;
    T_OK(ca_bert_config_load(path_of("ok.json"), &c));
}

/* A safetensors file of zeros: the config's tensors (with prefix), minus the `skip` names, with
 * `override` (name:shape) changed, plus `extra` names (1-D, 2 elements); dtype F32 unless the
 * name is `i64`. */
typedef struct {
    const char *prefix, *skip[2], *override_name, *extra[2], *i64;
    int64_t override_shape[2];
    bool gamma_beta;                     /* LayerNorm.weight/bias stored as gamma/beta */
} variant;

static void write_checkpoint(const char *file, const ca_bert_config *c, const variant *v) {
    int64_t n = ca_bert_tensor_names(c, NULL, 0);
    ca_bert_tensor *t = calloc((size_t)n + 2, sizeof *t);
    ca_bert_tensor_names(c, t, n);
    for (int i = 0; i < 2; i++)
        if (v->extra[i]) {
            snprintf(t[n].name, sizeof t[n].name, "%s", v->extra[i]);
            t[n].ndim = 1;
            t[n++].shape[0] = 2;
        }
    char *hdr = malloc(1 << 16);
    size_t k = (size_t)sprintf(hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        bool mine = i < ca_bert_tensor_names(c, NULL, 0);
        char name[160];
        snprintf(name, sizeof name, "%s%s", mine ? v->prefix : "", t[i].name);
        char *ln = strstr(name, "LayerNorm.");
        if (v->gamma_beta && ln) strcpy(ln, ln[10] == 'w' ? "LayerNorm.gamma" : "LayerNorm.beta");
        if ((v->skip[0] && strcmp(name, v->skip[0]) == 0) ||
            (v->skip[1] && strcmp(name, v->skip[1]) == 0))
            continue;
        int64_t *s = t[i].shape;
        if (v->override_name && strcmp(name, v->override_name) == 0) s = (int64_t *)v->override_shape;
        bool i64 = v->i64 && strcmp(name, v->i64) == 0;
        uint64_t bytes = (uint64_t)(s[0] * (t[i].ndim > 1 ? s[1] : 1)) * (i64 ? 8 : 4);
        k += (size_t)sprintf(hdr + k, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", name,
                             i64 ? "I64" : "F32", (long long)s[0]);
        if (t[i].ndim > 1) k += (size_t)sprintf(hdr + k, ",%lld", (long long)s[1]);
        k += (size_t)sprintf(hdr + k, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                             (unsigned long long)(off + bytes));
        off += bytes;
    }
    hdr[k++] = '}';
    while (k % 8) hdr[k++] = ' ';
    size_t total = 8 + k + off;
    unsigned char *buf = calloc(1, total);
    uint64_t hl = k;
    memcpy(buf, &hl, 8);                                 /* little-endian host */
    memcpy(buf + 8, hdr, k);
    write_file(file, buf, total);
    free(buf);
    free(hdr);
    free(t);
}

static void test_tensor_names(void **state) {
    (void)state;
    write_text("config.json", SMALL);
    ca_bert_config c;
    T_OK(ca_bert_config_load(g_tmp, &c));
    int64_t n = ca_bert_tensor_names(&c, NULL, 0);
    assert_int_equal(n, 5 + 16 * 2 + 2);
    ca_bert_tensor t[64];
    assert_int_equal(ca_bert_tensor_names(&c, t, 64), n);
    assert_string_equal(t[0].name, "embeddings.word_embeddings.weight");
    assert_int_equal(t[0].shape[0], 10);
    assert_int_equal(t[0].shape[1], 4);
    assert_string_equal(t[5].name, "encoder.layer.0.attention.self.query.weight");
    assert_string_equal(t[15].name, "encoder.layer.0.intermediate.dense.weight");
    assert_int_equal(t[15].shape[0], 8);
    assert_int_equal(t[15].shape[1], 4);
    assert_string_equal(t[17].name, "encoder.layer.0.output.dense.weight");
    assert_int_equal(t[17].shape[0], 4);
    assert_int_equal(t[17].shape[1], 8);
    assert_string_equal(t[n - 1].name, "pooler.dense.bias");
    assert_int_equal(t[n - 1].ndim, 1);
}

static void test_checkpoint(void **state) {
    (void)state;
    write_text("config.json", SMALL);
    ca_bert_config c;
    T_OK(ca_bert_config_load(g_tmp, &c));
    ca_bert_check r;
    /* BertModel's names, with the position_ids buffer */
    write_checkpoint("a.safetensors", &c,
                     &(variant){.prefix = "", .extra = {"embeddings.position_ids"}});
    T_OK(ca_bert_check_checkpoint(path_of("a.safetensors"), &c, &r));
    assert_string_equal(r.prefix, "");
    assert_int_equal(r.matched, 39);
    assert_int_equal(r.extra, 1);
    assert_true(r.has_pooler);
    /* BertForSequenceClassification's: "bert." and a classifier; no pooler */
    write_checkpoint("b.safetensors", &c,
                     &(variant){.prefix = "bert.", .skip = {"bert.pooler.dense.weight"},
                                .extra = {"classifier.weight", "classifier.bias"}});
    assert_int_equal(ca_bert_check_checkpoint(path_of("b.safetensors"), &c, &r), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "only one of 'pooler.dense.weight'"));
    /* missing tensor */
    write_checkpoint("c.safetensors", &c,
                     &(variant){.prefix = "bert.",
                                .skip = {"bert.encoder.layer.1.attention.self.key.bias"}});
    assert_int_equal(ca_bert_check_checkpoint(path_of("c.safetensors"), &c, &r), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(),
                           "tensor 'bert.encoder.layer.1.attention.self.key.bias' is missing"));
    assert_non_null(strstr(ca_last_error(), path_of("c.safetensors")));
    /* wrong shape */
    write_checkpoint("d.safetensors", &c,
                     &(variant){.prefix = "", .override_name = "encoder.layer.0.output.dense.weight",
                                .override_shape = {8, 4}});
    assert_int_equal(ca_bert_check_checkpoint(path_of("d.safetensors"), &c, &r), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "'encoder.layer.0.output.dense.weight' has shape "
                                            "[8, 4]; the config implies [4, 8]"));
    /* a layer the config does not have */
    write_checkpoint("e.safetensors", &c,
                     &(variant){.prefix = "", .extra = {"encoder.layer.2.output.dense.bias"}});
    assert_int_equal(ca_bert_check_checkpoint(path_of("e.safetensors"), &c, &r), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "is in layer 2, but the config's num_hidden_layers is 2"));
    /* not floating point */
    write_checkpoint("f.safetensors", &c,
                     &(variant){.prefix = "", .i64 = "embeddings.LayerNorm.bias"});
    assert_int_equal(ca_bert_check_checkpoint(path_of("f.safetensors"), &c, &r), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "'embeddings.LayerNorm.bias' is I64"));
    /* no pooler at all is fine (BertModel(add_pooling_layer=False)) */
    write_checkpoint("g.safetensors", &c,
                     &(variant){.prefix = "bert.",
                                .skip = {"bert.pooler.dense.weight", "bert.pooler.dense.bias"},
                                .extra = {"classifier.weight", "classifier.bias"}});
    T_OK(ca_bert_check_checkpoint(path_of("g.safetensors"), &c, &r));
    assert_string_equal(r.prefix, "bert.");
    assert_int_equal(r.matched, 37);
    assert_int_equal(r.extra, 2);
    assert_false(r.has_pooler);
    assert_false(r.gamma_beta);
    /* older checkpoints' LayerNorm.gamma / LayerNorm.beta */
    write_checkpoint("h.safetensors", &c, &(variant){.prefix = "bert.", .gamma_beta = true});
    T_OK(ca_bert_check_checkpoint(path_of("h.safetensors"), &c, &r));
    assert_int_equal(r.matched, 39);
    assert_int_equal(r.extra, 0);
    assert_true(r.gamma_beta);
    assert_int_equal(ca_bert_check_checkpoint(path_of("none.safetensors"), &c, &r),
                     CA_ERR_NOT_FOUND);
}

/* A config asking for more layers than the file has fails at once, from the names the file holds,
 * without first making the config's 16 names a layer (10^7 layers: 160 million names, 19 GB). */
static void test_checkpoint_fewer_layers(void **state) {
    (void)state;
    write_text("config.json", SMALL);
    ca_bert_config c;
    T_OK(ca_bert_config_load(g_tmp, &c));
    write_checkpoint("a.safetensors", &c, &(variant){.prefix = "bert."});
    c.num_hidden_layers = 10000000;
    ca_bert_check r;
    assert_int_equal(ca_bert_check_checkpoint(path_of("a.safetensors"), &c, &r), CA_ERR_INVALID);
    const char *e = ca_last_error();
    if (!strstr(e, path_of("a.safetensors")) ||
        !strstr(e, "no tensor 'bert.encoder.layer.2.attention.self.query.weight': the config asks for "
                   "10000000 layers, the file has 2"))
        fail_msg("%s", e);
    c.num_hidden_layers = 3;
    assert_int_equal(ca_bert_check_checkpoint(path_of("a.safetensors"), &c, &r), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "asks for 3 layers, the file has 2"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_tensor_names),
        cmocka_unit_test(test_checkpoint),
        cmocka_unit_test(test_config_sizes),
        cmocka_unit_test(test_checkpoint_fewer_layers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
