/* The lazy device's kernel table: every call records a node (slot, a copy of its arguments,
 * references to device memory with their element types, structural attributes) that runs later on the executor. */
#include "backends/xla_stub/xla_impl.h"

#include <stdlib.h>
#include <string.h>

#define SZ(dt) ((uint64_t)ca_dtype_size(dt))
#define N0(v) ((v) > 0 ? (uint64_t)(v) : 0)

/* Node prologue/epilogue: B opens node n of slot S on device x and copies the call's args `a`; R/W add references to the device
 * address held in field f of the node's copied arguments (the executor puts the memory's address
 * there before the node runs); K adds a
 * structural attribute (part of the cache key: shapes, dtypes, enums; never float scalars,
 * seeds or pointers, which are the program's runtime parameters). */
#define B(S) xla_dev *x = dev; xnode *n = xla_node_begin(x, XS_##S); ca_status s = CA_OK; n->a.S = *a
#define R(f, bytes, dt) if (s == CA_OK) s = xla_ref(x, n, n->a.f, XLA_FIELD(n, f), NULL, bytes, XR_READ, (int)(dt), #f)
#define W(f, bytes, fl, dt) \
    if (s == CA_OK) s = xla_ref(x, n, n->a.f, XLA_FIELD(n, f), NULL, bytes, XR_WRITE | (fl), (int)(dt), #f)
#define K(v) xla_key(x, n, (int64_t)(v))
#define E() return xla_node_end(x, n, s)
/* an output that is read first unless beta == 0 */
#define OUT(p, bytes, beta, dt) W(p, bytes, (beta) == 0 ? XR_FULL : XR_READ, dt)

static void key_bcast(xla_dev *x, xnode *n, const ca_bcast_args *b) {
    K(b->ndim);
    for (int i = 0; i < b->ndim && i < CA_MAX_DIMS; i++) {
        K(b->shape[i]); K(b->a_stride[i]); K(b->b_stride[i]);
    }
}

static uint64_t bcast_numel(const ca_bcast_args *b) {
    uint64_t e = 1;
    for (int i = 0; i < b->ndim; i++) e *= N0(b->shape[i]);
    return e;
}

static ca_status x_gemm(void *dev, const ca_gemm_args *a) {
    B(gemm);
    const ca_gemm_args *g = a;
    K(g->trans_a); K(g->trans_b); K(g->m); K(g->n); K(g->k); K(g->a_dtype); K(g->b_dtype); K(g->c_dtype);
    K(g->lda); K(g->ldb); K(g->ldc); K(g->stride_a); K(g->stride_b); K(g->stride_c); K(g->batch);
    K(g->allow_tf32); K(g->beta == 0);
    R(gemm.a, 0, g->a_dtype);
    R(gemm.b, 0, g->b_dtype);
    bool dense = g->batch <= 1 && g->ldc == g->n;
    OUT(gemm.c, dense ? N0(g->m) * N0(g->n) * SZ(g->c_dtype) : 0, g->beta, g->c_dtype);
    E();
}

static ca_status x_fill(void *dev, const ca_fill_args *a) {
    B(fill);
    K(a->dt); K(a->n);
    W(fill.y, N0(a->n) * SZ(a->dt), XR_FULL, a->dt);
    E();
}

static ca_status x_cast(void *dev, const ca_cast_args *a) {
    B(cast);
    K(a->src_dt); K(a->dst_dt); K(a->n);
    R(cast.x, N0(a->n) * SZ(a->src_dt), a->src_dt);
    W(cast.y, N0(a->n) * SZ(a->dst_dt), a->x == a->y ? XR_READ : XR_FULL, a->dst_dt);
    E();
}

/* The shape and strides are copied with the node (xla_fix_args points the args at them). */
static ca_status x_copy_strided(void *dev, const ca_copy_strided_args *a) {
    B(copy_strided);
    int nd = a->ndim;
    if (nd > 0) {
        memcpy(n->a.copy.shape, a->shape, (size_t)nd * sizeof *a->shape);
        memcpy(n->a.copy.xs, a->x_stride, (size_t)nd * sizeof *a->x_stride);
        memcpy(n->a.copy.ys, a->y_stride, (size_t)nd * sizeof *a->y_stride);
    }
    K(a->dt); K(nd);
    for (int i = 0; i < nd; i++) { K(a->shape[i]); K(a->x_stride[i]); K(a->y_stride[i]); }
    R(copy_strided.x, 0, a->dt);
    W(copy_strided.y, 0, 0, a->dt);
    E();
}

static ca_status x_unary(void *dev, const ca_unary_args *a) {
    B(unary);
    K(a->op); K(a->dt); K(a->n);
    R(unary.x, N0(a->n) * SZ(a->dt), a->dt);
    W(unary.y, N0(a->n) * SZ(a->dt), a->x == a->y ? XR_READ : XR_FULL, a->dt);
    E();
}

static ca_status x_unary_backward(void *dev, const ca_unary_backward_args *a) {
    B(unary_backward);
    K(a->op); K(a->dt); K(a->n); K(a->beta == 0); K(a->x != NULL); K(a->y != NULL);
    R(unary_backward.x, 0, a->dt);
    R(unary_backward.y, 0, a->dt);
    R(unary_backward.dy, 0, a->dt);
    bool alias = a->dx == a->x || a->dx == a->y || a->dx == a->dy;
    OUT(unary_backward.dx, N0(a->n) * SZ(a->dt), alias ? 1 : a->beta, a->dt);
    E();
}

static ca_status x_binary(void *dev, const ca_binary_args *a) {
    B(binary);
    K(a->op); K(a->dt); key_bcast(x, n, &a->shape);
    R(binary.a, 0, a->dt);
    R(binary.b, 0, a->dt);
    W(binary.y, bcast_numel(&a->shape) * SZ(a->dt), a->y == a->a || a->y == a->b ? XR_READ : XR_FULL, a->dt);
    E();
}

static ca_status x_axpby(void *dev, const ca_axpby_args *a) {
    B(axpby);
    K(a->dt); K(a->n); K(a->beta == 0);
    R(axpby.x, N0(a->n) * SZ(a->dt), a->dt);
    OUT(axpby.y, N0(a->n) * SZ(a->dt), a->x == a->y ? 1 : a->beta, a->dt);
    E();
}

static ca_status x_reduce(void *dev, const ca_reduce_args *a) {
    B(reduce);
    K(a->op); K(a->dt); K(a->outer); K(a->len); K(a->inner); K(a->beta == 0);
    R(reduce.x, 0, a->dt);
    OUT(reduce.y, N0(a->outer) * N0(a->inner) * SZ(a->dt), a->x == a->y ? 1 : a->beta, a->dt);
    E();
}

static ca_status x_argmax(void *dev, const ca_argmax_args *a) {
    B(argmax);
    K(a->dt); K(a->rows); K(a->cols);
    R(argmax.x, 0, a->dt);
    W(argmax.idx, N0(a->rows) * sizeof(int64_t), XR_FULL, CA_I64);
    E();
}

static ca_status x_softmax(void *dev, const ca_softmax_args *a) {
    B(softmax);
    K(a->log); K(a->dt); K(a->rows); K(a->cols);
    R(softmax.x, 0, a->dt);
    W(softmax.y, N0(a->rows) * N0(a->cols) * SZ(a->dt), a->x == a->y ? XR_READ : XR_FULL, a->dt);
    E();
}

static ca_status x_softmax_backward(void *dev, const ca_softmax_backward_args *a) {
    B(softmax_backward);
    K(a->log); K(a->dt); K(a->rows); K(a->cols); K(a->beta == 0);
    R(softmax_backward.y, 0, a->dt);
    R(softmax_backward.dy, 0, a->dt);
    OUT(softmax_backward.dx, N0(a->rows) * N0(a->cols) * SZ(a->dt), a->dx == a->y || a->dx == a->dy ? 1 : a->beta,
        a->dt);
    E();
}

static ca_status x_cross_entropy(void *dev, const ca_cross_entropy_args *a) {
    B(cross_entropy);
    K(a->dt); K(a->rows); K(a->cols); K(a->label_dt); K(a->ignore_index);
    R(cross_entropy.logits, 0, a->dt);
    R(cross_entropy.labels, 0, a->label_dt);
    W(cross_entropy.loss, sizeof(float), XR_FULL, CA_F32);
    W(cross_entropy.lse, N0(a->rows) * sizeof(float), XR_FULL, CA_F32);
    W(cross_entropy.count, sizeof(float), XR_FULL, CA_F32);
    E();
}

static ca_status x_cross_entropy_backward(void *dev, const ca_cross_entropy_backward_args *a) {
    B(cross_entropy_backward);
    K(a->dt); K(a->rows); K(a->cols); K(a->label_dt); K(a->ignore_index); K(a->beta == 0);
    R(cross_entropy_backward.logits, 0, a->dt);
    R(cross_entropy_backward.lse, 0, CA_F32);
    R(cross_entropy_backward.labels, 0, a->label_dt);
    R(cross_entropy_backward.dloss, 0, CA_F32);
    R(cross_entropy_backward.count, 0, CA_F32);
    OUT(cross_entropy_backward.dlogits, N0(a->rows) * N0(a->cols) * SZ(a->dt), a->dlogits == a->logits ? 1 : a->beta,
        a->dt);
    E();
}

static ca_status x_layer_norm(void *dev, const ca_layer_norm_args *a) {
    B(layer_norm);
    K(a->dt); K(a->rows); K(a->cols); K(a->gamma != NULL); K(a->beta_ != NULL);
    R(layer_norm.x, 0, a->dt);
    R(layer_norm.gamma, 0, a->dt);
    R(layer_norm.beta_, 0, a->dt);
    W(layer_norm.y, N0(a->rows) * N0(a->cols) * SZ(a->dt), a->y == a->x ? XR_READ : XR_FULL, a->dt);
    W(layer_norm.mean, N0(a->rows) * sizeof(float), XR_FULL, CA_F32);
    W(layer_norm.rstd, N0(a->rows) * sizeof(float), XR_FULL, CA_F32);
    E();
}

static ca_status x_layer_norm_backward(void *dev, const ca_layer_norm_backward_args *a) {
    B(layer_norm_backward);
    K(a->dt); K(a->rows); K(a->cols); K(a->gamma != NULL); K(a->beta == 0); K(a->accumulate_params);
    K(a->dgamma != NULL); K(a->dbeta_ != NULL);
    R(layer_norm_backward.x, 0, a->dt);
    R(layer_norm_backward.gamma, 0, a->dt);
    R(layer_norm_backward.mean, 0, CA_F32);
    R(layer_norm_backward.rstd, 0, CA_F32);
    R(layer_norm_backward.dy, 0, a->dt);
    W(layer_norm_backward.dx, 0, XR_READ, a->dt);
    W(layer_norm_backward.dgamma, 0, XR_READ, a->dt);
    W(layer_norm_backward.dbeta_, 0, XR_READ, a->dt);
    E();
}

static ca_status x_embedding(void *dev, const ca_embedding_args *a) {
    B(embedding);
    K(a->dt); K(a->n); K(a->rows); K(a->dim); K(a->idx_dt);
    R(embedding.table, 0, a->dt);
    R(embedding.idx, 0, a->idx_dt);
    W(embedding.y, N0(a->n) * N0(a->dim) * SZ(a->dt), XR_FULL, a->dt);
    E();
}

static ca_status x_embedding_backward(void *dev, const ca_embedding_backward_args *a) {
    B(embedding_backward);
    K(a->dt); K(a->n); K(a->rows); K(a->dim); K(a->idx_dt);
    R(embedding_backward.idx, 0, a->idx_dt);
    R(embedding_backward.dy, 0, a->dt);
    W(embedding_backward.dtable, 0, XR_READ, a->dt);
    E();
}

static ca_status x_rng(void *dev, const ca_rng_args *a) {
    B(rng);
    K(a->kind); K(a->dt); K(a->n);
    W(rng.y, N0(a->n) * SZ(a->dt), XR_FULL, a->dt);
    E();
}

static ca_status x_dropout(void *dev, const ca_dropout_args *a) {
    B(dropout);
    K(a->dt); K(a->n);
    R(dropout.x, 0, a->dt);
    W(dropout.y, N0(a->n) * SZ(a->dt), a->y == a->x ? XR_READ : XR_FULL, a->dt);
    W(dropout.mask, N0(a->n), XR_FULL, CA_U8);
    E();
}

static ca_status x_dropout_backward(void *dev, const ca_dropout_backward_args *a) {
    B(dropout_backward);
    K(a->dt); K(a->n); K(a->beta == 0);
    R(dropout_backward.mask, 0, CA_U8);
    R(dropout_backward.dy, 0, a->dt);
    OUT(dropout_backward.dx, N0(a->n) * SZ(a->dt), a->dx == a->dy ? 1 : a->beta, a->dt);
    E();
}

/* Copies a tensor list into one block owned by the node; references every tensor. */
/* pdt: the element type of t->param (f32 parameters for the updates; the gradients' type for the
 * list kernels that take gradients in t->param). */
static ca_status copy_list(xla_dev *x, xnode *n, const ca_tensor_list *t, int param_flags, ca_dtype pdt) {
    int c = t->count > 0 ? t->count : 0;
    size_t ptrs = (size_t)c * sizeof(void *);
    char *mem = malloc(4 * ptrs + (size_t)c * sizeof(int64_t) + 1);
    if (!mem) return ca_error(CA_ERR_NOMEM, "xla: out of host memory recording a tensor list of %d", c);
    xlist *l = &n->a.list.l;
    l->mem = mem;
    l->t = *t;
    void **p = (void **)mem, **g = p + c, **s1 = g + c, **s2 = s1 + c;
    int64_t *numel = (int64_t *)(s2 + c);
    for (int i = 0; i < c; i++) {
        p[i] = t->param ? t->param[i] : NULL;
        g[i] = t->grad ? (void *)t->grad[i] : NULL;
        s1[i] = t->state1 ? t->state1[i] : NULL;
        s2[i] = t->state2 ? t->state2[i] : NULL;
        numel[i] = t->numel ? t->numel[i] : 0;
    }
    l->t.param = t->param ? p : NULL;
    l->t.grad = t->grad ? (const void *const *)g : NULL;
    l->t.state1 = t->state1 ? s1 : NULL;
    l->t.state2 = t->state2 ? s2 : NULL;
    l->t.numel = t->numel ? numel : NULL;
    K(c); K(t->grad_dtype); K(t->grad != NULL); K(t->state1 != NULL); K(t->state2 != NULL);
    ca_status s = CA_OK;
    for (int i = 0; i < c && s == CA_OK; i++) {
        K(numel[i]);
        if (p[i]) s = xla_ref(x, n, p[i], -1, &p[i], 0, param_flags, (int)pdt, "param");
        if (s == CA_OK && g[i]) s = xla_ref(x, n, g[i], -1, &g[i], 0, XR_READ, (int)t->grad_dtype, "grad");
        if (s == CA_OK && s1[i]) s = xla_ref(x, n, s1[i], -1, &s1[i], 0, XR_READ | XR_WRITE, CA_F32, "state1");
        if (s == CA_OK && s2[i]) s = xla_ref(x, n, s2[i], -1, &s2[i], 0, XR_READ | XR_WRITE, CA_F32, "state2");
    }
    return s;
}

/* A list kernel's node: the args and a copy of their tensor list (xla_fix_args points args->t at it). */
#define LIST(S, flags, pdt) B(S); if (s == CA_OK) s = copy_list(x, n, a->t, flags, pdt)

static ca_status x_adamw(void *dev, const ca_adamw_args *a) {
    LIST(adamw, XR_READ | XR_WRITE, CA_F32);
    E();
}

static ca_status x_sgd(void *dev, const ca_sgd_args *a) {
    LIST(sgd, XR_READ | XR_WRITE, CA_F32);   /* first_step is a runtime flag of the update, not of the program */
    K(a->nesterov);
    E();
}

static ca_status x_sum_squares(void *dev, const ca_sum_squares_args *a) {
    LIST(sum_squares, XR_READ, a->t->grad_dtype);
    K(a->beta == 0);
    OUT(sum_squares.out, sizeof(float), a->beta, CA_F32);
    E();
}

static ca_status x_scale_list(void *dev, const ca_scale_list_args *a) {
    LIST(scale_list, XR_READ | XR_WRITE, a->t->grad_dtype);
    E();
}

static ca_status x_unscale_check(void *dev, const ca_unscale_check_args *a) {
    LIST(unscale_check, XR_READ | XR_WRITE, a->t->grad_dtype);
    W(unscale_check.found_inf, 0, XR_READ, CA_F32);
    E();
}

static ca_status x_clamp_list(void *dev, const ca_clamp_list_args *a) {
    LIST(clamp_list, XR_READ | XR_WRITE, a->t->grad_dtype);
    E();
}

static void key_attention(xla_dev *x, xnode *n, ca_dtype dt, const ca_attention_params *a) {
    K(dt); K(a->batch); K(a->heads); K(a->tq); K(a->tk); K(a->d); K(a->dv); K(a->causal);
    K(a->dropout_p == 0); K(a->mask != NULL); K(a->mask_dtype);
    for (int i = 0; i < 4; i++) K(a->mask_stride[i]);
}

/* The strides of a call's tensors (ABI 3.10), copied with its args. */
static void key_layout(xla_dev *x, xnode *n, const ca_attention_layout *l) {
    const int64_t *t[4] = {l->q, l->k, l->v, l->o};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) K(t[i][j]);
}

