/* Fused scaled dot-product attention: forward saves only the per-row log-sum-exp; backward recomputes the rest. */
#include "tensor/ops_impl.h"

#include <math.h>
#include <string.h>

/* The kernel arguments of a recorded node: sizes from the saved tensors' shapes,
 * the rest from the node's slots (see ca_scaled_dot_product_attention). */
static void node_args(const ca_node *n, ca_attention_params *a) {
    const ca_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2], *mask = n->saved[1];
    memset(a, 0, sizeof *a);
    a->batch = q->shape[0]; a->heads = q->shape[1]; a->tq = q->shape[2]; a->d = q->shape[3];
    a->tk = k->shape[2]; a->dv = v->shape[3];
    a->scale = (float)n->f[0];
    a->dropout_p = (float)n->f[1];
    a->causal = n->i[0] != 0;
    a->seed = (uint64_t)n->i[1];
    a->offset = (uint64_t)n->i[2];
    if (mask) {
        a->mask = ca_tptr(mask);
        a->mask_dtype = mask->dtype;
        memcpy(a->mask_stride, &n->i[3], sizeof a->mask_stride);
    }
}

/* x's strides as the kernels read them (ca_attention_layout): false when its last dimension is not
 * unit-stride or its rows overlap (a copy then makes it contiguous). A dimension of size 1 takes the
 * stride a contiguous tensor would have there, which any leading dimension accepts. */
static bool layout_of(const ca_tensor *x, int64_t *st) {
    const int64_t *sh = x->shape;
    if ((sh[3] > 1 && x->stride[3] != 1) || (sh[2] > 1 && x->stride[2] < sh[3])) return false;
    st[3] = 1;
    st[2] = sh[2] > 1 ? x->stride[2] : sh[3];
    st[1] = sh[1] > 1 ? x->stride[1] : sh[2] * sh[3];
    st[0] = sh[0] > 1 ? x->stride[0] : sh[1] * sh[2] * sh[3];
    return true;
}

/* Whether dev's attention kernels read strides (ABI 3.10's ca_attention_layout). */
static bool kernels_take_strides(const ca_device *dev) { return ca_device_ops_of(dev)->attention_strides; }

/* Whether views of one root at the sorted storage offsets off[0..n) (relative to the root's), each of
 * `shape` and `stride` (nd dims), hit no element twice: the offsets' step as one more dimension, the
 * dimensions sorted by stride, each stride at least the extent of the ones below it. *whole: they hit
 * every one of the root's `total` elements (no zeros needed around them). */
static bool views_disjoint(int n, const int64_t *off, int nd, const int64_t *shape, const int64_t *stride,
                           int64_t total, bool *whole) {
    int64_t sz[CA_MAX_DIMS + 1], st[CA_MAX_DIMS + 1];
    int m = 0;
    for (int i = 0; i < nd; i++)
        if (shape[i] > 1) { sz[m] = shape[i]; st[m++] = stride[i]; }
    if (n > 1) { sz[m] = n; st[m++] = off[1] - off[0]; }
    for (int i = 2; i < n; i++)
        if (off[i] - off[i - 1] != off[1] - off[0]) return false;
    for (int i = 1; i < m; i++)   /* insertion sort by stride */
        for (int j = i; j > 0 && st[j] < st[j - 1]; j--) {
            int64_t a = st[j], b = sz[j];
            st[j] = st[j - 1]; sz[j] = sz[j - 1]; st[j - 1] = a; sz[j - 1] = b;
        }
    int64_t extent = 1;
    *whole = off[0] == 0 && ca_shape_numel(nd, shape) > 0;
    for (int i = 0; i < m; i++) {
        if (st[i] < extent) return false;
        if (st[i] != extent) *whole = false;
        extent = st[i] * sz[i];
    }
    *whole = *whole && extent == total;
    return true;
}

