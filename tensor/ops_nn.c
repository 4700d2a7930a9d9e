/* Neural-network functions: softmax, log_softmax, cross_entropy, mse_loss, dropout, layer_norm, rms_norm, embedding,
 * rope (rotary position embedding), swiglu. */
#include "tensor/ops_impl.h"

#include <string.h>

static int64_t last_dim(const ca_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }

/* ------------------------------------------------------------------ softmax */

static ca_status softmax_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0], *y = n->out;
    float beta;
    ca_tensor *dx = ca_grad_target(x, &beta);
    if (!dx) return x->requires_grad ? ca_last_status() : CA_OK;
    int64_t cols = last_dim(x), rows = cols ? x->numel / cols : 0;
    ca_status s = CA_KCALL(ca_tdev(x), softmax_backward, .log = n->i[0] != 0, .dt = x->dtype, .rows = rows,
                           .cols = cols, .y = ca_tptr(y), .dy = ca_tptr(g), .dx = ca_tptr(dx), .beta = beta);
    if (s == CA_OK) ca_grad_written(x);
    return s;
}
static const ca_node_vt softmax_vt = {"softmax", softmax_backward};
static const ca_node_vt log_softmax_vt = {"log_softmax", softmax_backward};

static ca_tensor *softmax(ca_tensor *x, bool log) {
    x = ca_autocast_f32(x);
    CA_OP_NULLCHECK1(x);
    if (!ca_op_check_float(log ? "log_softmax" : "softmax", x)) return NULL;
    x = ca_contiguous(x);
    ca_tensor *y = x ? ca_op_new_like(x) : NULL;
    if (!y) return NULL;
    int64_t cols = last_dim(x), rows = cols ? x->numel / cols : 0;
    if (rows && CA_KCALL(ca_tdev(x), softmax, .log = log, .dt = x->dtype, .rows = rows, .cols = cols,
                         .x = ca_tptr(x), .y = ca_tptr(y)) != CA_OK)
        return NULL;
    if (ca_needs_grad(1, &x)) {
        ca_node *n = ca_record(log ? &log_softmax_vt : &softmax_vt, y, 1, &x);
        if (!n) return NULL;
        n->i[0] = log;
    }
    return y;
}

ca_tensor *ca_softmax(ca_tensor *x) { return softmax(x, false); }
ca_tensor *ca_log_softmax(ca_tensor *x) { return softmax(x, true); }

/* ------------------------------------------------------------------ cross entropy */

/* saved: labels, lse [rows], count (scalar; 1 for reduction=sum) */
static ca_status ce_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *logits = n->in[0], *labels = n->saved[0], *lse = n->saved[1], *count = n->saved[2];
    float beta;
    ca_tensor *dl = ca_grad_target(logits, &beta);
    if (!dl) return logits->requires_grad ? ca_last_status() : CA_OK;
    int64_t cols = last_dim(logits), rows = cols ? logits->numel / cols : 0;
    ca_status s = CA_KCALL(ca_tdev(logits), cross_entropy_backward, .dt = logits->dtype, .rows = rows,
                           .cols = cols, .logits = ca_tptr(logits), .lse = ca_tptr(lse),
                           .label_dt = labels->dtype, .labels = ca_tptr(labels), .ignore_index = n->i[0],
                           .dloss = ca_tptr(g), .count = ca_tptr(count), .dlogits = ca_tptr(dl), .beta = beta);
    if (s == CA_OK) ca_grad_written(logits);
    return s;
}
static const ca_node_vt ce_vt = {"cross_entropy", ce_backward};

