/* Matrix products: matmul (2-D, and batched with broadcasting) and linear, with GEMMs that write gradients in place. */
#include "tensor/ops_impl.h"

#include <string.h>

/* How a 2-D operand (last two dims of t) reaches GEMM without a copy:
 * row-major with leading dim ld, or its transpose. False: needs a copy. */
static bool gemm_layout(const ca_tensor *t, bool *trans, int64_t *ld) {
    int r = t->ndim - 2, c = t->ndim - 1;
    int64_t rows = t->shape[r], cols = t->shape[c];
    if (t->stride[c] == 1 && (t->stride[r] >= cols || rows == 1)) {
        *trans = false;
        *ld = rows == 1 ? (cols ? cols : 1) : t->stride[r];
        return true;
    }
    if (t->stride[r] == 1 && (t->stride[c] >= rows || cols == 1)) {
        *trans = true;
        *ld = cols == 1 ? (rows ? rows : 1) : t->stride[c];
        return true;
    }
    return false;
}

/* A tensor GEMM can read (t itself, or a contiguous copy). */
static ca_tensor *gemm_ready(ca_tensor *t, bool *trans, int64_t *ld) {
    if (gemm_layout(t, trans, ld)) return t;
    ca_tensor *c = ca_contiguous(t);
    if (c) gemm_layout(c, trans, ld);
    return c;
}

static ca_status gemm(ca_device *dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const ca_tensor *a, int64_t lda, int64_t sa, const ca_tensor *b, int64_t ldb, int64_t sb,
                      float beta, ca_tensor *c, int64_t ldc, int64_t sc, int64_t batch) {
    ca_gemm_args g = {
        .trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .alpha = alpha, .beta = beta,
        .a_dtype = a->dtype, .b_dtype = b->dtype, .c_dtype = c->dtype,
        .a = ca_tptr(a), .lda = lda, .stride_a = sa,
        .b = ca_tptr(b), .ldb = ldb, .stride_b = sb,
        .c = ca_tptr(c), .ldc = ldc, .stride_c = sc, .batch = batch,
    };
    if (m == 0 || n == 0) return CA_OK;
    if (k == 0) return beta == 0.0f ? CA_KCALL(dev, fill, .dt = c->dtype, .n = c->numel, .value = 0.0,
                                               .y = ca_tptr(c)) : CA_OK;
    return CA_KCALL_ARGS(dev, gemm, &g);
}

/* ------------------------------------------------------------------ matmul */

static ca_status matmul_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *a = n->saved[0], *b = n->saved[1];
    ca_tensor *ain = n->in[0], *bin = n->in[1];
    bool ta = n->i[0], tb = n->i[1];
    int64_t lda = n->i[2], ldb = n->i[3], m = n->i[4], k = n->i[5], nn = n->i[6], batch = n->i[7];
    int64_t sa = batch > 1 ? a->stride[0] : 0, sb = batch > 1 ? b->stride[0] : 0;
    ca_device *dev = ca_tdev(g);
    ca_status s = CA_OK;
    float beta;
    /* dA[m,k] = g[m,n] op(B)^T ; when A was read transposed, dA^T = op(B) g^T */
    ca_tensor *da = ca_grad_target(ain, &beta);
    if (da) {
        s = gemm(dev, false, !tb, m, k, nn, 1.0f, g, nn, m * nn, b, ldb, sb, beta, da, k, m * k, batch);
        if (s == CA_OK) ca_grad_written(ain);
    } else if (ain->requires_grad) return ca_last_status();
    ca_tensor *db = s == CA_OK ? ca_grad_target(bin, &beta) : NULL;
    if (db) {   /* dB[k,n] = op(A)^T g */
        s = gemm(dev, !ta, false, k, nn, m, 1.0f, a, lda, sa, g, nn, m * nn, beta, db, nn, k * nn, batch);
        if (s == CA_OK) ca_grad_written(bin);
    } else if (s == CA_OK && bin->requires_grad) return ca_last_status();
    return s;
}
static const ca_node_vt matmul_vt = {"matmul", matmul_backward};

