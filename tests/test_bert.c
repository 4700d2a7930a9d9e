/* BertModel and BertForSequenceClassification on a small config: Hugging Face's parameter names,
 * padding that changes nothing, gradients reaching every parameter, the save/load round trip
 * (with and without the "bert." prefix, gamma/beta names, a missing pooler) and the mismatch
 * errors naming file, tensor and shapes, and config.json written back. tests/test_bert_parity.sh
 * compares the real checkpoint's outputs with PyTorch. */
#include "test_util.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char g_tmp[] = "/tmp/caccel-bertm-XXXXXX";

static int setup(void **state) {
    (void)state;
    ca_manual_seed(7);
    return mkdtemp(g_tmp) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    ca_scope_release_all();
    return system(cmd);
}

static const char *sub(const char *name) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_tmp, name);
    mkdir(p[k], 0777);
    return p[k];
}

/* 20 tokens, hidden 8, 2 heads, 2 layers, intermediate 16, 16 positions, pad 0. */
static ca_bert_config small(void) {
    return (ca_bert_config){.vocab_size = 20, .hidden_size = 8, .num_hidden_layers = 2, .num_attention_heads = 2,
                            .intermediate_size = 16, .hidden_act = "gelu", .hidden_dropout_prob = 0.1,
                            .attention_probs_dropout_prob = 0.1, .max_position_embeddings = 16,
                            .type_vocab_size = 2, .layer_norm_eps = 1e-12, .pad_token_id = 0, .num_labels = 3};
}

static void test_names(void **state) {
    (void)state;
    ca_bert_config c = small();
    ca_module *m;
    T_OK(ca_bert_model_create(&c, &m));
    ca_bert_tensor want[64];
    int64_t n = ca_bert_tensor_names(&c, want, 64);
    assert_int_equal(ca_module_num_params(m), n);            /* 5 + 16 * 2 + 2 */
    for (int64_t i = 0; i < n; i++) {
        ca_tensor *p = T_NN(ca_module_param(m, want[i].name));
        assert_int_equal(ca_tensor_ndim(p), want[i].ndim);
        for (int d = 0; d < want[i].ndim; d++) assert_int_equal(ca_tensor_shape(p)[d], want[i].shape[d]);
    }
    ca_module_destroy(m);
    T_OK(ca_bert_for_sequence_classification_create(&c, 0, &m));
    assert_string_equal(ca_module_param_name(m, 0), "bert.embeddings.word_embeddings.weight");
    assert_non_null(ca_module_param(m, "bert.encoder.layer.1.output.LayerNorm.bias"));
    assert_int_equal(ca_tensor_shape(T_NN(ca_module_param(m, "classifier.weight")))[0], 3);
    assert_int_equal(ca_bert_module_config(m)->num_labels, 3);
    ca_module_destroy(m);
}

/* Pooled output of ids [1, len] with `pad` padding positions appended (masked). */
static void pooled(ca_module *m, const int64_t *ids, int64_t len, int64_t pad, float *out) {
    int64_t x[2][16] = {{0}};
    for (int64_t i = 0; i < len; i++) x[0][i] = ids[i], x[1][i] = 1;
    int64_t l = len + pad;
    int64_t flat[32];
    for (int64_t i = 0; i < l; i++) flat[i] = x[0][i], flat[l + i] = x[1][i];
    CA_SCOPE {
        ca_tensor *t = T_NN(ca_from_host(ca_cpu_device(), CA_I64, 3, (int64_t[]){1, 2, l}, flat));
        T_OK(ca_tensor_to_host(T_NN(ca_module_forward(m, t)), out, 8 * sizeof(float)));
    }
}

static void test_padding_and_eval(void **state) {
    (void)state;
    ca_bert_config c = small();
    ca_module *m;
    T_OK(ca_bert_model_create(&c, &m));
    ca_module_train(m, false);
    int64_t ids[5] = {2, 7, 11, 5, 3};
    float a[8], b[8], d[8];
    pooled(m, ids, 5, 0, a);
    pooled(m, ids, 5, 6, b);                                  /* padding is masked out */
    for (int i = 0; i < 8; i++) assert_true(fabsf(a[i] - b[i]) < 1e-5f);
    pooled(m, ids, 5, 0, d);                                  /* eval: no dropout, deterministic */
    for (int i = 0; i < 8; i++) assert_true(a[i] == d[i]);
    ids[4] = 4;
    pooled(m, ids, 5, 0, d);                                  /* but the tokens matter */
    float diff = 0;
    for (int i = 0; i < 8; i++) diff += fabsf(a[i] - d[i]);
    assert_true(diff > 0);        /* small: N(0, 0.02) weights barely mix positions */
    ca_module_destroy(m);
}

