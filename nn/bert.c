/* BertModel and BertForSequenceClassification with Hugging Face's parameter names; loading a
 * Hugging Face model.safetensors into them, and writing their config.json. */
#include "base/half_impl.h"
#include "nn/nn_impl.h"
#include "tensor/safetensors_impl.h"

#include <caccel/bert.h>

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define INIT_STD 0.02f                     /* BertConfig's initializer_range */

typedef struct bert_model bert_model;

typedef struct bert_layer {
    const bert_model *model;               /* the owner (a checkpointed layer's context) */
    ca_module *module;                     /* "encoder.layer.N", marked for checkpointing or not */
    ca_module *q, *k, *v, *attn_out, *attn_ln, *inter, *out, *out_ln;
} bert_layer;

/* The BertModel module's ctx: its config and its submodules (which own the parameters). */
struct bert_model {
    ca_bert_config cfg;
    ca_module *word, *pos, *type, *emb_ln, *pooler;
    int64_t nlayers;
    bert_layer *layers;
};

typedef struct bert_cls {
    ca_bert_config cfg;
    ca_module *bert, *classifier;
} bert_cls;

static const char *const MODEL_TYPE = "BertModel";
static const char *const CLS_TYPE = "BertForSequenceClassification";

static void bert_model_free(void *p) {
    bert_model *b = p;
    free(b->layers);
    free(b);
}

/* ------------------------------------------------------------------ building */

/* Linear with BERT's initialisation, added to parent as `name`; *out is the child. */
static ca_status add_linear(ca_module *parent, const char *name, int64_t in, int64_t out_f, ca_module **out) {
    return ca_nn_add_linear(parent, name, in, out_f, true, INIT_STD, out);
}

static ca_status add_layer_norm(ca_module *parent, const char *name, const ca_bert_config *c, ca_module **out) {
    ca_module *l;
    ca_status s = ca_layer_norm_create(c->hidden_size, c->layer_norm_eps, &l);
    if (s == CA_OK) s = ca_module_add(parent, name, l);
    if (s == CA_OK) *out = l;
    return s;
}

/* A container module (no forward of its own) added to parent. */
static ca_status add_container(ca_module *parent, const char *name, const char *type, ca_module **out) {
    ca_module *m;
    ca_status s = ca_module_create(type, NULL, NULL, NULL, &m);
    if (s == CA_OK) s = ca_module_add(parent, name, m);
    if (s == CA_OK) *out = m;
    return s;
}

static ca_status build_embeddings(ca_module *root, bert_model *b) {
    const ca_bert_config *c = &b->cfg;
    ca_module *e;
    ca_status s = add_container(root, "embeddings", "BertEmbeddings", &e);
    int64_t pad = c->pad_token_id >= 0 && c->pad_token_id < c->vocab_size ? c->pad_token_id : -1;
    int64_t h = c->hidden_size;
    if (s == CA_OK) s = ca_nn_add_embedding(e, "word_embeddings", c->vocab_size, h, pad, INIT_STD, &b->word);
    if (s == CA_OK) s = ca_nn_add_embedding(e, "position_embeddings", c->max_position_embeddings, h, -1, INIT_STD, &b->pos);
    if (s == CA_OK) s = ca_nn_add_embedding(e, "token_type_embeddings", c->type_vocab_size, h, -1, INIT_STD, &b->type);
    if (s == CA_OK) s = add_layer_norm(e, "LayerNorm", c, &b->emb_ln);
    return s;
}

