/* PEFT's adapter files (peft 0.10): adapter_config.json and adapter_model.safetensors, read and
 * written for ca_lora_save / ca_lora_load, and the merge of an adapter into a base checkpoint's
 * files (`caccel merge-weights --adapter`). */
#include "nn/lora_impl.h"
#include "tensor/safetensors_impl.h"
#include "core/json_impl.h"
#include "base/file_impl.h"
#include "base/half_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CONFIG_FILE "adapter_config.json"
#define WEIGHTS_FILE "adapter_model.safetensors"
/* PeftModel holds LoraModel as base_model, which holds the model as model; peft 0.10 drops the
 * adapter's name ("default") from the saved names. */
#define PEFT_PREFIX "base_model.model."

/* ------------------------------------------------------------------ adapter_config.json */

static json_object *member(json_object *o, const char *key) { return ca_json_member(o, key); }

static bool is_null_or_empty(json_object *v) {
    if (!v) return true;
    if (json_object_is_type(v, json_type_array)) return json_object_array_length(v) == 0;
    if (json_object_is_type(v, json_type_object)) return json_object_object_length(v) == 0;
    return false;
}

/* Options of LoraConfig caccel does not implement: refused unless absent, null, false or empty. */
static ca_status check_unsupported(json_object *root, const char *path) {
    static const char *const keys[] = {"use_dora", "modules_to_save", "layers_to_transform", "rank_pattern",
                                       "alpha_pattern", "layer_replication"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        json_object *v = member(root, keys[i]);
        bool off = is_null_or_empty(v) || (json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v));
        if (!off)
            return ca_error(CA_ERR_UNSUPPORTED, "adapter '%s': \"%s\" is %s; caccel implements LoRA without it", path,
                            keys[i], json_object_to_json_string(v));
    }
    return CA_OK;
}

static ca_status want(bool ok, const char *path, const char *key, json_object *v, const char *what) {
    if (ok) return CA_OK;
    return ca_error(CA_ERR_INVALID, "adapter '%s': \"%s\" is %s; %s is needed", path, key,
                    v ? json_object_to_json_string(v) : "missing", what);
}

static bool is_number(json_object *v) {
    return v && (json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double));
}

static const char *opt_string(json_object *root, const char *key, ca_status *s, const char *path) {
    json_object *v = member(root, key);
    if (*s != CA_OK || !v) return NULL;
    *s = want(json_object_is_type(v, json_type_string), path, key, v, "a string or null");
    return *s == CA_OK ? json_object_get_string(v) : NULL;
}

static bool opt_bool(json_object *root, const char *key, ca_status *s, const char *path) {
    json_object *v = member(root, key);
    if (*s != CA_OK || !v) return false;
    *s = want(json_object_is_type(v, json_type_boolean), path, key, v, "true or false");
    return *s == CA_OK && json_object_get_boolean(v);
}

/* target_modules: a regular expression or a list of names (null means PEFT's per-architecture
 * default, which caccel does not have). *names is malloc'd, pointing into root. */
static ca_status read_targets(json_object *root, ca_lora_config *c, const char **names, const char *path) {
    json_object *v = member(root, "target_modules");
    if (v && json_object_is_type(v, json_type_string)) {
        c->target_regex = json_object_get_string(v);
        return CA_OK;
    }
    ca_status s = want(v && json_object_is_type(v, json_type_array) && json_object_array_length(v) > 0, path,
                       "target_modules", v, "a list of module names or a regular expression");
    for (size_t i = 0; s == CA_OK && i < json_object_array_length(v); i++) {
        json_object *e = json_object_array_get_idx(v, i);
        s = want(json_object_is_type(e, json_type_string), path, "target_modules", v, "a list of strings");
        if (s == CA_OK) names[c->n_target_modules++] = json_object_get_string(e);
    }
    c->target_modules = names;
    return s;
}