ca_tensor *ca_cross_entropy_ex(ca_tensor *logits, ca_tensor *labels, const ca_cross_entropy_opts *o) {
    logits = ca_autocast_f32(logits);
    CA_OP_NULLCHECK2(logits, labels);
    if (!ca_op_check_float("cross_entropy", logits) || !ca_op_check_same_device("cross_entropy", logits, labels))
        return NULL;
    int64_t cols = last_dim(logits), rows = cols ? logits->numel / cols : 0;
    char a[128], b[128];
    if (logits->ndim < 1 || (labels->dtype != CA_I32 && labels->dtype != CA_I64) || labels->numel != rows) {
        ca_error(CA_ERR_INVALID, "cross_entropy: logits %s %s and labels %s %s: expected logits [..., C] and "
                 "integer labels [...] (i32 or i64)", ca_shape_str(logits->ndim, logits->shape, a, sizeof a),
                 ca_dtype_name(logits->dtype), ca_shape_str(labels->ndim, labels->shape, b, sizeof b),
                 ca_dtype_name(labels->dtype));
        return NULL;
    }
    int64_t ignore = o && o->has_ignore_index ? o->ignore_index : -100;
    bool sum = o && o->reduction == CA_REDUCTION_SUM;
    ca_device *dev = ca_tdev(logits);
    logits = ca_contiguous(logits);
    labels = ca_contiguous(labels);
    ca_tensor *loss = ca_tensor_new(dev, CA_F32, 0, NULL);
    ca_tensor *lse = ca_tensor_new(dev, CA_F32, 1, &rows);
    ca_tensor *count = ca_tensor_new(dev, CA_F32, 0, NULL);
    if (!logits || !labels || !loss || !lse || !count) return NULL;
    if (CA_KCALL(dev, cross_entropy, .dt = logits->dtype, .rows = rows, .cols = cols,
                 .logits = ca_tptr(logits), .label_dt = labels->dtype, .labels = ca_tptr(labels),
                 .ignore_index = ignore, .loss = ca_tptr(loss), .lse = ca_tptr(lse), .count = ca_tptr(count)) != CA_OK)
        return NULL;
    ca_tensor *grad_count = count;
    if (sum) {     /* sum = mean * count; its gradient is not divided by count */
        ca_bcast_args bc = {.ndim = 1, .shape = {1}};
        if (CA_KCALL(dev, binary, .op = CA_BINARY_MUL, .dt = CA_F32, .shape = bc, .a = ca_tptr(loss),
                     .b = ca_tptr(count), .y = ca_tptr(loss)) != CA_OK)
            return NULL;
        grad_count = ca_op_scalar(dev, 1.0f);
        if (!grad_count) return NULL;
    }
    if (ca_needs_grad(1, &logits)) {
        ca_node *n = ca_record(&ce_vt, loss, 1, &logits);
        if (!n) return NULL;
        n->saved[0] = labels; n->saved[1] = lse; n->saved[2] = grad_count;
        n->owned_saved = 6u;   /* labels are the caller's */
        n->i[0] = ignore;
    }
    return loss;
}

ca_tensor *ca_cross_entropy(ca_tensor *logits, ca_tensor *labels) {
    return ca_cross_entropy_ex(logits, labels, NULL);
}

ca_tensor *ca_mse_loss(ca_tensor *a, ca_tensor *b) {
    return ca_mean(ca_square(ca_sub(a, b)));
}

/* ------------------------------------------------------------------ dropout */

static ca_status dropout_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0], *mask = n->saved[0];
    float beta;
    ca_tensor *dx = ca_grad_target(x, &beta);
    if (!dx) return x->requires_grad ? ca_last_status() : CA_OK;
    ca_status s = CA_KCALL(ca_tdev(x), dropout_backward, .dt = x->dtype, .n = x->numel, .p = (float)n->f[0],
                           .mask = ca_tptr(mask), .dy = ca_tptr(g), .dx = ca_tptr(dx), .beta = beta);
    if (s == CA_OK) ca_grad_written(x);
    return s;
}
static const ca_node_vt dropout_vt = {"dropout", dropout_backward};