static ca_status build_layer(ca_module *layers, int64_t i, const ca_bert_config *c, bert_layer *l) {
    char name[24];
    snprintf(name, sizeof name, "%lld", (long long)i);
    int64_t h = c->hidden_size, f = c->intermediate_size;
    ca_module *layer, *attn, *self, *aout, *inter, *out;
    ca_status s = add_container(layers, name, "BertLayer", &layer);
    if (s == CA_OK) l->module = layer;
    if (s == CA_OK) s = add_container(layer, "attention", "BertAttention", &attn);
    if (s == CA_OK) s = add_container(attn, "self", "BertSelfAttention", &self);
    if (s == CA_OK) s = add_linear(self, "query", h, h, &l->q);
    if (s == CA_OK) s = add_linear(self, "key", h, h, &l->k);
    if (s == CA_OK) s = add_linear(self, "value", h, h, &l->v);
    if (s == CA_OK) s = add_container(attn, "output", "BertSelfOutput", &aout);
    if (s == CA_OK) s = add_linear(aout, "dense", h, h, &l->attn_out);
    if (s == CA_OK) s = add_layer_norm(aout, "LayerNorm", c, &l->attn_ln);
    if (s == CA_OK) s = add_container(layer, "intermediate", "BertIntermediate", &inter);
    if (s == CA_OK) s = add_linear(inter, "dense", h, f, &l->inter);
    if (s == CA_OK) s = add_container(layer, "output", "BertOutput", &out);
    if (s == CA_OK) s = add_linear(out, "dense", f, h, &l->out);
    if (s == CA_OK) s = add_layer_norm(out, "LayerNorm", c, &l->out_ln);
    return s;
}

static ca_tensor *bert_model_forward(ca_module *self, ca_tensor *x, void *ctx);

ca_status ca_bert_model_create(const ca_bert_config *c, ca_module **out) {
    if (out) *out = NULL;
    if (!c || !out) return ca_error(CA_ERR_INVALID, "ca_bert_model_create: config and out are required");
    ca_status s = ca_bert_check_sizes(c, 0, MODEL_TYPE);
    if (s != CA_OK) return s;
    bert_model *b = calloc(1, sizeof *b);
    if (b) b->layers = calloc((size_t)(c->num_hidden_layers ? c->num_hidden_layers : 1), sizeof *b->layers);
    if (!b || !b->layers) {
        if (b) bert_model_free(b);
        return ca_error(CA_ERR_NOMEM, "out of host memory creating BertModel");
    }
    b->cfg = *c;
    b->nlayers = c->num_hidden_layers;
    ca_module *root, *enc, *layers, *pooler;
    s = ca_module_create(MODEL_TYPE, bert_model_forward, b, bert_model_free, &root);
    if (s != CA_OK) return s;
    s = build_embeddings(root, b);
    if (s != CA_OK) ca_error_context("BertModel: embeddings");   /* out of memory, most likely */
    if (s == CA_OK) s = add_container(root, "encoder", "BertEncoder", &enc);
    if (s == CA_OK) s = add_container(enc, "layer", "ModuleList", &layers);
    for (int64_t i = 0; s == CA_OK && i < b->nlayers; i++) {
        b->layers[i].model = b;
        s = build_layer(layers, i, c, &b->layers[i]);
        if (s != CA_OK) ca_error_context("BertModel: encoder.layer.%lld", (long long)i);
    }
    if (s == CA_OK) s = add_container(root, "pooler", "BertPooler", &pooler);
    if (s == CA_OK) s = add_linear(pooler, "dense", c->hidden_size, c->hidden_size, &b->pooler);
    if (s != CA_OK) {
        ca_module_destroy(root);
        return s;
    }
    *out = root;
    return CA_OK;
}

static ca_tensor *bert_cls_forward(ca_module *self, ca_tensor *x, void *ctx);

ca_status ca_bert_for_sequence_classification_create(const ca_bert_config *c, int64_t num_labels,
                                                     ca_module **out) {
    if (out) *out = NULL;
    if (!c || !out) return ca_error(CA_ERR_INVALID, "ca_bert_for_sequence_classification_create: config and out are required");
    bert_cls *k = calloc(1, sizeof *k);
    if (!k) return ca_error(CA_ERR_NOMEM, "out of host memory creating %s", CLS_TYPE);
    k->cfg = *c;
    if (num_labels > 0) k->cfg.num_labels = num_labels;
    if (k->cfg.num_labels <= 0) {
        free(k);
        return ca_error(CA_ERR_INVALID, "%s: num_labels must be positive", CLS_TYPE);
    }
    ca_status s = ca_bert_check_sizes(&k->cfg, k->cfg.num_labels, CLS_TYPE);
    if (s != CA_OK) {
        free(k);
        return s;
    }
    ca_module *root;
    s = ca_module_create(CLS_TYPE, bert_cls_forward, k, free, &root);
    if (s != CA_OK) return s;
    s = ca_bert_model_create(&k->cfg, &k->bert);
    if (s == CA_OK) s = ca_module_add(root, "bert", k->bert);
    if (s == CA_OK) s = add_linear(root, "classifier", c->hidden_size, k->cfg.num_labels, &k->classifier);
    if (s != CA_OK) {
        ca_module_destroy(root);
        return s;
    }
    *out = root;
    return CA_OK;
}