static ca_status read_fields(json_object *root, ca_lora_config *c, const char **names, const char *path) {
    const char *type = ca_json_member_str(root, "peft_type");
    if (!type || strcmp(type, "LORA") != 0)
        return ca_error(CA_ERR_UNSUPPORTED, "adapter '%s': \"peft_type\" is %s; only \"LORA\" is supported", path,
                        member(root, "peft_type") ? json_object_to_json_string(member(root, "peft_type")) : "missing");
    json_object *r = member(root, "r"), *alpha = member(root, "lora_alpha"), *drop = member(root, "lora_dropout");
    ca_status s = want(r && json_object_is_type(r, json_type_int) && json_object_get_int64(r) > 0, path, "r", r,
                       "a positive integer");
    if (s == CA_OK) s = want(is_number(alpha), path, "lora_alpha", alpha, "a number");
    if (s == CA_OK && drop) s = want(is_number(drop), path, "lora_dropout", drop, "a number");
    if (s == CA_OK) s = check_unsupported(root, path);
    if (s != CA_OK) return s;
    c->r = json_object_get_int64(r);
    c->lora_alpha = json_object_get_double(alpha);
    c->lora_dropout = drop ? json_object_get_double(drop) : 0;
    c->bias = opt_string(root, "bias", &s, path);
    c->task_type = opt_string(root, "task_type", &s, path);
    c->base_model_name_or_path = opt_string(root, "base_model_name_or_path", &s, path);
    c->fan_in_fan_out = opt_bool(root, "fan_in_fan_out", &s, path);
    c->use_rslora = opt_bool(root, "use_rslora", &s, path);
    /* a string ("gaussian", "loftq", ...) names another initialisation: the weights are read anyway */
    json_object *init = member(root, "init_lora_weights");
    c->init_lora_weights = !init || json_object_get_boolean(init);
    return s == CA_OK ? read_targets(root, c, names, path) : s;
}

/* Reads dir/adapter_config.json into *out (owned: ca_lora_config_free), checked. */
static ca_status read_config(const char *dir, ca_lora_config *out) {
    char path[4096], why[128];
    snprintf(path, sizeof path, "%s/" CONFIG_FILE, dir);
    ca_status rs;
    json_object *root = ca_json_load(path, CA_FILE_MODEL_CONFIG, why, sizeof why, &rs);
    if (!root && !why[0]) return rs;
    if (!root) return ca_error(CA_ERR_INVALID, "adapter '%s': not valid JSON: %s", path, why);
    ca_status s = CA_OK;
    if (!json_object_is_type(root, json_type_object))
        s = ca_error(CA_ERR_INVALID, "adapter '%s': not a JSON object", path);
    json_object *tm = member(root, "target_modules");
    size_t nt = tm && json_object_is_type(tm, json_type_array) ? json_object_array_length(tm) : 0;
    const char **names = calloc(nt + 1, sizeof *names);
    if (s == CA_OK && !names) s = ca_error(CA_ERR_NOMEM, "out of host memory reading '%s'", path);
    ca_lora_config c;
    memset(&c, 0, sizeof c);
    if (s == CA_OK) s = read_fields(root, &c, names, path);
    char what[4200];
    snprintf(what, sizeof what, "adapter '%s'", path);
    if (s == CA_OK) s = ca_lora_config_check(&c, what);
    if (s == CA_OK) s = ca_lora_config_copy(out, &c);
    free(names);
    json_object_put(root);
    return s;
}

static json_object *number(double d) {
    if (d == (double)(int64_t)d) return json_object_new_int64((int64_t)d);
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", d);
    return json_object_new_double_s(d, buf);
}

static json_object *str_or_null(const char *s) { return s ? json_object_new_string(s) : NULL; }

static json_object *targets_json(const ca_lora_config *c) {
    if (c->target_regex) return json_object_new_string(c->target_regex);
    json_object *a = json_object_new_array();
    for (int i = 0; a && i < c->n_target_modules; i++) json_object_array_add(a, json_object_new_string(c->target_modules[i]));
    return a;
}

