/* Tensor-parallel Linear (Megatron-LM's column and row split) over the device mesh's tp communicator, the
 * vocabulary-parallel Embedding (its rows split) and cross-entropy (the logits' columns split), and the plan
 * (ca_tp_plan) that makes a prepared model's layers so. Two autograd ops carry the communication: tp_copy
 * (identity forward, all-reduce of the gradient backward) in front of a colwise layer, tp_reduce
 * (all-reduce forward, identity backward) after a rowwise one, the embedding and the loss's sums. */
#include "accelerator/mesh_impl.h"
#include "nn/lora_impl.h"
#include "tensor/ops_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ the two ops */

static ca_status tp_copy_backward(ca_node *n, ca_tensor *g) {
    ca_comm *tp = n->ctx;
    ca_tensor *sum = ca_op_new_like(g);
    if (!sum) return ca_last_status();
    ca_status s = ca_comm_all_reduce(tp, ca_tptr(g), ca_tptr(sum), (size_t)g->numel, g->dtype, CA_OP_SUM, NULL);
    if (s != CA_OK) return ca_error_context("tensor-parallel Linear (colwise): the input's gradient");
    return ca_op_accumulate_owned(n->in[0], sum, 1.0f);
}
static const ca_node_vt tp_copy_vt = {"tp_copy", tp_copy_backward};

/* x, whose gradient is summed over the tp ranks in backward (each holds the part its columns give). */
static ca_tensor *tp_copy(ca_tensor *x, ca_comm *tp) {
    if (!x || !ca_needs_grad(1, &x)) return x;
    ca_tensor *v = ca_tensor_view(x, x->ndim, x->shape, x->stride, x->offset);
    ca_node *n = v ? ca_record(&tp_copy_vt, v, 1, &x) : NULL;
    if (!n) return NULL;
    n->ctx = tp;
    return v;
}

static ca_status tp_reduce_backward(ca_node *n, ca_tensor *g) {
    return ca_op_accumulate_owned(n->in[0], g, 1.0f);   /* every rank's part had the whole output's gradient */
}
static const ca_node_vt tp_reduce_vt = {"tp_reduce", tp_reduce_backward};

/* The sum over the tp ranks of y (each rank's part: a rowwise product, its vocabulary rows' lookups or
 * terms of the loss); `what` names it in an error. Backward is the identity: each rank's loss is the
 * whole one. */
static ca_tensor *tp_reduce_what(ca_tensor *y, ca_comm *tp, const char *what) {
    ca_tensor *out = ca_mesh_sum(tp, &y, what);
    if (out && ca_needs_grad(1, &y) && !ca_record(&tp_reduce_vt, out, 1, &y)) return NULL;
    return out;
}

static ca_tensor *tp_reduce(ca_tensor *y, ca_comm *tp) {
    return tp_reduce_what(y, tp, "tensor-parallel Linear (rowwise): the output");
}

/* ------------------------------------------------------------------ the layers' forwards */

static ca_tensor *no_comm(ca_module *self) {
    ca_error(CA_ERR_STATE, "a tensor-parallel %s holds one tp rank's part of its weight and runs only while the "
             "accelerator that split it exists", self->type);
    return NULL;
}

static ca_tensor *colwise_forward(ca_module *self, ca_tensor *x, void *ctx) {
    if (!ctx) return no_comm(self);
    return ca_linear(tp_copy(x, ctx), self->params[0], self->nparams > 1 ? self->params[1] : NULL);
}

/* Backward of tp_gather_last: this rank's columns of the whole output's gradient. */
static ca_status tp_gather_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0];
    int last = x->ndim - 1;
    ca_tensor *dx = ca_op_new_like(x);
    if (!dx) return ca_last_status();
    const char *from = (const char *)ca_tptr(g) + (size_t)(n->i[0] * x->shape[last] * g->stride[last]) * ca_dtype_size(g->dtype);
    ca_status s = CA_KCALL(ca_tdev(x), copy_strided, .dt = g->dtype, .ndim = x->ndim, .shape = x->shape, .x = from,
                           .x_stride = g->stride, .y = ca_tptr(dx), .y_stride = dx->stride);
    if (s != CA_OK) return ca_error_context("tensor-parallel Linear (colwise_gather_output): the output's gradient");
    return ca_op_accumulate_owned(x, dx, 1.0f);
}
static const ca_node_vt tp_gather_vt = {"tp_gather", tp_gather_backward};

/* y [..., n] of every tp rank side by side along the last dimension: [..., n tp], rank r's at columns
 * [r n, (r + 1) n) (an all-gather, then each rank's block copied into its columns). */