static void test_gradients(void **state) {
    (void)state;
    ca_bert_config c = small();
    ca_module *m;
    T_OK(ca_bert_for_sequence_classification_create(&c, 3, &m));
    int64_t x[2 * 2 * 6] = {1, 5, 6, 7, 8, 2, 1, 1, 1, 1, 1, 1,  /* ids, mask of row 0 */
                            1, 9, 2, 0, 0, 0, 1, 1, 1, 0, 0, 0}; /* row 1: 3 tokens, padding */
    int64_t y[2] = {0, 2};
    CA_SCOPE {
        ca_tensor *xt = T_NN(ca_from_host(ca_cpu_device(), CA_I64, 3, (int64_t[]){2, 2, 6}, x));
        ca_tensor *yt = T_NN(ca_from_host(ca_cpu_device(), CA_I64, 1, (int64_t[]){2}, y));
        ca_tensor *loss = T_NN(ca_cross_entropy(ca_module_forward(m, xt), yt));
        T_OK(ca_autograd_backward(loss));
    }
    for (int i = 0; i < ca_module_num_params(m); i++) {
        const char *name = ca_module_param_name(m, i);
        ca_tensor *g = ca_tensor_grad(ca_module_param_at(m, i));
        if (!g) fail_msg("no gradient for %s", name);
        /* the pad token's embedding row (padding_idx 0) gets none, as in torch */
        if (!strcmp(name, "bert.embeddings.word_embeddings.weight")) {
            float row0[8];
            T_OK(ca_tensor_to_host(ca_narrow(g, 0, 0, 1), row0, sizeof row0));
            for (int k = 0; k < 8; k++) assert_true(row0[k] == 0.0f);
        }
    }
    ca_module_destroy(m);
}

static void assert_same_params(ca_module *a, const char *prefix_a, ca_module *b) {
    for (int i = 0; i < ca_module_num_params(b); i++) {
        char name[160];
        snprintf(name, sizeof name, "%s%s", prefix_a, ca_module_param_name(b, i));
        ca_tensor *pa = T_NN(ca_module_param(a, name)), *pb = ca_module_param_at(b, i);
        size_t n = ca_tensor_nbytes(pb);
        float *ha = malloc(n), *hb = malloc(n);
        T_OK(ca_tensor_to_host(pa, ha, n));
        T_OK(ca_tensor_to_host(pb, hb, n));
        if (memcmp(ha, hb, n)) fail_msg("%s differs after loading", name);
        free(ha);
        free(hb);
    }
}

/* Copies dir/model.safetensors to to/model.safetensors with LayerNorm weight/bias renamed gamma/beta
 * in the header (same lengths: `.weight"` becomes `.gamma" `, JSON whitespace after the key). */
static void gamma_beta_copy(const char *dir, const char *to) {
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    uint64_t hlen;
    memcpy(&hlen, buf, 8);
    int renamed = 0;
    for (char *p = buf + 8; p < buf + 8 + hlen - 17; p++) {
        if (!memcmp(p, "LayerNorm.weight\"", 17)) { memcpy(p, "LayerNorm.gamma\" ", 17); renamed++; }
        else if (!memcmp(p, "LayerNorm.bias\"", 15)) { memcpy(p, "LayerNorm.beta\"", 15); renamed++; }
    }
    assert_int_equal(renamed, 2 * (1 + 2 * 2));               /* embeddings + 2 per layer */
    snprintf(path, sizeof path, "%s/model.safetensors", to);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    free(buf);
}

