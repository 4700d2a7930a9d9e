/* A Hugging Face BERT checkpoint's config.json (BertConfig), the names and shapes of BertModel's
 * parameters, and the check that a model.safetensors holds them. */
#include "nn/nn_impl.h"
#include "tensor/safetensors_impl.h"
#include "core/json_impl.h"
#include "base/file_impl.h"

#include <caccel/bert_config.h>

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* Activations BertConfig names that transformers' ACT2FN maps. */
static const char *const known_acts[] = {"gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast",
                                         "quick_gelu", "relu", "silu", "swish", "tanh", "mish"};

static void defaults(ca_bert_config *c) {
    memset(c, 0, sizeof *c);
    c->vocab_size = 30522;
    c->hidden_size = 768;
    c->num_hidden_layers = 12;
    c->num_attention_heads = 12;
    c->intermediate_size = 3072;
    snprintf(c->hidden_act, sizeof c->hidden_act, "gelu");
    c->hidden_dropout_prob = 0.1;
    c->attention_probs_dropout_prob = 0.1;
    c->max_position_embeddings = 512;
    c->type_vocab_size = 2;
    c->layer_norm_eps = 1e-12;
    c->pad_token_id = 0;
    c->num_labels = 2;
}

static json_object *get(json_object *o, const char *key) {
    json_object *v = NULL;
    return json_object_object_get_ex(o, key, &v) ? v : NULL;
}

/* Integer key: absent keeps *v; present must be an integer in [lo, 2^40] (what the sizes may be
 * is ca_bert_check_sizes's to say, with the memory there is). */
static ca_status get_int(json_object *root, const char *key, int64_t lo, int64_t *v,
                         const char *path) {
    json_object *o = get(root, key);
    if (!o) return CA_OK;
    if (!json_object_is_type(o, json_type_int) || json_object_get_int64(o) < lo ||
        json_object_get_int64(o) > ((int64_t)1 << 40))
        return ca_error(CA_ERR_INVALID, "config '%s': \"%s\" is %s; an integer in [%lld, 2^40] is "
                        "needed", path, key, json_object_to_json_string(o), (long long)lo);
    *v = json_object_get_int64(o);
    return CA_OK;
}

static ca_status get_real(json_object *root, const char *key, double lo, double hi, double *v,
                          const char *path) {
    json_object *o = get(root, key);
    if (!o) return CA_OK;
    double d = json_object_get_double(o);
    if (!(json_object_is_type(o, json_type_double) || json_object_is_type(o, json_type_int)) ||
        !(d >= lo && d <= hi))
        return ca_error(CA_ERR_INVALID, "config '%s': \"%s\" is %s; a number in [%g, %g] is needed",
                        path, key, json_object_to_json_string(o), lo, hi);
    *v = d;
    return CA_OK;
}

static ca_status check_identity(json_object *root, ca_bert_config *c, const char *path) {
    json_object *mt = get(root, "model_type");
    const char *type = mt && json_object_is_type(mt, json_type_string) ? json_object_get_string(mt)
                                                                       : NULL;
    if (!type || strcmp(type, "bert") != 0)
        return ca_error(CA_ERR_UNSUPPORTED,
                        "config '%s': \"model_type\" is %s; only \"bert\" (BertConfig) is supported",
                        path, mt ? json_object_to_json_string(mt) : "missing");
    json_object *arch = get(root, "architectures");
    size_t n = arch && json_object_is_type(arch, json_type_array) ? json_object_array_length(arch) : 0;
    if (arch && !json_object_is_type(arch, json_type_array) && !json_object_is_type(arch, json_type_null))
        return ca_error(CA_ERR_INVALID, "config '%s': \"architectures\" is not a list", path);
    for (size_t i = 0; i < n; i++) {
        const char *a = json_object_get_string(json_object_array_get_idx(arch, i));
        if (!a || strncmp(a, "Bert", 4) != 0)
            return ca_error(CA_ERR_UNSUPPORTED,
                            "config '%s': \"architectures\"[%zu] is '%s'; only Bert* classes "
                            "(BertModel, BertForSequenceClassification, ...) are supported",
                            path, i, a ? a : "?");
        size_t used = strlen(c->architectures);
        snprintf(c->architectures + used, sizeof c->architectures - used, "%s%s", i ? "," : "", a);
    }
    json_object *pe = get(root, "position_embedding_type");
    if (pe && strcmp(json_object_get_string(pe), "absolute") != 0)
        return ca_error(CA_ERR_UNSUPPORTED,
                        "config '%s': \"position_embedding_type\" is %s; only \"absolute\" is "
                        "supported",
                        path, json_object_to_json_string(pe));
    return CA_OK;
}