/* Checks x, p and the part's place (ca_dropout_part); false with the error set. */
static bool dropout_check(const ca_tensor *x, double p, int dim, int64_t start, int64_t whole) {
    if (p < 0 || p >= 1) {
        ca_error(CA_ERR_INVALID, "dropout probability must be in [0, 1), got %g", p);
        return false;
    }
    int64_t size = x->ndim ? (dim >= 0 && dim < x->ndim ? x->shape[dim] : 0) : 1;   /* a scalar: [0, 1) of 1 */
    if (dim < 0 || dim >= (x->ndim ? x->ndim : 1) || start < 0 || start + size > whole) {
        ca_error(CA_ERR_INVALID, "dropout of a part: [%lld, %lld) of dimension %d (of %d) is not within %lld",
                 (long long)start, (long long)(start + size), dim, x->ndim, (long long)whole);
        return false;
    }
    return true;
}

/* The whole tensor's stream is reserved; each of x's `outer` runs of `run` elements starts at element e of
 * the whole, whose word is counter off + e / 4, lane e % 4 (backend.h): a run starting off a lane 0 would
 * need the kernel to start mid-counter, which it does not. */
ca_tensor *ca_dropout_part(ca_tensor *x, double p, bool training, int dim, int64_t start, int64_t whole) {
    CA_OP_NULLCHECK1(x);
    if (!dropout_check(x, p, dim, start, whole)) return NULL;
    if (!training || p == 0) return x;
    if (!ca_op_check_float("dropout", x)) return NULL;
    int64_t inner = 1, outer = 1, run;
    for (int d = 0; d < x->ndim; d++) *(d < dim ? &outer : &inner) *= d == dim ? 1 : x->shape[d];
    run = (x->ndim ? x->shape[dim] : 1) * inner;
    if ((start * inner) % 4 != 0 || (outer > 1 && (whole * inner) % 4 != 0)) {
        ca_error(CA_ERR_UNSUPPORTED, "dropout of a part: rows of %lld of %lld elements starting at element %lld do not "
                 "start on a generator word (a multiple of 4 elements): not yet", (long long)run,
                 (long long)(whole * inner), (long long)(start * inner));
        return NULL;
    }
    x = ca_contiguous(x);
    ca_tensor *y = x ? ca_op_new_like(x) : NULL;
    ca_tensor *mask = y ? ca_tensor_new(ca_tdev(x), CA_U8, x->ndim, x->shape) : NULL;
    if (!mask) return NULL;
    uint64_t seed, unused;
    ca_rng_get_state(&seed, &unused);
    uint64_t off = ca_rng_reserve(ca_rng_counters(CA_RNG_UNIFORM, outer * whole * inner));
    size_t es = ca_dtype_size(x->dtype);
    for (int64_t o = 0; o < outer && run; o++) {
        int64_t at = o * run, e = (o * whole + start) * inner;   /* in x, in the whole */
        if (CA_KCALL(ca_tdev(x), dropout, .dt = x->dtype, .n = run, .p = (float)p, .seed = seed,
                     .offset = off + (uint64_t)(e / 4), .x = (const char *)ca_tptr(x) + (size_t)at * es,
                     .y = (char *)ca_tptr(y) + (size_t)at * es, .mask = (uint8_t *)ca_tptr(mask) + at) != CA_OK)
            return NULL;
    }
    if (ca_needs_grad(1, &x)) {
        ca_node *n = ca_record(&dropout_vt, y, 1, &x);
        if (!n) return NULL;
        n->saved[0] = mask;
        n->owned_saved = 1u;
        n->f[0] = p;
    }
    return y;
}

ca_tensor *ca_dropout(ca_tensor *x, double p, bool training) {
    CA_OP_NULLCHECK1(x);
    return ca_dropout_part(x, p, training, 0, 0, x->ndim ? x->shape[0] : 1);   /* the whole: one run */
}

/* ------------------------------------------------------------------ layer norm */

