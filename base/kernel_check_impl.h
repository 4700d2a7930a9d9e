/* kernel_check_impl.h: argument checks every device backend's kernels share (header-only, so a
 * plugin gets them without the library exporting more): unsupported dtypes and multi-tensor lists. */
#ifndef CACCEL_KERNEL_CHECK_IMPL_H
#define CACCEL_KERNEL_CHECK_IMPL_H

#include <caccel/backend.h>
#include <caccel/status.h>
#include <caccel/types.h>

#include <stdbool.h>
#include <string.h>

/* "<backend> kernel <kernel>: <what> dtype bf16 is not supported here" (CA_ERR_UNSUPPORTED), or
 * CA_ERR_INVALID for a value outside the enum. */
static inline ca_status ca_kernel_bad_dtype(const char *backend, const char *kernel, const char *what,
                                            ca_dtype dt) {
    if ((unsigned)dt >= CA_DTYPE_COUNT)
        return ca_error(CA_ERR_INVALID, "%s kernel %s: %s has invalid dtype value %d", backend, kernel,
                        what, (int)dt);
    return ca_error(CA_ERR_UNSUPPORTED, "%s kernel %s: %s dtype %s is not supported here", backend,
                    kernel, what, ca_dtype_name(dt));
}

static inline const char *ca_kernel_missing_array(const ca_tensor_list *t, bool grad, bool s1) {
    return !t->numel ? "numel" : !t->param ? "param" : grad && !t->grad ? "grad" : s1 && !t->state1 ? "state1"
                                                                                                  : "state2";
}

/* Checks a multi-tensor list: arrays present, sizes non-negative, pointers present for non-empty
 * tensors, a float grad_dtype. grad/s1/s2: whether the kernel reads grad, state1, state2. */
static inline ca_status ca_kernel_check_list(const char *backend, const char *k, const ca_tensor_list *t,
                                             bool grad, bool s1, bool s2) {
    if (!t) return ca_error(CA_ERR_INVALID, "%s kernel %s: tensor list is NULL", backend, k);
    if (t->count < 0) return ca_error(CA_ERR_INVALID, "%s kernel %s: negative count %d", backend, k, t->count);
    if (t->count == 0) return CA_OK;
    if (!ca_dtype_is_float(t->grad_dtype)) return ca_kernel_bad_dtype(backend, k, "grad_dtype", t->grad_dtype);
    if (!t->numel || !t->param || (grad && !t->grad) || (s1 && !t->state1) || (s2 && !t->state2))
        return ca_error(CA_ERR_INVALID, "%s kernel %s: the list's %s array is NULL", backend, k,
                        ca_kernel_missing_array(t, grad, s1));
    for (int i = 0; i < t->count; i++) {
        if (t->numel[i] < 0)
            return ca_error(CA_ERR_INVALID, "%s kernel %s: tensor %d has negative numel %lld", backend, k, i,
                            (long long)t->numel[i]);
        if (t->numel[i] == 0) continue;
        if (!t->param[i] || (grad && !t->grad[i]) || (s1 && !t->state1[i]) || (s2 && !t->state2[i]))
            return ca_error(CA_ERR_INVALID, "%s kernel %s: tensor %d has a NULL %s", backend, k, i,
                            !t->param[i] ? "param" : grad && !t->grad[i] ? "grad" : s1 && !t->state1[i] ? "state1"
                                                                                                    : "state2");
    }
    return CA_OK;
}


/* ------------------------------------------------------------ per-slot checks */

/* ca_kcheck_<slot>(backend, args): the checks of a kernel's contract (include/caccel/backend.h) that
 * hold on every device: dtypes the contract allows, enum values, sizes, and NULL pointers where
 * there is work. The core runs them before the backend is called (core/device_impl.h), so a
 * backend keeps only its own limits and the checks that depend on the data. Messages read
 * "<backend> kernel <slot>: ...". */

#define CK_ERR(...) ca_error(CA_ERR_INVALID, __VA_ARGS__)
#define CK_IDX(dt) ((dt) == CA_I32 || (dt) == CA_I64)
#define CK_NEG(be, k, ...) CK_ERR("%s kernel %s: negative size", be, k)

static inline ca_status ca_kcheck_float(const char *be, const char *k, const char *what, ca_dtype dt) {
    return ca_dtype_is_float(dt) ? CA_OK : ca_kernel_bad_dtype(be, k, what, dt);
}
static inline ca_status ca_kcheck_any(const char *be, const char *k, const char *what, ca_dtype dt) {
    return ca_dtype_size(dt) ? CA_OK : ca_kernel_bad_dtype(be, k, what, dt);
}
static inline ca_status ca_kcheck_index(const char *be, const char *k, ca_dtype dt) {
    return CK_IDX(dt) ? CA_OK : ca_kernel_bad_dtype(be, k, "indices", dt);
}
/* "<backend> kernel <k>: <which> is NULL" for the first NULL among the first n of p[], named in
 * `names` (comma-separated), or CA_OK. */