static ca_status read_act(json_object *root, ca_bert_config *c, const char *path) {
    json_object *o = get(root, "hidden_act");
    if (!o) return CA_OK;
    const char *a = json_object_is_type(o, json_type_string) ? json_object_get_string(o) : NULL;
    for (size_t i = 0; a && i < sizeof known_acts / sizeof *known_acts; i++)
        if (strcmp(a, known_acts[i]) == 0) {
            snprintf(c->hidden_act, sizeof c->hidden_act, "%s", a);
            return CA_OK;
        }
    return ca_error(CA_ERR_UNSUPPORTED, "config '%s': \"hidden_act\" is %s, not an activation "
                    "transformers' BERT knows (gelu, gelu_new, relu, silu, tanh, ...)",
                    path, json_object_to_json_string(o));
}

static ca_status read_fields(json_object *root, ca_bert_config *c, const char *path) {
    ca_status st = check_identity(root, c, path);
    if (st == CA_OK) st = read_act(root, c, path);
    if (st == CA_OK) st = get_int(root, "vocab_size", 1, &c->vocab_size, path);
    if (st == CA_OK) st = get_int(root, "hidden_size", 1, &c->hidden_size, path);
    if (st == CA_OK) st = get_int(root, "num_hidden_layers", 1, &c->num_hidden_layers, path);
    if (st == CA_OK) st = get_int(root, "num_attention_heads", 1, &c->num_attention_heads, path);
    if (st == CA_OK) st = get_int(root, "intermediate_size", 1, &c->intermediate_size, path);
    if (st == CA_OK) st = get_int(root, "max_position_embeddings", 1, &c->max_position_embeddings, path);
    if (st == CA_OK) st = get_int(root, "type_vocab_size", 1, &c->type_vocab_size, path);
    if (st == CA_OK) st = get_int(root, "pad_token_id", 0, &c->pad_token_id, path);
    if (st == CA_OK) st = get_int(root, "num_labels", 1, &c->num_labels, path);
    if (st == CA_OK) st = get_real(root, "layer_norm_eps", 0, 1, &c->layer_norm_eps, path);
    if (st == CA_OK) st = get_real(root, "hidden_dropout_prob", 0, 1, &c->hidden_dropout_prob, path);
    if (st == CA_OK)
        st = get_real(root, "attention_probs_dropout_prob", 0, 1, &c->attention_probs_dropout_prob,
                      path);
    json_object *labels = get(root, "id2label");
    if (st == CA_OK && labels && json_object_is_type(labels, json_type_object))
        c->num_labels = json_object_object_length(labels);
    if (st == CA_OK) {
        char what[4200];
        snprintf(what, sizeof what, "config '%s'", path);
        st = ca_bert_check_sizes(c, c->num_labels, what);
    }
    if (st == CA_OK && c->pad_token_id >= c->vocab_size)
        st = ca_error(CA_ERR_INVALID, "config '%s': \"pad_token_id\" %lld is not below "
                      "\"vocab_size\" %lld", path, (long long)c->pad_token_id,
                      (long long)c->vocab_size);
    return st;
}

static ca_status parse(const char *path, ca_bert_config *out) {
    char why[256];
    ca_status rs;
    json_object *root = ca_json_load(path, CA_FILE_MODEL_CONFIG, why, sizeof why, &rs);
    if (!root && !why[0]) return rs;   /* the reader's error names the file */
    if (!root) return ca_error(CA_ERR_INVALID, "config '%s': not valid JSON: %s", path, why);
    ca_status st = json_object_is_type(root, json_type_object)
                       ? read_fields(root, out, path)
                       : ca_error(CA_ERR_INVALID, "config '%s': not a JSON object but a JSON %s", path,
                                  json_type_to_name(json_object_get_type(root)));
    json_object_put(root);
    return st;
}