static ca_status layer_norm_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0], *w = n->nin > 1 ? n->in[1] : NULL, *b = n->nin > 2 ? n->in[2] : NULL;
    ca_tensor *mean = n->saved[0], *rstd = n->saved[1];
    ca_device *dev = ca_tdev(x);
    int64_t cols = last_dim(x), rows = cols ? x->numel / cols : 0;
    float bx = 0, bw = 0, bb = 0;
    ca_tensor *dx = ca_grad_target(x, &bx);
    if (!dx && x->requires_grad) return ca_last_status();
    if (!dx && !(dx = ca_op_new_like(x))) return ca_last_status();   /* kernel always writes dx */
    ca_tensor *dw = w ? ca_grad_target(w, &bw) : NULL, *db = b ? ca_grad_target(b, &bb) : NULL;
    if ((w && w->requires_grad && !dw) || (b && b->requires_grad && !db)) return ca_last_status();
    /* the kernel takes one accumulate flag for both; give it scratch when they differ */
    bool acc = dw ? bw != 0 : bb != 0;
    ca_tensor *dw_k = dw, *db_k = db;
    if (dw && db && (bw != 0) != (bb != 0)) {
        if (!(db_k = ca_op_new_like(b))) return ca_last_status();
    }
    ca_status s = CA_KCALL(dev, layer_norm_backward, .dt = x->dtype, .rows = rows, .cols = cols,
                           .x = ca_tptr(x), .gamma = w ? ca_tptr(w) : NULL, .mean = ca_tptr(mean),
                           .rstd = ca_tptr(rstd), .dy = ca_tptr(g), .dx = ca_tptr(dx), .beta = bx,
                           .dgamma = dw_k ? ca_tptr(dw_k) : NULL, .dbeta_ = db_k ? ca_tptr(db_k) : NULL,
                           .accumulate_params = acc);
    if (s == CA_OK && db_k != db)
        s = CA_KCALL(dev, axpby, .dt = db->dtype, .n = db->numel, .alpha = 1.0f, .x = ca_tptr(db_k),
                     .beta = bb, .y = ca_tptr(db));
    if (s != CA_OK) return s;
    if (x->requires_grad) ca_grad_written(x);
    if (dw) ca_grad_written(w);
    if (db) ca_grad_written(b);
    return CA_OK;
}
static const ca_node_vt layer_norm_vt = {"layer_norm", layer_norm_backward};

ca_tensor *ca_layer_norm(ca_tensor *x, ca_tensor *w, ca_tensor *b, double eps) {
    x = ca_autocast_f32(x);
    if (x && w && x->dtype != w->dtype) x = ca_cast(x, w->dtype);   /* normalise in the weights' dtype */
    CA_OP_NULLCHECK1(x);
    if (!ca_op_check_float("layer_norm", x)) return NULL;
    int64_t cols = last_dim(x), rows = cols ? x->numel / cols : 0;
    if ((w && (w->numel != cols || !ca_op_check_same_device("layer_norm", x, w))) ||
        (b && (b->numel != cols || !ca_op_check_same_device("layer_norm", x, b)))) {
        if (ca_last_status() == CA_OK || (w && w->numel != cols) || (b && b->numel != cols))
            ca_error(CA_ERR_INVALID, "layer_norm: weight/bias must have %lld elements (the last dimension)",
                     (long long)cols);
        return NULL;
    }
    x = ca_contiguous(x);
    ca_tensor *y = x ? ca_op_new_like(x) : NULL;
    ca_tensor *mean = y ? ca_tensor_new(ca_tdev(x), CA_F32, 1, &rows) : NULL;
    ca_tensor *rstd = mean ? ca_tensor_new(ca_tdev(x), CA_F32, 1, &rows) : NULL;
    if (!rstd) return NULL;
    if (rows && CA_KCALL(ca_tdev(x), layer_norm, .dt = x->dtype, .rows = rows, .cols = cols, .x = ca_tptr(x),
                         .gamma = w ? ca_tptr(w) : NULL, .beta_ = b ? ca_tptr(b) : NULL, .eps = (float)eps,
                         .y = ca_tptr(y), .mean = ca_tptr(mean), .rstd = ca_tptr(rstd)) != CA_OK)
        return NULL;
    ca_tensor *in[3] = {x, w, b};
    int nin = b ? 3 : w ? 2 : 1;
    if (!w && b) {
        ca_error(CA_ERR_INVALID, "layer_norm: a bias without a weight is not supported");
        return NULL;
    }
    if (ca_needs_grad(nin, in)) {
        ca_node *n = ca_record(&layer_norm_vt, y, nin, in);
        if (!n) return NULL;
        n->saved[0] = mean;
        n->saved[1] = rstd;
        n->owned_saved = 3u;
    }
    return y;
}