static bool is_type(const ca_module *m, const char *type) {
    return m && m->type && strcmp(m->type, type) == 0 && m->ctx;
}

/* The BertModel of m (m itself or a classifier's `bert`), or NULL. */
static ca_module *bert_of(const ca_module *m) {
    if (is_type(m, MODEL_TYPE)) return (ca_module *)m;
    if (is_type(m, CLS_TYPE)) return ((bert_cls *)m->ctx)->bert;
    return NULL;
}

const ca_bert_config *ca_bert_module_config(const ca_module *m) {
    if (is_type(m, CLS_TYPE)) return &((bert_cls *)m->ctx)->cfg;
    ca_module *b = bert_of(m);
    return b ? &((bert_model *)b->ctx)->cfg : NULL;
}

/* ------------------------------------------------------------------ forward */

static ca_tensor *activation(const char *act, ca_tensor *x) {
    if (!strcmp(act, "gelu")) return ca_gelu_erf(x);
    if (!strcmp(act, "gelu_new") || !strcmp(act, "gelu_pytorch_tanh") || !strcmp(act, "gelu_fast"))
        return ca_gelu(x);                                  /* the same tanh approximation */
    if (!strcmp(act, "quick_gelu")) return ca_mul(x, ca_sigmoid(ca_mul_scalar(x, 1.702)));
    if (!strcmp(act, "relu")) return ca_relu(x);
    if (!strcmp(act, "silu") || !strcmp(act, "swish")) return ca_silu(x);
    if (!strcmp(act, "tanh")) return ca_tanh(x);
    if (!strcmp(act, "mish")) return ca_mul(x, ca_tanh(ca_log(ca_add_scalar(ca_exp(x), 1.0))));
    ca_error(CA_ERR_UNSUPPORTED, "BertModel: hidden_act \"%s\" is not implemented", act);
    return NULL;
}

/* [B, L, hidden] -> [B, heads, L, head_dim], a view: the attention reads q, k and v through their strides
 * where the device's kernels do (attention_strides) and writes their gradients straight into the
 * projections' (no copy either way); elsewhere it makes them contiguous itself. */
static ca_tensor *split_heads(ca_tensor *x, int64_t heads) {
    if (!x) return NULL;
    int64_t b = x->shape[0], l = x->shape[1], d = x->shape[2] / heads;
    return ca_transpose(ca_reshape(x, 4, (int64_t[]){b, l, heads, d}), 1, 2);
}

/* [B, heads, L, head_dim] -> [B, L, hidden]: a view of an attention output written in [B, L, heads,
 * head_dim] memory (strided kernels), a copy otherwise. */
static ca_tensor *merge_heads(ca_tensor *x) {
    if (!x) return NULL;
    int64_t b = x->shape[0], heads = x->shape[1], l = x->shape[2], d = x->shape[3];
    x = ca_contiguous(ca_transpose(x, 1, 2));
    return ca_reshape(x, 3, (int64_t[]){b, l, heads * d});
}