static ca_tensor *tp_gather_last(ca_tensor *y, ca_comm *tp) {
    if (!y) return NULL;
    if (!ca_tensor_is_contiguous(y)) y = ca_contiguous(y);
    int tpn = ca_comm_size(tp), last = y ? y->ndim - 1 : 0;
    int64_t all = y ? y->numel * tpn : 0, shape[CA_MAX_DIMS];
    ca_tensor *recv = y ? ca_tensor_keep(ca_tensor_new(ca_tdev(y), y->dtype, 1, &all)) : NULL;   /* freed below */
    if (!recv) return NULL;
    memcpy(shape, y->shape, sizeof(int64_t) * (size_t)y->ndim);
    shape[last] *= tpn;
    ca_tensor *out = ca_tensor_new(ca_tdev(y), y->dtype, y->ndim, shape);
    ca_status s = out ? ca_comm_all_gather(tp, ca_tptr(y), ca_tptr(recv), (size_t)y->numel, y->dtype, NULL)
                      : ca_last_status();
    size_t es = ca_dtype_size(y->dtype);
    for (int r = 0; s == CA_OK && r < tpn; r++)
        s = CA_KCALL(ca_tdev(y), copy_strided, .dt = y->dtype, .ndim = y->ndim, .shape = y->shape,
                     .x = (char *)ca_tptr(recv) + (size_t)(r * y->numel) * es, .x_stride = y->stride,
                     .y = (char *)ca_tptr(out) + (size_t)(r * y->shape[last]) * es, .y_stride = out->stride);
    ca_tensor_free(recv);
    if (s != CA_OK) {
        ca_error_context("tensor-parallel Linear (colwise_gather_output): gathering the output");
        return NULL;
    }
    if (ca_needs_grad(1, &y)) {
        ca_node *n = ca_record(&tp_gather_vt, out, 1, &y);
        if (!n) return NULL;
        n->i[0] = ca_comm_rank(tp);
    }
    return out;
}

/* transformers' colwise_gather_output (a decoder's lm_head): each rank computes its columns, then every
 * rank gets the whole output. */
static ca_tensor *colwise_gather_forward(ca_module *self, ca_tensor *x, void *ctx) {
    if (!ctx) return no_comm(self);
    return tp_gather_last(colwise_forward(self, x, ctx), ctx);
}

static ca_tensor *rowwise_forward(ca_module *self, ca_tensor *x, void *ctx) {
    if (!ctx) return no_comm(self);
    ca_tensor *y = tp_reduce(ca_linear(x, self->params[0], NULL), ctx);
    return y && self->nparams > 1 ? ca_add(y, self->params[1]) : y;
}

/* Under sequence parallelism (tp_seq.c): the input is this rank's tokens, all-gathered first (whose
 * backward sums the input's gradient over tp as tp_copy would); the output reduce-scattered to this rank's
 * tokens instead of all-reduced, the (whole) bias added to them, its gradient summed over tp. */
static ca_tensor *colwise_seq_forward(ca_module *self, ca_tensor *x, void *ctx) {
    if (!ctx) return no_comm(self);
    return ca_linear(ca_tp_seq_colwise_input(ctx, x), self->params[0], self->nparams > 1 ? self->params[1] : NULL);
}

static ca_tensor *rowwise_seq_forward(ca_module *self, ca_tensor *x, void *ctx) {
    if (!ctx) return no_comm(self);
    ca_tensor *y = ca_tp_seq_rowwise_output(ctx, ca_linear(x, self->params[0], NULL));
    return y && self->nparams > 1 ? ca_add(y, tp_copy(self->params[1], ctx)) : y;   /* the bias: this rank's tokens' sum */
}

/* A norm planned "sequence_parallel" runs on this rank's tokens: its weight (and bias) pass through
 * tp_copy, so that their gradients, each rank's from its tokens, are summed over tp. */
static ca_tensor *norm_seq_forward(ca_module *self, ca_tensor *x, void *ctx) {
    if (!ctx) return no_comm(self);
    ca_tensor *w = tp_copy(self->params[0], ctx);
    if (!strcmp(self->type, "RMSNorm")) return ca_rms_norm(x, w, self->p);
    return ca_layer_norm(x, w, self->nparams > 1 ? tp_copy(self->params[1], ctx) : NULL, self->p);
}

static bool is_colwise(ca_forward_fn f) { return f == colwise_forward || f == colwise_seq_forward; }
static bool is_rowwise(ca_forward_fn f) { return f == rowwise_forward || f == rowwise_seq_forward; }

/* ------------------------------------------------------------------ vocabulary parallelism */

/* Ids (an embedding's) or labels (the loss's) of the whole vocabulary, seen from the tp rank holding rows
 * [start, start + rows): made on the host, where the ids are read once (a GPU waits for them there). */
