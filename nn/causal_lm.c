/* Decoder language models (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM) with Hugging
 * Face's parameter names: building, the forward of transformers 4.39 (eager attention), the
 * shifted loss, loading model.safetensors or its shards, and writing config.json and
 * generation_config.json. */
#include "nn/nn_impl.h"

#include <caccel/causal_lm.h>
#include <caccel/collective.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lm_model lm_model;

typedef struct lm_layer {
    const lm_model *model;                 /* the owner (a checkpointed layer's context) */
    ca_module *module;                     /* "model.layers.N" */
    ca_module *in_ln, *q, *k, *v, *o, *post_ln, *gate, *up, *down;
} lm_layer;

/* The root module's ctx: the config and the submodules (which own the parameters). */
struct lm_model {
    ca_causal_lm_config cfg;
    ca_module *embed, *norm, *lm_head;     /* lm_head NULL when tied */
    int64_t nlayers;
    lm_layer *layers;
    bool tp_planned;                       /* base_model_tp_plan added to the module's plan */
};

static const char *const ARCH[] = {"", "LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM",
                                   "GPT2LMHeadModel"};
static const char *const BASE[] = {"", "LlamaModel", "Qwen2Model", "MistralModel", "GPT2Model"};

static void lm_model_free(void *p) {
    lm_model *b = p;
    free(b->layers);
    free(b);
}

/* ------------------------------------------------------------------ building */

static ca_status add_rms_norm(ca_module *parent, const char *name, const ca_causal_lm_config *c, ca_module **out) {
    ca_module *l;
    ca_status s = ca_rms_norm_create(c->hidden_size, c->rms_norm_eps, &l);
    if (s == CA_OK) s = ca_module_add(parent, name, l);
    if (s == CA_OK) *out = l;
    return s;
}

static ca_status add_container(ca_module *parent, const char *name, const char *type, ca_module **out) {
    ca_module *m;
    ca_status s = ca_module_create(type, NULL, NULL, NULL, &m);
    if (s == CA_OK) s = ca_module_add(parent, name, m);
    if (s == CA_OK) *out = m;
    return s;
}

static ca_status build_layer(ca_module *layers, int64_t i, const ca_causal_lm_config *c, lm_layer *l) {
    char name[24];
    snprintf(name, sizeof name, "%lld", (long long)i);
    int64_t h = c->hidden_size, f = c->intermediate_size;
    int64_t kv = c->num_key_value_heads * (h / c->num_attention_heads);
    float std = (float)c->initializer_range;
    ca_module *layer, *attn, *mlp;
    ca_status s = add_container(layers, name, "DecoderLayer", &layer);
    if (s == CA_OK) l->module = layer;
    if (s == CA_OK) s = add_rms_norm(layer, "input_layernorm", c, &l->in_ln);
    if (s == CA_OK) s = add_container(layer, "self_attn", "Attention", &attn);
    if (s == CA_OK) s = ca_nn_add_linear(attn, "q_proj", h, h, c->qkv_bias, std, &l->q);
    if (s == CA_OK) s = ca_nn_add_linear(attn, "k_proj", h, kv, c->qkv_bias, std, &l->k);
    if (s == CA_OK) s = ca_nn_add_linear(attn, "v_proj", h, kv, c->qkv_bias, std, &l->v);
    if (s == CA_OK) s = ca_nn_add_linear(attn, "o_proj", h, h, c->o_bias, std, &l->o);
    if (s == CA_OK) s = add_rms_norm(layer, "post_attention_layernorm", c, &l->post_ln);
    if (s == CA_OK) s = add_container(layer, "mlp", "MLP", &mlp);
    if (s == CA_OK) s = ca_nn_add_linear(mlp, "gate_proj", h, f, false, std, &l->gate);
    if (s == CA_OK) s = ca_nn_add_linear(mlp, "up_proj", h, f, false, std, &l->up);
    if (s == CA_OK) s = ca_nn_add_linear(mlp, "down_proj", f, h, false, std, &l->down);
    return s;
}