/* 2-D x 2-D, or 3-D x 3-D with one batch size. */
static ca_tensor *matmul_23(ca_tensor *a, ca_tensor *b) {
    ca_dtype lp = ca_autocast_dtype();
    if (lp != CA_F32 && ca_dtype_is_float(a->dtype) && ca_dtype_is_float(b->dtype)) {
        a = ca_cast(a, lp);       /* autocast: both operands in low precision */
        b = ca_cast(b, lp);
        CA_OP_NULLCHECK2(a, b);
    }
    if (!ca_op_check_float("matmul", a) || !ca_op_check_float("matmul", b) ||
        !ca_op_check_same_device("matmul", a, b))
        return NULL;
    char x[128], y[128];
    bool ok = (a->ndim == 2 && b->ndim == 2) || (a->ndim == 3 && b->ndim == 3 && a->shape[0] == b->shape[0]);
    if (!ok || a->shape[a->ndim - 1] != b->shape[b->ndim - 2] || a->dtype != b->dtype) {
        ca_error(CA_ERR_INVALID, "matmul: cannot multiply %s %s by %s %s", ca_shape_str(a->ndim, a->shape, x, sizeof x),
                 ca_dtype_name(a->dtype), ca_shape_str(b->ndim, b->shape, y, sizeof y), ca_dtype_name(b->dtype));
        return NULL;
    }
    int64_t batch = a->ndim == 3 ? a->shape[0] : 1;
    /* batched operands need a plain batch stride: make them contiguous */
    if (batch > 1) { a = ca_contiguous(a); b = ca_contiguous(b); if (!a || !b) return NULL; }
    bool ta, tb;
    int64_t lda, ldb;
    ca_tensor *ar = gemm_ready(a, &ta, &lda), *br = gemm_ready(b, &tb, &ldb);
    if (!ar || !br) return NULL;
    int64_t m = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1], n = b->shape[b->ndim - 1];
    int64_t shape[3] = {batch, m, n};
    ca_tensor *c = ca_tensor_new(ca_tdev(a), a->dtype, a->ndim, a->ndim == 3 ? shape : shape + 1);
    if (!c) return NULL;
    int64_t sa = batch > 1 ? ar->stride[0] : 0, sb = batch > 1 ? br->stride[0] : 0;
    if (gemm(ca_tdev(a), ta, tb, m, n, k, 1.0f, ar, lda, sa, br, ldb, sb, 0.0f, c, n, m * n, batch) != CA_OK)
        return NULL;
    ca_tensor *in[2] = {ar, br};
    if (ca_needs_grad(2, in)) {
        ca_node *nd = ca_record(&matmul_vt, c, 2, in);
        if (!nd) return NULL;
        nd->saved[0] = ar; nd->saved[1] = br;
        nd->i[0] = ta; nd->i[1] = tb; nd->i[2] = lda; nd->i[3] = ldb;
        nd->i[4] = m; nd->i[5] = k; nd->i[6] = n; nd->i[7] = batch;
    }
    return c;
}

/* ------------------------------------------------------------------ linear */

/* x [M, in] (row-major, ld = in), W [out, in], b [out]: y = x W^T + b. */
static ca_status linear_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0], *w = n->in[1], *b = n->nin > 2 ? n->in[2] : NULL;
    int64_t M = n->i[0], in = n->i[1], out = n->i[2];
    ca_device *dev = ca_tdev(g);
    ca_status s = CA_OK;
    float beta;
    ca_tensor *dx = ca_grad_target(x, &beta);          /* dX = g W */
    if (dx) {
        s = gemm(dev, false, false, M, in, out, 1.0f, g, out, 0, w, in, 0, beta, dx, in, 0, 1);
        if (s == CA_OK) ca_grad_written(x);
    } else if (x->requires_grad) return ca_last_status();
    ca_tensor *dw = s == CA_OK ? ca_grad_target(w, &beta) : NULL;   /* dW = g^T X, straight into .grad */
    if (dw) {
        s = gemm(dev, true, false, out, in, M, 1.0f, g, out, 0, x, in, 0, beta, dw, in, 0, 1);
        if (s == CA_OK) ca_grad_written(w);
    } else if (s == CA_OK && w->requires_grad) return ca_last_status();
    ca_tensor *db = s == CA_OK && b ? ca_grad_target(b, &beta) : NULL;  /* db = column sums of g */
    if (db) {
        s = CA_KCALL(dev, reduce, .op = CA_OP_SUM, .dt = g->dtype, .outer = 1, .len = M, .inner = out,
                     .x = ca_tptr(g), .y = ca_tptr(db), .beta = beta);
        if (s == CA_OK) ca_grad_written(b);
    } else if (s == CA_OK && b && b->requires_grad) return ca_last_status();
    return s;
}
static const ca_node_vt linear_vt = {"linear", linear_backward};

/* ------------------------------------------------------------------ linear under autocast */

/* in: x_low, w (f32 master), b (f32 master); saved: w_low. The weight gradient is
 * one GEMM of low-precision operands written as f32 straight into w's .grad, so
 * gradients reach the optimizer in f32 without a low-precision round trip. */
