/* Ring attention on a device's own memory (the lazy device, a GPU): cp_ring.c's schedule with every step a
 * device operation instead of a loop over host floats, so that on the lazy device the whole ring is
 * nodes of the step's graph, run in graph order by its executor: each exchange of a block
 * (ca_comm_sendrecv on device buffers, recorded as a host function keyed by its peers and size), the
 * attention kernel of each pair of chunks, the log-sum-exp merge of the blocks' outputs (elementwise
 * ops, which the lazy device fuses), the accumulations of the gradients. The key and value chunks
 * travel round the cp ring (rank r sends to r + 1, receives from r - 1) in cp - 1 exchanges; backward
 * rotates them again and sends each visiting block's gradient straight back to its owner. On the lazy
 * device an exchange runs when the executor reaches it: the next block is not in flight while the
 * current one is attended, as it is on the CPU. On a GPU the same operations are its kernels and the
 * cp communicator's sendrecv (NCCL's, or staged through host memory). */
#include "accelerator/mesh_impl.h"
#include "tensor/ops_impl.h"

#include <math.h>

typedef struct dring {
    ca_comm *comm;
    int rank, size;
    int64_t b, h, hkv, c, d, dv;   /* c: tokens per chunk (half the rank's) */
    float scale;
} dring;

static int64_t kn(const dring *r) { return r->b * r->hkv * r->c * r->d; }    /* one key chunk */
static int64_t vn(const dring *r) { return r->b * r->hkv * r->c * r->dv; }   /* one value chunk */
/* A block: key chunks 0 and 1, then value chunks 0 and 1 (each contiguous [B, Hkv, c, *]). */
static int64_t block_n(const dring *r) { return 2 * (kn(r) + vn(r)); }
static void *at(ca_tensor *t, int64_t elems) { return (char *)ca_tptr(t) + elems * (int64_t)sizeof(float); }
static void *block_k(const dring *r, ca_tensor *blk, int i) { return at(blk, i * kn(r)); }
static void *block_v(const dring *r, ca_tensor *blk, int i) { return at(blk, 2 * kn(r) + i * vn(r)); }

/* The global chunk of a rank's local chunk i (0: its first, 1: its second). */
static int64_t chunk_of(const dring *r, int owner, int i) { return i == 0 ? owner : 2 * r->size - 1 - owner; }

static ca_attention_params params(const dring *r, bool causal) {
    return (ca_attention_params){.batch = r->b, .heads = r->h, .tq = r->c, .tk = r->c, .d = r->d, .dv = r->dv,
                                 .scale = r->scale, .causal = causal};
}

/* Local chunk i of x [B, H, 2c, E], contiguous. */
static ca_tensor *chunk(ca_tensor *x, int i, int64_t c) { return ca_contiguous(ca_narrow(x, 2, i * c, c)); }

static ca_tensor *flat(ca_tensor *x) { return x ? ca_reshape(x, 1, (int64_t[]){x->numel}) : NULL; }

/* The rank's own block from k and v [B, Hkv, 2c, *]. */
static ca_tensor *own_block(const dring *r, ca_tensor *k, ca_tensor *v) {
    ca_tensor *parts[4] = {flat(chunk(k, 0, r->c)), flat(chunk(k, 1, r->c)), flat(chunk(v, 0, r->c)),
                           flat(chunk(v, 1, r->c))};
    for (int i = 0; i < 4; i++) CA_OP_NULLCHECK1(parts[i]);
    return ca_concat(4, parts, 0);
}

/* Chunk i of a block's keys (or values, `values`) as a tensor [B, Hkv, c, *] viewing the block. */
static ca_tensor *block_part(const dring *r, ca_tensor *blk, bool values, int i) {
    int64_t off = values ? 2 * kn(r) + i * vn(r) : i * kn(r), n = values ? vn(r) : kn(r);
    return ca_reshape(ca_narrow(blk, 0, off, n), 4, (int64_t[]){r->b, r->hkv, r->c, values ? r->dv : r->d});
}

/* One exchange round the ring: this block to the right, the left neighbour's into a new one. On the
 * lazy device it is a node of the graph and *w is complete at once. */
static ca_tensor *rotate(const dring *r, ca_tensor *blk, ca_work **w) {
    ca_tensor *next = ca_empty(ca_tdev(blk), CA_F32, 1, (int64_t[]){block_n(r)});
    if (!next) return NULL;
    int right = (r->rank + 1) % r->size, left = (r->rank + r->size - 1) % r->size;
    if (ca_comm_sendrecv(r->comm, ca_tptr(blk), (size_t)block_n(r), right, ca_tptr(next), (size_t)block_n(r), left,
                         CA_F32, w) != CA_OK) {
        ca_error_context("ring attention: passing the keys and values to rank %d of the cp group", right);
        return NULL;
    }
    return next;
}