static ca_tensor *encoder_layer(const bert_model *b, const bert_layer *l, ca_tensor *h, ca_tensor *mask,
                                bool training) {
    const ca_bert_config *c = &b->cfg;
    double p = training ? c->hidden_dropout_prob : 0, pa = training ? c->attention_probs_dropout_prob : 0;
    ca_tensor *q = split_heads(ca_module_forward(l->q, h), c->num_attention_heads);
    ca_tensor *k = split_heads(ca_module_forward(l->k, h), c->num_attention_heads);
    ca_tensor *v = split_heads(ca_module_forward(l->v, h), c->num_attention_heads);
    ca_tensor *ctx = merge_heads(ca_scaled_dot_product_attention(q, k, v, mask, false, pa, 0));
    ca_tensor *a = ca_dropout(ca_module_forward(l->attn_out, ctx), p, training);
    a = ca_module_forward(l->attn_ln, ca_add(a, h));
    ca_tensor *i = activation(c->hidden_act, ca_module_forward(l->inter, a));
    ca_tensor *o = ca_dropout(ca_module_forward(l->out, i), p, training);
    return ca_module_forward(l->out_ln, ca_add(o, a));
}

/* ctx: the layer, which lives as long as the model (backward reruns this). */
static ca_status checkpointed_layer(void *ctx, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out) {
    (void)n_out;
    const bert_layer *l = ctx;
    out[0] = encoder_layer(l->model, l, in[0], n_in > 1 ? in[1] : NULL, l->module->training);
    return out[0] ? CA_OK : ca_last_status();
}

/* One encoder layer, checkpointed when its module is marked (ca_module_set_checkpointing). */
static ca_tensor *run_layer(const bert_model *b, int64_t i, ca_tensor *h, ca_tensor *mask, bool training) {
    const bert_layer *l = &b->layers[i];
    if (!ca_grad_enabled()) {   /* evaluation: the layer's intermediates go when it returns */
        ca_locals_mark mark = ca_forward_locals_mark();
        ca_tensor *y = encoder_layer(b, l, h, mask, training);
        if (y) ca_forward_locals_free(mark, y);
        return y;
    }
    if (!ca_module_checkpointing(l->module)) return encoder_layer(b, l, h, mask, training);
    ca_tensor *in[2] = {h, mask}, *y = NULL;
    if (ca_checkpoint(checkpointed_layer, (void *)l, mask ? 2 : 1, in, 1, &y) != CA_OK) {
        ca_error_context("checkpointed encoder.layer.%lld", (long long)i);
        return NULL;
    }
    return y;
}

/* position ids 0..L-1 on dev */
static ca_tensor *positions(ca_device *dev, int64_t len) {
    int64_t *p = malloc((size_t)(len ? len : 1) * sizeof *p);
    if (!p) {
        ca_error(CA_ERR_NOMEM, "out of host memory");
        return NULL;
    }
    for (int64_t i = 0; i < len; i++) p[i] = i;
    ca_tensor *t = ca_from_host(dev, CA_I64, 1, &len, p);
    free(p);
    return t;
}

static ca_status run_bert(ca_module *m, ca_tensor *ids, ca_tensor *mask, ca_tensor *types, ca_bert_output *out) {
    bert_model *b = m->ctx;
    const ca_bert_config *c = &b->cfg;
    if (ids->ndim != 2 || (ids->dtype != CA_I64 && ids->dtype != CA_I32))
        return ca_error(CA_ERR_INVALID, "BertModel: input_ids must be i32/i64 [batch, length], got %d dims", ids->ndim);
    int64_t bsz = ids->shape[0], len = ids->shape[1];
    if (len > c->max_position_embeddings)
        return ca_error(CA_ERR_INVALID, "BertModel: sequence length %lld exceeds max_position_embeddings %lld",
                        (long long)len, (long long)c->max_position_embeddings);
    bool training = m->training;
    ca_tensor *e = ca_module_forward(b->word, ca_contiguous(ids));
    e = ca_add(e, ca_embedding(positions(ca_tdev(ids), len), b->pos->params[0]));
    e = ca_add(e, types ? ca_embedding(ca_contiguous(types), b->type->params[0])
                        : ca_narrow(b->type->params[0], 0, 0, 1));
    ca_tensor *h = ca_dropout(ca_module_forward(b->emb_ln, e), c->hidden_dropout_prob, training);
    ca_tensor *mask4 = NULL;
    if (mask) {
        mask4 = ca_reshape(mask, 4, (int64_t[]){bsz, 1, 1, len});
        if (mask4 && mask4->dtype != CA_U8) mask4 = ca_cast(mask4, CA_U8);
        if (!mask4) return ca_last_status();
    }
    for (int64_t i = 0; i < b->nlayers && h; i++) h = run_layer(b, i, h, mask4, training);
    ca_tensor *first = ca_reshape(ca_narrow(h, 1, 0, 1), 2, (int64_t[]){bsz, c->hidden_size});
    ca_tensor *pooled = ca_tanh(ca_module_forward(b->pooler, first));
    if (!pooled) return ca_last_status();
    out->last_hidden_state = h;
    out->pooler_output = pooled;
    return CA_OK;
}