typedef struct vocab_ids {
    ca_tensor *local;     /* i64, the ids' shape: the row in this rank's slice, 0 for an id outside it */
    ca_tensor *outside;   /* u8, the ids' shape + [1]: 1 where the id is not in the slice (or is ignored) */
    ca_tensor *ignored;   /* u8, the ids' shape + [1]: 1 where the label is ignore_index */
    int64_t counted;      /* the ids not ignored */
    ca_tensor *count;     /* f32 [], on a lazy device (vocab_ids_graph): the ids not ignored, never read back */
} vocab_ids;

static ca_status vocab_ids_fill(const int64_t *h, int64_t n, int64_t start, int64_t rows, int64_t vocab,
                                const int64_t *ignore, int64_t *loc, uint8_t *out, uint8_t *ign, vocab_ids *v,
                                const char *what) {
    for (int64_t i = 0; i < n; i++) {
        int64_t id = h[i];
        ign[i] = ignore && id == *ignore;
        if (!ign[i] && (id < 0 || id >= vocab))
            return ca_error(CA_ERR_INVALID, "%s: id %lld (element %lld) is outside the vocabulary of %lld rows", what,
                            (long long)id, (long long)i, (long long)vocab);
        bool in = !ign[i] && id >= start && id < start + rows;
        loc[i] = in ? id - start : 0;
        out[i] = !in;
        v->counted += !ign[i];
    }
    return CA_OK;
}

/* 1 where the integer values of x are >= 0, else 0: 1 - relu(1 - relu(x + 1)), exact on integers in f32. */
static ca_tensor *nonneg(ca_tensor *x) {
    return ca_add_scalar(ca_neg(ca_relu(ca_add_scalar(ca_neg(ca_relu(ca_add_scalar(x, 1.0))), 1.0))), 1.0);
}

/* vocab_ids_make on a lazy device: the same tensors made by the graph, so that no read of the ids cuts the
 * step's graph (torch_xla's vocabulary-parallel masks are device comparisons too). The ids are compared in
 * f32 (exact below 2^24); whether one is in this rank's rows is looked up in a table of the vocabulary,
 * whose gather fails the graph for an id outside it, naming its position and value (the host path fails at
 * the call). An ignored label looks up row 0 and is masked out; the count stays on the device. */
static ca_status vocab_ids_graph(ca_tensor *ids, int64_t start, int64_t rows, int64_t vocab, const int64_t *ignore,
                                 const char *what, vocab_ids *v) {
    if (vocab > ((int64_t)1 << 24))
        return ca_error(CA_ERR_UNSUPPORTED, "%s: a vocabulary of %lld rows on the lazy device (distributed_type XLA) "
                        "is not supported yet: its ids are compared in f32, exact up to 2^24", what, (long long)vocab);
    int64_t n = ids->numel, shape[CA_MAX_DIMS + 1];
    float *tab = malloc(sizeof(float) * (size_t)vocab);
    if (!tab) return ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int64_t i = 0; i < vocab; i++) tab[i] = i >= start && i < start + rows;
    ca_tensor *in_rows = ca_from_host(ca_tensor_device(ids), CA_F32, CA_SHAPE(1, vocab), tab);
    free(tab);
    ca_tensor *f = ca_reshape(ca_cast(ids, CA_F32), CA_SHAPE(1, n)), *keep = NULL;
    if (ignore) {   /* 1 where the label is not ignore_index: not (f - ignore >= 0 and ignore - f >= 0) */
        ca_tensor *ign = ca_mul(nonneg(ca_add_scalar(f, -(double)*ignore)), nonneg(ca_add_scalar(ca_neg(f), (double)*ignore)));
        keep = ca_add_scalar(ca_neg(ign), 1.0);
        f = ca_mul(f, keep);
        v->count = ca_sum(keep);
        memcpy(shape, ids->shape, sizeof(int64_t) * (size_t)ids->ndim);
        shape[ids->ndim] = 1;
        v->ignored = ca_cast(ca_reshape(ign, ids->ndim + 1, shape), CA_U8);
    }
    ca_tensor *in = ca_gather_dim(in_rows, 1, ca_cast(f, CA_I64));
    if (keep) in = ca_mul(in, keep);
    memcpy(shape, ids->shape, sizeof(int64_t) * (size_t)ids->ndim);
    shape[ids->ndim] = 1;
    v->local = ca_reshape(ca_cast(ca_mul(ca_add_scalar(f, -(double)start), in), CA_I64), ids->ndim, ids->shape);
    v->outside = ca_reshape(ca_cast(ca_add_scalar(ca_neg(in), 1.0), CA_U8), ids->ndim + 1, shape);
    if (!v->local || !v->outside || (ignore && (!v->ignored || !v->count))) return ca_last_status();
    return CA_OK;
}