static ca_status build(ca_module *root, lm_model *b) {
    const ca_causal_lm_config *c = &b->cfg;
    ca_module *model, *layers;
    ca_status s = add_container(root, "model", BASE[c->family], &model);
    if (s == CA_OK) s = ca_nn_add_embedding(model, "embed_tokens", c->vocab_size, c->hidden_size, c->pad_token_id,
                                           (float)c->initializer_range, &b->embed);
    if (s != CA_OK) return ca_error_context("%s: model.embed_tokens", ARCH[c->family]);
    s = add_container(model, "layers", "ModuleList", &layers);
    for (int64_t i = 0; s == CA_OK && i < b->nlayers; i++) {
        b->layers[i].model = b;
        s = build_layer(layers, i, c, &b->layers[i]);
        if (s != CA_OK) ca_error_context("%s: model.layers.%lld", ARCH[c->family], (long long)i);
    }
    if (s == CA_OK) s = add_rms_norm(model, "norm", c, &b->norm);
    if (s == CA_OK && !c->tie_word_embeddings)
        s = ca_nn_add_linear(root, "lm_head", c->hidden_size, c->vocab_size, false, (float)c->initializer_range,
                             &b->lm_head);
    return s;
}

static ca_tensor *lm_module_forward(ca_module *self, ca_tensor *x, void *ctx);
static lm_model *model_of(const ca_module *m);

/* ------------------------------------------------------------------ tensor parallelism */

/* transformers 5's base_model_tp_plan of LlamaConfig, Qwen2Config and MistralConfig (the same for the three):
 * Megatron's attention and MLP split, each rank computing num_attention_heads / tp_size heads (and as
 * many fewer key/value heads) and intermediate_size / tp_size features. */
static const char *const family_tp_plan[][2] = {
    {"layers.*.self_attn.q_proj", "colwise"}, {"layers.*.self_attn.k_proj", "colwise"},
    {"layers.*.self_attn.v_proj", "colwise"}, {"layers.*.self_attn.o_proj", "rowwise"},
    {"layers.*.mlp.gate_proj", "colwise"},    {"layers.*.mlp.up_proj", "colwise"},
    {"layers.*.mlp.down_proj", "rowwise"},
};

/* Whether some entry of the plan (n entries of pattern, style) names a module under `part`. */
static bool plan_names(const char *const (*plan)[2], const char (*cfg)[2][96], int n, const char *part) {
    for (int i = 0; i < n; i++)
        if (strstr(plan ? plan[i][0] : cfg[i][0], part)) return true;
    return false;
}

/* The sizes the plan splits, each a multiple of tp: the heads when it splits the attention, the MLP's
 * features when it splits the MLP. */
static ca_status tp_check_sizes(const ca_causal_lm_config *c, bool attn, bool mlp, int tp, const char *where) {
    static const char *const key[3] = {"num_attention_heads", "num_key_value_heads", "intermediate_size"};
    const int64_t v[3] = {c->num_attention_heads, c->num_key_value_heads, c->intermediate_size};
    for (int i = 0; i < 3; i++)
        if ((i < 2 ? attn : mlp) && v[i] % tp != 0)
            return ca_error(CA_ERR_CONFIG, "%s: \"%s\" %lld is not divisible by parallelism_config_tp_size %d "
                            "(base_model_tp_plan splits the %s over the tp ranks)", where, key[i], (long long)v[i], tp,
                            i < 2 ? "attention heads" : "MLP's intermediate features");
    return CA_OK;
}

/* Sequence parallelism (a config plan's "sequence_parallel" entries): the residual stream stays on each
 * rank's tokens from the first layer's input_layernorm to the final norm, so every norm on it must be one. */