static inline ca_status ca_kcheck_ptrs(const char *be, const char *k, const char *names, int n, const void *p0,
                                       const void *p1, const void *p2, const void *p3, const void *p4,
                                       const void *p5) {
    const void *p[6] = {p0, p1, p2, p3, p4, p5};
    const char *name = names;
    for (int i = 0; i < n && i < 6; i++) {
        size_t len = strcspn(name, ",");
        if (!p[i]) return CK_ERR("%s kernel %s: %.*s is NULL", be, k, (int)len, name);
        name += len + (name[len] == ',');
    }
    return CA_OK;
}
#define CK_NARGS_(...) CK_NARGS2_(__VA_ARGS__, 6, 5, 4, 3, 2, 1, 0)
#define CK_NARGS2_(a, b, c, d, e, f, n, ...) n
#define CK_FIRST6_(a, b, c, d, e, f, ...) a, b, c, d, e, f
/* CK_PTRS(backend, kernel, "x,y", x, y): at most 6 pointers. */
#define CK_PTRS(be, k, names, ...) \
    ca_kcheck_ptrs(be, k, names, CK_NARGS_(__VA_ARGS__), CK_FIRST6_(__VA_ARGS__, NULL, NULL, NULL, NULL, NULL, NULL))
#define CK_TRY(e) do { ca_status s_ = (e); if (s_ != CA_OK) return s_; } while (0)

static inline ca_status ca_kcheck_gemm(const char *be, const ca_gemm_args *g) {
    const char *k = "gemm";
    CK_TRY(ca_kcheck_float(be, k, "A", g->a_dtype));
    if (g->b_dtype != g->a_dtype)
        return CK_ERR("%s kernel gemm: A is %s but B is %s (they must match)", be, ca_dtype_name(g->a_dtype),
                      ca_dtype_name(g->b_dtype));
    if (g->c_dtype != CA_F32 && g->c_dtype != g->a_dtype)
        return CK_ERR("%s kernel gemm: C is %s; it must be f32 or %s like A", be, ca_dtype_name(g->c_dtype),
                      ca_dtype_name(g->a_dtype));
    int64_t m = g->m, n = g->n, kk = g->k;
    if (m < 0 || n < 0 || kk < 0 || g->batch < 0)
        return CK_ERR("%s kernel gemm: negative size (m %lld, n %lld, k %lld, batch %lld)", be, (long long)m,
                      (long long)n, (long long)kk, (long long)g->batch);
    if (m == 0 || n == 0) return CA_OK;
    /* A is stored [m,k] or [k,m], B [k,n] or [n,k]; the row strides must cover a row. */
    int64_t a_cols = g->trans_a ? m : kk, b_cols = g->trans_b ? kk : n;
    int64_t min_lda = a_cols > 1 ? a_cols : 1, min_ldb = b_cols > 1 ? b_cols : 1;
    if (g->lda < min_lda || g->ldb < min_ldb || g->ldc < n)
        return CK_ERR("%s kernel gemm: leading dimension too small (lda %lld needs >= %lld, "
                      "ldb %lld needs >= %lld, ldc %lld needs >= %lld; trans_a %d, trans_b %d)",
                      be, (long long)g->lda, (long long)min_lda, (long long)g->ldb, (long long)min_ldb,
                      (long long)g->ldc, (long long)n, g->trans_a, g->trans_b);
    if (!g->c || (kk > 0 && (!g->a || !g->b)))
        return CK_ERR("%s kernel gemm: %s is NULL", be, !g->c ? "C" : (!g->a ? "A" : "B"));
    return CA_OK;
}

static inline ca_status ca_kcheck_fill(const char *be, const ca_fill_args *a) {
    CK_TRY(ca_kcheck_any(be, "fill", "output", a->dt));
    if (a->n < 0) return CK_ERR("%s kernel fill: negative length %lld", be, (long long)a->n);
    return a->n > 0 && !a->y ? CK_ERR("%s kernel fill: output is NULL", be) : CA_OK;
}

static inline ca_status ca_kcheck_cast(const char *be, const ca_cast_args *a) {
    CK_TRY(ca_kcheck_any(be, "cast", "input", a->src_dt));
    CK_TRY(ca_kcheck_any(be, "cast", "output", a->dst_dt));
    if (a->n < 0) return CK_ERR("%s kernel cast: negative length %lld", be, (long long)a->n);
    return a->n ? CK_PTRS(be, "cast", "x,y", a->x, a->y) : CA_OK;
}