/* ------------------------------------------------------------------ embedding */

/* i[0]: padding_idx (-1: none). The padding row's gradient is saved before the
 * scatter-add and put back after it, so lookups of it contribute nothing. */
static ca_status embedding_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *table = n->in[0], *idx = n->saved[0];
    int64_t pad = n->i[0], dim = table->shape[1];
    float beta;
    ca_tensor *dt = ca_grad_target(table, &beta);
    if (!dt) return table->requires_grad ? ca_last_status() : CA_OK;
    ca_device *dev = ca_tdev(table);
    ca_status s = CA_OK;
    void *pad_row = pad >= 0 ? (char *)ca_tptr(dt) + (size_t)(pad * dim) * ca_dtype_size(dt->dtype) : NULL;
    ca_tensor *keep = pad_row && beta != 0.0f ? ca_tensor_new(dev, dt->dtype, 1, &dim) : NULL;
    if (pad_row && beta != 0.0f && !keep) return ca_last_status();
    if (beta == 0.0f) s = CA_KCALL(dev, fill, .dt = dt->dtype, .n = dt->numel, .value = 0.0, .y = ca_tptr(dt));
    if (s == CA_OK && keep) s = CA_KCALL(dev, axpby, .dt = dt->dtype, .n = dim, .alpha = 1.0f, .x = pad_row,
                                         .beta = 0.0f, .y = ca_tptr(keep));
    if (s == CA_OK)
        s = CA_KCALL(dev, embedding_backward, .dt = dt->dtype, .n = idx->numel, .rows = table->shape[0],
                     .dim = dim, .idx_dt = idx->dtype, .idx = ca_tptr(idx), .dy = ca_tptr(g),
                     .dtable = ca_tptr(dt));
    if (s == CA_OK && pad_row)
        s = keep ? CA_KCALL(dev, axpby, .dt = dt->dtype, .n = dim, .alpha = 1.0f, .x = ca_tptr(keep),
                            .beta = 0.0f, .y = pad_row)
                 : CA_KCALL(dev, fill, .dt = dt->dtype, .n = dim, .value = 0.0, .y = pad_row);
    if (s == CA_OK) ca_grad_written(table);
    return s;
}
static const ca_node_vt embedding_vt = {"embedding", embedding_backward};

ca_tensor *ca_embedding(ca_tensor *idx, ca_tensor *table) { return ca_embedding_ex(idx, table, -1); }

ca_tensor *ca_embedding_ex(ca_tensor *idx, ca_tensor *table, int64_t padding_idx) {
    CA_OP_NULLCHECK2(idx, table);
    if (!ca_op_check_float("embedding", table) || !ca_op_check_same_device("embedding", idx, table)) return NULL;
    if (table->ndim != 2 || (idx->dtype != CA_I32 && idx->dtype != CA_I64) || idx->ndim >= CA_MAX_DIMS) {
        ca_error(CA_ERR_INVALID, "embedding: expected integer indices and a [V, D] table");
        return NULL;
    }
    if (padding_idx < -1 || padding_idx >= table->shape[0]) {
        ca_error(CA_ERR_INVALID, "embedding: padding_idx %lld is outside the table's %lld rows (-1: none)",
                 (long long)padding_idx, (long long)table->shape[0]);
        return NULL;
    }
    idx = ca_contiguous(idx);
    table = ca_contiguous(table);
    if (!idx || !table) return NULL;
    int64_t shape[CA_MAX_DIMS];
    memcpy(shape, idx->shape, (size_t)idx->ndim * sizeof *shape);
    shape[idx->ndim] = table->shape[1];
    ca_tensor *y = ca_tensor_new(ca_tdev(table), table->dtype, idx->ndim + 1, shape);
    if (!y) return NULL;
    if (idx->numel && CA_KCALL(ca_tdev(table), embedding, .dt = table->dtype, .n = idx->numel,
                               .rows = table->shape[0], .dim = table->shape[1], .table = ca_tptr(table),
                               .idx_dt = idx->dtype, .idx = ca_tptr(idx), .y = ca_tptr(y)) != CA_OK)
        return NULL;
    if (ca_needs_grad(1, &table)) {
        ca_node *n = ca_record(&embedding_vt, y, 1, &table);
        if (!n) return NULL;
        n->saved[0] = idx;
        n->i[0] = padding_idx;
    }
    return y;
}