static ca_status tp_check_seq(const ca_module *self, const char *where) {
    static const char *const norms[3] = {"input_layernorm", "post_attention_layernorm", "norm"};
    for (int i = 0; i < 3; i++) {
        char name[96];
        snprintf(name, sizeof name, i < 2 ? "model.layers.0.%s" : "model.%s", norms[i]);
        if (ca_tp_plan_match(self, name, NULL) != CA_TP_SEQUENCE)
            return ca_error(CA_ERR_UNSUPPORTED, "%s: \"base_model_tp_plan\" runs some norms \"sequence_parallel\" but "
                            "not \"%s\"; caccel runs the decoder sequence-parallel with layers.*.input_layernorm, "
                            "layers.*.post_attention_layernorm and norm all so", where, name + 6);
    }
    return CA_OK;
}

/* ca_module's tp_prepare: the config's base_model_tp_plan (or the family's) checked against tp and added
 * to the model's plan under "model.", once. */
static ca_status lm_tp_prepare(ca_module *self, int tp) {
    lm_model *b = model_of(self);
    const ca_causal_lm_config *c = &b->cfg;
    char where[600];
    snprintf(where, sizeof where, c->config_file[0] ? "config '%s'" : "%s's config", c->config_file[0] ? c->config_file
                                                                                                         : ARCH[c->family]);
    bool own = c->n_tp_plan > 0;
    int n = own ? c->n_tp_plan : (int)(sizeof family_tp_plan / sizeof *family_tp_plan);
    const char *const (*plan)[2] = own ? NULL : family_tp_plan;
    ca_status s = tp_check_sizes(c, plan_names(plan, c->tp_plan, n, "self_attn"), plan_names(plan, c->tp_plan, n, "mlp"),
                                 tp, where);
    for (int i = 0; s == CA_OK && i < n; i++) {
        const char *pat = own ? c->tp_plan[i][0] : plan[i][0], *style = own ? c->tp_plan[i][1] : plan[i][1];
        if (strcmp(style, "colwise") != 0 && strcmp(style, "rowwise") != 0 && strcmp(style, "sequence_parallel") != 0)
            return ca_error(CA_ERR_UNSUPPORTED, "%s: \"base_model_tp_plan\" style \"%s\" for \"%s\" is not supported "
                            "yet (caccel splits Linear layers \"colwise\" and \"rowwise\", and runs norms "
                            "\"sequence_parallel\")", where, style, pat);
    }
    bool seq = false;
    for (int i = 0; own && i < n; i++) seq |= !strcmp(c->tp_plan[i][1], "sequence_parallel");
    for (int i = 0; s == CA_OK && !b->tp_planned && i < n; i++) {
        char name[128];
        snprintf(name, sizeof name, "model.%s", own ? c->tp_plan[i][0] : plan[i][0]);
        s = ca_tp_plan(self, name, own ? c->tp_plan[i][1] : plan[i][1]);
    }
    /* transformers' model-level plan: lm_head colwise_gather_output (each rank its vocabulary's logits, then
     * gathered: ca_causal_lm_loss unchanged). A tied head is the embedding, which the plan keeps whole; a
     * vocabulary tp does not divide keeps the head whole too (a tokenizer's 257 rows). Under sequence
     * parallelism its input is the final norm's output gathered (run_lm), whole as without it. */
    if (s == CA_OK && !b->tp_planned && b->lm_head && c->vocab_size % tp == 0)
        s = ca_tp_plan(self, "lm_head", "colwise_gather_output");
    if (s == CA_OK && seq) s = tp_check_seq(self, where);
    if (s == CA_OK) b->tp_planned = true;
    return s;
}

