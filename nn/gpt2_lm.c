/* GPT2LMHeadModel with Hugging Face's parameter names and layouts (Conv1D weights [in, out]), and
 * its forward as transformers 4.39 computes it (eager attention). ca_causal_lm_create and
 * ca_causal_lm_forward hand GPT-2 configs and modules here. */
#include "nn/nn_impl.h"

#include <caccel/causal_lm.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gpt2_model gpt2_model;

typedef struct gpt2_block {
    const gpt2_model *model;               /* the owner (a checkpointed block's context) */
    int64_t index;
    ca_module *module;                     /* "transformer.h.N", marked for checkpointing or not */
    ca_module *ln_1, *c_attn, *c_proj, *ln_2, *c_fc, *mlp_proj;
} gpt2_block;

/* The root module's ctx. */
struct gpt2_model {
    ca_causal_lm_config cfg;
    ca_module *wte, *wpe, *ln_f, *lm_head;     /* lm_head NULL when tied to wte */
    int64_t nlayers;
    gpt2_block *blocks;
};

static const char *const TYPE = "GPT2LMHeadModel";

static void gpt2_free(void *p) {
    gpt2_model *g = p;
    free(g->blocks);
    free(g);
}

/* transformers' Conv1D: y = x W + b with W [in, out]. */
static ca_tensor *conv1d_forward(ca_module *self, ca_tensor *x, void *ctx) {
    (void)ctx;
    return ca_add(ca_matmul(x, self->params[0]), self->params[1]);
}

static ca_status add_conv1d(ca_module *parent, const char *name, int64_t in, int64_t out_f, float std,
                            ca_module **out) {
    ca_module *m;
    ca_status s = ca_module_create("Conv1D", conv1d_forward, NULL, NULL, &m);
    if (s != CA_OK) return s;
    ca_tensor *w = NULL, *b = NULL;
    s = ca_parameter_create(ca_cpu_device(), CA_F32, 2, (int64_t[]){in, out_f}, &w);
    if (s == CA_OK) s = ca_module_add_param(m, "weight", w);
    if (s == CA_OK) s = ca_nn_init_normal(w, std);
    if (s == CA_OK) s = ca_parameter_create(ca_cpu_device(), CA_F32, 1, &out_f, &b);
    if (s == CA_OK) s = ca_module_add_param(m, "bias", b);
    if (s == CA_OK) s = ca_tensor_init_fill_(b, 0, out_f, 0.0);
    if (s != CA_OK) {
        ca_module_destroy(m);
        return s;
    }
    s = ca_module_add(parent, name, m);
    if (s == CA_OK) *out = m;
    return s;
}

static ca_status add_ln(ca_module *parent, const char *name, const ca_causal_lm_config *c, ca_module **out) {
    ca_module *l;
    ca_status s = ca_layer_norm_create(c->hidden_size, c->rms_norm_eps, &l);
    if (s == CA_OK) s = ca_module_add(parent, name, l);
    if (s == CA_OK) *out = l;
    return s;
}

static ca_status add_embedding(ca_module *parent, const char *name, int64_t n, int64_t pad,
                               const ca_causal_lm_config *c, ca_module **out) {
    ca_module *e;
    ca_status s = ca_embedding_create_ex(n, c->hidden_size, pad, &e);
    if (s != CA_OK) return s;
    s = ca_nn_init_normal(e->params[0], (float)c->initializer_range);
    if (s != CA_OK) {
        ca_module_destroy(e);
        return s;
    }
    s = ca_module_add(parent, name, e);
    if (s == CA_OK) *out = e;
    return s;
}