static ca_status vocab_ids_make(ca_tensor *ids, int64_t start, int64_t rows, int64_t vocab, const int64_t *ignore,
                                const char *what, vocab_ids *v) {
    *v = (vocab_ids){0};
    if (ids->dtype != CA_I64 && ids->dtype != CA_I32)
        return ca_error(CA_ERR_INVALID, "%s: ids must be i32 or i64", what);
    /* context parallelism's mean needs the count on the host (ca_cp_mean) */
    if (ca_device_is_lazy(ca_tensor_device(ids)) && !(ignore && ca_cp_active()))
        return vocab_ids_graph(ids, start, rows, vocab, ignore, what, v);
    int64_t n = ids->numel, shape[CA_MAX_DIMS + 1];
    ca_tensor *c = ca_contiguous(ids->dtype == CA_I64 ? ids : ca_cast(ids, CA_I64));
    int64_t *h = malloc(sizeof(int64_t) * (size_t)(2 * n + 1));
    uint8_t *m = malloc((size_t)(2 * n + 1));
    ca_status s = !c ? ca_last_status() : h && m ? ca_tensor_to_host(c, h, sizeof(int64_t) * (size_t)n)
                                                 : ca_error(CA_ERR_NOMEM, "out of host memory");
    if (s == CA_OK) s = vocab_ids_fill(h, n, start, rows, vocab, ignore, h + n, m, m + n, v, what);
    memcpy(shape, ids->shape, sizeof(int64_t) * (size_t)ids->ndim);
    shape[ids->ndim] = 1;
    ca_device *dev = ca_tensor_device(ids);
    if (s == CA_OK) {
        v->local = ca_from_host(dev, CA_I64, ids->ndim, shape, h + n);
        v->outside = ca_from_host(dev, CA_U8, ids->ndim + 1, shape, m);
        v->ignored = ca_from_host(dev, CA_U8, ids->ndim + 1, shape, m + n);
        if (!v->local || !v->outside || !v->ignored) s = ca_last_status();
    }
    free(h);
    free(m);
    return s;
}

/* Megatron's VocabParallelEmbedding: the ids in this rank's rows looked up, zeros for the others (whose
 * gradient is zero: the row it lands in is unchanged), summed over tp. */
static ca_tensor *vocab_embedding_forward(ca_module *self, ca_tensor *ids, void *ctx) {
    if (!ctx) return no_comm(self);
    if (!ids) return NULL;
    ca_tensor *w = self->params[0];
    int64_t rows = w->shape[0];
    vocab_ids v;
    if (vocab_ids_make(ids, ca_comm_rank(ctx) * rows, rows, rows * ca_comm_size(ctx), NULL,
                       "tensor-parallel Embedding (rowwise)", &v) != CA_OK)
        return NULL;
    ca_tensor *y = ca_masked_fill(ca_embedding(v.local, w), v.outside, 0.0);
    return tp_reduce_what(y, ctx, "tensor-parallel Embedding (rowwise): the lookups");
}

/* Whether the plan split m so that its output columns are a vocabulary slice: a colwise Linear, or a
 * rowwise Embedding used as a tied output layer (ca_embedding_attend). */
static bool vocab_split(const ca_module *m) {
    return is_colwise(m->forward) || m->forward == vocab_embedding_forward;
}

ca_tensor *ca_embedding_attend(ca_module *embedding, ca_tensor *x) {
    if (!embedding || embedding->nparams < 1) {
        ca_error(CA_ERR_INVALID, "ca_embedding_attend: an Embedding module is required");
        return NULL;
    }
    if (!x) return NULL;   /* a failed input: its error stays the one reported */
    ca_tensor *w = embedding->params[0];
    if (embedding->forward != vocab_embedding_forward) return ca_linear(x, w, NULL);
    if (!embedding->ctx) return no_comm(embedding);
    return ca_linear(tp_copy(x, embedding->ctx), w, NULL);
}

/* The all-reduce MAX over tp of x (no gradient: the shift of a log-sum-exp cancels in it). */
static ca_tensor *tp_max(ca_tensor *x, ca_comm *tp) {
    x = ca_contiguous(x);
    ca_tensor *out = x ? ca_op_new_like(x) : NULL;
    if (!out) return NULL;
    if (ca_comm_all_reduce(tp, ca_tptr(x), ca_tptr(out), (size_t)x->numel, x->dtype, CA_OP_MAX, NULL) != CA_OK) {
        ca_error_context("vocabulary-parallel cross-entropy: the rows' maxima");
        return NULL;
    }
    return out;
}

/* Megatron's vocab_parallel_cross_entropy on logits [N, V/tp] (this rank's columns): with m the rows'
 * maximum over all ranks, loss = log(sum over tp of sum(exp(z))) - z[label], z = logits - m; the target's
 * term comes from the rank holding its column. Mean over the labels that are not -100. */
