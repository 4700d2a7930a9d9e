/* The lazy device's kernel table: every call records a node (slot, a copy of its arguments,
 * references to device memory with their element types, structural attributes) that runs later on the executor. */
#include "backends/xla_stub/xla_impl.h"

#include <stdlib.h>
#include <string.h>

#define SZ(dt) ((uint64_t)ca_dtype_size(dt))
#define N0(v) ((v) > 0 ? (uint64_t)(v) : 0)

/* Node prologue/epilogue: B opens node n of slot S on device x; R/W add references to the device
 * address held in field f of the node's copied arguments (the executor puts the memory's address
 * there before the node runs); K adds a
 * structural attribute (part of the cache key: shapes, dtypes, enums; never float scalars,
 * seeds or pointers, which are the program's runtime parameters). */
#define B(S) xla_dev *x = dev; xnode *n = xla_node_begin(x, S); ca_status s = CA_OK
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

static ca_status x_gemm(void *dev, const ca_gemm_args *g) {
    B(XS_GEMM);
    n->a.gemm = *g;
    K(g->trans_a); K(g->trans_b); K(g->m); K(g->n); K(g->k); K(g->a_dtype); K(g->b_dtype); K(g->c_dtype);
    K(g->lda); K(g->ldb); K(g->ldc); K(g->stride_a); K(g->stride_b); K(g->stride_c); K(g->batch);
    K(g->allow_tf32); K(g->beta == 0);
    R(gemm.a, 0, g->a_dtype);
    R(gemm.b, 0, g->b_dtype);
    bool dense = g->batch <= 1 && g->ldc == g->n;
    OUT(gemm.c, dense ? N0(g->m) * N0(g->n) * SZ(g->c_dtype) : 0, g->beta, g->c_dtype);
    E();
}

static ca_status x_fill(void *dev, ca_dtype dt, int64_t cnt, double value, void *y) {
    B(XS_FILL);
    n->a.fill.dt = dt; n->a.fill.n = cnt; n->a.fill.value = value; n->a.fill.y = y;
    K(dt); K(cnt);
    W(fill.y, N0(cnt) * SZ(dt), XR_FULL, dt);
    E();
}

static ca_status x_cast(void *dev, ca_dtype src_dt, const void *xp, ca_dtype dst_dt, void *y, int64_t cnt,
                        float alpha) {
    B(XS_CAST);
    n->a.cast.src = src_dt; n->a.cast.dst = dst_dt; n->a.cast.x = xp; n->a.cast.y = y;
    n->a.cast.n = cnt; n->a.cast.alpha = alpha;
    K(src_dt); K(dst_dt); K(cnt);
    R(cast.x, N0(cnt) * SZ(src_dt), src_dt);
    W(cast.y, N0(cnt) * SZ(dst_dt), xp == y ? XR_READ : XR_FULL, dst_dt);
    E();
}

static ca_status x_copy_strided(void *dev, ca_dtype dt, int ndim, const int64_t *shape, const void *xp,
                                const int64_t *xs, void *y, const int64_t *ys) {
    B(XS_COPY_STRIDED);
    if (ndim < 0 || ndim > CA_MAX_DIMS) s = ca_error(CA_ERR_INVALID, "xla copy_strided: ndim %d", ndim);
    int nd = s == CA_OK ? ndim : 0;
    n->a.copy.dt = dt; n->a.copy.ndim = ndim; n->a.copy.x = xp; n->a.copy.y = y;
    memcpy(n->a.copy.shape, shape, (size_t)nd * sizeof *shape);
    memcpy(n->a.copy.xs, xs, (size_t)nd * sizeof *xs);
    memcpy(n->a.copy.ys, ys, (size_t)nd * sizeof *ys);
    K(dt); K(ndim);
    for (int i = 0; i < nd; i++) { K(shape[i]); K(xs[i]); K(ys[i]); }
    R(copy.x, 0, dt);
    W(copy.y, 0, 0, dt);
    E();
}

static ca_status x_unary(void *dev, ca_unary_op op, ca_dtype dt, int64_t cnt, const void *xp, void *y,
                         float alpha) {
    B(XS_UNARY);
    n->a.unary.op = op; n->a.unary.dt = dt; n->a.unary.n = cnt; n->a.unary.x = xp; n->a.unary.out = y;
    n->a.unary.alpha = alpha;
    K(op); K(dt); K(cnt);
    R(unary.x, N0(cnt) * SZ(dt), dt);
    W(unary.out, N0(cnt) * SZ(dt), xp == y ? XR_READ : XR_FULL, dt);
    E();
}

