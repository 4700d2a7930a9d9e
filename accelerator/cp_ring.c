/* Ring attention (parallelism_config_cp_comm_strategy alltoall, torch's rotate method of that name):
 * the causal attention of context parallelism without gathering the sequence. Each cp rank holds its
 * two load-balanced chunks of queries, keys and values (global chunks r and 2 cp - 1 - r); the key and
 * value chunks travel round the cp ring (rank r sends to r + 1, receives from r - 1) in cp - 1
 * exchanges, the next one in flight while the current block is attended. Each query chunk attends each
 * key chunk that is not after it (the diagonal one causally) with the device's attention kernel, and
 * the blocks' outputs are merged by their log-sum-exp (the online softmax). Backward rotates the keys
 * and values again and sends each visiting block's gradient straight back to its owner. A rank holds its own chunks, the block it attends and the one
 * arriving: about two blocks, never the whole sequence. Host memory only: the merge and the
 * accumulations are loops over host floats (cp_ring_dev.c serves the devices whose memory the host
 * cannot read). */
#include "accelerator/mesh_impl.h"
#include "tensor/ops_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What one call shares between forward and backward. */
typedef struct ring {
    ca_comm *comm;
    int rank, size;
    int64_t b, h, hkv, c, d, dv;   /* c: tokens per chunk (half the rank's) */
    float scale;
} ring;

static size_t qn(const ring *r) { return (size_t)(r->b * r->h * r->c * r->d); }      /* one query chunk */
static size_t on(const ring *r) { return (size_t)(r->b * r->h * r->c * r->dv); }     /* one output chunk */
static size_t kn(const ring *r) { return (size_t)(r->b * r->hkv * r->c * r->d); }    /* one key chunk */
static size_t vn(const ring *r) { return (size_t)(r->b * r->hkv * r->c * r->dv); }   /* one value chunk */
static size_t ln(const ring *r) { return (size_t)(r->b * r->h * r->c); }             /* one chunk's rows */
/* A block: key chunks 0 and 1, then value chunks 0 and 1 (each contiguous [B, Hkv, c, D]). */
static size_t block_n(const ring *r) { return 2 * (kn(r) + vn(r)); }
static float *block_k(const ring *r, float *blk, int i) { return blk + (size_t)i * kn(r); }
static float *block_v(const ring *r, float *blk, int i) { return blk + 2 * kn(r) + (size_t)i * vn(r); }

/* The global chunk of a rank's local chunk i (0: its first, 1: its second). */
static int64_t chunk_of(const ring *r, int owner, int i) { return i == 0 ? owner : 2 * r->size - 1 - owner; }

/* Local chunk i of x [B, H, 2c, E] copied to out [B, H, c, E] (or back, to_x). */
static void chunk_copy(float *x, float *out, int64_t bh, int64_t c, int64_t e, int i, bool to_x) {
    for (int64_t p = 0; p < bh; p++) {
        float *xs = x + (size_t)((p * 2 + i) * c * e), *os = out + (size_t)(p * c * e);
        if (to_x) memcpy(xs, os, sizeof(float) * (size_t)(c * e));
        else memcpy(os, xs, sizeof(float) * (size_t)(c * e));
    }
}

static ca_attention_params params(const ring *r, bool causal) {
    return (ca_attention_params){.batch = r->b, .heads = r->h, .tq = r->c, .tk = r->c, .d = r->d, .dv = r->dv,
                                 .scale = r->scale, .causal = causal};
}

/* One exchange round the ring: send this block right, receive the left neighbour's into next. */
static ca_status rotate(const ring *r, const float *cur, float *next, size_t n, ca_work **w) {
    int right = (r->rank + 1) % r->size, left = (r->rank + r->size - 1) % r->size;
    return ca_comm_sendrecv(r->comm, cur, n, right, next, n, left, CA_F32, w);
}

static ca_status wait_rotation(ca_work *w, ca_status s, const char *what) {
    if (s == CA_OK) s = ca_work_wait(w, -1);
    ca_work_free(w);
    if (s != CA_OK) ca_error_context("ring attention: %s", what);
    return s;
}

/* ------------------------------------------------------------------ forward */

/* out, lse of a query chunk merged with one block's (o, l): the log-sum-exp of both, and the outputs
 * weighted by their share of it. */