static ca_status build_block(ca_module *h, int64_t i, const ca_causal_lm_config *c, gpt2_block *b) {
    char name[24];
    snprintf(name, sizeof name, "%lld", (long long)i);
    int64_t e = c->hidden_size, f = c->intermediate_size;
    float std = (float)c->initializer_range;
    float proj = (float)(c->initializer_range / sqrt(2.0 * (double)c->num_hidden_layers));   /* GPT-2's */
    ca_module *block, *attn, *mlp;
    ca_status s = ca_module_create("GPT2Block", NULL, NULL, NULL, &block);
    if (s == CA_OK) s = ca_module_add(h, name, block);
    if (s == CA_OK) b->module = block;
    if (s == CA_OK) s = add_ln(block, "ln_1", c, &b->ln_1);
    if (s == CA_OK) s = ca_module_create("GPT2Attention", NULL, NULL, NULL, &attn);
    if (s == CA_OK) s = ca_module_add(block, "attn", attn);
    if (s == CA_OK) s = add_conv1d(attn, "c_attn", e, 3 * e, std, &b->c_attn);
    if (s == CA_OK) s = add_conv1d(attn, "c_proj", e, e, proj, &b->c_proj);
    if (s == CA_OK) s = add_ln(block, "ln_2", c, &b->ln_2);
    if (s == CA_OK) s = ca_module_create("GPT2MLP", NULL, NULL, NULL, &mlp);
    if (s == CA_OK) s = ca_module_add(block, "mlp", mlp);
    if (s == CA_OK) s = add_conv1d(mlp, "c_fc", e, f, std, &b->c_fc);
    if (s == CA_OK) s = add_conv1d(mlp, "c_proj", f, e, proj, &b->mlp_proj);
    return s;
}

static ca_status build(ca_module *root, gpt2_model *g) {
    const ca_causal_lm_config *c = &g->cfg;
    ca_module *t, *h;
    ca_status s = ca_module_create("GPT2Model", NULL, NULL, NULL, &t);
    if (s == CA_OK) s = ca_module_add(root, "transformer", t);
    if (s == CA_OK) s = add_embedding(t, "wte", c->vocab_size, c->pad_token_id, c, &g->wte);
    if (s == CA_OK) s = add_embedding(t, "wpe", c->max_position_embeddings, -1, c, &g->wpe);
    if (s == CA_OK) s = ca_module_create("ModuleList", NULL, NULL, NULL, &h);
    if (s == CA_OK) s = ca_module_add(t, "h", h);
    for (int64_t i = 0; s == CA_OK && i < g->nlayers; i++) {
        g->blocks[i].model = g;
        g->blocks[i].index = i;
        s = build_block(h, i, c, &g->blocks[i]);
        if (s != CA_OK) ca_error_context("%s: transformer.h.%lld", TYPE, (long long)i);
    }
    if (s == CA_OK) s = add_ln(t, "ln_f", c, &g->ln_f);
    if (s != CA_OK || c->tie_word_embeddings) return s;
    s = ca_nn_add_linear(root, "lm_head", c->hidden_size, c->vocab_size, false, (float)c->initializer_range,
                         &g->lm_head);
    return s;
}

static ca_tensor *gpt2_module_forward(ca_module *self, ca_tensor *x, void *ctx);

/* ca_module's tp_prepare: transformers defines no base_model_tp_plan for GPT-2, and the plan splits Linear
 * layers, not Conv1D's [in, out] weights (examples/gpt splits its own GPT-2 with ca_tp_plan). */
static ca_status gpt2_tp_prepare(ca_module *self, int tp) {
    const ca_causal_lm_config *c = &((const gpt2_model *)self->ctx)->cfg;
    return ca_error(CA_ERR_UNSUPPORTED, "%s (config '%s'%s) at parallelism_config_tp_size %d: tensor parallelism of "
                    "GPT-2's Conv1D layers is not supported yet (transformers defines no base_model_tp_plan for "
                    "GPT-2)", TYPE, c->config_file[0] ? c->config_file : "of the program",
                    c->n_tp_plan ? ", with a base_model_tp_plan" : "", tp);
}

/* c is checked (ca_causal_lm_check_sizes) by the caller. */
ca_status ca_gpt2_lm_create(const ca_causal_lm_config *c, ca_module **out) {
    gpt2_model *g = calloc(1, sizeof *g);
    if (g) g->blocks = calloc((size_t)c->num_hidden_layers, sizeof *g->blocks);
    if (!g || !g->blocks) {
        if (g) gpt2_free(g);
        return ca_error(CA_ERR_NOMEM, "out of host memory creating %s", TYPE);
    }
    g->cfg = *c;
    g->nlayers = c->num_hidden_layers;
    ca_module *root;
    ca_status s = ca_module_create(TYPE, gpt2_module_forward, g, gpt2_free, &root);
    if (s != CA_OK) return s;
    s = build(root, g);
    if (s != CA_OK) {
        ca_module_destroy(root);
        return s;
    }
    root->tp_prepare = gpt2_tp_prepare;
    *out = root;
    return CA_OK;
}