static ca_tensor *vocab_cross_entropy(ca_comm *tp, ca_tensor *logits, ca_tensor *labels) {
    int64_t cols = logits->shape[logits->ndim - 1], n = logits->numel / cols, ignore = -100;
    vocab_ids v;
    ca_tensor *flat = ca_reshape(labels, CA_SHAPE(n));
    if (!flat || vocab_ids_make(flat, ca_comm_rank(tp) * cols, cols, cols * ca_comm_size(tp), &ignore,
                                "ca_tp_cross_entropy: labels", &v) != CA_OK)
        return NULL;
    ca_tensor *z = ca_reshape(logits->dtype == CA_F32 ? logits : ca_cast(logits, CA_F32), CA_SHAPE(n, cols));
    z = ca_sub(z, tp_max(ca_max_dim(ca_detach(z), 1, true), tp));
    ca_tensor *sum = tp_reduce_what(ca_sum_dim(ca_exp(z), 1, true), tp, "vocabulary-parallel cross-entropy: the sums");
    ca_tensor *t = ca_masked_fill(ca_gather_dim(z, 1, ca_reshape(v.local, CA_SHAPE(n, 1))), v.outside, 0.0);
    t = tp_reduce_what(t, tp, "vocabulary-parallel cross-entropy: the labels' logits");
    ca_tensor *per = ca_masked_fill(ca_sub(ca_log(sum), t), v.ignored, 0.0);
    if (v.count) return ca_div(ca_sum(per), v.count);   /* the lazy device's count, on it */
    return ca_cp_mean(ca_sum(per), v.counted);   /* over the cp ranks' labels too */
}

ca_tensor *ca_tp_cross_entropy(const ca_module *head, ca_tensor *logits, ca_tensor *labels) {
    if (!head || !logits || !labels) {
        if (!head) ca_error(CA_ERR_INVALID, "ca_tp_cross_entropy: the output layer is NULL");
        return NULL;
    }
    if (!vocab_split(head)) return ca_cp_active() ? ca_cp_cross_entropy(logits, labels) : ca_cross_entropy(logits, labels);
    if (!head->ctx) return no_comm((ca_module *)head);
    int64_t rows = head->params[0]->shape[0], cols = logits->ndim ? logits->shape[logits->ndim - 1] : 0;
    if (cols != rows || logits->numel / (cols ? cols : 1) != labels->numel) {
        ca_error(CA_ERR_INVALID, "ca_tp_cross_entropy: logits of %lld columns and %lld labels for a tensor-parallel "
                 "%s holding %lld rows of the vocabulary on tp rank %d (the logits must be its output)",
                 (long long)cols, (long long)labels->numel, head->type, (long long)rows, ca_comm_rank(head->ctx));
        return NULL;
    }
    return vocab_cross_entropy(head->ctx, logits, labels);
}

/* ------------------------------------------------------------------ LoRA adapters on split layers */

/* A colwise base: lora_A (whole) gives every rank the same r-wide product, lora_B (this rank's output rows)
 * its part of the output; the product's gradient is all-reduced over tp, so that lora_A's gradient and the
 * input's through it are whole (each rank's lora_B rows contribute a part). */
static ca_tensor *lora_mix_copy(ca_tensor *h, void *tp) {
    if (!tp) {
        ca_error(CA_ERR_STATE, "a LoRA adapter on a tensor-parallel layer runs only while the accelerator that "
                 "split it exists");
        return NULL;
    }
    return tp_copy(h, tp);
}

/* A rowwise base: lora_A holds this rank's input columns, so its product is a partial sum; summed over tp
 * before lora_B (whole, r columns: a small all-reduce), which then gets its whole gradient on every rank. */
static ca_tensor *lora_mix_reduce(ca_tensor *h, void *tp) {
    if (!tp) return lora_mix_copy(h, tp);
    return tp_reduce_what(h, tp, "LoRA adapter on a tensor-parallel Linear (rowwise): lora_A's products");
}

/* Under sequence parallelism a colwise base's input is this rank's tokens: the r-wide products are
 * all-gathered along the sequence (backward: reduce-scattered, summing the ranks' parts as lora_mix_copy
 * does), and lora_A, whole, sees this rank's tokens only (tp_whole: its gradient summed over tp). */
static ca_tensor *lora_mix_seq_gather(ca_tensor *h, void *tp) {
    if (!tp) return lora_mix_copy(h, tp);
    return ca_tp_seq_colwise_input(tp, h);
}

/* ... and a rowwise base's output is this rank's tokens: lora_A's partial products reduce-scattered along
 * the sequence (backward: all-gathered), so that lora_B, whole, sees this rank's tokens (tp_whole). */
static ca_tensor *lora_mix_seq_scatter(ca_tensor *h, void *tp) {
    if (!tp) return lora_mix_copy(h, tp);
    return ca_tp_seq_rowwise_output(tp, h);
}

static ca_tensor *lora_whole(ca_tensor *w, void *tp) {
    return tp_copy(w, tp);
}