/* Where the backward writes the gradients of q, k and v: a view of each one's root gradient
 * (ca_grad_view_root: the GPT's q, k and v, transposed slices of one projection, straight into that
 * projection's gradient, where the views' backward would copy twice each), or a fresh tensor added
 * afterwards (dst[i] then owned). Inputs sharing a root are written directly when their views of it
 * are disjoint; the root's gradient is zero-filled first unless together they cover it. */
typedef struct grad_dest {
    ca_tensor *dst[3], *root[3];
    bool fresh[3];
} grad_dest;

static ca_status place_root(ca_tensor *const *in, grad_dest *gd, ca_tensor *root) {
    int idx[3], n = 0;
    for (int i = 0; i < 3; i++)
        if (gd->root[i] == root) idx[n++] = i;
    for (int i = 1; i < n; i++)   /* by storage offset */
        for (int j = i; j > 0 && in[idx[j]]->offset < in[idx[j - 1]]->offset; j--) {
            int t = idx[j]; idx[j] = idx[j - 1]; idx[j - 1] = t;
        }
    const ca_tensor *x0 = in[idx[0]];
    bool same = true, whole = false;
    int64_t off[3];
    for (int i = 0; i < n; i++) {
        const ca_tensor *x = in[idx[i]];
        off[i] = x->offset - root->offset;
        same = same && memcmp(x->shape, x0->shape, 4 * sizeof *x->shape) == 0 &&
               memcmp(x->stride, x0->stride, 4 * sizeof *x->stride) == 0;
    }
    int direct = same && views_disjoint(n, off, 4, x0->shape, x0->stride, root->numel, &whole) ? n
                 : views_disjoint(1, off, 4, x0->shape, x0->stride, root->numel, &whole) ? 1 : 0;
    for (int i = direct; i < n; i++) gd->root[idx[i]] = NULL;   /* fresh tensors, added after */
    if (!direct) return CA_OK;
    float beta;
    ca_tensor *gb = ca_grad_target(root, &beta);
    if (!gb) return ca_last_status();
    if (!whole) {
        ca_status s = CA_KCALL(ca_tdev(root), fill, .dt = gb->dtype, .n = gb->numel, .value = 0.0, .y = ca_tptr(gb));
        if (s != CA_OK) return s;
    }
    for (int i = 0; i < direct; i++) {
        const ca_tensor *x = in[idx[i]];
        gd->dst[idx[i]] = ca_tensor_view(gb, 4, x->shape, x->stride, gb->offset + off[i]);
        if (!gd->dst[idx[i]]) return ca_last_status();
    }
    return CA_OK;
}

static ca_status grad_dests(ca_tensor *const *in, bool strided, grad_dest *gd) {
    memset(gd, 0, sizeof *gd);
    int64_t st[4];
    for (int i = 0; i < 3; i++)
        gd->root[i] = strided && in[i]->dtype == CA_F32 && layout_of(in[i], st) ? ca_grad_view_root(in[i]) : NULL;
    ca_tensor *placed[3];
    int np = 0;
    for (int i = 0; i < 3; i++) {
        bool seen = !gd->root[i];
        for (int j = 0; j < np; j++) seen = seen || placed[j] == gd->root[i];
        if (seen) continue;
        placed[np++] = gd->root[i];
        ca_status s = place_root(in, gd, gd->root[i]);
        if (s != CA_OK) return s;
    }
    for (int i = 0; i < 3; i++) {
        if (gd->dst[i]) continue;
        gd->dst[i] = ca_op_new_like(in[i]);
        gd->fresh[i] = true;
        if (!gd->dst[i]) return ca_last_status();
    }
    return CA_OK;
}

/* The written roots' gradients are defined; the fresh ones are added into their inputs'. */
static ca_status grad_finish(ca_tensor *const *in, grad_dest *gd) {
    ca_status s = CA_OK;
    for (int i = 0; i < 3; i++)
        if (gd->root[i]) ca_grad_written(gd->root[i]);
    for (int i = 0; s == CA_OK && i < 3; i++)
        if (gd->fresh[i] && in[i]->requires_grad) s = ca_op_accumulate_owned(in[i], gd->dst[i], 1.0f);
    return s;
}