ca_status ca_causal_lm_create(const ca_causal_lm_config *c, ca_module **out) {
    if (out) *out = NULL;
    if (!c || !out) return ca_error(CA_ERR_INVALID, "ca_causal_lm_create: config and out are required");
    const char *type = ca_causal_lm_model_type(c->family) ? ARCH[c->family] : "ca_causal_lm_create";
    ca_status s = ca_causal_lm_check_sizes(c, type);
    if (s != CA_OK) return s;
    if (c->family == CA_CAUSAL_LM_GPT2) return ca_gpt2_lm_create(c, out);
    lm_model *b = calloc(1, sizeof *b);
    if (b) b->layers = calloc((size_t)c->num_hidden_layers, sizeof *b->layers);
    if (!b || !b->layers) {
        if (b) lm_model_free(b);
        return ca_error(CA_ERR_NOMEM, "out of host memory creating %s", type);
    }
    b->cfg = *c;
    b->nlayers = c->num_hidden_layers;
    ca_module *root;
    s = ca_module_create(type, lm_module_forward, b, lm_model_free, &root);
    if (s != CA_OK) return s;
    s = build(root, b);
    if (s != CA_OK) {
        ca_module_destroy(root);
        return s;
    }
    root->tp_prepare = lm_tp_prepare;
    *out = root;
    return CA_OK;
}

static lm_model *model_of(const ca_module *m) {
    return m && m->forward == lm_module_forward ? m->ctx : NULL;
}

const ca_causal_lm_config *ca_causal_lm_module_config(const ca_module *m) {
    lm_model *b = model_of(m);
    return b ? &b->cfg : ca_gpt2_lm_config(m);
}

/* ------------------------------------------------------------------ rotary embeddings */

/* The rotary tables of config c for positions pos ([rows, T]; NULL: 0..T-1, tables [T, d/2]; else
 * [rows, T, d/2]) on dev, as ca_rope takes them: ca_rope_tables computes them as transformers 4.39's
 * LlamaRotaryEmbedding does (linear: positions divided by the factor; dynamic: the base grows once
 * the longest position passes max_position_embeddings). */
static ca_status rope_tables(const ca_causal_lm_config *c, const int64_t *pos, int64_t rows, int64_t T,
                             ca_device *dev, ca_tensor **cos_t, ca_tensor **sin_t) {
    ca_rope_config rc = {.head_dim = c->hidden_size / c->num_attention_heads, .theta = c->rope_theta,
                         .max_position_embeddings = c->max_position_embeddings};
    ca_status s = ca_rope_scaling_parse(c->rope_scaling_type, &rc.type);
    if (s != CA_OK) return s;
    if (rc.type != CA_ROPE_SCALING_NONE) rc.factor = c->rope_scaling_factor;
    rc.low_freq_factor = c->rope_low_freq_factor;
    rc.high_freq_factor = c->rope_high_freq_factor;
    rc.original_max_position_embeddings = c->rope_original_max_position_embeddings;
    rc.beta_fast = c->rope_beta_fast;
    rc.beta_slow = c->rope_beta_slow;
    rc.attention_factor = c->rope_attention_factor;
    /* yarn with the pretrained length named: transformers (4.48 on) scales by the ratio of the lengths */
    if (rc.type == CA_ROPE_SCALING_YARN && rc.original_max_position_embeddings > 0)
        rc.factor = (double)c->max_position_embeddings / (double)rc.original_max_position_embeddings;
    return ca_rope_tables(dev, &rc, pos, pos ? rows : 1, T, cos_t, sin_t);
}

/* A rotary table ([T, R], or [B, T, R] from position_ids) as one row per token, [B * T, 1, R] (row
 * b * T + t: token t of sequence b), as rope_heads takes it: a view of the per-sequence tables, a copy of
 * the shared one for B > 1 (once a forward, for every layer). */
static ca_tensor *token_table(ca_tensor *t, int64_t bsz, int64_t len) {
    if (!t) return NULL;
    int64_t r = t->shape[t->ndim - 1];
    if (t->ndim == 2 && bsz > 1)
        t = ca_contiguous(ca_expand(ca_reshape(t, 3, (int64_t[]){1, len, r}), 3, (int64_t[]){bsz, len, r}));
    return ca_reshape(t, 3, (int64_t[]){bsz * len, 1, r});
}