/* ------------------------------------------------------------------ rms norm */

static ca_status rms_norm_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0], *w = n->nin > 1 ? n->in[1] : NULL, *rstd = n->saved[0];
    int64_t cols = last_dim(x), rows = cols ? x->numel / cols : 0;
    float bx = 0, bw = 0;
    ca_tensor *dx = ca_grad_target(x, &bx);
    if (!dx && x->requires_grad) return ca_last_status();
    if (!dx && !(dx = ca_op_new_like(x))) return ca_last_status();   /* kernel always writes dx */
    ca_tensor *dw = w ? ca_grad_target(w, &bw) : NULL;
    if (w && w->requires_grad && !dw) return ca_last_status();
    ca_status s = CA_KCALL(ca_tdev(x), rms_norm_backward, .dt = x->dtype, .rows = rows, .cols = cols,
                           .x = ca_tptr(x), .gamma = w ? ca_tptr(w) : NULL, .rstd = ca_tptr(rstd), .dy = ca_tptr(g),
                           .dx = ca_tptr(dx), .beta = bx, .dgamma = dw ? ca_tptr(dw) : NULL,
                           .accumulate_params = bw != 0);
    if (s != CA_OK) return s;
    if (x->requires_grad) ca_grad_written(x);
    if (dw) ca_grad_written(w);
    return CA_OK;
}
static const ca_node_vt rms_norm_vt = {"rms_norm", rms_norm_backward};

/* One kernel each way (rms_norm, rms_norm_backward); tests/test_transformer_ops.c checks it against
 * the same op made of elementwise ops and a mean. */
ca_tensor *ca_rms_norm(ca_tensor *x, ca_tensor *w, double eps) {
    x = ca_autocast_f32(x);
    if (x && w && x->dtype != w->dtype) x = ca_cast(x, w->dtype);
    CA_OP_NULLCHECK1(x);
    if (!ca_op_check_float("rms_norm", x)) return NULL;
    int64_t cols = last_dim(x), rows = cols ? x->numel / cols : 0;
    if (w && (w->numel != cols || !ca_op_check_same_device("rms_norm", x, w))) {
        if (w->numel != cols)
            ca_error(CA_ERR_INVALID, "rms_norm: weight must have %lld elements (the last dimension), has %lld",
                     (long long)cols, (long long)w->numel);
        return NULL;
    }
    x = ca_contiguous(x);
    ca_tensor *y = x ? ca_op_new_like(x) : NULL;
    ca_tensor *rstd = y ? ca_tensor_new(ca_tdev(x), CA_F32, 1, &rows) : NULL;
    if (!rstd) return NULL;
    if (rows && CA_KCALL(ca_tdev(x), rms_norm, .dt = x->dtype, .rows = rows, .cols = cols, .x = ca_tptr(x),
                         .gamma = w ? ca_tptr(w) : NULL, .eps = (float)eps, .y = ca_tptr(y),
                         .rstd = ca_tptr(rstd)) != CA_OK)
        return NULL;
    ca_tensor *in[2] = {x, w};
    int nin = w ? 2 : 1;
    if (ca_needs_grad(nin, in)) {
        ca_node *n = ca_record(&rms_norm_vt, y, nin, in);
        if (!n) return NULL;
        n->saved[0] = rstd;
        n->owned_saved = 1u;
    }
    return y;
}

/* ------------------------------------------------------------------ rope */

/* The rope kernel over x's [B, H, T, D] with the tables cs/sn ([T, rot/2] or [tb, T, rot/2], f32):
 * dst = beta dst + (src turned by the angles, or by minus them when inverse). */