static void merge(const ring *r, float *out, float *lse, const float *o, const float *l) {
    size_t rows = ln(r);
    for (size_t i = 0; i < rows; i++) {
        float m = lse[i] > l[i] ? lse[i] : l[i];
        if (m == -INFINITY) continue;
        float wa = expf(lse[i] - m), wb = expf(l[i] - m), t = wa + wb;
        wa /= t;
        wb /= t;
        float *oi = out + i * (size_t)r->dv;
        const float *bi = o + i * (size_t)r->dv;
        for (int64_t e = 0; e < r->dv; e++) oi[e] = oi[e] * wa + bi[e] * wb;
        lse[i] = m + logf(t);
    }
}

/* The rank's two query chunks attend the block of `owner` (its two key chunks): each pair whose key
 * chunk is not after the query chunk, the diagonal causally. */
static ca_status attend_block(ca_device *dev, const ring *r, float *const q[2], float *blk, int owner, float *out[2],
                              float *lse[2], float *tmp_o, float *tmp_l) {
    for (int qi = 0; qi < 2; qi++)
        for (int ki = 0; ki < 2; ki++) {
            int64_t j = chunk_of(r, r->rank, qi), i = chunk_of(r, owner, ki);
            if (i > j) continue;
            ca_status s = CA_KCALL(dev, attention, .dt = CA_F32, .p = params(r, i == j), .q = q[qi],
                                   .k = block_k(r, blk, ki), .v = block_v(r, blk, ki), .out = tmp_o, .lse = tmp_l,
                                   .kv_heads = r->hkv);
            if (s != CA_OK) return ca_error_context("ring attention: query chunk %lld against key chunk %lld",
                                                    (long long)j, (long long)i);
            merge(r, out[qi], lse[qi], tmp_o, tmp_l);
        }
    return CA_OK;
}

/* ------------------------------------------------------------------ backward */