ca_status ca_bert_config_load(const char *path, ca_bert_config *out) {
    if (!path || !out) return ca_error(CA_ERR_INVALID, "ca_bert_config_load: NULL argument");
    ca_bert_config c;
    defaults(&c);
    struct stat st;
    char file[4096];
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(file, sizeof file, "%s/config.json", path);
        path = file;
    }
    ca_status s = parse(path, &c);
    if (s == CA_OK) *out = c;
    return s;
}

/* ------------------------------------------------------------------ sizes */

/* The deepest Transformers published have about 1,000 layers; a config asking for more is a typo
 * or hostile, and each layer is 8 modules and 16 tensors to build, name and look up. */
#define MAX_LAYERS 1000

/* The memory a model's parameters may take: physical memory, or the process's address-space or
 * data limit (ulimit -v, ulimit -d) when one is lower. *what says which. */
static double memory_there_is(const char **what) {
    double mem = 1e300;
    *what = "physical memory";
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) mem = (double)pages * (double)page;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (double)rl.rlim_cur < mem) {
        mem = (double)rl.rlim_cur;
        *what = "the address-space limit RLIMIT_AS, ulimit -v";
    }
    if (getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (double)rl.rlim_cur < mem) {
        mem = (double)rl.rlim_cur;
        *what = "the data limit RLIMIT_DATA, ulimit -d";
    }
    return mem;
}

static const char *human_bytes(double b, char *buf, size_t len) {
    static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
    int u = 0;
    for (; b >= 1024 && u < 8; u++) b /= 1024;
    snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
    return buf;
}

/* A weight of BertModel (or of the classifier) and the keys its sizes come from. */
typedef struct bert_weight {
    const char *name, *rows_key, *cols_key;
    int64_t rows, cols;
} bert_weight;

/* The parameters of BertModel for c, with a classifier of num_labels (0: none). In double: the
 * sizes may be up to 2^63 each, and this only has to say "too many". */
static double param_count(const ca_bert_config *c, int64_t num_labels) {
    double H = (double)c->hidden_size, I = (double)c->intermediate_size;
    double layer = 4 * (H * H + H) + (I * H + I) + (H * I + H) + 2 * 2 * H;
    double n = ((double)c->vocab_size + (double)c->max_position_embeddings + (double)c->type_vocab_size) * H;
    n += 2 * H;
    n += (double)c->num_hidden_layers * layer + H * H + H;
    return n + (num_labels > 0 ? (double)num_labels * (H + 1) : 0);
}

/* Each weight, then the whole model, against the memory there is (f32 parameters, as
 * ca_bert_model_create makes them): a size of 2^40 fails here, naming its key, rather than in an
 * allocation of petabytes. */