static ca_status x_attention(void *dev, const ca_attention_args *a) {
    B(attention);
    key_attention(x, n, a->dt, &a->p);
    key_layout(x, n, &a->st);
    K(a->kv_heads); K(a->stream_heads); K(a->stream_head0);
    R(attention.p.mask, 0, a->p.mask_dtype);
    R(attention.q, 0, a->dt);
    R(attention.k, 0, a->dt);
    R(attention.v, 0, a->dt);
    W(attention.out, 0, 0, a->dt);
    W(attention.lse, 0, 0, CA_F32);
    E();
}

static ca_status x_attention_backward(void *dev, const ca_attention_backward_args *a) {
    B(attention_backward);
    key_attention(x, n, a->dt, &a->p);
    key_layout(x, n, &a->st);
    key_layout(x, n, &a->dst);
    K(a->kv_heads); K(a->stream_heads); K(a->stream_head0);
    R(attention_backward.p.mask, 0, a->p.mask_dtype);
    R(attention_backward.q, 0, a->dt);
    R(attention_backward.k, 0, a->dt);
    R(attention_backward.v, 0, a->dt);
    R(attention_backward.out, 0, a->dt);
    R(attention_backward.dout, 0, a->dt);
    R(attention_backward.lse, 0, CA_F32);
    W(attention_backward.dq, 0, 0, a->dt);
    W(attention_backward.dk, 0, 0, a->dt);
    W(attention_backward.dv, 0, 0, a->dt);
    E();
}