/* ------------------------------------------------------------------ forward */

/* [B, T, heads * d] -> [B, heads, T, d], a view: the heads this rank's projection gave (under tensor
 * parallelism a colwise q/k/v_proj gives num_attention_heads / tp_size of them). The attention reads it
 * through its strides where the kernels do (attention_strides), its gradient written into the
 * projection's. */
static ca_tensor *split_heads(ca_tensor *x, int64_t d) {
    if (!x) return NULL;
    int64_t b = x->shape[0], t = x->shape[1], heads = x->shape[2] / d;
    return ca_transpose(ca_reshape(x, 4, (int64_t[]){b, t, heads, d}), 1, 2);
}

/* q or k, x [B, T, heads * d], turned by the token tables cs, sn ([B * T, 1, R], token_tables) in the
 * projection's own [B, T, heads, d] memory: ca_rope sees it as B * T sequences of one token, each with
 * its own table row, so its kernel reads and writes contiguous rows and no copy is made either way;
 * then split as split_heads. */
static ca_tensor *rope_heads(ca_tensor *x, int64_t d, ca_tensor *cs, ca_tensor *sn) {
    if (!x) return NULL;
    int64_t b = x->shape[0], t = x->shape[1], heads = x->shape[2] / d;
    ca_tensor *r = ca_rope(ca_reshape(x, 4, (int64_t[]){b * t, heads, 1, d}), cs, sn);
    return r ? split_heads(ca_reshape(r, 3, (int64_t[]){b, t, heads * d}), d) : NULL;
}

/* [B, heads, T, d] -> [B, T, heads * d]: a view of an attention output written in [B, T, heads, d]
 * memory (strided kernels), a copy otherwise. */
static ca_tensor *merge_heads(ca_tensor *x) {
    if (!x) return NULL;
    int64_t b = x->shape[0], heads = x->shape[1], t = x->shape[2], d = x->shape[3];
    return ca_reshape(ca_contiguous(ca_transpose(x, 1, 2)), 3, (int64_t[]){b, t, heads * d});
}

/* in: hidden [B, T, H], cos, sin, and the key-padding mask [B, 1, 1, T] (u8) or NULL. */
static ca_tensor *decoder_layer(const lm_layer *l, ca_tensor *const *in, bool training) {
    const ca_causal_lm_config *c = &l->model->cfg;
    ca_tensor *h = in[0], *cos_t = in[1], *sin_t = in[2], *mask = in[3];
    ca_tensor *x = ca_module_forward(l->in_ln, h);
    int64_t d = c->hidden_size / c->num_attention_heads;
    ca_tensor *q = rope_heads(ca_module_forward(l->q, x), d, cos_t, sin_t);
    ca_tensor *k = rope_heads(ca_module_forward(l->k, x), d, cos_t, sin_t);
    ca_tensor *v = split_heads(ca_module_forward(l->v, x), d);
    /* grouped-query attention in the op: k and v keep their num_key_value_heads heads (no repeat_kv copy);
     * under tensor parallelism the dropout of this rank's heads is one process's (ca_tp_heads) */
    int64_t h0 = 0, heads = 1;
    if (q && ca_tp_heads(l->q, q->shape[1], &h0, &heads) != CA_OK) return NULL;
    ca_tensor *a = ca_scaled_dot_product_attention_heads(q, k, v, mask, true, training ? c->attention_dropout : 0, 0,
                                                         h0, heads);
    h = ca_add(h, ca_module_forward(l->o, merge_heads(a)));
    x = ca_module_forward(l->post_ln, h);
    return ca_add(h, ca_module_forward(l->down, ca_swiglu(ca_module_forward(l->gate, x), ca_module_forward(l->up, x))));
}