static bool wait_rotation(ca_work *w, const char *what) {
    ca_status s = ca_work_wait(w, -1);
    ca_work_free(w);
    if (s != CA_OK) ca_error_context("ring attention: %s", what);
    return s == CA_OK;
}

/* ------------------------------------------------------------------ forward */

/* out, lse of a query chunk merged with one block's (o, l) by their log-sum-exp: the block's share of
 * the softmax is sigmoid(l - lse), the new log-sum-exp max(lse, l) + log(1 + exp(-|l - lse|)) (max
 * and |.| through relu, which keeps both finite). */
static void merge(ca_tensor **out, ca_tensor **lse, ca_tensor *o, ca_tensor *l) {
    ca_tensor *d = ca_sub(l, *lse), *up = ca_relu(d), *down = ca_relu(ca_neg(d));
    ca_tensor *share = d ? ca_reshape(ca_sigmoid(d), 4, (int64_t[]){d->shape[0], d->shape[1], d->shape[2], 1}) : NULL;
    *out = ca_add(*out, ca_mul(share, ca_sub(o, *out)));
    *lse = ca_add(ca_add(*lse, up), ca_log(ca_add_scalar(ca_exp(ca_neg(ca_add(up, down))), 1.0)));
}

/* The rank's two query chunks attend the block of `owner` (its two key chunks): each pair whose key
 * chunk is not after the query chunk, the diagonal causally; the first block a query chunk meets
 * starts its output. */
static bool attend_block(const dring *r, ca_tensor *const q[2], ca_tensor *blk, int owner, ca_tensor *out[2],
                         ca_tensor *lse[2]) {
    ca_device *dev = ca_tdev(blk);
    for (int qi = 0; qi < 2; qi++)
        for (int ki = 0; ki < 2; ki++) {
            int64_t j = chunk_of(r, r->rank, qi), i = chunk_of(r, owner, ki);
            if (i > j) continue;
            ca_tensor *o = ca_empty(dev, CA_F32, 4, (int64_t[]){r->b, r->h, r->c, r->dv});
            ca_tensor *l = o ? ca_empty(dev, CA_F32, 3, (int64_t[]){r->b, r->h, r->c}) : NULL;
            if (!l) return false;
            if (CA_KCALL(dev, attention, .dt = CA_F32, .p = params(r, i == j), .q = ca_tptr(q[qi]),
                         .k = block_k(r, blk, ki), .v = block_v(r, blk, ki), .out = ca_tptr(o), .lse = ca_tptr(l),
                         .kv_heads = r->hkv) != CA_OK) {
                ca_error_context("ring attention: query chunk %lld against key chunk %lld", (long long)j, (long long)i);
                return false;
            }
            if (!out[qi]) {
                out[qi] = o;
                lse[qi] = l;
            } else {
                merge(&out[qi], &lse[qi], o, l);
                if (!out[qi] || !lse[qi]) return false;
            }
        }
    return true;
}

/* The forward's rotation: each query chunk's output and log-sum-exp over the cp blocks. */
static bool ring_forward(const dring *r, ca_tensor *const q[2], ca_tensor *blk, ca_tensor *out[2], ca_tensor *lse[2]) {
    for (int step = 0; step < r->size; step++) {
        ca_work *w = NULL;
        bool more = step + 1 < r->size;
        ca_tensor *next = more ? rotate(r, blk, &w) : NULL;
        if (more && !next) return false;
        bool ok = attend_block(r, q, blk, (r->rank - step + r->size) % r->size, out, lse);
        if (more && !wait_rotation(w, "passing the keys and values on")) return false;
        if (!ok) return false;
        blk = next;
    }
    return true;
}

/* ------------------------------------------------------------------ backward */

/* y += x over n floats (device pointers). */
static ca_status add_into(ca_device *dev, void *y, const void *x, int64_t n) {
    return CA_KCALL(dev, axpby, .dt = CA_F32, .n = n, .alpha = 1.0f, .x = x, .beta = 1.0f, .y = y);
}

typedef struct grads {
    ca_tensor *q[2], *o[2], *g[2], *lse[2];   /* each query chunk's input, output, its gradient, lse */
    ca_tensor *dq[2];                         /* each query chunk's gradient, accumulated */
} grads;