/* cond_stride is copied with the node (xla_fix_args points the args at it). */
static ca_status x_where(void *dev, const ca_where_args *a) {
    B(where);
    K(a->dt); key_bcast(x, n, &a->shape);
    for (int i = 0; i < a->shape.ndim; i++) {
        n->a.where_x.cond_stride[i] = a->cond_stride[i];
        K(a->cond_stride[i]);
    }
    R(where.cond, 0, CA_U8);
    R(where.a, 0, a->dt);
    R(where.b, 0, a->dt);
    W(where.y, bcast_numel(&a->shape) * SZ(a->dt), a->y == a->a || a->y == a->b ? XR_READ : XR_FULL, a->dt);
    E();
}

static ca_status x_gather(void *dev, const ca_gather_args *a) {
    B(gather);
    K(a->dt); K(a->outer); K(a->len); K(a->inner); K(a->n); K(a->idx_dt);
    R(gather.x, 0, a->dt);
    R(gather.idx, 0, a->idx_dt);
    W(gather.y, N0(a->outer) * N0(a->n) * N0(a->inner) * SZ(a->dt), XR_FULL, a->dt);
    E();
}

static ca_status x_gather_backward(void *dev, const ca_gather_backward_args *a) {
    B(gather_backward);
    K(a->dt); K(a->outer); K(a->len); K(a->inner); K(a->n); K(a->idx_dt);
    R(gather_backward.idx, 0, a->idx_dt);
    R(gather_backward.dy, 0, a->dt);
    W(gather_backward.dx, 0, XR_READ, a->dt);
    E();
}