/* ctx: the layer, which lives as long as the model (backward reruns this). */
static ca_status checkpointed_layer(void *ctx, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out) {
    (void)n_out;
    const lm_layer *l = ctx;
    ca_tensor *args[4] = {in[0], in[1], in[2], n_in > 3 ? in[3] : NULL};
    out[0] = decoder_layer(l, args, l->module->training);
    return out[0] ? CA_OK : ca_last_status();
}

/* One layer, checkpointed when its module is marked (ca_module_set_checkpointing). */
static ca_tensor *run_layer(const lm_model *b, int64_t i, ca_tensor **in, bool training) {
    const lm_layer *l = &b->layers[i];
    if (!in[0]) return NULL;
    if (!ca_grad_enabled()) {   /* evaluation: the layer's intermediates go when it returns */
        ca_locals_mark mark = ca_forward_locals_mark();
        ca_tensor *y = decoder_layer(l, in, training);
        if (y) ca_forward_locals_free(mark, y);
        return y;
    }
    if (!ca_module_checkpointing(l->module)) return decoder_layer(l, in, training);
    ca_tensor *y = NULL;
    if (ca_checkpoint(checkpointed_layer, (void *)l, in[3] ? 4 : 3, in, 1, &y) != CA_OK) {
        ca_error_context("checkpointed model.layers.%lld", (long long)i);
        return NULL;
    }
    return y;
}

/* position_ids as host i64 (*out NULL when pos is NULL). */
static ca_status host_positions(ca_tensor *pos, int64_t **out) {
    *out = NULL;
    if (!pos) return CA_OK;
    ca_tensor *p = pos->dtype == CA_I64 ? ca_contiguous(pos) : ca_cast(pos, CA_I64);
    int64_t *h = malloc((size_t)pos->numel * sizeof *h);
    if (!p || !h) {
        free(h);
        return p ? ca_error(CA_ERR_NOMEM, "out of host memory for position_ids") : ca_last_status();
    }
    ca_status s = ca_tensor_to_host(p, h, (size_t)pos->numel * sizeof *h);
    for (int64_t i = 0; s == CA_OK && i < pos->numel; i++)
        if (h[i] < 0) s = ca_error(CA_ERR_INVALID, "position_ids[%lld] is %lld; positions are >= 0", (long long)i,
                                   (long long)h[i]);
    if (s == CA_OK) *out = h;
    else free(h);
    return s;
}

/* The sliding window applies (Mistral; Qwen2 with use_sliding_window) and the sequence is longer. */
static ca_status check_window(const ca_causal_lm_config *c, int64_t len) {
    bool on = c->sliding_window > 0 && (c->family == CA_CAUSAL_LM_MISTRAL ||
                                        (c->family == CA_CAUSAL_LM_QWEN2 && c->use_sliding_window));
    if (on && len > c->sliding_window)
        return ca_error(CA_ERR_INVALID, "%s: the sequence length %lld is longer than sliding_window %lld; "
                        "sliding-window attention is not supported yet (a window at least as long as the "
                        "sequence is plain causal attention)", ARCH[c->family], (long long)len,
                        (long long)c->sliding_window);
    return CA_OK;
}

/* Under sequence parallelism (the norms planned "sequence_parallel", prepared at tp > 1) the tokens a
 * sequence is padded with at its end to a multiple of tp (causal attention keeps them out of the real
 * ones): ids and the mask (if any) padded in place. 0 otherwise. */
static int64_t seq_pad(const lm_model *b, ca_tensor **ids, ca_tensor **mask, const ca_tensor *pos) {
    const ca_module_seq *sq = b->nlayers ? b->layers[0].in_ln->tp_seq : NULL;
    int64_t len = (*ids)->shape[1], n = sq ? sq->size : 1, pad = (n - len % n) % n, bsz = (*ids)->shape[0];
    if (!pad) return 0;
    if (pos) {
        ca_error(CA_ERR_UNSUPPORTED, "ca_causal_lm_forward: position_ids with sequence parallelism and a length (%lld) "
                 "that parallelism_config_tp_size %lld does not divide are not supported yet", (long long)len,
                 (long long)n);
        return -1;
    }
    ca_device *dev = ca_tdev(*ids);
    bool masked = *mask != NULL;
    *ids = ca_concat(2, (ca_tensor *[]){*ids, ca_zeros(dev, (*ids)->dtype, 2, (int64_t[]){bsz, pad})}, 1);
    if (masked)
        *mask = ca_concat(2, (ca_tensor *[]){*mask, ca_full(dev, (*mask)->dtype, 2, (int64_t[]){bsz, pad}, 1)}, 1);
    return *ids && (!masked || *mask) ? pad : -1;
}