/* The adapter's tensor-parallel hooks for its base's split forward f (none: plain, unsplit). */
static void lora_hooks(ca_lora_layer *lo, ca_forward_fn f, bool plain) {
    bool seq = f == colwise_seq_forward || f == rowwise_seq_forward;
    lo->tp_mix = plain ? NULL
                 : seq ? (is_rowwise(f) ? lora_mix_seq_scatter : lora_mix_seq_gather)
                       : (is_rowwise(f) ? lora_mix_reduce : lora_mix_copy);
    lo->tp_whole = !plain && seq ? lora_whole : NULL;
    lo->tp_whole_b = is_rowwise(f);
}

/* Where the plan puts a split layer's forward and its communicator: the module's own, or under a LoRA
 * adapter its base layer's (the adapter's forward calls it, then adds its own product). */
static void tp_slot(ca_module *l, ca_forward_fn **fwd, void ***ctx) {
    ca_lora_layer *lo = ca_lora_layer_of(l);
    *fwd = lo ? &lo->base_forward : &l->forward;
    *ctx = lo ? &lo->base_ctx : &l->ctx;
}

/* ------------------------------------------------------------------ the plan */

typedef struct tp_walk {
    ca_accelerator *acc;
    ca_module *root;
    int matched;
} tp_walk;

/* Whether the plan can split l: a Linear either way, an Embedding rowwise (its rows: torch's
 * RowwiseParallel on an nn.Embedding), without padding_idx (its forward's context holds that). */
static ca_status tp_splittable(const ca_module *l, const char *name, int style, bool emb) {
    const ca_lora_layer *lo = ca_lora_layer_of(l);   /* PEFT's lora.Linear: its base layer is split */
    const char *type = lo ? lo->base_type : l->type;
    if (style == CA_TP_SEQUENCE)
        return !lo && (!strcmp(type, "LayerNorm") || !strcmp(type, "RMSNorm")) && l->nparams >= 1
                   ? CA_OK
                   : ca_error(CA_ERR_UNSUPPORTED, "ca_tp_plan: \"%s\" is a %s; \"sequence_parallel\" applies to "
                              "LayerNorm and RMSNorm layers only", name, type);
    if (!emb && (strcmp(type, "Linear") != 0 || l->nparams < 1 || l->params[0]->ndim != 2))
        return ca_error(CA_ERR_UNSUPPORTED, "ca_tp_plan: \"%s\" is a %s%s; caccel splits Linear and Embedding layers "
                        "only (not yet norms)", name, type, lo ? " under a LoRA adapter" : "");
    if (emb && style != CA_TP_ROWWISE)
        return ca_error(CA_ERR_UNSUPPORTED, "ca_tp_plan: Embedding \"%s\" can be split \"rowwise\" only (its "
                        "vocabulary rows); colwise (its embedding dimension) is not supported yet", name);
    if (emb && (l->ctx || l->nparams != 1 || l->params[0]->ndim != 2))
        return ca_error(CA_ERR_UNSUPPORTED, "ca_tp_plan: Embedding \"%s\" has a padding_idx; a rowwise Embedding "
                        "with one is not supported yet", name);
    return CA_OK;
}

/* A colwise layer's place among the tp ranks while its split forward runs (ca_tp_heads reads it: which
 * attention heads its output holds); tp NULL: none (not split, or its plain forward). */
static void tp_mark(ca_module *l, ca_comm *tp) {
    l->tp_rank = tp ? ca_comm_rank(tp) : 0;
    l->tp_size = tp ? ca_comm_size(tp) : 0;
}

static ca_status tp_record(tp_walk *w, ca_module *l, ca_forward_fn f);

/* ca_tensor_narrow_, except for a parameter whose values a deferred load reads from a file: that reads
 * this rank's slice alone (its rows, or its column block row by row), never the whole tensor. */
static ca_status tp_narrow(ca_tensor *t, int dim, int parts, int64_t start, int64_t len) {
    if (ca_meta_from_file(t)) return ca_meta_materialize_slice_(t, &(ca_slice){dim, parts, start, len});
    return ca_tensor_narrow_(t, dim, parts, start, len);
}

/* Splits Linear or Embedding module l (named `name`) by style over the tp ranks, each of its `parts`
 * blocks alike; a norm planned "sequence_parallel" stays whole. */