static inline ca_status ca_kcheck_copy_strided(const char *be, const ca_copy_strided_args *a) {
    CK_TRY(ca_kcheck_any(be, "copy_strided", "tensor", a->dt));
    if (a->ndim < 0 || a->ndim > CA_MAX_DIMS)
        return CK_ERR("%s kernel copy_strided: ndim %d outside [0, %d]", be, a->ndim, CA_MAX_DIMS);
    if (a->ndim > 0 && (!a->shape || !a->x_stride || !a->y_stride))
        return CK_ERR("%s kernel copy_strided: shape or strides are NULL", be);
    for (int d = 0; d < a->ndim; d++) {
        if (a->shape[d] < 0)
            return CK_ERR("%s kernel copy_strided: dim %d has negative size %lld", be, d, (long long)a->shape[d]);
        if (a->shape[d] == 0) return CA_OK;
    }
    return CK_PTRS(be, "copy_strided", "x,y", a->x, a->y);
}

static inline ca_status ca_kcheck_unary_common(const char *be, const char *k, ca_unary_op op, ca_dtype dt,
                                               int64_t n) {
    CK_TRY(ca_kcheck_float(be, k, "tensor", dt));
    if ((unsigned)op >= CA_UNARY_OP_COUNT) return CK_ERR("%s kernel %s: unknown op %d", be, k, (int)op);
    if (n < 0) return CK_ERR("%s kernel %s %s: negative length %lld", be, k, ca_unary_op_name(op), (long long)n);
    return CA_OK;
}

static inline ca_status ca_kcheck_unary(const char *be, const ca_unary_args *a) {
    CK_TRY(ca_kcheck_unary_common(be, "unary", a->op, a->dt, a->n));
    return a->n ? CK_PTRS(be, "unary", "x,y", a->x, a->y) : CA_OK;
}

/* Which of x and y the backward of op reads (backend.h's contract). */
static inline bool ca_unary_grad_reads_y(ca_unary_op op) {
    return op == CA_UNARY_RELU || op == CA_UNARY_TANH || op == CA_UNARY_SIGMOID || op == CA_UNARY_EXP ||
           op == CA_UNARY_SQRT;
}
static inline bool ca_unary_grad_reads_input(ca_unary_op op) {
    return !(op == CA_UNARY_NEG || op == CA_UNARY_SCALE || op == CA_UNARY_ADD_SCALAR);
}

static inline ca_status ca_kcheck_unary_backward(const char *be, const ca_unary_backward_args *a) {
    CK_TRY(ca_kcheck_unary_common(be, "unary_backward", a->op, a->dt, a->n));
    if (a->n == 0) return CA_OK;
    bool ry = ca_unary_grad_reads_y(a->op), in = ca_unary_grad_reads_input(a->op);
    if (!a->dy || !a->dx || (in && ry && !a->y) || (in && !ry && !a->x))
        return CK_ERR("%s kernel unary_backward %s: %s is NULL", be, ca_unary_op_name(a->op),
                      !a->dy ? "dy" : !a->dx ? "dx" : ry ? "y (the forward output)" : "x (the forward input)");
    return CA_OK;
}

/* The element count of a broadcast shape (0 when any dim is 0), or -1 after an error. */
static inline int64_t ca_kcheck_bcast(const char *be, const char *k, const ca_bcast_args *s) {
    if (s->ndim < 1 || s->ndim > CA_MAX_DIMS) {
        CK_ERR("%s kernel %s: ndim %d outside [1, %d]", be, k, s->ndim, CA_MAX_DIMS);
        return -1;
    }
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) {
        if (s->shape[d] < 0) {
            CK_ERR("%s kernel %s: dim %d has negative size %lld", be, k, d, (long long)s->shape[d]);
            return -1;
        }
        n *= s->shape[d];
    }
    return n;
}

static inline ca_status ca_kcheck_binary(const char *be, const ca_binary_args *a) {
    CK_TRY(ca_kcheck_float(be, "binary", "tensor", a->dt));
    if ((unsigned)a->op >= CA_BINARY_OP_COUNT) return CK_ERR("%s kernel binary: unknown op %d", be, (int)a->op);
    int64_t n = ca_kcheck_bcast(be, "binary", &a->shape);
    if (n < 0) return ca_last_status();
    return n ? CK_PTRS(be, "binary", "a,b,y", a->a, a->b, a->y) : CA_OK;
}