ca_status ca_bert_forward(ca_module *m, ca_tensor *ids, ca_tensor *mask, ca_tensor *types, ca_bert_output *out) {
    ca_module *b = bert_of(m);
    if (!b || !ids || !out)
        return ca_error(CA_ERR_INVALID, "ca_bert_forward: a BERT module, input_ids and out are required");
    if (mask && ca_tensor_numel(mask) != ca_tensor_numel(ids))
        return ca_error(CA_ERR_INVALID, "ca_bert_forward: attention_mask has %lld elements, input_ids %lld",
                        (long long)ca_tensor_numel(mask), (long long)ca_tensor_numel(ids));
    if (types && (types->ndim != ids->ndim || ca_tensor_numel(types) != ca_tensor_numel(ids)))
        return ca_error(CA_ERR_INVALID, "ca_bert_forward: token_type_ids must have input_ids' shape");
    return run_bert(b, ids, mask, types, out);
}

/* Splits x ([B, L] ids, or [B, 2, L] ids + mask) and runs the model. */
static ca_tensor *pooled_of(ca_module *bert, ca_tensor *x) {
    ca_tensor *ids = x, *mask = NULL;
    if (x->ndim == 3 && x->shape[1] == 2) {
        int64_t shape[2] = {x->shape[0], x->shape[2]};
        ids = ca_reshape(ca_narrow(x, 1, 0, 1), 2, shape);
        mask = ca_reshape(ca_narrow(x, 1, 1, 1), 2, shape);
        if (!ids || !mask) return NULL;
    } else if (x->ndim != 2) {
        ca_error(CA_ERR_INVALID, "BertModel: input must be [batch, length] ids or [batch, 2, length] ids and "
                 "attention mask, got %d dims", x->ndim);
        return NULL;
    }
    ca_bert_output o;
    return run_bert(bert, ids, mask, NULL, &o) == CA_OK ? o.pooler_output : NULL;
}

static ca_tensor *bert_model_forward(ca_module *self, ca_tensor *x, void *ctx) {
    (void)ctx;
    return pooled_of(self, x);
}

static ca_tensor *bert_cls_forward(ca_module *self, ca_tensor *x, void *ctx) {
    bert_cls *k = ctx;
    ca_tensor *pooled = ca_module_forward(k->bert, x);   /* its hooks: stage 3 gathers the encoder */
    pooled = ca_dropout(pooled, k->cfg.hidden_dropout_prob, self->training);
    return ca_module_forward(k->classifier, pooled);
}

/* ------------------------------------------------------------------ loading */

/* The checkpoint file of `path` (a directory holding model.safetensors, or the file). */
static void checkpoint_file(const char *path, char *out, size_t cap) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(out, cap, "%s/model.safetensors", path);
    else snprintf(out, cap, "%s", path);
}

/* The file's name for a parameter of the BertModel (name relative to it). */
static void file_name(const ca_bert_check *chk, const char *rel, char *out, size_t cap) {
    snprintf(out, cap, "%s%s", chk->prefix, rel);
    size_t n = strlen(out);
    if (!chk->gamma_beta || !strstr(rel, "LayerNorm.")) return;
    if (n > 7 && !strcmp(out + n - 7, ".weight")) snprintf(out + n - 7, cap - (n - 7), ".gamma");
    else if (n > 5 && !strcmp(out + n - 5, ".bias")) snprintf(out + n - 5, cap - (n - 5), ".beta");
}