/* The keys peft 0.10's LoraConfig.save_pretrained writes, in its (sorted) order. */
static json_object *config_json(const ca_lora_config *c) {
    json_object *o = json_object_new_object();
    if (!o) return NULL;
    json_object_object_add(o, "alpha_pattern", json_object_new_object());
    json_object_object_add(o, "auto_mapping", NULL);
    json_object_object_add(o, "base_model_name_or_path", str_or_null(c->base_model_name_or_path));
    json_object_object_add(o, "bias", json_object_new_string("none"));
    json_object_object_add(o, "fan_in_fan_out", json_object_new_boolean(c->fan_in_fan_out));
    json_object_object_add(o, "inference_mode", json_object_new_boolean(1));
    json_object_object_add(o, "init_lora_weights", json_object_new_boolean(c->init_lora_weights));
    json_object_object_add(o, "layer_replication", NULL);
    json_object_object_add(o, "layers_pattern", NULL);
    json_object_object_add(o, "layers_to_transform", NULL);
    json_object_object_add(o, "loftq_config", json_object_new_object());
    json_object_object_add(o, "lora_alpha", number(c->lora_alpha));
    json_object_object_add(o, "lora_dropout", number(c->lora_dropout));
    json_object_object_add(o, "megatron_config", NULL);
    json_object_object_add(o, "megatron_core", json_object_new_string("megatron.core"));
    json_object_object_add(o, "modules_to_save", NULL);
    json_object_object_add(o, "peft_type", json_object_new_string("LORA"));
    json_object_object_add(o, "r", json_object_new_int64(c->r));
    json_object_object_add(o, "rank_pattern", json_object_new_object());
    json_object_object_add(o, "revision", NULL);
    json_object_object_add(o, "target_modules", targets_json(c));
    json_object_object_add(o, "task_type", str_or_null(c->task_type));
    json_object_object_add(o, "use_dora", json_object_new_boolean(0));
    json_object_object_add(o, "use_rslora", json_object_new_boolean(c->use_rslora));
    return o;
}

static ca_status write_text(const char *path, const char *text) {
    const void *parts[2] = {text, "\n"};
    size_t lens[2] = {strlen(text), 1};
    return ca_st_write_atomic(path, parts, lens, 2);
}

static ca_status ensure_dir(const char *dir) {
    if (mkdir(dir, 0777) == 0 || errno == EEXIST) return CA_OK;
    return ca_error(CA_ERR_IO, "cannot create directory '%s': %s", dir, strerror(errno));
}

/* ------------------------------------------------------------------ tensors */

static void tensor_name(char *buf, size_t len, const char *layer, char which) {
    snprintf(buf, len, PEFT_PREFIX "%s.lora_%c.weight", layer, which);
}

static bool is_float_dtype(ca_dtype dt) { return dt == CA_F32 || dt == CA_F16 || dt == CA_BF16; }

static void to_f32(const void *src, ca_dtype dt, int64_t n, float *dst) {
    if (dt == CA_F32) { memcpy(dst, src, (size_t)n * sizeof *dst); return; }
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = dt == CA_F16 ? ca_f16_to_f32(h[i]) : ca_bf16_to_f32(h[i]);
}

static void from_f32(const float *src, ca_dtype dt, int64_t n, void *dst) {
    if (dt == CA_F32) { memcpy(dst, src, (size_t)n * sizeof *src); return; }
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = dt == CA_F16 ? ca_f32_to_f16(src[i]) : ca_f32_to_bf16(src[i]);
}

static int64_t entry_numel(const ca_st_entry *e) {
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
    return n;
}

/* e must be a float matrix [d0, d1]. */
static ca_status check_shape(const char *path, const ca_st_entry *e, int64_t d0, int64_t d1, const char *need) {
    if (!is_float_dtype(e->dtype))
        return ca_error(CA_ERR_INVALID, "adapter '%s': tensor '%s' is %s; F32, F16 or BF16 is needed", path, e->name,
                        ca_st_dtype_name(e->dtype));
    if (e->ndim == 2 && e->shape[0] == d0 && e->shape[1] == d1) return CA_OK;
    char sh[128];
    return ca_error(CA_ERR_INVALID, "adapter '%s': tensor '%s' has shape %s; %s needs [%lld, %lld]", path, e->name,
                    ca_shape_str(e->ndim, e->shape, sh, sizeof sh), need, (long long)d0, (long long)d1);
}

/* A layer the file's tensors are checked against. */
typedef struct expected {
    const char *name;
    int64_t in, out;
    const ca_st_entry *a, *b;
} expected;

static ca_status match_layer(const ca_st_file *f, expected *x, int64_t r) {
    char an[1024], bn[1024], need[1200];
    tensor_name(an, sizeof an, x->name, 'A');
    tensor_name(bn, sizeof bn, x->name, 'B');
    x->a = ca_st_find(f, an);
    x->b = ca_st_find(f, bn);
    if (!x->a || !x->b)
        return ca_error(CA_ERR_INVALID, "adapter '%s': tensor '%s' is missing (the adapter of layer '%s')", f->path,
                        x->a ? bn : an, x->name);
    snprintf(need, sizeof need, "layer '%s' (r %lld, in %lld, out %lld)", x->name, (long long)r, (long long)x->in,
             (long long)x->out);
    ca_status s = check_shape(f->path, x->a, r, x->in, need);
    return s == CA_OK ? check_shape(f->path, x->b, x->out, r, need) : s;
}