static inline ca_status ca_kcheck_axpby(const char *be, const ca_axpby_args *a) {
    CK_TRY(ca_kcheck_float(be, "axpby", "tensor", a->dt));
    if (a->n < 0) return CK_ERR("%s kernel axpby: negative length %lld", be, (long long)a->n);
    return a->n ? CK_PTRS(be, "axpby", "x,y", a->x, a->y) : CA_OK;
}

static inline ca_status ca_kcheck_reduce(const char *be, const ca_reduce_args *a) {
    CK_TRY(ca_kcheck_float(be, "reduce", "tensor", a->dt));
    if ((unsigned)a->op >= CA_REDUCE_OP_COUNT) return CK_ERR("%s kernel reduce: unknown op %d", be, (int)a->op);
    const char *name = ca_reduce_op_name(a->op);
    if (a->outer < 0 || a->len < 0 || a->inner < 0)
        return CK_ERR("%s kernel reduce %s: negative size (outer %lld, len %lld, inner %lld)", be, name,
                      (long long)a->outer, (long long)a->len, (long long)a->inner);
    if (a->outer == 0 || a->inner == 0) return CA_OK;
    if (a->len == 0 && (a->op == CA_OP_MIN || a->op == CA_OP_MAX))
        return CK_ERR("%s kernel reduce %s: cannot take the %s over an empty dimension", be, name, name);
    if (!a->y || (a->len > 0 && !a->x)) return CK_ERR("%s kernel reduce %s: %s is NULL", be, name, !a->y ? "y" : "x");
    return CA_OK;
}

static inline ca_status ca_kcheck_argmax(const char *be, const ca_argmax_args *a) {
    CK_TRY(ca_kcheck_float(be, "argmax", "input", a->dt));
    if (a->rows < 0 || a->cols < 1)
        return CK_ERR("%s kernel argmax: bad shape [%lld, %lld] (cols must be >= 1)", be, (long long)a->rows,
                      (long long)a->cols);
    return a->rows ? CK_PTRS(be, "argmax", "x,idx", a->x, a->idx) : CA_OK;
}

static inline ca_status ca_kcheck_rows(const char *be, const char *k, ca_dtype dt, int64_t rows, int64_t cols) {
    CK_TRY(ca_kcheck_float(be, k, "tensor", dt));
    if (rows < 0 || cols < 0)
        return CK_ERR("%s kernel %s: negative shape [%lld, %lld]", be, k, (long long)rows, (long long)cols);
    return CA_OK;
}

static inline ca_status ca_kcheck_softmax(const char *be, const ca_softmax_args *a) {
    const char *k = a->log ? "log_softmax" : "softmax";
    CK_TRY(ca_kcheck_rows(be, k, a->dt, a->rows, a->cols));
    return a->rows && a->cols ? CK_PTRS(be, k, "x,y", a->x, a->y) : CA_OK;
}

static inline ca_status ca_kcheck_softmax_backward(const char *be, const ca_softmax_backward_args *a) {
    const char *k = a->log ? "log_softmax_backward" : "softmax_backward";
    CK_TRY(ca_kcheck_rows(be, k, a->dt, a->rows, a->cols));
    return a->rows && a->cols ? CK_PTRS(be, k, "y,dy,dx", a->y, a->dy, a->dx) : CA_OK;
}

static inline ca_status ca_kcheck_ce(const char *be, const char *k, ca_dtype dt, int64_t rows, int64_t cols,
                                     ca_dtype label_dt) {
    CK_TRY(ca_kcheck_rows(be, k, dt, rows, cols));
    if (!CK_IDX(label_dt)) return ca_kernel_bad_dtype(be, k, "labels", label_dt);
    return rows > 0 && cols < 1 ? CK_ERR("%s kernel %s: logits have no classes", be, k) : CA_OK;
}

static inline ca_status ca_kcheck_cross_entropy(const char *be, const ca_cross_entropy_args *a) {
    const char *k = "cross_entropy";
    CK_TRY(ca_kcheck_ce(be, k, a->dt, a->rows, a->cols, a->label_dt));
    CK_TRY(CK_PTRS(be, k, "loss,count", a->loss, a->count));
    return a->rows ? CK_PTRS(be, k, "logits,labels,lse", a->logits, a->labels, a->lse) : CA_OK;
}

static inline ca_status ca_kcheck_cross_entropy_backward(const char *be, const ca_cross_entropy_backward_args *a) {
    const char *k = "cross_entropy_backward";
    CK_TRY(ca_kcheck_ce(be, k, a->dt, a->rows, a->cols, a->label_dt));
    if (!a->rows) return CA_OK;
    return CK_PTRS(be, k, "logits,lse,labels,dloss,count,dlogits", a->logits, a->lse, a->labels, a->dloss,
                   a->count, a->dlogits);
}