static bool same_shape(const ca_st_entry *e, const ca_tensor *t) {
    if (e->ndim != t->ndim) return false;
    for (int d = 0; d < t->ndim; d++)
        if (e->shape[d] != t->shape[d]) return false;
    return true;
}

/* Checks entry e against parameter t. */
static ca_status check_entry(const char *file, const ca_st_entry *e, const ca_tensor *t) {
    char fs[128], ts[128];
    if (!same_shape(e, t))
        return ca_error(CA_ERR_INVALID, "checkpoint '%s': tensor '%s' has shape %s; the model's parameter is %s",
                        file, e->name, ca_shape_str(e->ndim, e->shape, fs, sizeof fs),
                        ca_shape_str(t->ndim, t->shape, ts, sizeof ts));
    if (e->dtype != CA_F32 && e->dtype != CA_F16 && e->dtype != CA_BF16)
        return ca_error(CA_ERR_INVALID, "checkpoint '%s': tensor '%s' is %s; F32, F16 or BF16 is needed",
                        file, e->name, ca_st_dtype_name(e->dtype));
    return CA_OK;
}

/* For every parameter of m: the file's entry (NULL: keep the initialisation). Fails on a
 * BertModel tensor the file lacks, or on a mismatch. */
static ca_status match_entries(ca_module *m, const ca_st_file *f, const ca_bert_check *chk,
                               const ca_st_entry **entries, ca_bert_load_info *info) {
    const char *bprefix = m == bert_of(m) ? "" : "bert.";
    size_t bl = strlen(bprefix);
    int n = ca_module_num_params(m);
    for (int i = 0; i < n; i++) {
        const char *name = ca_module_param_name(m, i);
        char fname[160];
        bool in_bert = strncmp(name, bprefix, bl) == 0;
        if (in_bert) file_name(chk, name + bl, fname, sizeof fname);
        else snprintf(fname, sizeof fname, "%s", name);
        entries[i] = ca_st_find(f, fname);
        bool optional = !in_bert || (!chk->has_pooler && !strncmp(name + bl, "pooler.", 7));
        if (!entries[i] && !optional)
            return ca_error(CA_ERR_INVALID, "checkpoint '%s': tensor '%s' (parameter %s) is missing", f->path,
                            fname, name);
        if (!entries[i]) {
            if (!info->initialized++) snprintf(info->first_initialized, sizeof info->first_initialized, "%s", name);
            continue;
        }
        ca_status s = check_entry(f->path, entries[i], ca_module_param_at(m, i));
        if (s != CA_OK) return s;
        info->loaded++;
    }
    info->unused = f->n - info->loaded;
    return CA_OK;
}

ca_status ca_bert_load_pretrained(ca_module *m, const char *path, ca_bert_load_info *info) {
    ca_module *b = bert_of(m);
    if (!b || !path)
        return ca_error(CA_ERR_INVALID, "ca_bert_load_pretrained: a module made by ca_bert_model_create or "
                        "ca_bert_for_sequence_classification_create and a path are required");
    ca_bert_load_info local;
    if (!info) info = &local;
    memset(info, 0, sizeof *info);
    char file[4096];
    checkpoint_file(path, file, sizeof file);
    ca_bert_check chk;
    ca_status s = ca_bert_check_checkpoint(file, &((bert_model *)b->ctx)->cfg, &chk);
    if (s != CA_OK) return s;
    snprintf(info->prefix, sizeof info->prefix, "%s", chk.prefix);
    ca_st_file f;
    s = ca_st_open(file, &f);
    if (s != CA_OK) return s;
    int n = ca_module_num_params(m);
    const ca_st_entry **entries = calloc((size_t)(n ? n : 1), sizeof *entries);
    if (!entries) s = ca_error(CA_ERR_NOMEM, "out of host memory");
    if (s == CA_OK) s = match_entries(m, &f, &chk, entries, info);
    ca_meta_src *src = NULL;   /* under ca_init_empty_weights: read at ca_prepare */
    for (int i = 0; s == CA_OK && i < n; i++)
        if (entries[i]) s = ca_meta_load_entry(ca_module_param_at(m, i), &f, entries[i], &src);
    ca_meta_src_unref(src);
    free(entries);
    ca_st_close(&f);
    return s;
}