static ca_status check_memory(const ca_bert_config *c, int64_t num_labels, const char *what) {
    const char *mem_what;
    double mem = memory_there_is(&mem_what);
    int64_t H = c->hidden_size;
    const bert_weight w[] = {
        {"embeddings.word_embeddings.weight", "vocab_size", "hidden_size", c->vocab_size, H},
        {"embeddings.position_embeddings.weight", "max_position_embeddings", "hidden_size",
         c->max_position_embeddings, H},
        {"embeddings.token_type_embeddings.weight", "type_vocab_size", "hidden_size", c->type_vocab_size, H},
        {"encoder.layer.N.attention.self.query.weight", "hidden_size", "hidden_size", H, H},
        {"encoder.layer.N.intermediate.dense.weight", "intermediate_size", "hidden_size",
         c->intermediate_size, H},
        {"classifier.weight", "num_labels", "hidden_size", num_labels > 0 ? num_labels : 1, H},
    };
    char b[32], m[32];
    for (size_t i = 0; i < sizeof w / sizeof *w; i++) {
        double bytes = (double)w[i].rows * (double)w[i].cols * sizeof(float);
        if (bytes <= mem) continue;
        bool rows = w[i].rows >= w[i].cols;
        return ca_error(CA_ERR_INVALID, "%s: \"%s\" %lld makes a %lld x %lld weight (%s, %s in f32) "
                        "larger than the %s of memory there is (%s)", what,
                        rows ? w[i].rows_key : w[i].cols_key, (long long)(rows ? w[i].rows : w[i].cols),
                        (long long)w[i].rows, (long long)w[i].cols, w[i].name,
                        human_bytes(bytes, b, sizeof b), human_bytes(mem, m, sizeof m), mem_what);
    }
    double n = param_count(c, num_labels);
    if (n * sizeof(float) > mem)
        return ca_error(CA_ERR_INVALID, "%s: %lld layers (\"num_hidden_layers\") of \"hidden_size\" %lld "
                        "and \"intermediate_size\" %lld make %.3g parameters (%s in f32), more than the %s "
                        "of memory there is (%s)", what, (long long)c->num_hidden_layers, (long long)H,
                        (long long)c->intermediate_size, n, human_bytes(n * sizeof(float), b, sizeof b),
                        human_bytes(mem, m, sizeof m), mem_what);
    return CA_OK;
}

ca_status ca_bert_check_sizes(const ca_bert_config *c, int64_t num_labels, const char *what) {
    const struct { const char *key; int64_t v, lo; } sizes[] = {
        {"vocab_size", c->vocab_size, 1}, {"hidden_size", c->hidden_size, 1},
        {"num_hidden_layers", c->num_hidden_layers, 0}, {"num_attention_heads", c->num_attention_heads, 1},
        {"intermediate_size", c->intermediate_size, 1},
        {"max_position_embeddings", c->max_position_embeddings, 1},
        {"type_vocab_size", c->type_vocab_size, 1},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        if (sizes[i].v < sizes[i].lo)
            return ca_error(CA_ERR_INVALID, "%s: \"%s\" is %lld; it must be at least %lld", what, sizes[i].key,
                            (long long)sizes[i].v, (long long)sizes[i].lo);
    if (c->num_hidden_layers > MAX_LAYERS)
        return ca_error(CA_ERR_INVALID, "%s: \"num_hidden_layers\" is %lld; at most %d layers are "
                        "supported", what, (long long)c->num_hidden_layers, MAX_LAYERS);
    if (c->num_attention_heads > c->hidden_size)
        return ca_error(CA_ERR_INVALID, "%s: \"num_attention_heads\" %lld is more than \"hidden_size\" "
                        "%lld (each head has hidden_size / num_attention_heads channels)", what,
                        (long long)c->num_attention_heads, (long long)c->hidden_size);
    if (c->hidden_size % c->num_attention_heads != 0)
        return ca_error(CA_ERR_INVALID, "%s: \"hidden_size\" %lld is not a multiple of "
                        "\"num_attention_heads\" %lld", what, (long long)c->hidden_size,
                        (long long)c->num_attention_heads);
    return check_memory(c, num_labels, what);
}

/* ------------------------------------------------------------------ tensor names */

static void put(ca_bert_tensor *out, int64_t cap, int64_t *k, const char *name, int ndim,
                int64_t d0, int64_t d1) {
    if (*k < cap && out) {
        snprintf(out[*k].name, sizeof out[*k].name, "%s", name);
        out[*k].ndim = ndim;
        out[*k].shape[0] = d0;
        out[*k].shape[1] = ndim > 1 ? d1 : 0;
    }
    (*k)++;
}

/* Linear layer `name` (out x in): weight [out, in] and bias [out]. */
static void put_linear(ca_bert_tensor *out, int64_t cap, int64_t *k, const char *name,
                       int64_t o, int64_t i) {
    char n[96];
    snprintf(n, sizeof n, "%s.weight", name);
    put(out, cap, k, n, 2, o, i);
    snprintf(n, sizeof n, "%s.bias", name);
    put(out, cap, k, n, 1, o, 0);
}

static void put_norm(ca_bert_tensor *out, int64_t cap, int64_t *k, const char *name, int64_t h) {
    char n[96];
    snprintf(n, sizeof n, "%s.weight", name);
    put(out, cap, k, n, 1, h, 0);
    snprintf(n, sizeof n, "%s.bias", name);
    put(out, cap, k, n, 1, h, 0);
}

int64_t ca_bert_tensor_names(const ca_bert_config *c, ca_bert_tensor *out, int64_t cap) {
    if (!c) return 0;
    int64_t k = 0, H = c->hidden_size, I = c->intermediate_size;
    put(out, cap, &k, "embeddings.word_embeddings.weight", 2, c->vocab_size, H);
    put(out, cap, &k, "embeddings.position_embeddings.weight", 2, c->max_position_embeddings, H);
    put(out, cap, &k, "embeddings.token_type_embeddings.weight", 2, c->type_vocab_size, H);
    put_norm(out, cap, &k, "embeddings.LayerNorm", H);
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        char p[96];
        static const char *const qkv[] = {"query", "key", "value"};
        for (int j = 0; j < 3; j++) {
            snprintf(p, sizeof p, "encoder.layer.%lld.attention.self.%s", (long long)l, qkv[j]);
            put_linear(out, cap, &k, p, H, H);
        }
        snprintf(p, sizeof p, "encoder.layer.%lld.attention.output.dense", (long long)l);
        put_linear(out, cap, &k, p, H, H);
        snprintf(p, sizeof p, "encoder.layer.%lld.attention.output.LayerNorm", (long long)l);
        put_norm(out, cap, &k, p, H);
        snprintf(p, sizeof p, "encoder.layer.%lld.intermediate.dense", (long long)l);
        put_linear(out, cap, &k, p, I, H);
        snprintf(p, sizeof p, "encoder.layer.%lld.output.dense", (long long)l);
        put_linear(out, cap, &k, p, H, I);
        snprintf(p, sizeof p, "encoder.layer.%lld.output.LayerNorm", (long long)l);
        put_norm(out, cap, &k, p, H);
    }
    put_linear(out, cap, &k, "pooler.dense", H, H);
    return k;
}