/* The strides of q, k, v and o (an attention's four tensors) into l; false when one needs a copy. */
static bool layouts_of(const ca_tensor *q, const ca_tensor *k, const ca_tensor *v, const ca_tensor *o,
                       ca_attention_layout *l) {
    return layout_of(q, l->q) && layout_of(k, l->k) && layout_of(v, l->v) && layout_of(o, l->o);
}

static ca_status attention_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2], *lse = n->saved[0];
    ca_attention_params a;
    node_args(n, &a);
    bool strided = kernels_take_strides(ca_tdev(q));
    ca_attention_layout st = {0}, dst = {0};
    if (strided && !layout_of(g, dst.o)) g = ca_contiguous(g);   /* dst.o: g's strides, set again below */
    if (!g) return ca_last_status();
    grad_dest gd;
    ca_status s = grad_dests(n->in, strided, &gd);
    if (s != CA_OK) return s;
    if (strided && (!layouts_of(q, k, v, n->out, &st) || !layouts_of(gd.dst[0], gd.dst[1], gd.dst[2], g, &dst)))
        return ca_error(CA_ERR_INTERNAL, "scaled_dot_product_attention backward: a tensor the forward passed "
                        "strided has strides the kernel cannot read");
    s = CA_KCALL(ca_tdev(q), attention_backward, .dt = CA_F32, .p = a, .q = ca_tptr(q), .k = ca_tptr(k),
                 .v = ca_tptr(v), .out = ca_tptr(n->out), .dout = ca_tptr(g), .lse = ca_tptr(lse),
                 .dq = ca_tptr(gd.dst[0]), .dk = ca_tptr(gd.dst[1]), .dv = ca_tptr(gd.dst[2]),
                 .kv_heads = k->shape[1], .stream_heads = (int64_t)n->f[3], .stream_head0 = (int64_t)n->f[2],
                 .st = st, .dst = dst);
    return s == CA_OK ? grad_finish(n->in, &gd) : s;
}
static const ca_node_vt attention_vt = {"scaled_dot_product_attention", attention_backward};

/* q [B,H,Tq,D], k [B,Hkv,Tk,D], v [B,Hkv,Tk,Dv] with Hkv dividing H (grouped-query attention when
 * Hkv < H, as torch's enable_gqa). */
static bool check_shapes(const ca_tensor *q, const ca_tensor *k, const ca_tensor *v) {
    bool ok = q->ndim == 4 && k->ndim == 4 && v->ndim == 4 && k->shape[0] == q->shape[0] &&
              v->shape[0] == q->shape[0] && v->shape[1] == k->shape[1] && k->shape[3] == q->shape[3] &&
              v->shape[2] == k->shape[2];
    char a[128], b[128], c[128];
    if (!ok) {
        ca_error(CA_ERR_INVALID, "scaled_dot_product_attention: q %s, k %s, v %s: expected q [B,H,Tq,D], "
                 "k [B,Hkv,Tk,D], v [B,Hkv,Tk,Dv]", ca_shape_str(q->ndim, q->shape, a, sizeof a),
                 ca_shape_str(k->ndim, k->shape, b, sizeof b), ca_shape_str(v->ndim, v->shape, c, sizeof c));
        return false;
    }
    int64_t h = q->shape[1], hkv = k->shape[1];
    if (hkv == h || (hkv > 0 && h % hkv == 0)) return true;
    ca_error(CA_ERR_INVALID, "scaled_dot_product_attention: k and v have %lld heads, which do not divide q's %lld "
             "heads (grouped-query attention: each kv head serves the same number of query heads)", (long long)hkv,
             (long long)h);
    return false;
}

/* A kernel table older than ABI 3.5 reads no kv_heads: there k and v are repeated to H heads first (as
 * transformers' repeat_kv: kv head j serves query heads [j g, (j + 1) g)), a copy autograd sums back. */