/* ------------------------------------------------------------------ config.json */

static json_object *labels_object(const char *const *labels, int64_t n, bool by_id) {
    json_object *o = json_object_new_object();
    for (int64_t i = 0; o && i < n; i++) {
        char id[32], dflt[48];
        snprintf(id, sizeof id, "%lld", (long long)i);
        snprintf(dflt, sizeof dflt, "LABEL_%lld", (long long)i);
        const char *label = labels && labels[i] ? labels[i] : dflt;
        if (by_id) json_object_object_add(o, id, json_object_new_string(label));
        else json_object_object_add(o, label, json_object_new_int64(i));
    }
    return o;
}

/* A double written as its shortest decimal ("0.1", "1e-12"), not %.17g's 0.10000000000000001. */
static json_object *real(double d) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", d);
    return json_object_new_double_s(d, buf);
}

static json_object *config_json(const ca_bert_config *c, bool cls, const char *const *labels) {
    json_object *o = json_object_new_object(), *arch = json_object_new_array();
    if (!o || !arch) {
        json_object_put(o);
        json_object_put(arch);
        return NULL;
    }
    json_object_array_add(arch, json_object_new_string(cls ? CLS_TYPE : MODEL_TYPE));
    json_object_object_add(o, "architectures", arch);
    json_object_object_add(o, "model_type", json_object_new_string("bert"));
    json_object_object_add(o, "vocab_size", json_object_new_int64(c->vocab_size));
    json_object_object_add(o, "hidden_size", json_object_new_int64(c->hidden_size));
    json_object_object_add(o, "num_hidden_layers", json_object_new_int64(c->num_hidden_layers));
    json_object_object_add(o, "num_attention_heads", json_object_new_int64(c->num_attention_heads));
    json_object_object_add(o, "intermediate_size", json_object_new_int64(c->intermediate_size));
    json_object_object_add(o, "hidden_act", json_object_new_string(c->hidden_act));
    json_object_object_add(o, "hidden_dropout_prob", real(c->hidden_dropout_prob));
    json_object_object_add(o, "attention_probs_dropout_prob", real(c->attention_probs_dropout_prob));
    json_object_object_add(o, "max_position_embeddings", json_object_new_int64(c->max_position_embeddings));
    json_object_object_add(o, "type_vocab_size", json_object_new_int64(c->type_vocab_size));
    json_object_object_add(o, "initializer_range", real(0.02));
    json_object_object_add(o, "layer_norm_eps", real(c->layer_norm_eps));
    json_object_object_add(o, "pad_token_id", json_object_new_int64(c->pad_token_id));
    json_object_object_add(o, "position_embedding_type", json_object_new_string("absolute"));
    if (cls) {
        json_object_object_add(o, "num_labels", json_object_new_int64(c->num_labels));
        json_object_object_add(o, "id2label", labels_object(labels, c->num_labels, true));
        json_object_object_add(o, "label2id", labels_object(labels, c->num_labels, false));
        json_object_object_add(o, "problem_type", json_object_new_string("single_label_classification"));
    }
    return o;
}

ca_status ca_bert_save_config(const ca_module *m, const char *dir, const char *const *labels) {
    const ca_bert_config *c = ca_bert_module_config(m);
    if (!c || !dir) return ca_error(CA_ERR_INVALID, "ca_bert_save_config: a BERT module and a directory are required");
    json_object *o = config_json(c, is_type(m, CLS_TYPE), labels);
    if (!o) return ca_error(CA_ERR_NOMEM, "out of host memory writing config.json");
    const char *text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    const void *parts[2] = {text, "\n"};
    size_t lens[2] = {strlen(text), 1};
    ca_status s = ca_st_write_atomic(path, parts, lens, 2);
    json_object_put(o);
    return s;
}