static inline ca_status ca_kcheck_layer_norm(const char *be, const ca_layer_norm_args *a) {
    const char *k = "layer_norm";
    CK_TRY(ca_kcheck_rows(be, k, a->dt, a->rows, a->cols));
    if (a->rows == 0) return CA_OK;
    if (a->cols < 1) return CK_ERR("%s kernel %s: rows have no elements", be, k);
    return CK_PTRS(be, k, "x,y", a->x, a->y);
}

static inline ca_status ca_kcheck_layer_norm_backward(const char *be, const ca_layer_norm_backward_args *a) {
    const char *k = "layer_norm_backward";
    CK_TRY(ca_kcheck_rows(be, k, a->dt, a->rows, a->cols));
    if (a->rows == 0) return CA_OK;
    if (a->cols < 1) return CK_ERR("%s kernel %s: rows have no elements", be, k);
    return CK_PTRS(be, k, "x,mean,rstd,dy", a->x, a->mean, a->rstd, a->dy);
}

static inline ca_status ca_kcheck_embedding(const char *be, const ca_embedding_args *a) {
    const char *k = "embedding";
    CK_TRY(ca_kcheck_any(be, k, "table", a->dt));
    CK_TRY(ca_kcheck_index(be, k, a->idx_dt));
    if (a->n < 0 || a->dim < 0 || a->rows < 0)
        return CK_ERR("%s kernel %s: negative shape (n %lld, dim %lld)", be, k, (long long)a->n, (long long)a->dim);
    if (a->n == 0) return CA_OK;
    CK_TRY(CK_PTRS(be, k, "idx", a->idx));
    return a->dim ? CK_PTRS(be, k, "table,y", a->table, a->y) : CA_OK;
}

static inline ca_status ca_kcheck_embedding_backward(const char *be, const ca_embedding_backward_args *a) {
    const char *k = "embedding_backward";
    CK_TRY(ca_kcheck_float(be, k, "table", a->dt));
    CK_TRY(ca_kcheck_index(be, k, a->idx_dt));
    if (a->n < 0 || a->dim < 0 || a->rows < 0)
        return CK_ERR("%s kernel %s: negative shape (n %lld, dim %lld)", be, k, (long long)a->n, (long long)a->dim);
    if (a->n == 0) return CA_OK;
    CK_TRY(CK_PTRS(be, k, "idx", a->idx));
    return a->dim ? CK_PTRS(be, k, "dy,dtable", a->dy, a->dtable) : CA_OK;
}

static inline ca_status ca_kcheck_rng(const char *be, const ca_rng_args *a) {
    CK_TRY(ca_kcheck_float(be, "rng", "output", a->dt));
    if (a->kind != CA_RNG_UNIFORM && a->kind != CA_RNG_NORMAL)
        return CK_ERR("%s kernel rng: unknown kind %d", be, (int)a->kind);
    if (a->n < 0) return CK_ERR("%s kernel rng: negative length %lld", be, (long long)a->n);
    return a->n > 0 && !a->y ? CK_ERR("%s kernel rng: output is NULL", be) : CA_OK;
}

static inline ca_status ca_kcheck_dropout(const char *be, const ca_dropout_args *a) {
    CK_TRY(ca_kcheck_float(be, "dropout", "tensor", a->dt));
    if (a->n < 0) return CK_ERR("%s kernel dropout: negative length %lld", be, (long long)a->n);
    if (!(a->p >= 0.0f && a->p <= 1.0f))
        return CK_ERR("%s kernel dropout: probability %g outside [0, 1]", be, (double)a->p);
    return a->n ? CK_PTRS(be, "dropout", "x,y", a->x, a->y) : CA_OK;
}

static inline ca_status ca_kcheck_dropout_backward(const char *be, const ca_dropout_backward_args *a) {
    CK_TRY(ca_kcheck_float(be, "dropout_backward", "tensor", a->dt));
    if (a->n < 0) return CK_ERR("%s kernel dropout_backward: negative length %lld", be, (long long)a->n);
    if (!(a->p >= 0.0f && a->p <= 1.0f))
        return CK_ERR("%s kernel dropout_backward: probability %g outside [0, 1]", be, (double)a->p);
    return a->n ? CK_PTRS(be, "dropout_backward", "mask,dy,dx", a->mask, a->dy, a->dx) : CA_OK;
}