const ca_causal_lm_config *ca_gpt2_lm_config(const ca_module *m) {
    return m && m->forward == gpt2_module_forward ? &((const gpt2_model *)m->ctx)->cfg : NULL;
}

/* ------------------------------------------------------------------ forward */

static ca_tensor *activation(const char *act, ca_tensor *x) {
    if (!strcmp(act, "gelu")) return ca_gelu_erf(x);
    if (!strcmp(act, "relu")) return ca_relu(x);
    if (!strcmp(act, "silu") || !strcmp(act, "swish")) return ca_silu(x);
    if (!strcmp(act, "tanh")) return ca_tanh(x);
    return ca_gelu(x);                     /* gelu_new, gelu_pytorch_tanh, gelu_fast: the tanh form */
}

/* [B, T, heads * d] (a slice of c_attn's [B, T, 3 heads d]) -> [B, heads, T, d], a view: the attention
 * reads q, k and v where c_attn holds them when the device's kernels read strides (attention_strides)
 * and writes their gradients straight into c_attn's (examples/gpt's way); elsewhere it makes them
 * contiguous itself. */
static ca_tensor *split_heads(ca_tensor *x, int64_t heads) {
    if (!x) return NULL;
    int64_t b = x->shape[0], t = x->shape[1], d = x->shape[2] / heads;
    return ca_transpose(ca_reshape(x, 4, (int64_t[]){b, t, heads, d}), 1, 2);
}

/* [B, heads, T, d] -> [B, T, heads d]: a view of an attention output written in [B, T, heads, d] memory
 * (strided kernels), a copy otherwise. */
static ca_tensor *merge_heads(ca_tensor *x) {
    if (!x) return NULL;
    int64_t b = x->shape[0], heads = x->shape[1], t = x->shape[2], d = x->shape[3];
    return ca_reshape(ca_contiguous(ca_transpose(x, 1, 2)), 3, (int64_t[]){b, t, heads * d});
}

static ca_tensor *block_forward(const gpt2_model *g, int64_t i, ca_tensor *h, ca_tensor *mask, bool training) {
    const ca_causal_lm_config *c = &g->cfg;
    const gpt2_block *b = &g->blocks[i];
    double pr = training ? c->resid_pdrop : 0, pa = training ? c->attention_dropout : 0;
    int64_t e = c->hidden_size, heads = c->num_attention_heads;
    ca_tensor *qkv = ca_module_forward(b->c_attn, ca_module_forward(b->ln_1, h));
    if (!qkv) return NULL;
    ca_tensor *q = split_heads(ca_narrow(qkv, 2, 0, e), heads);
    ca_tensor *k = split_heads(ca_narrow(qkv, 2, e, e), heads);
    ca_tensor *v = split_heads(ca_narrow(qkv, 2, 2 * e, e), heads);
    double scale = c->scale_attn_weights ? 1.0 / sqrt((double)(e / heads)) : 1.0;
    if (c->scale_attn_by_inverse_layer_idx) scale /= (double)(i + 1);
    ca_tensor *a = merge_heads(ca_scaled_dot_product_attention(q, k, v, mask, true, pa, scale));
    h = ca_add(h, ca_dropout(ca_module_forward(b->c_proj, a), pr, training));
    ca_tensor *m = activation(c->activation_function, ca_module_forward(b->c_fc, ca_module_forward(b->ln_2, h)));
    return ca_add(h, ca_dropout(ca_module_forward(b->mlp_proj, m), pr, training));
}

/* ctx: the block, which lives as long as the model (backward reruns this). */
static ca_status checkpointed_block(void *ctx, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out) {
    (void)n_out;
    const gpt2_block *b = ctx;
    out[0] = block_forward(b->model, b->index, in[0], n_in > 1 ? in[1] : NULL, b->module->training);
    return out[0] ? CA_OK : ca_last_status();
}