/* ------------------------------------------------------------------ checkpoint check */

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
    int k = snprintf(buf, len, "[");
    for (int i = 0; i < ndim; i++)
        k += snprintf(buf + k, len - (size_t)k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(buf + k, len - (size_t)k, "]");
}

/* The stored name of `want`: prefix + name, or, for a LayerNorm, the TF-era "gamma"/"beta" names
 * that older checkpoints (bert-base-uncased's among them) keep and transformers renames on load. */
static const ca_st_entry *find(const ca_st_file *f, const char *prefix, const char *name,
                               char *stored, size_t len, bool *legacy) {
    snprintf(stored, len, "%s%s", prefix, name);
    const ca_st_entry *e = ca_st_find(f, stored);
    const char *ln = strstr(name, "LayerNorm.");
    if (e || !ln) return e;
    bool w = strcmp(ln, "LayerNorm.weight") == 0;
    snprintf(stored, len, "%s%.*sLayerNorm.%s", prefix, (int)(ln - name), name, w ? "gamma" : "beta");
    e = ca_st_find(f, stored);
    if (e) *legacy = true;
    else snprintf(stored, len, "%s%s", prefix, name);
    return e;
}

static ca_status check_one(const ca_st_file *f, const ca_bert_tensor *want, ca_bert_check *r,
                           bool *found) {
    char name[160];
    const ca_st_entry *e = find(f, r->prefix, want->name, name, sizeof name, &r->gamma_beta);
    *found = e != NULL;
    if (!e) return CA_OK;
    bool same = e->ndim == want->ndim;
    for (int i = 0; same && i < want->ndim; i++) same = e->shape[i] == want->shape[i];
    if (!same) {
        char a[64], b[64];
        shape_str(a, sizeof a, e->ndim, e->shape);
        shape_str(b, sizeof b, want->ndim, want->shape);
        return ca_error(CA_ERR_INVALID, "checkpoint '%s': tensor '%s' has shape %s; the config "
                        "implies %s", f->path, name, a, b);
    }
    if (e->dtype != CA_F32 && e->dtype != CA_F16 && e->dtype != CA_BF16)
        return ca_error(CA_ERR_INVALID, "checkpoint '%s': tensor '%s' is %s, not a floating-point "
                        "dtype (F32, F16, BF16)", f->path, name, ca_st_dtype_name(e->dtype));
    return CA_OK;
}