/* The gradients of one block: each query chunk's into gr->dq, the key and value chunks' into the block's
 * accumulator acc (laid out as a block). */
static ca_status block_backward(const dring *r, grads *gr, ca_tensor *blk, int owner, ca_tensor *acc) {
    ca_device *dev = ca_tdev(blk);
    for (int qi = 0; qi < 2; qi++)
        for (int ki = 0; ki < 2; ki++) {
            int64_t j = chunk_of(r, r->rank, qi), i = chunk_of(r, owner, ki);
            if (i > j) continue;
            ca_tensor *dq = ca_op_new_like(gr->q[qi]), *dk = dq ? ca_op_new_like(block_part(r, blk, false, ki)) : NULL,
                      *dv = dk ? ca_op_new_like(block_part(r, blk, true, ki)) : NULL;
            if (!dv) return ca_last_status();
            ca_status s = CA_KCALL(dev, attention_backward, .dt = CA_F32, .p = params(r, i == j),
                                   .q = ca_tptr(gr->q[qi]), .k = block_k(r, blk, ki), .v = block_v(r, blk, ki),
                                   .out = ca_tptr(gr->o[qi]), .dout = ca_tptr(gr->g[qi]), .lse = ca_tptr(gr->lse[qi]),
                                   .dq = ca_tptr(dq), .dk = ca_tptr(dk), .dv = ca_tptr(dv), .kv_heads = r->hkv);
            if (s == CA_OK) s = add_into(dev, ca_tptr(gr->dq[qi]), ca_tptr(dq), dq->numel);
            if (s == CA_OK) s = add_into(dev, block_k(r, acc, ki), ca_tptr(dk), kn(r));
            if (s == CA_OK) s = add_into(dev, block_v(r, acc, ki), ca_tptr(dv), vn(r));
            if (s != CA_OK)
                return ca_error_context("ring attention backward: query chunk %lld against key chunk %lld",
                                        (long long)j, (long long)i);
        }
    return CA_OK;
}

/* Rotates keys and values again: at step s the block of rank r - s is attended and, from step 1 on, the
 * gradient of its keys and values goes straight back to that rank while the one this rank's block got
 * from rank r + s arrives, added in step order into *own. */
static ca_status ring_backward(const dring *r, grads *gr, ca_tensor *blk, ca_tensor *own) {
    ca_device *dev = ca_tdev(blk);
    int64_t bn = block_n(r);
    for (int step = 0; step < r->size; step++) {
        int owner = (r->rank - step + r->size) % r->size, from = (r->rank + step) % r->size;
        ca_work *w = NULL;
        bool more = step + 1 < r->size;
        ca_tensor *next = more ? rotate(r, blk, &w) : NULL;
        if (more && !next) return ca_last_status();
        ca_tensor *acc = step == 0 ? own : ca_zeros(dev, CA_F32, 1, (int64_t[]){bn});
        ca_status s = acc ? block_backward(r, gr, blk, owner, acc) : ca_last_status();
        if (s == CA_OK && step > 0) {
            ca_tensor *in = ca_empty(dev, CA_F32, 1, (int64_t[]){bn});
            s = in ? ca_comm_sendrecv(r->comm, ca_tptr(acc), (size_t)bn, owner, ca_tptr(in), (size_t)bn, from, CA_F32, NULL)
                   : ca_last_status();
            if (s == CA_OK) s = add_into(dev, ca_tptr(own), ca_tptr(in), bn);
            else ca_error_context("ring attention: the key and value gradients back to rank %d of the cp group", owner);
        }
        if (more && !wait_rotation(w, "passing the keys and values on in backward") && s == CA_OK) s = ca_last_status();
        if (s != CA_OK) return s;
        blk = next;
    }
    return CA_OK;
}

/* The gradient of x [B, H*, 2c, *] from its two chunks. */
static ca_tensor *join(ca_tensor *a, ca_tensor *b) {
    CA_OP_NULLCHECK2(a, b);
    return ca_concat(2, (ca_tensor *[]){a, b}, 2);
}