static ca_status x_rms_norm(void *dev, const ca_rms_norm_args *a) {
    B(rms_norm);
    K(a->dt); K(a->rows); K(a->cols); K(a->gamma != NULL);
    R(rms_norm.x, 0, a->dt);
    R(rms_norm.gamma, 0, a->dt);
    W(rms_norm.y, N0(a->rows) * N0(a->cols) * SZ(a->dt), a->y == a->x ? XR_READ : XR_FULL, a->dt);
    W(rms_norm.rstd, N0(a->rows) * sizeof(float), XR_FULL, CA_F32);
    E();
}

static ca_status x_rms_norm_backward(void *dev, const ca_rms_norm_backward_args *a) {
    B(rms_norm_backward);
    K(a->dt); K(a->rows); K(a->cols); K(a->gamma != NULL); K(a->beta == 0); K(a->accumulate_params);
    K(a->dgamma != NULL);
    R(rms_norm_backward.x, 0, a->dt);
    R(rms_norm_backward.gamma, 0, a->dt);
    R(rms_norm_backward.rstd, 0, CA_F32);
    R(rms_norm_backward.dy, 0, a->dt);
    W(rms_norm_backward.dx, 0, XR_READ, a->dt);
    W(rms_norm_backward.dgamma, 0, XR_READ, a->dt);
    E();
}