static ca_status x_unary_backward(void *dev, ca_unary_op op, ca_dtype dt, int64_t cnt, const void *xp,
                                  const void *y, const void *dy, void *dx, float alpha, float beta) {
    B(XS_UNARY_BACKWARD);
    n->a.unary.op = op; n->a.unary.dt = dt; n->a.unary.n = cnt; n->a.unary.x = xp; n->a.unary.y = y;
    n->a.unary.dy = dy; n->a.unary.out = dx; n->a.unary.alpha = alpha; n->a.unary.beta = beta;
    K(op); K(dt); K(cnt); K(beta == 0); K(xp != NULL); K(y != NULL);
    R(unary.x, 0, dt);
    R(unary.y, 0, dt);
    R(unary.dy, 0, dt);
    bool alias = dx == xp || dx == y || dx == dy;
    OUT(unary.out, N0(cnt) * SZ(dt), alias ? 1 : beta, dt);
    E();
}

static ca_status x_binary(void *dev, ca_binary_op op, ca_dtype dt, const ca_bcast_args *shape, const void *a,
                          const void *b, void *y) {
    B(XS_BINARY);
    n->a.binary.op = op; n->a.binary.dt = dt; n->a.binary.shape = *shape;
    n->a.binary.a = a; n->a.binary.b = b; n->a.binary.y = y;
    K(op); K(dt); key_bcast(x, n, shape);
    R(binary.a, 0, dt);
    R(binary.b, 0, dt);
    W(binary.y, bcast_numel(shape) * SZ(dt), y == a || y == b ? XR_READ : XR_FULL, dt);
    E();
}

static ca_status x_axpby(void *dev, ca_dtype dt, int64_t cnt, float alpha, const void *xp, float beta, void *y) {
    B(XS_AXPBY);
    n->a.axpby.dt = dt; n->a.axpby.n = cnt; n->a.axpby.alpha = alpha; n->a.axpby.beta = beta;
    n->a.axpby.x = xp; n->a.axpby.y = y;
    K(dt); K(cnt); K(beta == 0);
    R(axpby.x, N0(cnt) * SZ(dt), dt);
    OUT(axpby.y, N0(cnt) * SZ(dt), xp == y ? 1 : beta, dt);
    E();
}

static ca_status x_reduce(void *dev, ca_reduce_op op, ca_dtype dt, int64_t outer, int64_t len, int64_t inner,
                          const void *xp, void *y, float beta) {
    B(XS_REDUCE);
    n->a.reduce.op = op; n->a.reduce.dt = dt; n->a.reduce.outer = outer; n->a.reduce.len = len;
    n->a.reduce.inner = inner; n->a.reduce.x = xp; n->a.reduce.y = y; n->a.reduce.beta = beta;
    K(op); K(dt); K(outer); K(len); K(inner); K(beta == 0);
    R(reduce.x, 0, dt);
    OUT(reduce.y, N0(outer) * N0(inner) * SZ(dt), xp == y ? 1 : beta, dt);
    E();
}

static ca_status x_argmax(void *dev, ca_dtype dt, int64_t rows, int64_t cols, const void *xp, int64_t *idx) {
    B(XS_ARGMAX);
    n->a.softmax.dt = dt; n->a.softmax.rows = rows; n->a.softmax.cols = cols; n->a.softmax.x = xp;
    n->a.softmax.idx = idx;
    K(dt); K(rows); K(cols);
    R(softmax.x, 0, dt);
    W(softmax.idx, N0(rows) * sizeof(int64_t), XR_FULL, CA_I64);
    E();
}

static ca_status x_softmax(void *dev, bool log, ca_dtype dt, int64_t rows, int64_t cols, const void *xp, void *y) {
    B(XS_SOFTMAX);
    n->a.softmax.log = log; n->a.softmax.dt = dt; n->a.softmax.rows = rows; n->a.softmax.cols = cols;
    n->a.softmax.x = xp; n->a.softmax.out = y;
    K(log); K(dt); K(rows); K(cols);
    R(softmax.x, 0, dt);
    W(softmax.out, N0(rows) * N0(cols) * SZ(dt), xp == y ? XR_READ : XR_FULL, dt);
    E();
}