static ca_status dring_backward_body(ca_node *n, ca_tensor *g, const dring *r) {
    ca_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
    ca_device *dev = ca_tdev(q);
    grads gr = {.lse = {n->saved[0], n->saved[1]}};
    g = ca_contiguous(g);
    if (!g) return ca_last_status();
    for (int i = 0; i < 2; i++) {
        gr.q[i] = chunk(q, i, r->c);
        gr.o[i] = chunk(n->out, i, r->c);
        gr.g[i] = chunk(g, i, r->c);
        gr.dq[i] = ca_zeros(dev, CA_F32, 4, (int64_t[]){r->b, r->h, r->c, r->d});
        if (!gr.q[i] || !gr.o[i] || !gr.g[i] || !gr.dq[i]) return ca_last_status();
    }
    ca_tensor *blk = own_block(r, k, v), *own = ca_zeros(dev, CA_F32, 1, (int64_t[]){block_n(r)});
    if (!blk || !own) return ca_last_status();
    ca_status s = ring_backward(r, &gr, blk, own);
    if (s != CA_OK) return s;
    ca_tensor *dq = join(gr.dq[0], gr.dq[1]);
    ca_tensor *dk = join(ca_contiguous(block_part(r, own, false, 0)), ca_contiguous(block_part(r, own, false, 1)));
    ca_tensor *dv = join(ca_contiguous(block_part(r, own, true, 0)), ca_contiguous(block_part(r, own, true, 1)));
    if (!dq || !dk || !dv) return ca_last_status();
    if (q->requires_grad) s = ca_op_accumulate_owned(q, dq, 1.0f);
    if (s == CA_OK && k->requires_grad) s = ca_op_accumulate_owned(k, dk, 1.0f);
    if (s == CA_OK && v->requires_grad) s = ca_op_accumulate_owned(v, dv, 1.0f);
    return s;
}

/* The ring of q [B, H, 2c, D], k [B, Hkv, 2c, D], v [B, Hkv, 2c, Dv] (f32, contiguous). */
static dring dring_of(ca_comm *comm, int rank, int size, ca_tensor *const in[3], float scale) {
    const int64_t *q = in[0]->shape;
    return (dring){.comm = comm, .rank = rank, .size = size, .b = q[0], .h = q[1], .hkv = in[1]->shape[1], .c = q[2] / 2,
                   .d = q[3], .dv = in[2]->shape[3], .scale = scale};
}

static ca_status dring_backward(ca_node *n, ca_tensor *g) {
    dring r = dring_of(n->ctx, (int)n->i[0], (int)n->i[1], n->in, (float)n->f[0]);
    ca_no_grad_begin();   /* the ring's own ops are not part of the tape */
    ca_status s = dring_backward_body(n, g, &r);
    ca_no_grad_end();
    return s;
}
static const ca_node_vt dring_vt = {"cp_ring_attention", dring_backward};

/* ------------------------------------------------------------------ the op */

static ca_tensor *dring_forward(const dring *r, ca_tensor *q, ca_tensor *k, ca_tensor *v, ca_tensor *lse[2]) {
    ca_tensor *qc[2] = {chunk(q, 0, r->c), chunk(q, 1, r->c)}, *blk = own_block(r, k, v), *out[2] = {NULL, NULL};
    if (!qc[0] || !qc[1] || !blk || !ring_forward(r, qc, blk, out, lse)) return NULL;
    return join(out[0], out[1]);
}

ca_tensor *ca_cp_ring_attention_dev(ca_comm *comm, int rank, int size, ca_tensor *q, ca_tensor *k, ca_tensor *v,
                                    double scale) {
    /* as the attention op: f32 under autocast, else the queries' dtype; the ring works on f32 copies */
    ca_dtype out_dt = !q || ca_autocast_dtype() != CA_F32 ? CA_F32 : q->dtype;
    ca_tensor *in[3] = {q, k, v}, *lse[2] = {NULL, NULL};
    for (int i = 0; i < 3; i++)
        if (!(in[i] = ca_contiguous(ca_cast(in[i], CA_F32)))) return NULL;
    dring r = dring_of(comm, rank, size, in, scale > 0 ? (float)scale : 1.0f / sqrtf((float)in[0]->shape[3]));
    bool grad = ca_needs_grad(3, in);
    ca_no_grad_begin();
    ca_tensor *out = dring_forward(&r, in[0], in[1], in[2], lse);
    ca_no_grad_end();
    CA_OP_NULLCHECK1(out);
    if (grad) {
        ca_node *n = ca_record(&dring_vt, out, 3, in);
        if (!n) return NULL;
        n->saved[0] = lse[0];
        n->saved[1] = lse[1];
        n->owned_saved = 3u;   /* the log-sum-exps, made for the backward alone */
        n->ctx = comm;
        n->i[0] = rank;
        n->i[1] = size;
        n->f[0] = r.scale;
    }
    return out_dt == CA_F32 ? out : ca_cast(out, out_dt);
}