/* y may be x (read) or accumulated into (beta != 0). */
static ca_status x_rope(void *dev, const ca_rope_args *a) {
    B(rope);
    K(a->dt); K(a->batch); K(a->heads); K(a->seq); K(a->dim); K(a->rot); K(a->table_batch); K(a->inverse);
    K(a->beta == 0);
    uint64_t bytes = N0(a->batch) * N0(a->heads) * N0(a->seq) * N0(a->dim) * SZ(a->dt);
    R(rope.x, bytes, a->dt);
    R(rope.cos, 0, CA_F32);
    R(rope.sin, 0, CA_F32);
    OUT(rope.y, bytes, a->y == a->x ? 1 : a->beta, a->dt);
    E();
}

static ca_status x_swiglu(void *dev, const ca_swiglu_args *a) {
    B(swiglu);
    K(a->dt); K(a->n);
    R(swiglu.gate, N0(a->n) * SZ(a->dt), a->dt);
    R(swiglu.up, N0(a->n) * SZ(a->dt), a->dt);
    W(swiglu.y, N0(a->n) * SZ(a->dt), XR_FULL, a->dt);
    E();
}

static ca_status x_swiglu_backward(void *dev, const ca_swiglu_backward_args *a) {
    B(swiglu_backward);
    K(a->dt); K(a->n); K(a->dgate != NULL); K(a->dup != NULL); K(a->beta_gate == 0); K(a->beta_up == 0);
    uint64_t bytes = N0(a->n) * SZ(a->dt);
    R(swiglu_backward.gate, bytes, a->dt);
    R(swiglu_backward.up, bytes, a->dt);
    R(swiglu_backward.dy, bytes, a->dt);
    OUT(swiglu_backward.dgate, bytes, a->beta_gate, a->dt);
    OUT(swiglu_backward.dup, bytes, a->beta_up, a->dt);
    E();
}