static ca_status tp_split(tp_walk *w, ca_module *l, const char *name, int style, int parts) {
    ca_mesh *m = w->acc->mesh;
    int tp = m->shape.size[CA_MESH_TP], r = m->coord[CA_MESH_TP];
    bool emb = !strcmp(l->type, "Embedding");
    ca_status s = tp_splittable(l, name, style, emb);
    if (s != CA_OK) return s;
    if (style == CA_TP_SEQUENCE) return tp_record(w, l, norm_seq_forward);   /* whole, on this rank's tokens */
    ca_tensor *wt = l->params[0];
    bool col = style != CA_TP_ROWWISE;   /* colwise, colwise_gather_output */
    int dim = col || emb ? 0 : 1;   /* Linear [out, in]: colwise splits out, rowwise in;
                                                         * Embedding [vocab, dim]: rowwise splits the vocabulary */
    int64_t n = wt->shape[dim];
    if (emb && n % tp != 0)
        return ca_error(CA_ERR_CONFIG, "ca_tp_plan: rowwise Embedding \"%s\" has a vocabulary of %lld rows, which "
                        "parallelism_config_tp_size %d does not divide (pad the vocabulary to a multiple of it)", name,
                        (long long)n, tp);
    if (n % parts != 0 || (n / parts) % tp != 0)
        return ca_error(CA_ERR_CONFIG, "ca_tp_plan: %s Linear \"%s\" has %lld %s features%s, which "
                        "parallelism_config_tp_size %d does not divide", col ? "colwise" : "rowwise",
                        name, (long long)(n / parts), dim ? "input" : "output", parts > 1 ? " per fused block" : "", tp);
    int64_t part = n / parts / tp;
    s = tp_narrow(wt, dim, parts, r * part, part);
    if (s == CA_OK && l->nparams > 1 && col)
        s = tp_narrow(l->params[1], 0, parts, r * part, part);
    ca_lora_layer *lo = ca_lora_layer_of(l);   /* lora_B [out, r] by its rows, lora_A [r, in] by its columns */
    if (s == CA_OK && lo)
        s = col ? tp_narrow(lo->b->params[0], 0, parts, r * part, part)
                                   : tp_narrow(lo->a->params[0], 1, parts, r * part, part);
    if (s != CA_OK) return ca_error_context("splitting \"%s\" over the tp ranks (rank %d)", name, w->acc->rank);
    return tp_record(w, l, emb ? vocab_embedding_forward : style == CA_TP_COLWISE_GATHER ? colwise_gather_forward
                           : col ? (m->seq ? colwise_seq_forward : colwise_forward)
                                 : (m->seq ? rowwise_seq_forward : rowwise_forward));
}

/* l, split, gets forward f over the tp communicator (its plain one kept for ca_summon_full_params). */
static ca_status tp_record(tp_walk *w, ca_module *l, ca_forward_fn f) {
    ca_mesh *m = w->acc->mesh;
    ca_module **nt = realloc(m->tp, (size_t)(m->ntp + 1) * sizeof *nt);
    if (nt) m->tp = nt;
    ca_forward_fn *np = nt ? realloc(m->tp_plain, (size_t)(m->ntp + 1) * sizeof *np) : NULL;
    if (np) m->tp_plain = np;
    ca_forward_fn *nf = np ? realloc(m->tp_fwd, (size_t)(m->ntp + 1) * sizeof *nf) : NULL;
    if (nf) m->tp_fwd = nf;
    void **nc = nf ? realloc(m->tp_plain_ctx, (size_t)(m->ntp + 1) * sizeof *nc) : NULL;
    if (!nc) return ca_error(CA_ERR_NOMEM, "out of host memory");
    m->tp_plain_ctx = nc;
    ca_forward_fn *fwd;
    void **ctx;
    tp_slot(l, &fwd, &ctx);
    m->tp_plain[m->ntp] = *fwd;
    m->tp_plain_ctx[m->ntp] = *ctx;
    *fwd = f;
    m->tp_fwd[m->ntp] = *fwd;
    m->tp[m->ntp++] = l;
    *ctx = m->comm[CA_MESH_TP];
    tp_mark(l, is_colwise(f) ? m->comm[CA_MESH_TP] : NULL);
    l->tp_seq = m->seq ? ca_tp_seq_ops(m) : NULL;   /* ca_tp_sequence_split finds its ops there */
    ca_lora_layer *lo = ca_lora_layer_of(l);
    if (lo) {
        lora_hooks(lo, f, false);
        lo->tp_ctx = m->comm[CA_MESH_TP];
    }
    w->matched++;
    return CA_OK;
}

/* Every module under mod (named prefix) that the plan names is split. */
static ca_status tp_visit(tp_walk *w, ca_module *mod, const char *prefix) {
    for (int i = 0; i < mod->nchildren; i++) {
        char name[512];
        snprintf(name, sizeof name, "%s%s%s", prefix, prefix[0] ? "." : "", mod->child_names[i]);
        int parts = 1, style = ca_tp_plan_match(w->root, name, &parts);
        ca_status s = style ? tp_split(w, mod->children[i], name, style, parts) : tp_visit(w, mod->children[i], name);
        if (s != CA_OK) return s;
    }
    return CA_OK;
}