/* Every expected layer's tensors present with the right shapes, and no other tensor in the file. */
static ca_status match_file(const ca_st_file *f, expected *x, int n, int64_t r) {
    for (int i = 0; i < n; i++) {
        ca_status s = match_layer(f, &x[i], r);
        if (s != CA_OK) return s;
    }
    for (int j = 0; j < f->n; j++) {
        bool used = false;
        for (int i = 0; i < n && !used; i++) used = x[i].a == &f->entries[j] || x[i].b == &f->entries[j];
        if (!used)
            return ca_error(CA_ERR_INVALID, "adapter '%s': tensor '%s' belongs to no layer the adapter wraps in this "
                            "model", f->path, f->entries[j].name);
    }
    return CA_OK;
}

static ca_status copy_entry(const ca_st_file *f, const ca_st_entry *e, ca_tensor *p) {
    int64_t n = entry_numel(e);
    float *buf = malloc((size_t)(n ? n : 1) * sizeof *buf);
    if (!buf) return ca_error(CA_ERR_NOMEM, "out of host memory reading '%s'", e->name);
    to_f32(ca_st_data(f, e), e->dtype, n, buf);
    ca_status s = ca_tensor_copy_from_host(p, buf, (size_t)n * sizeof *buf);
    free(buf);
    return s;
}

/* ------------------------------------------------------------------ save */

static ca_status host_copy(ca_tensor *t, void **out) {
    size_t n = ca_tensor_nbytes(t);
    *out = malloc(n ? n : 1);
    if (!*out) return ca_error(CA_ERR_NOMEM, "out of host memory saving an adapter");
    return ca_tensor_to_host(t, *out, n);
}

static ca_status save_weights(const char *dir, const ca_lora_named *l, int n) {
    ca_st_tensor *t = calloc((size_t)(2 * n), sizeof *t);
    char **names = calloc((size_t)(2 * n), sizeof *names);
    void **data = calloc((size_t)(2 * n), sizeof *data);
    ca_status s = t && names && data ? CA_OK : ca_error(CA_ERR_NOMEM, "out of host memory saving an adapter");
    for (int i = 0; s == CA_OK && i < 2 * n; i++) {
        ca_lora_layer *ll = ca_lora_layer_of(l[i / 2].m);
        ca_tensor *p = (i % 2 ? ll->b : ll->a)->params[0];
        char buf[1024];
        tensor_name(buf, sizeof buf, l[i / 2].name, i % 2 ? 'B' : 'A');
        names[i] = strdup(buf);
        s = names[i] ? host_copy(p, &data[i]) : ca_error(CA_ERR_NOMEM, "out of host memory saving an adapter");
        t[i] = (ca_st_tensor){.name = names[i], .dtype = p->dtype, .ndim = p->ndim, .shape = p->shape,
                              .data = data[i]};
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/" WEIGHTS_FILE, dir);
    if (s == CA_OK) s = ca_st_write(path, t, 2 * n);
    for (int i = 0; names && data && i < 2 * n; i++) {
        free(names[i]);
        free(data[i]);
    }
    free(t);
    free(names);
    free(data);
    return s;
}

ca_status ca_lora_save(ca_module *model, const char *dir) {
    if (!model || !dir) return ca_error(CA_ERR_INVALID, "ca_lora_save: a model and a directory are required");
    ca_lora_named *l;
    int n;
    ca_status s = ca_lora_layers(model, &l, &n);
    if (s == CA_OK && n == 0) s = ca_error(CA_ERR_INVALID, "ca_lora_save: the model has no adapters (ca_lora_apply)");
    if (s == CA_OK) s = ensure_dir(dir);
    if (s == CA_OK) s = save_weights(dir, l, n);
    json_object *o = s == CA_OK ? config_json(&ca_lora_layer_of(l[0].m)->cfg) : NULL;
    if (s == CA_OK && !o) s = ca_error(CA_ERR_NOMEM, "out of host memory writing " CONFIG_FILE);
    if (s == CA_OK) {
        char path[4096];
        snprintf(path, sizeof path, "%s/" CONFIG_FILE, dir);
        s = write_text(path, json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                                                   JSON_C_TO_STRING_NOSLASHESCAPE));
    }
    json_object_put(o);
    ca_lora_named_free(l, n);
    return s;
}