/* The table: x_<slot> for every slot of CA_KERNEL_LIST. */
#define X_SLOT(slot) .slot = x_##slot,
const ca_kernels xla_kernels = {
    .struct_size = sizeof(ca_kernels),
    .abi_version = CA_ABI_VERSION,
    CA_KERNEL_LIST(X_SLOT)
};
#undef X_SLOT

/* ------------------------------------------------------------------ execution */

/* Points the pointers of a node's args that lead to data copied with the node (the node array
 * moves as it grows) at those copies. */
static void fix_args(xargs *a, xslot slot) {
    switch (slot) {
    case XS_copy_strided:
        a->copy_strided.shape = a->copy.shape;
        a->copy_strided.x_stride = a->copy.xs;
        a->copy_strided.y_stride = a->copy.ys;
        break;
    case XS_where: a->where.cond_stride = a->where_x.cond_stride; break;
    case XS_adamw: a->adamw.t = &a->list.l.t; break;
    case XS_sgd: a->sgd.t = &a->list.l.t; break;
    case XS_sum_squares: a->sum_squares.t = &a->list.l.t; break;
    case XS_scale_list: a->scale_list.t = &a->list.l.t; break;
    case XS_unscale_check: a->unscale_check.t = &a->list.l.t; break;
    case XS_clamp_list: a->clamp_list.t = &a->list.l.t; break;
    default: break;
    }
}