static ca_status rope_call(const ca_tensor *x, const ca_tensor *cs, const ca_tensor *sn, const void *src, void *dst,
                           bool inverse, float beta) {
    return CA_KCALL(ca_tdev(x), rope, .dt = x->dtype, .batch = x->shape[0], .heads = x->shape[1],
                    .seq = x->shape[2], .dim = x->shape[3], .rot = 2 * last_dim(cs),
                    .table_batch = cs->ndim == 3 ? cs->shape[0] : 1, .x = src, .cos = ca_tptr(cs),
                    .sin = ca_tptr(sn), .inverse = inverse, .y = dst, .beta = beta);
}

/* The rotation is orthogonal: its backward turns dy by minus the angles (the same kernel, inverse). */
static ca_status rope_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0];
    float beta;
    ca_tensor *dx = ca_grad_target(x, &beta);
    if (!dx) return x->requires_grad ? ca_last_status() : CA_OK;
    ca_status s = rope_call(x, n->saved[0], n->saved[1], ca_tptr(g), ca_tptr(dx), true, beta);
    if (s == CA_OK) ca_grad_written(x);
    return s;
}
static const ca_node_vt rope_vt = {"rope", rope_backward};

/* NULL (error recorded) unless cos and sin are tables for x: the same shape, [T, R] or [B or 1, T, R]
 * with T x's sequence, 2R <= x's head dim, f32 after the cast, on x's device, no gradient wanted. */
static bool rope_tables_ok(const ca_tensor *x, ca_tensor *cs, ca_tensor *sn) {
    char a[64], b[64];
    if (!ca_op_check_same_device("rope", x, cs) || !ca_op_check_same_device("rope", x, sn)) return false;
    if (cs->requires_grad || sn->requires_grad) {
        ca_error(CA_ERR_UNSUPPORTED, "rope: the cos/sin tables get no gradient; pass them detached");
        return false;
    }
    bool same = cs->ndim == sn->ndim && memcmp(cs->shape, sn->shape, (size_t)cs->ndim * sizeof *cs->shape) == 0;
    int64_t tb = cs->ndim == 3 ? cs->shape[0] : 1, r = last_dim(cs);
    if (!same || (cs->ndim != 2 && cs->ndim != 3) || cs->shape[cs->ndim - 2] != x->shape[2] ||
        (tb != 1 && tb != x->shape[0]) || r < 1 || 2 * r > x->shape[3]) {
        ca_error(CA_ERR_INVALID, "rope: cos %s and sin %s must both be [T, R] or [B or 1, T, R] with T = %lld and "
                 "2R <= the head dim %lld (x [B, H, T, D] = %s)", ca_shape_str(cs->ndim, cs->shape, a, sizeof a),
                 ca_shape_str(sn->ndim, sn->shape, b, sizeof b), (long long)x->shape[2], (long long)x->shape[3],
                 ca_shape_str(x->ndim, x->shape, (char[64]){0}, 64));
        return false;
    }
    return true;
}

/* One kernel each way (rope, with `inverse` for the backward); the tables are inputs the caller makes
 * (ca_rope_tables) and reuses across layers. */
ca_tensor *ca_rope(ca_tensor *x, ca_tensor *cos, ca_tensor *sin) {
    CA_OP_NULLCHECK2(x, cos);
    CA_OP_NULLCHECK1(sin);
    if (!ca_op_check_float("rope", x) || !ca_op_check_float("rope", cos) || !ca_op_check_float("rope", sin))
        return NULL;
    if (x->ndim != 4) {
        char a[64];
        ca_error(CA_ERR_INVALID, "rope: x must be [batch, heads, seq, head_dim], is %s",
                 ca_shape_str(x->ndim, x->shape, a, sizeof a));
        return NULL;
    }
    if (!rope_tables_ok(x, cos, sin)) return NULL;
    if (cos->dtype != CA_F32) cos = ca_cast(cos, CA_F32);
    if (sin->dtype != CA_F32) sin = ca_cast(sin, CA_F32);
    x = ca_contiguous(x);
    cos = cos ? ca_contiguous(cos) : NULL;
    sin = sin ? ca_contiguous(sin) : NULL;
    ca_tensor *y = x && cos && sin ? ca_op_new_like(x) : NULL;
    if (!y) return NULL;
    if (x->numel && rope_call(x, cos, sin, ca_tptr(x), ca_tptr(y), false, 0.0f) != CA_OK) return NULL;
    if (ca_needs_grad(1, &x)) {
        ca_node *n = ca_record(&rope_vt, y, 1, &x);
        if (!n) return NULL;
        n->saved[0] = cos;
        n->saved[1] = sin;
    }
    return y;
}