static ca_status linear_amp_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0], *w = n->in[1], *b = n->nin > 2 ? n->in[2] : NULL, *wl = n->saved[0];
    int64_t M = n->i[0], in = n->i[1], out = n->i[2];
    ca_device *dev = ca_tdev(g);
    ca_status s = CA_OK;
    float beta;
    ca_tensor *dx = ca_grad_target(x, &beta);
    if (dx) {
        s = gemm(dev, false, false, M, in, out, 1.0f, g, out, 0, wl, in, 0, beta, dx, in, 0, 1);
        if (s == CA_OK) ca_grad_written(x);
    } else if (x->requires_grad) return ca_last_status();
    ca_tensor *dw = s == CA_OK ? ca_grad_target(w, &beta) : NULL;
    if (dw) {
        s = gemm(dev, true, false, out, in, M, 1.0f, g, out, 0, x, in, 0, beta, dw, in, 0, 1);
        if (s == CA_OK) ca_grad_written(w);
    } else if (s == CA_OK && w->requires_grad) return ca_last_status();
    ca_tensor *db = s == CA_OK && b ? ca_grad_target(b, &beta) : NULL;
    if (db) {   /* column sums in f32 */
        ca_tensor *g32 = ca_tensor_new(dev, CA_F32, g->ndim, g->shape);
        s = g32 ? CA_KCALL(dev, cast, .src_dt = g->dtype, .x = ca_tptr(g), .dst_dt = CA_F32,
                           .y = ca_tptr(g32), .n = g->numel, .alpha = 1.0f) : ca_last_status();
        if (s == CA_OK) s = CA_KCALL(dev, reduce, .op = CA_OP_SUM, .dt = CA_F32, .outer = 1, .len = M,
                                     .inner = out, .x = ca_tptr(g32), .y = ca_tptr(db), .beta = beta);
        if (s == CA_OK) ca_grad_written(b);
    } else if (s == CA_OK && b && b->requires_grad) return ca_last_status();
    return s;
}
static const ca_node_vt linear_amp_vt = {"linear (autocast)", linear_amp_backward};