static void test_round_trip(void **state) {
    (void)state;
    ca_bert_config c = small();
    ca_module *cls, *cls2, *bert;
    T_OK(ca_bert_for_sequence_classification_create(&c, 3, &cls));
    const char *dir = sub("cls");
    T_OK(ca_save_model(NULL, cls, dir, 0));
    T_OK(ca_bert_save_config(cls, dir, (const char *[]){"a", "b", "c"}));
    ca_bert_config back;
    T_OK(ca_bert_config_load(dir, &back));                    /* config.json reads back */
    assert_int_equal(back.num_labels, 3);
    assert_int_equal(back.intermediate_size, 16);
    assert_string_equal(back.architectures, "BertForSequenceClassification");

    ca_bert_load_info info;                                   /* classifier file -> BertModel */
    T_OK(ca_bert_model_create(&back, &bert));
    T_OK(ca_bert_load_pretrained(bert, dir, &info));
    assert_string_equal(info.prefix, "bert.");
    assert_int_equal(info.loaded, 39);
    assert_int_equal(info.unused, 2);                         /* classifier.weight/bias */
    assert_same_params(cls, "bert.", bert);

    ca_manual_seed(99);                                       /* classifier file -> classifier */
    T_OK(ca_bert_for_sequence_classification_create(&back, 0, &cls2));
    T_OK(ca_bert_load_pretrained(cls2, dir, &info));
    assert_int_equal(info.loaded, 41);
    assert_int_equal(info.initialized, 0);
    assert_same_params(cls, "", cls2);
    ca_module_destroy(cls2);

    const char *dir2 = sub("model");                          /* BertModel file -> classifier */
    T_OK(ca_save_model(NULL, bert, dir2, 0));
    T_OK(ca_bert_for_sequence_classification_create(&back, 0, &cls2));
    T_OK(ca_bert_load_pretrained(cls2, dir2, &info));
    assert_string_equal(info.prefix, "");
    assert_int_equal(info.loaded, 39);
    assert_int_equal(info.initialized, 2);
    assert_string_equal(info.first_initialized, "classifier.weight");
    assert_same_params(cls2, "bert.", bert);
    ca_module_destroy(cls2);

    const char *dir3 = sub("gamma");                          /* older LayerNorm names */
    gamma_beta_copy(dir2, dir3);
    T_OK(ca_bert_for_sequence_classification_create(&back, 0, &cls2));
    T_OK(ca_bert_load_pretrained(cls2, dir3, &info));
    assert_int_equal(info.loaded, 39);
    assert_same_params(cls2, "bert.", bert);
    ca_module_destroy(cls2);
    ca_module_destroy(bert);
    ca_module_destroy(cls);
}

static void test_mismatch(void **state) {
    (void)state;
    ca_bert_config c = small(), wide = small();
    wide.intermediate_size = 12;
    ca_module *m, *w;
    T_OK(ca_bert_model_create(&wide, &w));
    const char *dir = sub("wide");
    T_OK(ca_save_model(NULL, w, dir, 0));
    T_OK(ca_bert_model_create(&c, &m));
    ca_tensor *p = ca_module_param(m, "encoder.layer.0.intermediate.dense.weight");
    float before[4], after[4];
    T_OK(ca_tensor_to_host(ca_narrow(ca_reshape(p, 1, (int64_t[]){-1}), 0, 0, 4), before, sizeof before));
    assert_int_equal(ca_bert_load_pretrained(m, dir, NULL), CA_ERR_INVALID);
    const char *e = ca_last_error();
    if (!strstr(e, "model.safetensors") || !strstr(e, "encoder.layer.0.intermediate.dense.weight") ||
        !strstr(e, "[12, 8]") || !strstr(e, "[16, 8]"))
        fail_msg("message lacks the file, tensor or shapes: %s", e);
    T_OK(ca_tensor_to_host(ca_narrow(ca_reshape(p, 1, (int64_t[]){-1}), 0, 0, 4), after, sizeof after));
    assert_memory_equal(before, after, sizeof before);        /* unchanged on failure */
    assert_int_equal(ca_bert_load_pretrained(m, sub("empty"), NULL), CA_ERR_NOT_FOUND);
    if (!strstr(ca_last_error(), "empty/model.safetensors")) fail_msg("%s", ca_last_error());
    ca_module_destroy(w);
    ca_module_destroy(m);
}