/* ------------------------------------------------------------------ swiglu */

/* Both gradients in one kernel. swiglu(x, x) (one tensor twice): dup goes to a scratch tensor and is
 * added after, since the kernel's two outputs must not overlap. */
static ca_status swiglu_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *gt = n->in[0], *ut = n->in[1];
    bool same = gt == ut;
    float bg = 0, bu = 0;
    ca_tensor *dg = ca_grad_target(gt, &bg);
    if (!dg && gt->requires_grad) return ca_last_status();
    ca_tensor *du = !ut->requires_grad ? NULL : same ? ca_op_new_like(ut) : ca_grad_target(ut, &bu);
    if (!du && ut->requires_grad) return ca_last_status();
    ca_status s = CA_KCALL(ca_tdev(gt), swiglu_backward, .dt = gt->dtype, .n = gt->numel, .gate = ca_tptr(gt),
                           .up = ca_tptr(ut), .dy = ca_tptr(g), .dgate = dg ? ca_tptr(dg) : NULL,
                           .dup = du ? ca_tptr(du) : NULL, .beta_gate = bg, .beta_up = bu);
    if (s != CA_OK) return s;
    if (dg) ca_grad_written(gt);
    if (du && same) return ca_op_accumulate(ut, du, 1.0f);
    if (du) ca_grad_written(ut);
    return CA_OK;
}
static const ca_node_vt swiglu_vt = {"swiglu", swiglu_backward};

/* silu(gate) * up in one kernel each way; tests/test_ops.c checks it against ca_mul(ca_silu(gate), up). */
ca_tensor *ca_swiglu(ca_tensor *gate, ca_tensor *up) {
    CA_OP_NULLCHECK2(gate, up);
    if (!ca_op_check_float("swiglu", gate) || !ca_op_check_float("swiglu", up) ||
        !ca_op_check_same_device("swiglu", gate, up))
        return NULL;
    if (gate->ndim != up->ndim || memcmp(gate->shape, up->shape, (size_t)gate->ndim * sizeof *gate->shape) != 0) {
        char a[64], b[64];
        ca_error(CA_ERR_INVALID, "swiglu: gate %s and up %s must have the same shape",
                 ca_shape_str(gate->ndim, gate->shape, a, sizeof a), ca_shape_str(up->ndim, up->shape, b, sizeof b));
        return NULL;
    }
    if (gate->dtype != up->dtype) {   /* mixed float dtypes promote to f32, as the binary ops do */
        gate = ca_cast(gate, CA_F32);
        up = ca_cast(up, CA_F32);
        CA_OP_NULLCHECK2(gate, up);
    }
    gate = ca_contiguous(gate);
    up = gate && up ? ca_contiguous(up) : NULL;
    ca_tensor *y = up ? ca_op_new_like(gate) : NULL;
    if (!y) return NULL;
    if (y->numel && CA_KCALL(ca_tdev(gate), swiglu, .dt = gate->dtype, .n = gate->numel, .gate = ca_tptr(gate),
                             .up = ca_tptr(up), .y = ca_tptr(y)) != CA_OK)
        return NULL;
    ca_tensor *in[2] = {gate, up};
    if (ca_needs_grad(2, in)) {
        if (!ca_record(&swiglu_vt, y, 2, in)) return NULL;
    }
    return y;
}