/* ------------------------------------------------------------------ load */

/* The layers the file must fill: the wrapped ones, or those cfg would wrap in a plain model. */
static ca_status expected_layers(ca_module *model, const ca_lora_config *cfg, const char *path, ca_lora_named **l,
                                 int *n, bool *fresh) {
    ca_status s = ca_lora_layers(model, l, n);
    *fresh = s == CA_OK && *n == 0;
    if (*fresh) {
        ca_lora_named_free(*l, *n);
        return ca_lora_targets(model, cfg, l, n);
    }
    const ca_lora_config *have = s == CA_OK ? &ca_lora_layer_of((*l)[0].m)->cfg : NULL;
    if (have && (have->r != cfg->r || have->lora_alpha != cfg->lora_alpha || have->use_rslora != cfg->use_rslora))
        s = ca_error(CA_ERR_INVALID, "adapter '%s': r %lld, lora_alpha %g, use_rslora %d differ from the model's "
                     "adapters (r %lld, lora_alpha %g, use_rslora %d)", path, (long long)cfg->r, cfg->lora_alpha,
                     cfg->use_rslora, (long long)have->r, have->lora_alpha, have->use_rslora);
    return s;
}

static ca_status load_checked(ca_module *model, const char *dir, const ca_lora_config *cfg) {
    char cpath[4096], wpath[4096];
    snprintf(cpath, sizeof cpath, "%s/" CONFIG_FILE, dir);
    snprintf(wpath, sizeof wpath, "%s/" WEIGHTS_FILE, dir);
    ca_lora_named *l = NULL;
    int n = 0;
    bool fresh = false;
    ca_status s = expected_layers(model, cfg, cpath, &l, &n, &fresh);
    expected *x = s == CA_OK ? calloc((size_t)n + 1, sizeof *x) : NULL;
    if (s == CA_OK && !x) s = ca_error(CA_ERR_NOMEM, "out of host memory loading '%s'", dir);
    for (int i = 0; s == CA_OK && i < n; i++) {
        bool fifo;
        ca_lora_layer *ll = ca_lora_layer_of(l[i].m);
        x[i].name = l[i].name;
        if (ll) x[i].in = ll->in, x[i].out = ll->out;
        else ca_lora_layout(l[i].m, &fifo, &x[i].in, &x[i].out);
    }
    ca_st_file f;
    memset(&f, 0, sizeof f);
    if (s == CA_OK) s = ca_st_open(wpath, &f);
    if (s == CA_OK) s = match_file(&f, x, n, cfg->r);
    if (s == CA_OK && fresh) s = ca_lora_apply(model, cfg, NULL);   /* wraps exactly the layers checked */
    for (int i = 0; s == CA_OK && i < n; i++) {
        ca_lora_layer *ll = ca_lora_layer_of(l[i].m);
        s = copy_entry(&f, x[i].a, ll->a->params[0]);
        if (s == CA_OK) s = copy_entry(&f, x[i].b, ll->b->params[0]);
    }
    ca_st_close(&f);
    free(x);
    ca_lora_named_free(l, n);
    return s;
}

ca_status ca_lora_load(ca_module *model, const char *dir) {
    if (!model || !dir) return ca_error(CA_ERR_INVALID, "ca_lora_load: a model and a directory are required");
    ca_lora_config cfg;
    ca_status s = read_config(dir, &cfg);
    if (s != CA_OK) return s;
    s = load_checked(model, dir, &cfg);
    ca_lora_config_free(&cfg);
    return s;
}

/* ------------------------------------------------------------------ merge-weights --adapter */

/* One base tensor and, when the adapter targets it, its merged values (in the base's dtype). */
typedef struct merge_job {
    const ca_st_file *base, *ad;
    const ca_lora_config *cfg;
    ca_st_tensor *out;           /* one per base entry */
    void **owned;                /* merged data, per base entry */
} merge_job;