/* Lines [lo, hi) of COPY_LINE bytes of a copy whose source and destination are apart. */
#define COPY_LINE 64
typedef struct copy_job {
    void *dst;
    const void *src;
    size_t bytes;
} copy_job;

static void copy_range(void *ctx, int64_t lo, int64_t hi) {
    const copy_job *j = ctx;
    size_t from = (size_t)lo * COPY_LINE, to = (size_t)hi * COPY_LINE;
    if (to > j->bytes) to = j->bytes;
    memcpy((char *)j->dst + from, (const char *)j->src + from, to - from);
}

void xla_copy(const xla_dev *x, void *dst, const void *src, size_t bytes) {
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (d + bytes <= s || s + bytes <= d) {   /* apart: shared among threads, a line costing 16 floats */
        copy_job j = {dst, src, bytes};
        x->parallel_for((int64_t)((bytes + COPY_LINE - 1) / COPY_LINE), COPY_LINE / 4, copy_range, &j);
    } else if (d != s) {
        memmove(dst, src, bytes);
    }
}

/* Calls the executor's kernel for node n with its recorded arguments. */
ca_status xla_exec_node(xla_dev *x, const xnode *n) {
    const ca_kernels *k = x->k;
    void *c = x->exec_ctx;
    xargs a = n->a;
    fix_args(&a, n->slot);
#define X_EXEC(slot) case XS_##slot: return k->slot(c, &a.slot);
    switch (n->slot) {
    CA_KERNEL_LIST(X_EXEC)
    case XS_MEMCPY:
        xla_copy(x, a.memcpy.dst, a.memcpy.src, a.memcpy.bytes);
        return CA_OK;
    case XS_HOST:   /* the function frees its context as it runs (exec_one forgets it) */
        return a.host.ctx ? a.host.fn(a.host.ctx, true, a.host.in, a.host.out)
                          : ca_error(CA_ERR_STATE, "xla: a host function ran twice");
    case XS_COUNT: break;
    }
#undef X_EXEC
    return ca_error(CA_ERR_INVALID, "xla: unknown node kind %d", (int)n->slot);
}

const char *xla_slot_name(xslot s) {
#define X_NAME(slot) #slot,
    static const char *const names[] = {CA_KERNEL_LIST(X_NAME) "memcpy", "host_fn"};
#undef X_NAME
    CA_TABLE_COVERS(names, XS_COUNT);
    return (unsigned)s < XS_COUNT ? names[s] : "?";
}