static inline ca_status ca_kcheck_adamw(const char *be, const ca_adamw_args *a) {
    CK_TRY(ca_kernel_check_list(be, "adamw", a->t, true, true, true));
    if (!(a->bias_correction1 > 0.0f) || !(a->bias_correction2 > 0.0f))
        return CK_ERR("%s kernel adamw: bias corrections must be > 0 (got %g and %g; 1 - beta^step with step >= 1)",
                      be, (double)a->bias_correction1, (double)a->bias_correction2);
    return CA_OK;
}

static inline ca_status ca_kcheck_sgd(const char *be, const ca_sgd_args *a) {
    bool mom = a->momentum != 0.0f;
    CK_TRY(ca_kernel_check_list(be, "sgd", a->t, true, mom, false));
    if (a->nesterov && (!mom || a->dampening != 0.0f))
        return CK_ERR("%s kernel sgd: nesterov needs momentum > 0 and dampening 0 (momentum %g, dampening %g)", be,
                      (double)a->momentum, (double)a->dampening);
    return CA_OK;
}

static inline ca_status ca_kcheck_sum_squares(const char *be, const ca_sum_squares_args *a) {
    CK_TRY(ca_kernel_check_list(be, "sum_squares", a->t, false, false, false));
    return CK_PTRS(be, "sum_squares", "out", a->out);
}

static inline ca_status ca_kcheck_scale_list(const char *be, const ca_scale_list_args *a) {
    return ca_kernel_check_list(be, "scale_list", a->t, false, false, false);
}

static inline ca_status ca_kcheck_unscale_check(const char *be, const ca_unscale_check_args *a) {
    CK_TRY(CK_PTRS(be, "unscale_check", "found_inf", a->found_inf));
    return ca_kernel_check_list(be, "unscale_check", a->t, false, false, false);
}

static inline ca_status ca_kcheck_clamp_list(const char *be, const ca_clamp_list_args *a) {
    if (a->lo > a->hi)
        return CK_ERR("%s kernel clamp_list: lo %g is greater than hi %g", be, (double)a->lo, (double)a->hi);
    return ca_kernel_check_list(be, "clamp_list", a->t, false, false, false);
}

static inline ca_status ca_kcheck_att(const char *be, const char *k, ca_dtype dt, const ca_attention_params *p,
                                      const void *q, const void *kk, const void *v) {
    CK_TRY(ca_kcheck_float(be, k, "tensor", dt));
    if (p->batch < 0 || p->heads < 0 || p->tq < 0 || p->tk < 0 || p->d < 0 || p->dv < 0)
        return CK_ERR("%s kernel %s: negative size", be, k);
    if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f))
        return CK_ERR("%s kernel %s: dropout probability %g outside [0, 1)", be, k, (double)p->dropout_p);
    if (p->mask && p->mask_dtype != CA_F32 && p->mask_dtype != CA_U8)
        return ca_kernel_bad_dtype(be, k, "mask", p->mask_dtype);
    if (p->batch * p->heads * p->tq > 0 && (!q || !kk || !v)) return CK_ERR("%s kernel %s: q, k or v is NULL", be, k);
    return CA_OK;
}

/* kv_heads 0 (every head its own k and v) or a divisor of heads (grouped-query attention). */
static inline ca_status ca_kcheck_att_kv(const char *be, const char *k, const ca_attention_params *p, int64_t kv) {
    if (kv < 0 || (kv > 0 && p->heads % kv != 0))
        return CK_ERR("%s kernel %s: kv_heads %lld does not divide heads %lld", be, k, (long long)kv,
                      (long long)p->heads);
    return CA_OK;
}

/* The dropout stream's heads (ABI 3.6): 0, or the call's heads within [0, stream_heads). */
static inline ca_status ca_kcheck_att_stream(const char *be, const char *k, const ca_attention_params *p, int64_t sh,
                                             int64_t h0) {
    if (sh < 0 || (sh == 0 && h0 != 0) || (sh > 0 && (h0 < 0 || h0 + p->heads > sh)))
        return CK_ERR("%s kernel %s: heads [%lld, %lld) are not within the dropout stream's %lld heads", be, k,
                      (long long)h0, (long long)(h0 + p->heads), (long long)sh);
    return CA_OK;
}

/* ABI 3.10's strides of one [B, *, T, E] tensor of a call: all 0 (contiguous), or none negative, e's 1 (where
 * E > 1) and t's at least E (where T > 1): rows of E unit-stride elements that do not overlap. */
static inline ca_status ca_kcheck_att_st(const char *be, const char *k, const char *name, const int64_t *st,
                                         int64_t t, int64_t e) {
    if (!(st[0] | st[1] | st[2] | st[3])) return CA_OK;
    if (st[0] < 0 || st[1] < 0 || st[2] < 0 || st[3] < 0 || (e > 1 && st[3] != 1) || (t > 1 && st[2] < e))
        return CK_ERR("%s kernel %s: %s's strides [%lld, %lld, %lld, %lld] are not rows of %lld unit-stride "
                      "elements", be, k, name, (long long)st[0], (long long)st[1], (long long)st[2], (long long)st[3],
                      (long long)e);
    return CA_OK;
}