/* The base tensor "<name>.weight" of the adapter tensor "base_model.model.<name>.lora_A.weight". */
static ca_status pair_of(const merge_job *j, const ca_st_entry *a, const ca_st_entry **b, int *wi) {
    size_t pl = strlen(PEFT_PREFIX), sl = strlen(".lora_A.weight"), len = strlen(a->name);
    char name[1024], bname[1024];
    snprintf(name, sizeof name, "%.*s.weight", (int)(len - pl - sl), a->name + pl);
    snprintf(bname, sizeof bname, "%.*s.lora_B.weight", (int)(len - sl), a->name);
    *b = ca_st_find(j->ad, bname);
    const ca_st_entry *w = ca_st_find(j->base, name);
    if (!*b) return ca_error(CA_ERR_INVALID, "adapter '%s': tensor '%s' is missing (the pair of '%s')", j->ad->path, bname, a->name);
    if (!w)
        return ca_error(CA_ERR_INVALID, "base '%s': tensor '%s' is missing (adapter tensor '%s' targets it)",
                        j->base->path, name, a->name);
    *wi = (int)(w - j->base->entries);
    if (!is_float_dtype(w->dtype) || w->ndim != 2)
        return ca_error(CA_ERR_INVALID, "base '%s': tensor '%s' is not a float matrix", j->base->path, name);
    int64_t in = w->shape[j->cfg->fan_in_fan_out ? 0 : 1], out = w->shape[j->cfg->fan_in_fan_out ? 1 : 0];
    char need[1200];
    snprintf(need, sizeof need, "base tensor '%s' %s[%lld, %lld] with r %lld", name,
             j->cfg->fan_in_fan_out ? "(fan_in_fan_out) " : "", (long long)w->shape[0], (long long)w->shape[1],
             (long long)j->cfg->r);
    ca_status s = check_shape(j->ad->path, a, j->cfg->r, in, need);
    return s == CA_OK ? check_shape(j->ad->path, *b, out, j->cfg->r, need) : s;
}

/* Every adapter tensor is a lora_A with its lora_B and its base weight, or such a lora_B. */
static ca_status check_adapter_names(const merge_job *j) {
    const char *sa = ".lora_A.weight", *sb = ".lora_B.weight";
    size_t pl = strlen(PEFT_PREFIX), sl = strlen(sa);
    for (int i = 0; i < j->ad->n; i++) {
        const char *nm = j->ad->entries[i].name;
        size_t len = strlen(nm);
        bool ok = len > pl + sl && strncmp(nm, PEFT_PREFIX, pl) == 0 &&
                  (strcmp(nm + len - sl, sa) == 0 || strcmp(nm + len - sl, sb) == 0);
        if (!ok)
            return ca_error(CA_ERR_INVALID, "adapter '%s': tensor '%s' is not a LoRA weight "
                            "(\"" PEFT_PREFIX "<name>.lora_A.weight\" or \".lora_B.weight\")", j->ad->path, nm);
        if (strcmp(nm + len - sl, sb) == 0) {
            char an[1024];
            snprintf(an, sizeof an, "%.*s%s", (int)(len - sl), nm, sa);
            if (!ca_st_find(j->ad, an))
                return ca_error(CA_ERR_INVALID, "adapter '%s': tensor '%s' is missing (the pair of '%s')", j->ad->path,
                                an, nm);
        }
    }
    return CA_OK;
}

/* W + scaling * B A (transposed for fan_in_fan_out), in f32 as PEFT's get_delta_weight. */
static ca_status merge_one(merge_job *j, const ca_st_entry *a, const ca_st_entry *b, int wi) {
    const ca_st_entry *w = &j->base->entries[wi];
    int64_t r = a->shape[0], in = a->shape[1], out = b->shape[0], nw = entry_numel(w);
    float *fa = malloc((size_t)(r * in) * sizeof *fa), *fb = malloc((size_t)(out * r) * sizeof *fb);
    float *fw = malloc((size_t)nw * sizeof *fw);
    void *res = malloc((size_t)nw * ca_dtype_size(w->dtype));
    if (!fa || !fb || !fw || !res) {
        free(fa), free(fb), free(fw), free(res);
        return ca_error(CA_ERR_NOMEM, "out of host memory merging '%s'", w->name);
    }
    to_f32(ca_st_data(j->ad, a), a->dtype, r * in, fa);
    to_f32(ca_st_data(j->ad, b), b->dtype, out * r, fb);
    to_f32(ca_st_data(j->base, w), w->dtype, nw, fw);
    double scaling = ca_lora_scaling(j->cfg);
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            float d = 0;
            for (int64_t k = 0; k < r; k++) d += fb[o * r + k] * fa[k * in + i];
            int64_t at = j->cfg->fan_in_fan_out ? i * out + o : o * in + i;
            fw[at] = fw[at] + (float)(d * scaling);
        }
    from_f32(fw, w->dtype, nw, res);
    free(j->owned[wi]);
    j->owned[wi] = res;
    j->out[wi].data = res;
    free(fa), free(fb), free(fw);
    return CA_OK;
}