static ca_status x_softmax_backward(void *dev, bool log, ca_dtype dt, int64_t rows, int64_t cols, const void *y,
                                    const void *dy, void *dx, float beta) {
    B(XS_SOFTMAX_BACKWARD);
    n->a.softmax.log = log; n->a.softmax.dt = dt; n->a.softmax.rows = rows; n->a.softmax.cols = cols;
    n->a.softmax.y = y; n->a.softmax.dy = dy; n->a.softmax.out = dx; n->a.softmax.beta = beta;
    K(log); K(dt); K(rows); K(cols); K(beta == 0);
    R(softmax.y, 0, dt);
    R(softmax.dy, 0, dt);
    OUT(softmax.out, N0(rows) * N0(cols) * SZ(dt), dx == y || dx == dy ? 1 : beta, dt);
    E();
}

static ca_status x_cross_entropy(void *dev, ca_dtype dt, int64_t rows, int64_t cols, const void *logits,
                                 ca_dtype label_dt, const void *labels, int64_t ignore, float *loss, float *lse,
                                 float *count) {
    B(XS_CROSS_ENTROPY);
    n->a.ce.dt = dt; n->a.ce.rows = rows; n->a.ce.cols = cols; n->a.ce.logits = logits;
    n->a.ce.label_dt = label_dt; n->a.ce.labels = labels; n->a.ce.ignore = ignore;
    n->a.ce.loss = loss; n->a.ce.lse = lse; n->a.ce.count = count;
    K(dt); K(rows); K(cols); K(label_dt); K(ignore);
    R(ce.logits, 0, dt);
    R(ce.labels, 0, label_dt);
    W(ce.loss, sizeof(float), XR_FULL, CA_F32);
    W(ce.lse, N0(rows) * sizeof(float), XR_FULL, CA_F32);
    W(ce.count, sizeof(float), XR_FULL, CA_F32);
    E();
}

static ca_status x_cross_entropy_backward(void *dev, ca_dtype dt, int64_t rows, int64_t cols, const void *logits,
                                          const float *lse, ca_dtype label_dt, const void *labels, int64_t ignore,
                                          const float *dloss, const float *count, void *dlogits, float beta) {
    B(XS_CROSS_ENTROPY_BACKWARD);
    n->a.ce.dt = dt; n->a.ce.rows = rows; n->a.ce.cols = cols; n->a.ce.logits = logits; n->a.ce.lse_in = lse;
    n->a.ce.label_dt = label_dt; n->a.ce.labels = labels; n->a.ce.ignore = ignore; n->a.ce.dloss = dloss;
    n->a.ce.count_in = count; n->a.ce.dlogits = dlogits; n->a.ce.beta = beta;
    K(dt); K(rows); K(cols); K(label_dt); K(ignore); K(beta == 0);
    R(ce.logits, 0, dt);
    R(ce.lse_in, 0, CA_F32);
    R(ce.labels, 0, label_dt);
    R(ce.dloss, 0, CA_F32);
    R(ce.count_in, 0, CA_F32);
    OUT(ce.dlogits, N0(rows) * N0(cols) * SZ(dt), dlogits == logits ? 1 : beta, dt);
    E();
}

static ca_status x_layer_norm(void *dev, ca_dtype dt, int64_t rows, int64_t cols, const void *xp,
                              const void *gamma, const void *beta_, float eps, void *y, float *mean, float *rstd) {
    B(XS_LAYER_NORM);
    n->a.ln.dt = dt; n->a.ln.rows = rows; n->a.ln.cols = cols; n->a.ln.x = xp; n->a.ln.gamma = gamma;
    n->a.ln.beta_ = beta_; n->a.ln.eps = eps; n->a.ln.y = y; n->a.ln.mean = mean; n->a.ln.rstd = rstd;
    K(dt); K(rows); K(cols); K(gamma != NULL); K(beta_ != NULL);
    R(ln.x, 0, dt);
    R(ln.gamma, 0, dt);
    R(ln.beta_, 0, dt);
    W(ln.y, N0(rows) * N0(cols) * SZ(dt), y == xp ? XR_READ : XR_FULL, dt);
    W(ln.mean, N0(rows) * sizeof(float), XR_FULL, CA_F32);
    W(ln.rstd, N0(rows) * sizeof(float), XR_FULL, CA_F32);
    E();
}