static ca_tensor *linear_amp(ca_tensor *x, ca_tensor *w, ca_tensor *b, ca_dtype lp, int64_t in, int64_t out) {
    x = ca_contiguous(ca_cast(x, lp));
    ca_tensor *wl = ca_autocast_weight(w, lp), *bl = b ? ca_autocast_weight(b, lp) : NULL;
    if (!x || !wl || (b && !bl)) return NULL;
    int64_t M = in ? x->numel / in : 0;
    int64_t shape[CA_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = out;
    ca_device *dev = ca_tdev(x);
    ca_tensor *y = ca_tensor_new(dev, lp, x->ndim, shape);
    if (!y) return NULL;
    float beta = 0.0f;
    if (bl && M) {
        int64_t bshape[2] = {M, out}, bs[2] = {0, 1}, ys[2] = {out, 1};
        if (CA_KCALL(dev, copy_strided, .dt = lp, .ndim = 2, .shape = bshape, .x = ca_tptr(bl),
                     .x_stride = bs, .y = ca_tptr(y), .y_stride = ys) != CA_OK) return NULL;
        beta = 1.0f;
    }
    if (gemm(dev, false, true, M, out, in, 1.0f, x, in, 0, wl, in, 0, beta, y, out, 0, 1) != CA_OK) return NULL;
    ca_tensor *ins[3] = {x, w, b};
    int nin = b ? 3 : 2;
    if (ca_needs_grad(nin, ins)) {
        ca_node *n = ca_record(&linear_amp_vt, y, nin, ins);
        if (!n) return NULL;
        n->saved[0] = wl;
        n->i[0] = M; n->i[1] = in; n->i[2] = out;
    }
    return y;
}

ca_tensor *ca_linear(ca_tensor *x, ca_tensor *w, ca_tensor *b) {
    CA_OP_NULLCHECK2(x, w);
    if (!ca_op_check_float("linear", x) || !ca_op_check_same_device("linear", x, w) ||
        (b && !ca_op_check_same_device("linear", x, b)))
        return NULL;
    char xs[128], ws[128];
    int64_t in = w->ndim == 2 ? w->shape[1] : -1, out = w->ndim == 2 ? w->shape[0] : -1;
    ca_dtype lp = ca_autocast_dtype();
    bool amp = lp != CA_F32 && w->dtype == CA_F32 && (!b || b->dtype == CA_F32);
    if (lp != CA_F32 && w->dtype == lp && (!b || b->dtype == lp) && x->dtype != lp && ca_dtype_is_float(x->dtype)) {
        x = ca_cast(x, lp);   /* a weight stored in low precision (a frozen bf16 base): autocast casts the input */
        if (!x) return NULL;
    }
    if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != in || (!amp && x->dtype != w->dtype) ||
        (b && (b->numel != out || b->dtype != w->dtype))) {
        ca_error(CA_ERR_INVALID, "linear: input %s %s does not fit weight %s %s%s",
                 ca_shape_str(x->ndim, x->shape, xs, sizeof xs), ca_dtype_name(x->dtype),
                 ca_shape_str(w->ndim, w->shape, ws, sizeof ws), ca_dtype_name(w->dtype),
                 b && b->numel != out ? " (bias size differs)" : "");
        return NULL;
    }
    if (amp) return linear_amp(x, w, b, lp, in, out);
    x = ca_contiguous(x);
    w = ca_contiguous(w);
    if (!x || !w) return NULL;
    int64_t M = in ? x->numel / in : 0;
    int64_t shape[CA_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = out;
    ca_tensor *y = ca_tensor_new(ca_tdev(x), x->dtype, x->ndim, shape);
    if (!y) return NULL;
    ca_device *dev = ca_tdev(x);
    float beta = 0.0f;
    if (b && M) {   /* rows of y start as the bias; the GEMM adds x W^T on top */
        int64_t bshape[2] = {M, out}, bs[2] = {0, 1}, ys[2] = {out, 1};
        if (CA_KCALL(dev, copy_strided, .dt = b->dtype, .ndim = 2, .shape = bshape, .x = ca_tptr(b),
                     .x_stride = bs, .y = ca_tptr(y), .y_stride = ys) != CA_OK) return NULL;
        beta = 1.0f;
    }
    if (gemm(dev, false, true, M, out, in, 1.0f, x, in, 0, w, in, 0, beta, y, out, 0, 1) != CA_OK) return NULL;
    ca_tensor *ins[3] = {x, w, b};
    int nin = b ? 3 : 2;
    if (ca_needs_grad(nin, ins)) {
        ca_node *n = ca_record(&linear_vt, y, nin, ins);
        if (!n) return NULL;
        n->i[0] = M; n->i[1] = in; n->i[2] = out;
    }
    return y;
}

/* ------------------------------------------------------------------ batched matmul */

static ca_tensor *matmul_error(const ca_tensor *a, const ca_tensor *b) {
    char x[128], y[128];
    ca_error(CA_ERR_INVALID, "matmul: cannot multiply %s %s by %s %s", ca_shape_str(a->ndim, a->shape, x, sizeof x),
             ca_dtype_name(a->dtype), ca_shape_str(b->ndim, b->shape, y, sizeof y), ca_dtype_name(b->dtype));
    return NULL;
}

/* Collapses the batch dims of x (shape batch + [r, c]) to one: [prod(batch), r, c]. */
static ca_tensor *fold_batch(ca_tensor *x) {
    int64_t s3[3] = {-1, x->shape[x->ndim - 2], x->shape[x->ndim - 1]};
    return ca_reshape(x, 3, s3);
}

ca_tensor *ca_matmul(ca_tensor *a, ca_tensor *b) {
    CA_OP_NULLCHECK2(a, b);
    if (a->ndim < 2 || b->ndim < 2 || a->shape[a->ndim - 1] != b->shape[b->ndim - 2]) return matmul_error(a, b);
    if (a->ndim == 2 && b->ndim == 2) return matmul_23(a, b);
    int64_t m = a->shape[a->ndim - 2], n = b->shape[b->ndim - 1];
    int64_t out[CA_MAX_DIMS];
    if (b->ndim == 2) {     /* [.., m, k] x [k, n]: one GEMM over all rows */
        memcpy(out, a->shape, sizeof out);
        out[a->ndim - 1] = n;
        int64_t rows[2] = {-1, a->shape[a->ndim - 1]};
        return ca_reshape(matmul_23(ca_reshape(a, 2, rows), b), a->ndim, out);
    }
    int nb = (a->ndim > b->ndim ? a->ndim : b->ndim) - 2;
    int64_t ea[CA_MAX_DIMS], eb[CA_MAX_DIMS];
    bool expand_a = a->ndim - 2 != nb, expand_b = b->ndim - 2 != nb;
    for (int i = 0; i < nb; i++) {
        int ia = i - (nb - (a->ndim - 2)), ib = i - (nb - (b->ndim - 2));
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) return matmul_error(a, b);
        out[i] = sa > sb ? sa : sb;
        expand_a |= sa != out[i];
        expand_b |= sb != out[i];
    }
    memcpy(ea, out, sizeof ea);
    memcpy(eb, out, sizeof eb);
    ea[nb] = m; ea[nb + 1] = a->shape[a->ndim - 1];
    eb[nb] = b->shape[b->ndim - 2]; eb[nb + 1] = n;
    if (expand_a) a = ca_expand(a, nb + 2, ea);
    if (expand_b) b = ca_expand(b, nb + 2, eb);
    CA_OP_NULLCHECK2(a, b);
    out[nb] = m; out[nb + 1] = n;
    ca_tensor *c = matmul_23(fold_batch(a), fold_batch(b));
    return nb == 1 ? c : ca_reshape(c, nb + 2, out);
}