ca_status ca_tp_apply(ca_accelerator *acc, ca_module *m) {
    if (!acc->mesh || acc->mesh->shape.size[CA_MESH_TP] <= 1) return CA_OK;   /* context parallelism alone */
    const char *tpo = ca_config_origin(acc->cfg, "parallelism_config.parallelism_config_tp_size");
    int tp = acc->mesh->shape.size[CA_MESH_TP];
    if (m->tp_prepare && m->tp_prepare(m, tp) != CA_OK)   /* the model's own plan (base_model_tp_plan) */
        return ca_error_context("ca_prepare: parallelism_config_tp_size %d (from %s)", tp, tpo);
    if (!m->ntp)
        return ca_error(CA_ERR_UNSUPPORTED, "ca_prepare: parallelism_config_tp_size %d (from %s) needs a tensor-parallel "
                        "plan on the model (ca_tp_plan(model, \"fc1\", \"colwise\"), ...); a model without one is "
                        "not split automatically yet", tp, tpo);
    for (int i = 0; i < m->ntp; i++) acc->mesh->seq |= m->tp_style[i] == CA_TP_SEQUENCE;
    tp_walk w = {.acc = acc, .root = m};
    ca_status s = tp_visit(&w, m, "");
    if (s == CA_OK && !w.matched)
        s = ca_error(CA_ERR_CONFIG, "ca_prepare: the model's tensor-parallel plan (%d entr%s, the first \"%s\") names no "
                     "module of it", m->ntp, m->ntp > 1 ? "ies" : "y", m->tp_pattern[0]);
    if (s == CA_OK) ca_module_zero_grad(m);
    return s;
}

void ca_tp_release(ca_accelerator *acc) {
    ca_mesh *m = acc->mesh;
    if (!m) return;
    for (int i = 0; acc->model && i < m->ntp; i++) {
        ca_forward_fn *fwd;
        void **ctx;
        tp_slot(m->tp[i], &fwd, &ctx);
        *ctx = NULL;
        tp_mark(m->tp[i], NULL);
        m->tp[i]->tp_seq = NULL;
        ca_lora_layer *lo = ca_lora_layer_of(m->tp[i]);
        if (lo) {
            lora_hooks(lo, NULL, true);
            lo->tp_ctx = NULL;
        }
    }
    free(m->tp);
    free(m->tp_plain);
    free(m->tp_fwd);
    free(m->tp_plain_ctx);
    m->tp = NULL;
    m->tp_plain = m->tp_fwd = NULL;
    m->tp_plain_ctx = NULL;
    m->ntp = 0;
}

void ca_tp_set_plain(ca_accelerator *acc, bool plain) {
    ca_mesh *m = acc->mesh;
    for (int i = 0; m && i < m->ntp; i++) {
        ca_forward_fn *fwd;
        void **ctx;
        tp_slot(m->tp[i], &fwd, &ctx);
        *fwd = plain ? m->tp_plain[i] : m->tp_fwd[i];
        *ctx = plain ? m->tp_plain_ctx[i] : m->comm[CA_MESH_TP];
        tp_mark(m->tp[i], !plain && is_colwise(m->tp_fwd[i]) ? m->comm[CA_MESH_TP] : NULL);
        m->tp[i]->tp_seq = !plain && m->seq ? ca_tp_seq_ops(m) : NULL;
        ca_lora_layer *lo = ca_lora_layer_of(m->tp[i]);
        if (lo) lora_hooks(lo, m->tp_fwd[i], plain);
    }
}

bool ca_tp_reads_slices(const ca_accelerator *acc) {
    return acc && acc->mesh && acc->mesh->shape.size[CA_MESH_TP] > 1;
}

bool ca_tp_is_split(const ca_accelerator *acc, const ca_tensor *t) {
    return ca_tp_split_dim(acc, t) >= 0;
}

int ca_tp_split_dim(const ca_accelerator *acc, const ca_tensor *t) {
    for (int i = 0; acc->mesh && i < acc->mesh->ntp; i++) {
        const ca_module *l = acc->mesh->tp[i];   /* a rowwise layer's bias is whole */
        ca_forward_fn f = acc->mesh->tp_fwd[i];
        const ca_lora_layer *lo = ca_lora_layer_of(l);
        if (f == norm_seq_forward) continue;   /* whole (its gradient summed over tp) */
        bool col = is_colwise(f) || f == colwise_gather_forward;   /* split alike */
        if (col && l->nparams > 1 && l->params[1] == t) return 0;
        if (l->params[0] == t) return is_rowwise(f) ? 1 : 0;   /* an Embedding: its rows */
        if (lo && col && lo->b->params[0] == t) return 0;   /* lora_B's output rows */
        if (lo && is_rowwise(f) && lo->a->params[0] == t) return 1;   /* lora_A's input columns */
    }
    return -1;
}