/* The four tensors' strides of a layout: q, k, v and out, or (grads) dq, dk, dv and dout. */
static inline ca_status ca_kcheck_att_layout(const char *be, const char *k, const ca_attention_params *p,
                                             const ca_attention_layout *l, bool grads) {
    CK_TRY(ca_kcheck_att_st(be, k, grads ? "dq" : "q", l->q, p->tq, p->d));
    CK_TRY(ca_kcheck_att_st(be, k, grads ? "dk" : "k", l->k, p->tk, p->d));
    CK_TRY(ca_kcheck_att_st(be, k, grads ? "dv" : "v", l->v, p->tk, p->dv));
    return ca_kcheck_att_st(be, k, grads ? "dout" : "out", l->o, p->tq, p->dv);
}

static inline ca_status ca_kcheck_attention(const char *be, const ca_attention_args *a) {
    CK_TRY(ca_kcheck_att(be, "attention", a->dt, &a->p, a->q, a->k, a->v));
    CK_TRY(ca_kcheck_att_kv(be, "attention", &a->p, a->kv_heads));
    CK_TRY(ca_kcheck_att_stream(be, "attention", &a->p, a->stream_heads, a->stream_head0));
    CK_TRY(ca_kcheck_att_layout(be, "attention", &a->p, &a->st, false));
    if (a->p.batch * a->p.heads * a->p.tq > 0 && (!a->out || !a->lse))
        return CK_ERR("%s kernel attention: out or lse is NULL", be);
    return CA_OK;
}

static inline ca_status ca_kcheck_attention_backward(const char *be, const ca_attention_backward_args *a) {
    CK_TRY(ca_kcheck_att(be, "attention_backward", a->dt, &a->p, a->q, a->k, a->v));
    CK_TRY(ca_kcheck_att_kv(be, "attention_backward", &a->p, a->kv_heads));
    CK_TRY(ca_kcheck_att_stream(be, "attention_backward", &a->p, a->stream_heads, a->stream_head0));
    CK_TRY(ca_kcheck_att_layout(be, "attention_backward", &a->p, &a->st, false));
    CK_TRY(ca_kcheck_att_layout(be, "attention_backward", &a->p, &a->dst, true));
    if (a->p.batch * a->p.heads > 0 && (!a->dq || !a->dk || !a->dv || (a->p.tq && (!a->out || !a->dout || !a->lse))))
        return CK_ERR("%s kernel attention_backward: an output or saved buffer is NULL", be);
    return CA_OK;
}

static inline ca_status ca_kcheck_where(const char *be, const ca_where_args *a) {
    CK_TRY(ca_kcheck_any(be, "where", "tensor", a->dt));
    if (!a->cond_stride) return CK_ERR("%s kernel where: bad shape arguments", be);
    int64_t n = ca_kcheck_bcast(be, "where", &a->shape);
    if (n < 0) return ca_last_status();
    return n ? CK_PTRS(be, "where", "cond,a,b,y", a->cond, a->a, a->b, a->y) : CA_OK;
}

static inline ca_status ca_kcheck_gather_shape(const char *be, const char *k, ca_dtype idx_dt, int64_t outer,
                                               int64_t len, int64_t inner, int64_t n, const void *idx) {
    CK_TRY(ca_kcheck_index(be, k, idx_dt));
    if (outer < 0 || len < 0 || inner < 0 || n < 0) return CK_ERR("%s kernel %s: negative shape", be, k);
    return outer * n * inner != 0 ? CK_PTRS(be, k, "idx", idx) : CA_OK;
}

static inline ca_status ca_kcheck_gather(const char *be, const ca_gather_args *a) {
    CK_TRY(ca_kcheck_any(be, "gather", "tensor", a->dt));
    CK_TRY(ca_kcheck_gather_shape(be, "gather", a->idx_dt, a->outer, a->len, a->inner, a->n, a->idx));
    return a->outer * a->n * a->inner != 0 ? CK_PTRS(be, "gather", "x,y", a->x, a->y) : CA_OK;
}

static inline ca_status ca_kcheck_gather_backward(const char *be, const ca_gather_backward_args *a) {
    CK_TRY(ca_kcheck_float(be, "gather_backward", "tensor", a->dt));
    CK_TRY(ca_kcheck_gather_shape(be, "gather_backward", a->idx_dt, a->outer, a->len, a->inner, a->n, a->idx));
    return a->outer * a->n * a->inner != 0 ? CK_PTRS(be, "gather_backward", "dy,dx", a->dy, a->dx) : CA_OK;
}