static ca_tensor *repeat_heads(ca_tensor *x, int64_t heads) {
    int64_t b = x->shape[0], kv = x->shape[1], t = x->shape[2], d = x->shape[3];
    x = ca_expand(ca_reshape(x, 5, (int64_t[]){b, kv, 1, t, d}), 5, (int64_t[]){b, kv, heads / kv, t, d});
    return ca_reshape(x, 4, (int64_t[]){b, heads, t, d});
}
static bool kernels_abi(const ca_device *dev, uint32_t minor) {
    uint32_t v = ca_device_kernels(dev)->abi_version;
    return (v >> 16) > 3 || ((v >> 16) == 3 && (v & 0xffff) >= minor);
}
static bool kernels_take_kv_heads(const ca_device *dev) { return kernels_abi(dev, 5); }

/* The dropout stream of heads [head0, head0 + H) of `heads` (ca_scaled_dot_product_attention_heads):
 * a kernel table older than ABI 3.6 reads no stream_heads and would draw another mask. */
static bool check_stream(const ca_device *dev, int64_t h, int64_t head0, int64_t heads, double dropout_p) {
    const char *op = "scaled_dot_product_attention_heads";
    if (head0 < 0 || heads < 1 || head0 + h > heads) {
        ca_error(CA_ERR_INVALID, "%s: q's %lld heads from head %lld are not within %lld heads", op, (long long)h,
                 (long long)head0, (long long)heads);
        return false;
    }
    if (dropout_p > 0 && heads != h && !kernels_abi(dev, 6)) {
        ca_error(CA_ERR_UNSUPPORTED, "%s: the %s device's kernels (ABI before 3.6) cannot draw the dropout of a "
                 "part of the heads", op, ca_device_name(dev));
        return false;
    }
    return true;
}

/* The mask's strides over [B,H,Tq,Tk] (0 on broadcast dims); false when it does not broadcast. */
static bool mask_strides(const ca_tensor *m, const int64_t *full, int64_t *st) {
    if (m->ndim > 4) return false;
    for (int i = 0; i < 4; i++) {
        int im = i - (4 - m->ndim);
        int64_t sz = im >= 0 ? m->shape[im] : 1;
        if (sz != full[i] && sz != 1) return false;
        st[i] = im >= 0 && sz != 1 ? m->stride[im] : 0;
    }
    return true;
}

/* q, k, v as f32 (the kernels compute in f32), contiguous unless the kernels read x's strides (then
 * written into st). */
static ca_tensor *as_f32(ca_tensor *x, bool strided, int64_t *st) {
    x = ca_autocast_f32(x);
    if (x && x->dtype != CA_F32) x = ca_cast(x, CA_F32);
    if (x && strided && layout_of(x, st)) return x;
    memset(st, 0, 4 * sizeof *st);
    return ca_contiguous(x);
}

/* The output [B, H, Tq, Dv]; where the kernels read strides, in the memory of a [B, Tq, H, Dv] tensor (as
 * torch's CPU flash attention returns it; its strides into st): the heads' merge that follows every
 * attention of a transformer (transpose(1, 2), contiguous, reshape to [B, Tq, H Dv]) is then a view, and
 * so is its gradient's way back (transpose_backward hands it over, ca_node_takes_strided_grad). */
static ca_tensor *new_out(ca_device *dev, const int64_t *shape, bool strided, int64_t *st) {
    if (!strided) return ca_tensor_new(dev, CA_F32, 4, shape);
    int64_t b = shape[0], h = shape[1], t = shape[2], dv = shape[3];
    ca_tensor *m = ca_tensor_new(dev, CA_F32, 4, (int64_t[]){b, t, h, dv});
    if (!m) return NULL;
    int64_t stride[4] = {t * h * dv, dv, h * dv, 1};
    ca_tensor *out = ca_tensor_view(m, 4, shape, stride, m->offset);
    if (out && !layout_of(out, st)) memcpy(st, stride, sizeof stride);
    return out;
}