/* One block, checkpointed when its module is marked (ca_module_checkpoint_layers). */
static ca_tensor *run_block(const gpt2_model *g, int64_t i, ca_tensor *h, ca_tensor *mask, bool training) {
    const gpt2_block *b = &g->blocks[i];
    if (!ca_module_checkpointing(b->module) || !ca_grad_enabled()) return block_forward(g, i, h, mask, training);
    ca_tensor *in[2] = {h, mask}, *y = NULL;
    if (ca_checkpoint(checkpointed_block, (void *)b, mask ? 2 : 1, in, 1, &y) != CA_OK) {
        ca_error_context("checkpointed transformer.h.%lld", (long long)i);
        return NULL;
    }
    return y;
}

/* The rows of wpe: position_ids (each checked below n_positions), or 0..T-1. */
static ca_tensor *position_rows(const gpt2_model *g, ca_tensor *pos, int64_t len, ca_device *dev) {
    int64_t n = pos ? pos->numel : len, *h = malloc((size_t)n * sizeof *h);
    if (!h) {
        ca_error(CA_ERR_NOMEM, "out of host memory for position ids");
        return NULL;
    }
    ca_tensor *p = pos ? (pos->dtype == CA_I64 ? ca_contiguous(pos) : ca_cast(pos, CA_I64)) : NULL;
    ca_status s = pos ? (p ? ca_tensor_to_host(p, h, (size_t)n * sizeof *h) : ca_last_status()) : CA_OK;
    for (int64_t i = 0; s == CA_OK && i < n; i++) {
        if (!pos) h[i] = i;
        if (h[i] < 0 || h[i] >= g->cfg.max_position_embeddings)
            s = ca_error(CA_ERR_INVALID, "%s: position %lld is not below n_positions %lld (the sequence is %lld "
                         "tokens)", TYPE, (long long)h[i], (long long)g->cfg.max_position_embeddings, (long long)len);
    }
    ca_tensor *t = s == CA_OK ? (pos ? ca_from_host(dev, CA_I64, 2, pos->shape, h) : ca_from_host(dev, CA_I64, 1, &n, h))
                              : NULL;
    free(h);
    return t;
}

ca_status ca_gpt2_lm_run(ca_module *m, ca_tensor *ids, ca_tensor *mask, ca_tensor *pos, ca_tensor **logits) {
    gpt2_model *g = m->ctx;
    const ca_causal_lm_config *c = &g->cfg;
    int64_t bsz = ids->shape[0], len = ids->shape[1];
    bool training = m->training;
    ca_tensor *rows = position_rows(g, pos, len, ca_tdev(ids));
    if (!rows) return ca_last_status();
    ca_tensor *mask4 = NULL;
    if (mask) {
        mask4 = ca_reshape(mask, 4, (int64_t[]){bsz, 1, 1, len});
        if (mask4 && mask4->dtype != CA_U8) mask4 = ca_cast(mask4, CA_U8);
        if (!mask4) return ca_last_status();
    }
    ca_tensor *h = ca_add(ca_module_forward(g->wte, ca_contiguous(ids)), ca_module_forward(g->wpe, rows));
    h = ca_dropout(h, c->embd_pdrop, training);
    for (int64_t i = 0; i < g->nlayers && h; i++) h = run_block(g, i, h, mask4, training);
    h = ca_module_forward(g->ln_f, h);
    *logits = g->lm_head ? ca_module_forward(g->lm_head, h) : ca_linear(h, g->wte->params[0], NULL);
    return *logits ? CA_OK : ca_last_status();
}

/* x: [B, T] ids, or [B, 2, T] ids and attention mask (as the Llama family's). */
static ca_tensor *gpt2_module_forward(ca_module *self, ca_tensor *x, void *ctx) {
    (void)ctx;
    ca_tensor *ids = x, *mask = NULL, *logits = NULL;
    if (x && x->ndim == 3 && x->shape[1] == 2) {
        int64_t shape[2] = {x->shape[0], x->shape[2]};
        ids = ca_reshape(ca_narrow(x, 1, 0, 1), 2, shape);
        mask = ca_reshape(ca_narrow(x, 1, 1, 1), 2, shape);
        if (!ids || !mask) return NULL;
    }
    return ca_causal_lm_forward(self, ids, mask, NULL, &logits) == CA_OK ? logits : NULL;
}