static ca_status x_layer_norm_backward(void *dev, ca_dtype dt, int64_t rows, int64_t cols, const void *xp,
                                       const void *gamma, const float *mean, const float *rstd, const void *dy,
                                       void *dx, float beta, void *dgamma, void *dbeta_, bool accumulate) {
    B(XS_LAYER_NORM_BACKWARD);
    n->a.ln.dt = dt; n->a.ln.rows = rows; n->a.ln.cols = cols; n->a.ln.x = xp; n->a.ln.gamma = gamma;
    n->a.ln.mean_in = mean; n->a.ln.rstd_in = rstd; n->a.ln.dy = dy; n->a.ln.dx = dx; n->a.ln.beta = beta;
    n->a.ln.dgamma = dgamma; n->a.ln.dbeta_ = dbeta_; n->a.ln.accumulate = accumulate;
    K(dt); K(rows); K(cols); K(gamma != NULL); K(beta == 0); K(accumulate); K(dgamma != NULL); K(dbeta_ != NULL);
    R(ln.x, 0, dt);
    R(ln.gamma, 0, dt);
    R(ln.mean_in, 0, CA_F32);
    R(ln.rstd_in, 0, CA_F32);
    R(ln.dy, 0, dt);
    W(ln.dx, 0, XR_READ, dt);
    W(ln.dgamma, 0, XR_READ, dt);
    W(ln.dbeta_, 0, XR_READ, dt);
    E();
}

static ca_status x_embedding(void *dev, ca_dtype dt, int64_t cnt, int64_t rows, int64_t dim, const void *table,
                             ca_dtype idx_dt, const void *idx, void *y) {
    B(XS_EMBEDDING);
    n->a.index.dt = dt; n->a.index.n = cnt; n->a.index.rows = rows; n->a.index.dim = dim;
    n->a.index.table = table; n->a.index.idx_dt = idx_dt; n->a.index.idx = idx; n->a.index.y = y;
    K(dt); K(cnt); K(rows); K(dim); K(idx_dt);
    R(index.table, 0, dt);
    R(index.idx, 0, idx_dt);
    W(index.y, N0(cnt) * N0(dim) * SZ(dt), XR_FULL, dt);
    E();
}

static ca_status x_embedding_backward(void *dev, ca_dtype dt, int64_t cnt, int64_t rows, int64_t dim,
                                      ca_dtype idx_dt, const void *idx, const void *dy, void *dtable) {
    B(XS_EMBEDDING_BACKWARD);
    n->a.index.dt = dt; n->a.index.n = cnt; n->a.index.rows = rows; n->a.index.dim = dim;
    n->a.index.idx_dt = idx_dt; n->a.index.idx = idx; n->a.index.dy = dy; n->a.index.y = dtable;
    K(dt); K(cnt); K(rows); K(dim); K(idx_dt);
    R(index.idx, 0, idx_dt);
    R(index.dy, 0, dt);
    W(index.y, 0, XR_READ, dt);
    E();
}

static ca_status x_rng(void *dev, ca_rng_kind kind, ca_dtype dt, int64_t cnt, uint64_t seed, uint64_t offset,
                       float a, float b, void *y) {
    B(XS_RNG);
    n->a.rng.kind = kind; n->a.rng.dt = dt; n->a.rng.n = cnt; n->a.rng.seed = seed; n->a.rng.offset = offset;
    n->a.rng.a = a; n->a.rng.b = b; n->a.rng.y = y;
    K(kind); K(dt); K(cnt);
    W(rng.y, N0(cnt) * SZ(dt), XR_FULL, dt);
    E();
}

static ca_status x_dropout(void *dev, ca_dtype dt, int64_t cnt, float p, uint64_t seed, uint64_t offset,
                           const void *xp, void *y, uint8_t *mask) {
    B(XS_DROPOUT);
    n->a.rng.dt = dt; n->a.rng.n = cnt; n->a.rng.p = p; n->a.rng.seed = seed; n->a.rng.offset = offset;
    n->a.rng.x = xp; n->a.rng.y = y; n->a.rng.mask = mask;
    K(dt); K(cnt);
    R(rng.x, 0, dt);
    W(rng.y, N0(cnt) * SZ(dt), y == xp ? XR_READ : XR_FULL, dt);
    W(rng.mask, N0(cnt), XR_FULL, CA_U8);
    E();
}