static ca_status run_lm(lm_model *b, bool training, ca_tensor *ids, ca_tensor *mask, ca_tensor *pos,
                        ca_tensor **logits) {
    const ca_causal_lm_config *c = &b->cfg;
    int64_t real = ids->shape[1], pad = seq_pad(b, &ids, &mask, pos);
    if (pad < 0) return ca_last_status();
    int64_t bsz = ids->shape[0], len = ids->shape[1];
    ca_status s = check_window(c, real);
    int64_t *hpos = NULL;
    if (s == CA_OK) s = host_positions(pos, &hpos);
    ca_tensor *in[4] = {NULL, NULL, NULL, NULL};
    if (s == CA_OK) s = rope_tables(c, hpos, hpos ? bsz : 1, len, ca_tdev(ids), &in[1], &in[2]);
    free(hpos);
    if (s != CA_OK) return s;
    in[1] = token_table(in[1], bsz, len);
    in[2] = token_table(in[2], bsz, len);
    if (!in[1] || !in[2]) return ca_last_status();
    if (mask) {
        in[3] = ca_reshape(mask, 4, (int64_t[]){bsz, 1, 1, len});
        if (in[3] && in[3]->dtype != CA_U8) in[3] = ca_cast(in[3], CA_U8);
        if (!in[3]) return ca_last_status();
    }
    in[0] = ca_module_forward(b->embed, ca_contiguous(ids));
    ca_module *first_ln = b->nlayers ? b->layers[0].in_ln : b->norm;   /* sequence-parallel: each rank its tokens */
    in[0] = ca_tp_sequence_split(first_ln, in[0]);
    for (int64_t i = 0; i < b->nlayers; i++) in[0] = run_layer(b, i, in, training);
    ca_tensor *h = ca_tp_sequence_gather(first_ln, ca_module_forward(b->norm, in[0]));
    if (pad && h) h = ca_narrow(h, 1, 0, real);
    *logits = b->lm_head ? ca_module_forward(b->lm_head, h) : ca_linear(h, b->embed->params[0], NULL);
    return *logits ? CA_OK : ca_last_status();
}

static ca_status check_ids(const char *what, const ca_tensor *t, const ca_tensor *ids, bool int_only) {
    if (!t) return CA_OK;
    if (t->ndim != 2 || (int_only && t->dtype != CA_I64 && t->dtype != CA_I32) ||
        (ids && (t->shape[0] != ids->shape[0] || t->shape[1] != ids->shape[1])))
        return ca_error(CA_ERR_INVALID, "ca_causal_lm_forward: %s must be %s[batch, length]%s", what,
                        int_only ? "i32/i64 " : "", ids ? " as input_ids" : "");
    return CA_OK;
}

ca_status ca_causal_lm_forward(ca_module *m, ca_tensor *ids, ca_tensor *mask, ca_tensor *pos, ca_tensor **logits) {
    lm_model *b = model_of(m);
    if (logits) *logits = NULL;
    if (!ca_causal_lm_module_config(m) || !ids || !logits)
        return ca_error(CA_ERR_INVALID, "ca_causal_lm_forward: a module made by ca_causal_lm_create, input_ids and "
                        "logits are required");
    ca_status s = check_ids("input_ids", ids, NULL, true);
    if (s == CA_OK) s = check_ids("attention_mask", mask, ids, false);
    if (s == CA_OK) s = check_ids("position_ids", pos, ids, true);
    if (s == CA_OK && ids->shape[1] < 1) s = ca_error(CA_ERR_INVALID, "ca_causal_lm_forward: an empty sequence");
    if (s != CA_OK) return s;
    return b ? run_lm(b, m->training, ids, mask, pos, logits) : ca_gpt2_lm_run(m, ids, mask, pos, logits);
}