/* The file's encoder layers must be the config's: an index >= num_hidden_layers in any tensor
 * name is a mismatch, and so are fewer layers than the config asks for. The second is found here,
 * from the names the file has, before the config's names are made: those are 16 a layer, and a
 * config may ask for millions of layers. */
static ca_status check_layers(const ca_st_file *f, const ca_bert_config *c, const char *prefix) {
    char head[64];
    snprintf(head, sizeof head, "%sencoder.layer.", prefix);
    long long have = 0;                    /* the highest layer index in the file, plus one */
    for (int i = 0; i < f->n; i++) {
        const char *n = f->entries[i].name;
        if (strncmp(n, head, strlen(head)) != 0 || !isdigit((unsigned char)n[strlen(head)])) continue;
        long long l = strtoll(n + strlen(head), NULL, 10);
        if (l >= c->num_hidden_layers)
            return ca_error(CA_ERR_INVALID, "checkpoint '%s': tensor '%s' is in layer %lld, but "
                            "the config's num_hidden_layers is %lld", f->path, n, l,
                            (long long)c->num_hidden_layers);
        if (l >= have) have = l + 1;
    }
    if (have < c->num_hidden_layers)
        return ca_error(CA_ERR_INVALID, "checkpoint '%s': no tensor '%s%lld.attention.self.query.weight': "
                        "the config asks for %lld layers, the file has %lld", f->path, head, have,
                        (long long)c->num_hidden_layers, have);
    return CA_OK;
}

static ca_status check_file(const ca_st_file *f, const ca_bert_config *c, ca_bert_check *r) {
    snprintf(r->prefix, sizeof r->prefix, "%s",
             ca_st_find(f, "bert.embeddings.word_embeddings.weight") ? "bert." : "");
    ca_status st = check_layers(f, c, r->prefix);
    if (st != CA_OK) return st;
    int64_t n = ca_bert_tensor_names(c, NULL, 0);
    ca_bert_tensor *want = malloc((size_t)n * sizeof *want);
    if (!want) return ca_error(CA_ERR_NOMEM, "checkpoint '%s': out of memory", f->path);
    ca_bert_tensor_names(c, want, n);
    int64_t pooler = 0;
    for (int64_t i = 0; st == CA_OK && i < n; i++) {
        bool found;
        st = check_one(f, &want[i], r, &found);
        bool is_pooler = strncmp(want[i].name, "pooler.", 7) == 0;
        if (st == CA_OK && !found && !is_pooler)
            st = ca_error(CA_ERR_INVALID, "checkpoint '%s': tensor '%s%s' is missing (the config "
                          "has %lld layers of hidden size %lld)", f->path, r->prefix,
                          want[i].name, (long long)c->num_hidden_layers, (long long)c->hidden_size);
        r->matched += found;
        pooler += found && is_pooler;
    }
    if (st == CA_OK && pooler == 1)
        st = ca_error(CA_ERR_INVALID, "checkpoint '%s': the pooler has only one of "
                      "'pooler.dense.weight' and 'pooler.dense.bias'", f->path);
    r->has_pooler = pooler == 2;
    r->extra = f->n - r->matched;
    free(want);
    return st;
}

ca_status ca_bert_check_checkpoint(const char *path, const ca_bert_config *c,
                                   ca_bert_check *result) {
    if (!path || !c) return ca_error(CA_ERR_INVALID, "ca_bert_check_checkpoint: NULL argument");
    ca_bert_check r;
    memset(&r, 0, sizeof r);
    ca_st_file f;
    ca_status st = ca_st_open(path, &f);
    if (st == CA_OK) st = check_file(&f, c, &r);
    ca_st_close(&f);
    if (result) *result = r;
    return st;
}