static ca_status merge_all(merge_job *j) {
    for (int i = 0; i < j->base->n; i++) {
        const ca_st_entry *e = &j->base->entries[i];
        j->out[i] = (ca_st_tensor){.name = e->name, .dtype = e->dtype, .ndim = e->ndim, .shape = e->shape,
                                   .data = ca_st_data(j->base, e)};
    }
    ca_status s = check_adapter_names(j);
    size_t sl = strlen(".lora_A.weight");
    for (int pass = 0; pass < 2 && s == CA_OK; pass++)   /* check every pair, then merge */
        for (int i = 0; s == CA_OK && i < j->ad->n; i++) {
            const ca_st_entry *a = &j->ad->entries[i], *b;
            size_t len = strlen(a->name);
            if (strcmp(a->name + len - sl, ".lora_A.weight") != 0) continue;
            int wi = 0;
            s = pair_of(j, a, &b, &wi);
            if (s == CA_OK && pass == 1) s = merge_one(j, a, b, wi);
        }
    return s;
}

static ca_status copy_config(const char *base_dir, const char *out_dir) {
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/config.json", base_dir);
    snprintf(dst, sizeof dst, "%s/config.json", out_dir);
    struct stat st;
    if (stat(src, &st) != 0) return CA_OK;      /* a bare safetensors checkpoint has none */
    char *buf;
    size_t len;
    ca_status s = ca_file_read(src, CA_FILE_MODEL_CONFIG, &buf, &len);
    if (s != CA_OK) return s;
    const void *parts[1] = {buf};
    s = ca_st_write_atomic(dst, parts, &len, 1);
    free(buf);
    return s;
}

static ca_status merge_opened(const ca_st_file *base, const ca_st_file *ad, const ca_lora_config *cfg,
                              const char *base_dir, const char *out_dir) {
    merge_job j = {base, ad, cfg, calloc((size_t)base->n + 1, sizeof *j.out), calloc((size_t)base->n + 1, sizeof *j.owned)};
    ca_status s = j.out && j.owned ? merge_all(&j) : ca_error(CA_ERR_NOMEM, "out of host memory merging");
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if (s == CA_OK) s = ensure_dir(out_dir);
    if (s == CA_OK) s = ca_st_write(path, j.out, base->n);
    if (s == CA_OK) s = copy_config(base_dir, out_dir);
    for (int i = 0; j.owned && i < base->n; i++) free(j.owned[i]);
    free(j.owned);
    free(j.out);
    return s;
}

ca_status ca_lora_merge_files(const char *adapter_dir, const char *base_dir, const char *out_dir) {
    if (!adapter_dir || !base_dir || !out_dir)
        return ca_error(CA_ERR_INVALID, "ca_lora_merge_files: the adapter, base and output directories are required");
    ca_lora_config cfg;
    ca_status s = read_config(adapter_dir, &cfg);
    if (s != CA_OK) return s;
    char ap[4096], bp[4096];
    snprintf(ap, sizeof ap, "%s/" WEIGHTS_FILE, adapter_dir);
    snprintf(bp, sizeof bp, "%s/model.safetensors", base_dir);
    ca_st_file ad, base;
    memset(&ad, 0, sizeof ad);
    memset(&base, 0, sizeof base);
    s = ca_st_open(ap, &ad);
    if (s == CA_OK) s = ca_st_open(bp, &base);
    if (s == CA_OK) s = merge_opened(&base, &ad, &cfg, base_dir, out_dir);
    ca_st_close(&base);
    ca_st_close(&ad);
    ca_lora_config_free(&cfg);
    return s;
}