/* A config of sizes no memory holds fails before any allocation, naming the key; *out is NULL. */
static void test_sizes_refused(void **state) {
    (void)state;
    static int stale_obj;
    ca_bert_config c = small();
    c.intermediate_size = (int64_t)1 << 40;
    ca_module *m = (ca_module *)&stale_obj;
    assert_int_equal(ca_bert_model_create(&c, &m), CA_ERR_INVALID);
    assert_null(m);
    if (!strstr(ca_last_error(), "BertModel: \"intermediate_size\" 1099511627776 makes a 1099511627776 x 8 "
                                 "weight (encoder.layer.N.intermediate.dense.weight"))
        fail_msg("%s", ca_last_error());
    c = small();
    c.max_position_embeddings = (int64_t)1 << 40;
    assert_int_equal(ca_bert_model_create(&c, &m), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "\"max_position_embeddings\" 1099511627776 makes a"));
    c = small();
    c.num_attention_heads = 0;
    assert_int_equal(ca_bert_model_create(&c, &m), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "BertModel: \"num_attention_heads\" is 0; it must be at least 1"));
    c = small();
    m = (ca_module *)&stale_obj;
    assert_int_equal(ca_bert_for_sequence_classification_create(&c, (int64_t)1 << 40, &m), CA_ERR_INVALID);
    assert_null(m);
    if (!strstr(ca_last_error(), "BertForSequenceClassification: \"num_labels\" 1099511627776 makes a "
                                 "1099511627776 x 8 weight (classifier.weight"))
        fail_msg("%s", ca_last_error());
}

/* The process's mapped size (VmSize), in bytes; 0 when /proc does not say. */
static uint64_t vm_size(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb * 1024;
}

/* The child of test_out_of_memory, a fresh process (main runs this when OOM_CHILD is set): under
 * an address-space limit of what it maps plus 64 MiB, a model the size check lets through (it is
 * below the limit) but that does not fit beside what the process already maps. The allocation of
 * a weight fails, and construction must return CA_ERR_NOMEM naming the layer, with *out NULL and
 * nothing leaked, rather than destroy the module the failed constructor never made (SIGSEGV). */
#define OOM_CHILD "CACCEL_TEST_BERT_OOM_CHILD"
static int oom_child(void) {
    if (!ca_cpu_device()) return 2;                /* opened before the limit, as a program's is */
    uint64_t vm = vm_size();
    if (!vm) return 2;
    const uint64_t headroom = 64 << 20;
    uint64_t want = headroom + (vm / 2 < (256u << 20) ? vm / 2 : (256u << 20));   /* in (headroom, vm + headroom) */
    ca_bert_config c = small();
    c.hidden_size = 256;
    c.num_attention_heads = 4;
    c.intermediate_size = (int64_t)(want / 4 / 256 / 2);   /* two such weights a layer */
    c.num_hidden_layers = 1;
    struct rlimit old, rl;
    getrlimit(RLIMIT_AS, &old);
    rl = old;
    rl.rlim_cur = vm + headroom;
    if (setrlimit(RLIMIT_AS, &rl) != 0) return 3;
    ca_module *m = (ca_module *)&c;                /* stale: a failure must set it NULL */
    ca_status s = ca_bert_model_create(&c, &m);
    bool clean = s == CA_ERR_NOMEM && m == NULL && strstr(ca_last_error(), "BertModel: encoder.layer.0: ");
    printf("child: %s: %s\n", ca_status_name(s), ca_last_error());
    setrlimit(RLIMIT_AS, &old);                    /* the leak check at exit needs its memory */
    if (s == CA_OK) ca_module_destroy(m);
    ca_shutdown();
    return clean ? 0 : 1;
}

/* Runs oom_child in a new process image: there ASan (in the sanitizer build) can be told to return
 * NULL from a failed allocation, as malloc does, rather than report and abort. */
static void test_out_of_memory(void **state) {
    (void)state;
    if (getenv("CACCEL_UNDER_VALGRIND")) skip();   /* /proc/self/exe is valgrind's own program there */
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        const char *asan = getenv("ASAN_OPTIONS");
        char opts[1024];
        snprintf(opts, sizeof opts, "%s%sallocator_may_return_null=1", asan ? asan : "", asan && *asan ? ":" : "");
        setenv("ASAN_OPTIONS", opts, 1);
        setenv(OOM_CHILD, "1", 1);
        execl("/proc/self/exe", "test_bert", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the child %s %d", WIFEXITED(status) ? "exited with" : "died of signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

int main(void) {
    if (getenv(OOM_CHILD)) return oom_child();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_padding_and_eval),
        cmocka_unit_test(test_gradients),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_sizes_refused),
        cmocka_unit_test(test_out_of_memory),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    ca_shutdown();
    return rc;
}