static void add_into(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* The gradients of one block: each query chunk's into dq, the key and value chunks' into the block's
 * accumulators (grad: dk 0, dk 1, dv 0, dv 1, laid out as a block). */
static ca_status block_backward(ca_device *dev, const ring *r, float *const q[2], float *const o[2],
                                float *const dout[2], float *const lse[2], float *blk, int owner, float *grad,
                                float *dq[2], float *t_dq, float *t_dk, float *t_dv) {
    for (int qi = 0; qi < 2; qi++)
        for (int ki = 0; ki < 2; ki++) {
            int64_t j = chunk_of(r, r->rank, qi), i = chunk_of(r, owner, ki);
            if (i > j) continue;
            ca_status s = CA_KCALL(dev, attention_backward, .dt = CA_F32, .p = params(r, i == j), .q = q[qi],
                                   .k = block_k(r, blk, ki), .v = block_v(r, blk, ki), .out = o[qi],
                                   .dout = dout[qi], .lse = lse[qi], .dq = t_dq, .dk = t_dk, .dv = t_dv,
                                   .kv_heads = r->hkv);
            if (s != CA_OK) return ca_error_context("ring attention backward: query chunk %lld against key chunk %lld",
                                                    (long long)j, (long long)i);
            add_into(dq[qi], t_dq, qn(r));
            add_into(block_k(r, grad, ki), t_dk, kn(r));
            add_into(block_v(r, grad, ki), t_dv, vn(r));
        }
    return CA_OK;
}

typedef struct ring_saved {
    ring r;
    float *lse;      /* [2][B, H, c]: each query chunk's log-sum-exp */
} ring_saved;

static void ring_release(ca_node *n) {
    ring_saved *sv = n->ctx;
    if (sv) free(sv->lse);
    free(sv);
    n->ctx = NULL;
}

/* Rotates keys and values again: at step s the block of rank r - s is attended (the next one in
 * flight meanwhile) and, from step 1 on, the gradient of its keys and values goes straight back to
 * that rank while the one this rank's block got from rank r + s arrives, added in step order. */
static ca_status ring_backward_run(ca_device *dev, const ring *r, float *const q[2], float *const o[2],
                                   float *const dout[2], float *const lse[2], const float *k, const float *v,
                                   float *dq[2], float *dk, float *dv) {
    size_t bn = block_n(r), scratch = qn(r) + kn(r) + vn(r);
    float *mem = calloc(5 * bn + scratch, sizeof(float));
    if (!mem) return ca_error(CA_ERR_NOMEM, "ring attention backward: out of host memory for two blocks");
    float *blk = mem, *next = mem + bn, *own = next + bn, *grad = own + bn, *in = grad + bn, *t_dq = in + bn;
    float *t_dk = t_dq + qn(r), *t_dv = t_dk + kn(r);
    for (int i = 0; i < 2; i++) {
        chunk_copy((float *)k, block_k(r, blk, i), r->b * r->hkv, r->c, r->d, i, false);
        chunk_copy((float *)v, block_v(r, blk, i), r->b * r->hkv, r->c, r->dv, i, false);
    }
    ca_status s = CA_OK;
    for (int step = 0; step < r->size && s == CA_OK; step++) {
        int owner = (r->rank - step + r->size) % r->size;
        ca_work *w = NULL;
        bool more = step + 1 < r->size;
        ca_status rs = more ? rotate(r, blk, next, bn, &w) : CA_OK;
        if (step > 0) memset(grad, 0, sizeof(float) * bn);
        s = block_backward(dev, r, q, o, dout, lse, blk, owner, step == 0 ? own : grad, dq, t_dq, t_dk, t_dv);
        if (s == CA_OK && step > 0) {
            s = ca_comm_sendrecv(r->comm, grad, bn, owner, in, bn, (r->rank + step) % r->size, CA_F32, NULL);
            if (s == CA_OK) add_into(own, in, bn);
            else ca_error_context("ring attention: the key and value gradients back to rank %d of the cp group", owner);
        }
        if (more) rs = wait_rotation(w, rs, "passing the keys and values on in backward");
        if (s == CA_OK) s = rs;
        float *t = blk; blk = next; next = t;
    }
    for (int i = 0; s == CA_OK && i < 2; i++) {
        chunk_copy(dk, block_k(r, own, i), r->b * r->hkv, r->c, r->d, i, true);
        chunk_copy(dv, block_v(r, own, i), r->b * r->hkv, r->c, r->dv, i, true);
    }
    free(mem);
    return s;
}

/* Splits x [B, H, 2c, E] (contiguous) into its two chunks in m (two consecutive [B, H, c, E]). */
static void split2(const float *x, float *m, int64_t bh, int64_t c, int64_t e, float *out[2]) {
    out[0] = m;
    out[1] = m + (size_t)(bh * c * e);
    for (int i = 0; i < 2; i++) chunk_copy((float *)x, out[i], bh, c, e, i, false);
}

static ca_status ring_node_backward(ca_node *n, ca_tensor *g) {
    ring_saved *sv = n->ctx;
    const ring *r = &sv->r;
    ca_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
    g = ca_contiguous(g);
    ca_tensor *dq = g ? ca_op_new_like(q) : NULL, *dk = dq ? ca_op_new_like(k) : NULL, *dv = dk ? ca_op_new_like(v) : NULL;
    if (!dv) return ca_last_status();
    size_t per = 2 * (qn(r) + 2 * on(r) + qn(r));
    float *mem = malloc(sizeof(float) * per), *qc[2], *oc[2], *gc[2], *dqc[2];
    if (!mem) return ca_error(CA_ERR_NOMEM, "ring attention backward: out of host memory");
    int64_t bh = r->b * r->h;
    split2(ca_tptr(q), mem, bh, r->c, r->d, qc);
    split2(ca_tptr(n->out), mem + 2 * qn(r), bh, r->c, r->dv, oc);
    split2(ca_tptr(g), mem + 2 * qn(r) + 2 * on(r), bh, r->c, r->dv, gc);
    dqc[0] = mem + 2 * qn(r) + 4 * on(r);
    dqc[1] = dqc[0] + qn(r);
    memset(dqc[0], 0, sizeof(float) * 2 * qn(r));
    float *lse[2] = {sv->lse, sv->lse + ln(r)};
    ca_status s = ring_backward_run(ca_tdev(q), r, qc, oc, gc, lse, ca_tptr(k), ca_tptr(v), dqc, ca_tptr(dk),
                                    ca_tptr(dv));
    for (int i = 0; s == CA_OK && i < 2; i++) chunk_copy(ca_tptr(dq), dqc[i], bh, r->c, r->d, i, true);
    free(mem);
    if (s == CA_OK && q->requires_grad) s = ca_op_accumulate_owned(q, dq, 1.0f);
    if (s == CA_OK && k->requires_grad) s = ca_op_accumulate_owned(k, dk, 1.0f);
    if (s == CA_OK && v->requires_grad) s = ca_op_accumulate_owned(v, dv, 1.0f);
    return s;
}
static const ca_node_vt ring_vt = {"cp_ring_attention", ring_node_backward};

/* ------------------------------------------------------------------ the op */

/* The forward's rotation: out and lse per query chunk, over cp blocks, the next in flight. */
static ca_status ring_forward_run(ca_device *dev, const ring *r, float *const q[2], const float *k, const float *v,
                                  float *out[2], float *lse[2]) {
    size_t bn = block_n(r);
    float *mem = malloc(sizeof(float) * (2 * bn + on(r) + ln(r)));
    if (!mem) return ca_error(CA_ERR_NOMEM, "ring attention: out of host memory for two blocks");
    float *blk = mem, *next = mem + bn, *tmp_o = next + bn, *tmp_l = tmp_o + on(r);
    for (int i = 0; i < 2; i++) {
        chunk_copy((float *)k, block_k(r, blk, i), r->b * r->hkv, r->c, r->d, i, false);
        chunk_copy((float *)v, block_v(r, blk, i), r->b * r->hkv, r->c, r->dv, i, false);
    }
    ca_status s = CA_OK;
    for (int step = 0; step < r->size && s == CA_OK; step++) {
        ca_work *w = NULL;
        bool more = step + 1 < r->size;
        ca_status rs = more ? rotate(r, blk, next, bn, &w) : CA_OK;
        s = attend_block(dev, r, q, blk, (r->rank - step + r->size) % r->size, out, lse, tmp_o, tmp_l);
        if (more) rs = wait_rotation(w, rs, "passing the keys and values on");
        if (s == CA_OK) s = rs;
        float *t = blk; blk = next; next = t;
    }
    free(mem);
    return s;
}

ca_tensor *ca_cp_ring_attention(ca_comm *comm, int rank, int size, ca_tensor *q, ca_tensor *k, ca_tensor *v,
                                double scale) {
    /* as the attention op: f32 under autocast, else the queries' dtype */
    ca_dtype out_dt = !q || ca_autocast_dtype() != CA_F32 ? CA_F32 : q->dtype;
    q = ca_contiguous(ca_cast(q, CA_F32));
    k = ca_contiguous(ca_cast(k, CA_F32));
    v = ca_contiguous(ca_cast(v, CA_F32));
    CA_OP_NULLCHECK2(q, k);
    CA_OP_NULLCHECK1(v);
    ring r = {.comm = comm, .rank = rank, .size = size, .b = q->shape[0], .h = q->shape[1], .hkv = k->shape[1],
              .c = q->shape[2] / 2, .d = q->shape[3], .dv = v->shape[3],
              .scale = scale > 0 ? (float)scale : 1.0f / sqrtf((float)q->shape[3])};
    int64_t oshape[4] = {r.b, r.h, 2 * r.c, r.dv};
    ca_tensor *out = ca_tensor_new(ca_tdev(q), CA_F32, 4, oshape);
    float *lse = malloc(sizeof(float) * 2 * ln(&r)), *mem = malloc(sizeof(float) * 2 * (qn(&r) + on(&r)));
    if (!out || !lse || !mem) {
        free(lse);
        free(mem);
        if (out) ca_error(CA_ERR_NOMEM, "ring attention: out of host memory");
        return NULL;
    }
    float *qc[2], *oc[2] = {mem + 2 * qn(&r), mem + 2 * qn(&r) + on(&r)}, *lc[2] = {lse, lse + ln(&r)};
    split2(ca_tptr(q), mem, r.b * r.h, r.c, r.d, qc);
    memset(oc[0], 0, sizeof(float) * 2 * on(&r));
    for (size_t i = 0; i < 2 * ln(&r); i++) lse[i] = -INFINITY;
    ca_status s = ring_forward_run(ca_tdev(q), &r, qc, ca_tptr(k), ca_tptr(v), oc, lc);
    for (int i = 0; s == CA_OK && i < 2; i++) chunk_copy(ca_tptr(out), oc[i], r.b * r.h, r.c, r.dv, i, true);
    free(mem);
    ring_saved *sv = NULL;
    ca_tensor *in[3] = {q, k, v};
    if (s == CA_OK && ca_needs_grad(3, in)) {
        ca_node *n = (sv = malloc(sizeof *sv)) ? ca_record(&ring_vt, out, 3, in) : NULL;
        if (!n) {
            if (!sv) ca_error(CA_ERR_NOMEM, "ring attention: out of host memory");
            free(sv);
            free(lse);
            return NULL;
        }
        *sv = (ring_saved){.r = r, .lse = lse};
        n->ctx = sv;
        n->release = ring_release;
        lse = NULL;
    }
    free(lse);
    if (s != CA_OK) return NULL;
    return out_dt == CA_F32 ? out : ca_cast(out, out_dt);
}