bool ca_node_takes_strided_grad(const ca_node *n) {
    return n->vt == &attention_vt && kernels_take_strides(ca_tdev(n->out));
}

/* The calling thread's replacement (context parallelism's, set between ca_maybe_context_parallel and
 * ca_context_parallel_end): thread-local, as a program's forward runs on its own thread. */
static _Thread_local ca_attention_hook hook_fn;
static _Thread_local void *hook_ctx;

void ca_attention_set_hook(ca_attention_hook fn, void *ctx) {
    hook_fn = fn;
    hook_ctx = fn ? ctx : NULL;
}

ca_tensor *ca_scaled_dot_product_attention(ca_tensor *q, ca_tensor *k, ca_tensor *v, ca_tensor *mask,
                                           bool causal, double dropout_p, double scale) {
    CA_OP_NULLCHECK1(q);
    int64_t h = q->ndim == 4 ? q->shape[1] : 1;
    return ca_scaled_dot_product_attention_heads(q, k, v, mask, causal, dropout_p, scale, 0, h > 0 ? h : 1);
}

static ca_tensor *attention_heads(ca_tensor *q, ca_tensor *k, ca_tensor *v, ca_tensor *mask, bool causal,
                                  double dropout_p, double scale, int64_t head0, int64_t heads);

/* Context parallelism's hook takes the call whole: it refuses dropout, the only use of the head range. */
ca_tensor *ca_scaled_dot_product_attention_heads(ca_tensor *q, ca_tensor *k, ca_tensor *v, ca_tensor *mask,
                                                 bool causal, double dropout_p, double scale, int64_t head0,
                                                 int64_t heads) {
    if (hook_fn) return hook_fn(hook_ctx, q, k, v, mask, causal, dropout_p, scale);
    return attention_heads(q, k, v, mask, causal, dropout_p, scale, head0, heads);
}

ca_tensor *ca_op_attention(ca_tensor *q, ca_tensor *k, ca_tensor *v, ca_tensor *mask, bool causal,
                           double dropout_p, double scale) {
    CA_OP_NULLCHECK1(q);
    int64_t h = q->ndim == 4 ? q->shape[1] : 1;
    return attention_heads(q, k, v, mask, causal, dropout_p, scale, 0, h > 0 ? h : 1);
}

/* The dropout draws element ((b heads + head0 + h) Tq + i) Tk + j of a stream reserved for all `heads`:
 * every tensor-parallel rank reserves the same counters (the whole attention's, so that what follows
 * draws as one process does) and draws its heads' part of the one mask, without making the others'. */