/* Whether the attention mask m (i64 or i32 [B, T]) is all ones: no padding, so no mask (transformers'
 * SDPA path drops such a mask too; context parallelism splits only attention without one). */
static bool all_ones(ca_tensor *m) {
    ca_tensor *c = ca_contiguous(m->dtype == CA_I64 ? m : ca_cast(m, CA_I64));
    int64_t *h = c ? malloc(sizeof *h * (size_t)(c->numel ? c->numel : 1)) : NULL;
    bool ones = h && ca_tensor_to_host(c, h, sizeof *h * (size_t)c->numel) == CA_OK;
    for (int64_t i = 0; ones && i < c->numel; i++) ones = h[i] == 1;
    free(h);
    return ones;   /* unreadable: kept as a mask */
}

/* x: [B, T] ids, [B, 2, T] ids and attention mask, or [B, 3, T] ids, attention mask and position_ids
 * (context parallelism's split: each rank's tokens with their global positions; there a mask of all ones
 * is none). */
static ca_tensor *lm_module_forward(ca_module *self, ca_tensor *x, void *ctx) {
    (void)ctx;
    ca_tensor *ids = x, *mask = NULL, *pos = NULL, *logits = NULL;
    if (x && x->ndim == 3 && (x->shape[1] == 2 || x->shape[1] == 3)) {
        int64_t shape[2] = {x->shape[0], x->shape[2]};
        ids = ca_reshape(ca_narrow(x, 1, 0, 1), 2, shape);
        mask = ca_reshape(ca_narrow(x, 1, 1, 1), 2, shape);
        if (x->shape[1] == 3) pos = ca_reshape(ca_narrow(x, 1, 2, 1), 2, shape);
        if (!ids || !mask || (x->shape[1] == 3 && !pos)) return NULL;
        if (pos && all_ones(mask)) mask = NULL;
    }
    return ca_causal_lm_forward(self, ids, mask, pos, &logits) == CA_OK ? logits : NULL;
}

ca_tensor *ca_causal_lm_loss(ca_tensor *logits, ca_tensor *labels) {
    if (!logits || !labels || logits->ndim != 3 || labels->ndim != 2 || logits->shape[0] != labels->shape[0] ||
        logits->shape[1] != labels->shape[1] || logits->shape[1] < 2) {
        ca_error(CA_ERR_INVALID, "ca_causal_lm_loss: logits [batch, length, vocab] and labels [batch, length] "
                 "with length >= 2 are needed");
        return NULL;
    }
    /* transformers' shift by the labels: every position's logits against the next label, the last
     * position's against -100 (ignored; the mean counts the same tokens as logits[:, :-1] against
     * labels[:, 1:]). The logits stay one [B * T, V] view, not a copy of logits[:, :-1] and a scatter
     * of its gradient into zeros: three passes over [B, T, V] less. */
    int64_t b = logits->shape[0], t = logits->shape[1], v = logits->shape[2];
    ca_tensor *x = ca_reshape(logits, 2, (int64_t[]){b * t, v});
    ca_tensor *tail = ca_full(ca_tdev(labels), labels->dtype, 2, (int64_t[]){b, 1}, -100.0);
    ca_tensor *parts[2] = {ca_narrow(labels, 1, 1, t - 1), tail};
    ca_tensor *y = parts[0] && tail ? ca_reshape(ca_concat(2, parts, 1), 1, (int64_t[]){b * t}) : NULL;
    return x && y ? ca_cross_entropy(x, y) : NULL;
}