static inline ca_status ca_kcheck_rms_norm(const char *be, const ca_rms_norm_args *a) {
    const char *k = "rms_norm";
    CK_TRY(ca_kcheck_rows(be, k, a->dt, a->rows, a->cols));
    if (a->rows == 0) return CA_OK;
    if (a->cols < 1) return CK_ERR("%s kernel %s: rows have no elements", be, k);
    return CK_PTRS(be, k, "x,y,rstd", a->x, a->y, a->rstd);
}

static inline ca_status ca_kcheck_rms_norm_backward(const char *be, const ca_rms_norm_backward_args *a) {
    const char *k = "rms_norm_backward";
    CK_TRY(ca_kcheck_rows(be, k, a->dt, a->rows, a->cols));
    if (a->rows == 0) return CA_OK;
    if (a->cols < 1) return CK_ERR("%s kernel %s: rows have no elements", be, k);
    return CK_PTRS(be, k, "x,rstd,dy,dx", a->x, a->rstd, a->dy, a->dx);
}

static inline ca_status ca_kcheck_rope(const char *be, const ca_rope_args *a) {
    const char *k = "rope";
    CK_TRY(ca_kcheck_float(be, k, "tensor", a->dt));
    if (a->batch < 0 || a->heads < 0 || a->seq < 0 || a->dim < 0)
        return CK_ERR("%s kernel %s: negative shape [%lld, %lld, %lld, %lld]", be, k, (long long)a->batch,
                      (long long)a->heads, (long long)a->seq, (long long)a->dim);
    if (a->rot < 2 || a->rot % 2 || a->rot > a->dim)
        return CK_ERR("%s kernel %s: rotary dims %lld must be even, at least 2 and at most the head dim %lld", be, k,
                      (long long)a->rot, (long long)a->dim);
    if (a->table_batch != 1 && a->table_batch != a->batch)
        return CK_ERR("%s kernel %s: the tables hold %lld batches; 1 or the batch %lld", be, k,
                      (long long)a->table_batch, (long long)a->batch);
    if (a->batch * a->heads * a->seq == 0) return CA_OK;
    return CK_PTRS(be, k, "x,cos,sin,y", a->x, a->cos, a->sin, a->y);
}

static inline ca_status ca_kcheck_swiglu(const char *be, const ca_swiglu_args *a) {
    CK_TRY(ca_kcheck_float(be, "swiglu", "tensor", a->dt));
    if (a->n < 0) return CK_ERR("%s kernel swiglu: negative length %lld", be, (long long)a->n);
    return a->n ? CK_PTRS(be, "swiglu", "gate,up,y", a->gate, a->up, a->y) : CA_OK;
}

static inline ca_status ca_kcheck_swiglu_backward(const char *be, const ca_swiglu_backward_args *a) {
    const char *k = "swiglu_backward";
    CK_TRY(ca_kcheck_float(be, k, "tensor", a->dt));
    if (a->n < 0) return CK_ERR("%s kernel %s: negative length %lld", be, k, (long long)a->n);
    if (a->n == 0) return CA_OK;
    if (!a->dgate && !a->dup) return CK_ERR("%s kernel %s: dgate and dup are both NULL", be, k);
    return CK_PTRS(be, k, "gate,up,dy", a->gate, a->up, a->dy);
}

/* The check table: one function per slot of CA_KERNEL_LIST (a slot without its ca_kcheck_<slot>
 * does not compile), called with a copy of the caller's args whose struct_size is this build's. */
#define CA_KCHECKED_(slot)                                                                              \
    static inline ca_status ca_kernel_checked_##slot(const char *backend, const ca_kernels *k, void *ctx, \
                                                     const ca_##slot##_args *args) {                    \
        if (!args) return ca_error(CA_ERR_INVALID, "%s kernel %s: args is NULL", backend, #slot);       \
        ca_##slot##_args c_ = *args;                                                                    \
        c_.struct_size = sizeof c_;                                                                     \
        ca_status s_ = ca_kcheck_##slot(backend, &c_);                                                  \
        return s_ != CA_OK ? s_ : k->slot(ctx, &c_);                                                    \
    }
CA_KERNEL_LIST(CA_KCHECKED_)
#undef CA_KCHECKED_

#undef CK_ERR
#undef CK_IDX
#undef CK_NEG
#undef CK_TRY
#undef CK_NARGS_
#undef CK_NARGS2_
#undef CK_FIRST6_
#undef CK_PTRS

#endif