static ca_tensor *attention_heads(ca_tensor *q, ca_tensor *k, ca_tensor *v, ca_tensor *mask, bool causal,
                                  double dropout_p, double scale, int64_t head0, int64_t heads) {
    CA_OP_NULLCHECK2(q, k);
    CA_OP_NULLCHECK1(v);
    const char *op = "scaled_dot_product_attention";
    if (!ca_op_check_float(op, q) || !ca_op_check_float(op, k) || !ca_op_check_float(op, v) ||
        !ca_op_check_same_device(op, q, k) || !ca_op_check_same_device(op, q, v) ||
        (mask && !ca_op_check_same_device(op, q, mask)) || !check_shapes(q, k, v) ||
        !check_stream(ca_tdev(q), q->shape[1], head0, heads, dropout_p))
        return NULL;
    if (!(dropout_p >= 0 && dropout_p < 1)) {
        ca_error(CA_ERR_INVALID, "%s: dropout probability must be in [0, 1), got %g", op, dropout_p);
        return NULL;
    }
    ca_dtype out_dt = ca_autocast_dtype() != CA_F32 ? CA_F32 : q->dtype;
    ca_device *dev = ca_tdev(q);
    ca_attention_params a = {
        .batch = q->shape[0], .heads = q->shape[1], .tq = q->shape[2], .tk = k->shape[2],
        .d = q->shape[3], .dv = v->shape[3], .causal = causal, .dropout_p = (float)dropout_p,
        .scale = (float)(scale > 0 ? scale : 1.0 / sqrt((double)(q->shape[3] ? q->shape[3] : 1))),
    };
    if (mask) {
        if (ca_dtype_is_float(mask->dtype) && mask->dtype != CA_F32) mask = ca_cast(mask, CA_F32);
        CA_OP_NULLCHECK1(mask);
        int64_t full[4] = {a.batch, a.heads, a.tq, a.tk};
        char ms[128], fs[128];
        if ((mask->dtype != CA_F32 && mask->dtype != CA_U8) || !mask_strides(mask, full, a.mask_stride)) {
            ca_error(CA_ERR_INVALID, "%s: mask %s %s does not broadcast to %s as f32 (additive) or u8 (boolean)",
                     op, ca_shape_str(mask->ndim, mask->shape, ms, sizeof ms), ca_dtype_name(mask->dtype),
                     ca_shape_str(4, full, fs, sizeof fs));
            return NULL;
        }
        a.mask = ca_tptr(mask);
        a.mask_dtype = mask->dtype;
    }
    bool strided = kernels_take_strides(dev);
    ca_attention_layout st = {0};
    q = as_f32(q, strided, st.q); k = as_f32(k, strided, st.k); v = as_f32(v, strided, st.v);
    CA_OP_NULLCHECK2(q, k);
    CA_OP_NULLCHECK1(v);
    if (k->shape[1] != a.heads && !kernels_take_kv_heads(dev)) {
        k = ca_contiguous(repeat_heads(k, a.heads));
        v = ca_contiguous(repeat_heads(v, a.heads));
        memset(st.k, 0, sizeof st.k);
        memset(st.v, 0, sizeof st.v);
        CA_OP_NULLCHECK2(k, v);
    }
    if (dropout_p > 0) {
        uint64_t unused;
        ca_rng_get_state(&a.seed, &unused);
        a.offset = ca_rng_reserve(ca_rng_counters(CA_RNG_UNIFORM, a.batch * heads * a.tq * a.tk));
    }
    int64_t oshape[4] = {a.batch, a.heads, a.tq, a.dv};
    ca_tensor *out = new_out(dev, oshape, strided, st.o);
    ca_tensor *lse = out ? ca_tensor_new(dev, CA_F32, 3, oshape) : NULL;
    if (!lse) return NULL;
    if (CA_KCALL(dev, attention, .dt = CA_F32, .p = a, .q = ca_tptr(q), .k = ca_tptr(k), .v = ca_tptr(v),
                 .out = ca_tptr(out), .lse = ca_tptr(lse), .kv_heads = k->shape[1],
                 .stream_heads = heads == a.heads ? 0 : heads, .stream_head0 = heads == a.heads ? 0 : head0,
                 .st = st) != CA_OK)
        return NULL;
    ca_tensor *in[3] = {q, k, v};
    if (ca_needs_grad(3, in)) {
        ca_node *n = ca_record(&attention_vt, out, 3, in);
        if (!n) return NULL;
        n->saved[0] = lse;
        n->saved[1] = mask;
        n->owned_saved = 1u;   /* the log-sum-exp; the mask is the caller's */
        n->f[0] = a.scale;
        n->f[1] = a.dropout_p;
        n->f[2] = heads == a.heads ? 0 : (double)head0;   /* the dropout stream's heads (exact in a double) */
        n->f[3] = heads == a.heads ? 0 : (double)heads;
        n->i[0] = causal;
        n->i[1] = (int64_t)a.seed;
        n->i[2] = (int64_t)a.offset;
        memcpy(&n->i[3], a.mask_stride, sizeof a.mask_stride);
    }
    return out_dt == CA_F32 ? out : ca_cast(out, out_dt);
}