static ca_status x_dropout_backward(void *dev, ca_dtype dt, int64_t cnt, float p, const uint8_t *mask,
                                    const void *dy, void *dx, float beta) {
    B(XS_DROPOUT_BACKWARD);
    n->a.rng.dt = dt; n->a.rng.n = cnt; n->a.rng.p = p; n->a.rng.mask_in = mask; n->a.rng.dy = dy;
    n->a.rng.y = dx; n->a.rng.beta = beta;
    K(dt); K(cnt); K(beta == 0);
    R(rng.mask_in, 0, CA_U8);
    R(rng.dy, 0, dt);
    OUT(rng.y, N0(cnt) * SZ(dt), dx == dy ? 1 : beta, dt);
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

#define LIST(S, flags, pdt) B(S); s = copy_list(x, n, t, flags, pdt)

static ca_status x_adamw(void *dev, const ca_tensor_list *t, const ca_adamw_args *args) {
    LIST(XS_ADAMW, XR_READ | XR_WRITE, CA_F32);
    n->a.list.adamw = *args;
    E();
}

static ca_status x_sgd(void *dev, const ca_tensor_list *t, const ca_sgd_args *args) {
    LIST(XS_SGD, XR_READ | XR_WRITE, CA_F32);
    n->a.list.sgd = *args;   /* first_step is a runtime flag of the update, not of the program */
    K(args->nesterov);
    E();
}

static ca_status x_sum_squares(void *dev, const ca_tensor_list *t, float *out, float beta) {
    LIST(XS_SUM_SQUARES, XR_READ, t->grad_dtype);
    n->a.list.out = out; n->a.list.beta = beta;
    K(beta == 0);
    OUT(list.out, sizeof(float), beta, CA_F32);
    E();
}

static ca_status x_scale_list(void *dev, const ca_tensor_list *t, float alpha) {
    LIST(XS_SCALE_LIST, XR_READ | XR_WRITE, t->grad_dtype);
    n->a.list.alpha = alpha;
    E();
}

static ca_status x_unscale_check(void *dev, const ca_tensor_list *t, float inv_scale, float *found_inf) {
    LIST(XS_UNSCALE_CHECK, XR_READ | XR_WRITE, t->grad_dtype);
    n->a.list.alpha = inv_scale; n->a.list.out = found_inf;
    W(list.out, 0, XR_READ, CA_F32);
    E();
}

static ca_status x_clamp_list(void *dev, const ca_tensor_list *t, float lo, float hi) {
    LIST(XS_CLAMP_LIST, XR_READ | XR_WRITE, t->grad_dtype);
    n->a.list.lo = lo; n->a.list.hi = hi;
    E();
}

static void key_attention(xla_dev *x, xnode *n, ca_dtype dt, const ca_attention_args *a) {
    K(dt); K(a->batch); K(a->heads); K(a->tq); K(a->tk); K(a->d); K(a->dv); K(a->causal);
    K(a->dropout_p == 0); K(a->mask != NULL); K(a->mask_dtype);
    for (int i = 0; i < 4; i++) K(a->mask_stride[i]);
}

static ca_status x_attention(void *dev, ca_dtype dt, const ca_attention_args *args, const void *q, const void *k,
                             const void *v, void *out, float *lse) {
    B(XS_ATTENTION);
    n->a.attn.dt = dt; n->a.attn.a = *args; n->a.attn.q = q; n->a.attn.k = k; n->a.attn.v = v;
    n->a.attn.out = out; n->a.attn.lse = lse;
    key_attention(x, n, dt, args);
    R(attn.a.mask, 0, args->mask_dtype);
    R(attn.q, 0, dt);
    R(attn.k, 0, dt);
    R(attn.v, 0, dt);
    W(attn.out, 0, 0, dt);
    W(attn.lse, 0, 0, CA_F32);
    E();
}

static ca_status x_attention_backward(void *dev, ca_dtype dt, const ca_attention_args *args, const void *q,
                                      const void *k, const void *v, const void *out, const void *dout,
                                      const float *lse, void *dq, void *dk, void *dv) {
    B(XS_ATTENTION_BACKWARD);
    n->a.attn.dt = dt; n->a.attn.a = *args; n->a.attn.q = q; n->a.attn.k = k; n->a.attn.v = v;
    n->a.attn.out_in = out; n->a.attn.dout = dout; n->a.attn.lse_in = lse;
    n->a.attn.dq = dq; n->a.attn.dk = dk; n->a.attn.dv = dv;
    key_attention(x, n, dt, args);
    R(attn.a.mask, 0, args->mask_dtype);
    R(attn.q, 0, dt);
    R(attn.k, 0, dt);
    R(attn.v, 0, dt);
    R(attn.out_in, 0, dt);
    R(attn.dout, 0, dt);
    R(attn.lse_in, 0, CA_F32);
    W(attn.dq, 0, 0, dt);
    W(attn.dk, 0, 0, dt);
    W(attn.dv, 0, 0, dt);
    E();
}

static ca_status x_where(void *dev, ca_dtype dt, const ca_bcast_args *shape, const int64_t *cond_stride,
                         const uint8_t *cond, const void *a, const void *b, void *y) {
    B(XS_WHERE);
    n->a.binary.dt = dt; n->a.binary.shape = *shape; n->a.binary.cond = cond;
    n->a.binary.a = a; n->a.binary.b = b; n->a.binary.y = y;
    K(dt); key_bcast(x, n, shape);
    for (int i = 0; i < shape->ndim && i < CA_MAX_DIMS; i++) {
        n->a.binary.cond_stride[i] = cond_stride[i];
        K(cond_stride[i]);
    }
    R(binary.cond, 0, CA_U8);
    R(binary.a, 0, dt);
    R(binary.b, 0, dt);
    W(binary.y, bcast_numel(shape) * SZ(dt), y == a || y == b ? XR_READ : XR_FULL, dt);
    E();
}

static ca_status x_gather(void *dev, ca_dtype dt, int64_t outer, int64_t len, int64_t inner, int64_t cnt,
                          const void *xp, ca_dtype idx_dt, const void *idx, void *y) {
    B(XS_GATHER);
    n->a.index.dt = dt; n->a.index.outer = outer; n->a.index.len = len; n->a.index.inner = inner;
    n->a.index.n = cnt; n->a.index.table = xp; n->a.index.idx_dt = idx_dt; n->a.index.idx = idx;
    n->a.index.y = y;
    K(dt); K(outer); K(len); K(inner); K(cnt); K(idx_dt);
    R(index.table, 0, dt);
    R(index.idx, 0, idx_dt);
    W(index.y, N0(outer) * N0(cnt) * N0(inner) * SZ(dt), XR_FULL, dt);
    E();
}

static ca_status x_gather_backward(void *dev, ca_dtype dt, int64_t outer, int64_t len, int64_t inner, int64_t cnt,
                                   ca_dtype idx_dt, const void *idx, const void *dy, void *dx) {
    B(XS_GATHER_BACKWARD);
    n->a.index.dt = dt; n->a.index.outer = outer; n->a.index.len = len; n->a.index.inner = inner;
    n->a.index.n = cnt; n->a.index.idx_dt = idx_dt; n->a.index.idx = idx; n->a.index.dy = dy;
    n->a.index.y = dx;
    K(dt); K(outer); K(len); K(inner); K(cnt); K(idx_dt);
    R(index.idx, 0, idx_dt);
    R(index.dy, 0, dt);
    W(index.y, 0, XR_READ, dt);
    E();
}

const ca_kernels xla_kernels = {
    .struct_size = sizeof(ca_kernels),
    .abi_version = CA_ABI_VERSION,
    .gemm = x_gemm,
    .fill = x_fill,
    .cast = x_cast,
    .copy_strided = x_copy_strided,
    .unary = x_unary,
    .unary_backward = x_unary_backward,
    .binary = x_binary,
    .axpby = x_axpby,
    .reduce = x_reduce,
    .argmax = x_argmax,
    .softmax = x_softmax,
    .softmax_backward = x_softmax_backward,
    .cross_entropy = x_cross_entropy,
    .cross_entropy_backward = x_cross_entropy_backward,
    .layer_norm = x_layer_norm,
    .layer_norm_backward = x_layer_norm_backward,
    .embedding = x_embedding,
    .embedding_backward = x_embedding_backward,
    .rng = x_rng,
    .dropout = x_dropout,
    .dropout_backward = x_dropout_backward,
    .adamw = x_adamw,
    .sgd = x_sgd,
    .sum_squares = x_sum_squares,
    .scale_list = x_scale_list,
    .unscale_check = x_unscale_check,
    .clamp_list = x_clamp_list,
    .attention = x_attention,
    .attention_backward = x_attention_backward,
    .where = x_where,
    .gather = x_gather,
    .gather_backward = x_gather_backward,
};

/* ------------------------------------------------------------------ execution */

/* Calls the executor's kernel for node n with its recorded arguments. */
ca_status xla_exec_node(xla_dev *x, const xnode *n) {
    const ca_kernels *k = x->k;
    void *c = x->exec_ctx;
    const xargs *a = &n->a;
    switch (n->slot) {
    case XS_GEMM: return k->gemm(c, &a->gemm);
    case XS_FILL: return k->fill(c, a->fill.dt, a->fill.n, a->fill.value, a->fill.y);
    case XS_CAST: return k->cast(c, a->cast.src, a->cast.x, a->cast.dst, a->cast.y, a->cast.n, a->cast.alpha);
    case XS_COPY_STRIDED:
        return k->copy_strided(c, a->copy.dt, a->copy.ndim, a->copy.shape, a->copy.x, a->copy.xs, a->copy.y,
                               a->copy.ys);
    case XS_UNARY: return k->unary(c, a->unary.op, a->unary.dt, a->unary.n, a->unary.x, a->unary.out, a->unary.alpha);
    case XS_UNARY_BACKWARD:
        return k->unary_backward(c, a->unary.op, a->unary.dt, a->unary.n, a->unary.x, a->unary.y, a->unary.dy,
                                 a->unary.out, a->unary.alpha, a->unary.beta);
    case XS_BINARY:
        return k->binary(c, a->binary.op, a->binary.dt, &a->binary.shape, a->binary.a, a->binary.b, a->binary.y);
    case XS_AXPBY: return k->axpby(c, a->axpby.dt, a->axpby.n, a->axpby.alpha, a->axpby.x, a->axpby.beta, a->axpby.y);
    case XS_REDUCE:
        return k->reduce(c, a->reduce.op, a->reduce.dt, a->reduce.outer, a->reduce.len, a->reduce.inner, a->reduce.x,
                         a->reduce.y, a->reduce.beta);
    case XS_ARGMAX: return k->argmax(c, a->softmax.dt, a->softmax.rows, a->softmax.cols, a->softmax.x, a->softmax.idx);
    case XS_SOFTMAX:
        return k->softmax(c, a->softmax.log, a->softmax.dt, a->softmax.rows, a->softmax.cols, a->softmax.x,
                          a->softmax.out);
    case XS_SOFTMAX_BACKWARD:
        return k->softmax_backward(c, a->softmax.log, a->softmax.dt, a->softmax.rows, a->softmax.cols, a->softmax.y,
                                   a->softmax.dy, a->softmax.out, a->softmax.beta);
    case XS_CROSS_ENTROPY:
        return k->cross_entropy(c, a->ce.dt, a->ce.rows, a->ce.cols, a->ce.logits, a->ce.label_dt, a->ce.labels,
                                a->ce.ignore, a->ce.loss, a->ce.lse, a->ce.count);
    case XS_CROSS_ENTROPY_BACKWARD:
        return k->cross_entropy_backward(c, a->ce.dt, a->ce.rows, a->ce.cols, a->ce.logits, a->ce.lse_in,
                                         a->ce.label_dt, a->ce.labels, a->ce.ignore, a->ce.dloss, a->ce.count_in,
                                         a->ce.dlogits, a->ce.beta);
    case XS_LAYER_NORM:
        return k->layer_norm(c, a->ln.dt, a->ln.rows, a->ln.cols, a->ln.x, a->ln.gamma, a->ln.beta_, a->ln.eps,
                             a->ln.y, a->ln.mean, a->ln.rstd);
    case XS_LAYER_NORM_BACKWARD:
        return k->layer_norm_backward(c, a->ln.dt, a->ln.rows, a->ln.cols, a->ln.x, a->ln.gamma, a->ln.mean_in,
                                      a->ln.rstd_in, a->ln.dy, a->ln.dx, a->ln.beta, a->ln.dgamma, a->ln.dbeta_,
                                      a->ln.accumulate);
    case XS_EMBEDDING:
        return k->embedding(c, a->index.dt, a->index.n, a->index.rows, a->index.dim, a->index.table,
                            a->index.idx_dt, a->index.idx, a->index.y);
    case XS_EMBEDDING_BACKWARD:
        return k->embedding_backward(c, a->index.dt, a->index.n, a->index.rows, a->index.dim, a->index.idx_dt,
                                     a->index.idx, a->index.dy, a->index.y);
    case XS_RNG:
        return k->rng(c, a->rng.kind, a->rng.dt, a->rng.n, a->rng.seed, a->rng.offset, a->rng.a, a->rng.b, a->rng.y);
    case XS_DROPOUT:
        return k->dropout(c, a->rng.dt, a->rng.n, a->rng.p, a->rng.seed, a->rng.offset, a->rng.x, a->rng.y,
                          a->rng.mask);
    case XS_DROPOUT_BACKWARD:
        return k->dropout_backward(c, a->rng.dt, a->rng.n, a->rng.p, a->rng.mask_in, a->rng.dy, a->rng.y, a->rng.beta);
    case XS_ADAMW: return k->adamw(c, &a->list.l.t, &a->list.adamw);
    case XS_SGD: return k->sgd(c, &a->list.l.t, &a->list.sgd);
    case XS_SUM_SQUARES: return k->sum_squares(c, &a->list.l.t, a->list.out, a->list.beta);
    case XS_SCALE_LIST: return k->scale_list(c, &a->list.l.t, a->list.alpha);
    case XS_UNSCALE_CHECK: return k->unscale_check(c, &a->list.l.t, a->list.alpha, a->list.out);
    case XS_CLAMP_LIST: return k->clamp_list(c, &a->list.l.t, a->list.lo, a->list.hi);
    case XS_ATTENTION:
        return k->attention(c, a->attn.dt, &a->attn.a, a->attn.q, a->attn.k, a->attn.v, a->attn.out, a->attn.lse);
    case XS_ATTENTION_BACKWARD:
        return k->attention_backward(c, a->attn.dt, &a->attn.a, a->attn.q, a->attn.k, a->attn.v, a->attn.out_in,
                                     a->attn.dout, a->attn.lse_in, a->attn.dq, a->attn.dk, a->attn.dv);
    case XS_WHERE:
        return k->where(c, a->binary.dt, &a->binary.shape, a->binary.cond_stride, a->binary.cond, a->binary.a,
                        a->binary.b, a->binary.y);
    case XS_GATHER:
        return k->gather(c, a->index.dt, a->index.outer, a->index.len, a->index.inner, a->index.n, a->index.table,
                         a->index.idx_dt, a->index.idx, a->index.y);
    case XS_GATHER_BACKWARD:
        return k->gather_backward(c, a->index.dt, a->index.outer, a->index.len, a->index.inner, a->index.n,
                                  a->index.idx_dt, a->index.idx, a->index.dy, a->index.y);
    case XS_MEMCPY:
        memmove(a->memcpy.dst, a->memcpy.src, a->memcpy.bytes);
        return CA_OK;
    case XS_HOST:   /* the function frees its context as it runs (exec_one forgets it) */
        return a->host.ctx ? a->host.fn(a->host.ctx, true, a->host.in, a->host.out)
                           : ca_error(CA_ERR_STATE, "xla: a host function ran twice");
    case XS_COUNT: break;
    }
    return ca_error(CA_ERR_INVALID, "xla: unknown node kind %d", (int)n->slot);
}

const char *xla_slot_name(xslot s) {
    static const char *const names[XS_COUNT] = {
        "gemm", "fill", "cast", "copy_strided", "unary", "unary_backward", "binary", "axpby", "reduce", "argmax",
        "softmax", "softmax_backward", "cross_entropy", "cross_entropy_backward", "layer_norm",
        "layer_norm_backward", "embedding", "embedding_backward", "rng", "dropout", "dropout_backward", "adamw",
        "sgd", "sum_squares", "scale_list", "unscale_check", "clamp_list", "attention", "attention_backward",
        "where", "gather", "gather_backward", "memcpy", "host_fn"};
    return (unsigned)s < XS_COUNT ? names[s] : "?";
}
