/* Context parallelism (Accelerate's parallelism_config_cp_size, torch's context_parallel): each cp rank
 * holds T / cp tokens of every sequence, in load-balanced causal chunks (the sequence cut into 2 cp
 * chunks; rank r keeps chunks r and 2 cp - 1 - r, so every rank's causal work is the same), and causal
 * attention all-gathers keys and values over the cp communicator (torch's default "allgather" rotation;
 * "alltoall" passes them round a ring instead: cp_ring.c). The gradients of the gathered keys and
 * values are reduce-scattered back to their owners; the loss is the mean over the tokens of all cp
 * ranks. */
#include "accelerator/mesh_impl.h"
#include "tensor/ops_impl.h"

#include <stdlib.h>
#include <string.h>

/* The calling thread's split, between ca_maybe_context_parallel and ca_context_parallel_end. */
typedef struct cp_split {
    ca_comm *comm;
    int rank, size;
    int64_t seq;    /* the whole sequence's length */
    bool ring;      /* parallelism_config_cp_comm_strategy alltoall: ring attention (cp_ring.c) */
    const char *origin;
} cp_split;
static _Thread_local cp_split cur;

static const char cp_key[] = "parallelism_config_cp_size";

/* ------------------------------------------------------------------ the two collective ops */

static ca_status gather_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0], *mine = ca_op_new_like(x);
    if (!mine) return ca_last_status();
    g = ca_contiguous(g);
    if (!g) return ca_last_status();
    ca_status s = ca_comm_reduce_scatter(n->ctx, ca_tptr(g), ca_tptr(mine), (size_t)x->numel, CA_F32, CA_OP_SUM, NULL);
    if (s != CA_OK) return ca_error_context("context parallelism: the gathered keys' and values' gradients");
    return ca_op_accumulate_owned(x, mine, 1.0f);
}
static const ca_node_vt gather_vt = {"cp_all_gather", gather_backward};

/* x (f32) from every cp rank, stacked along a new first dimension in rank order; backward sums each
 * rank's part of the gradient over the cp ranks into its owner's x (reduce-scatter). */
static ca_tensor *cp_all_gather(ca_tensor *x, ca_comm *cp, int size) {
    x = ca_contiguous(x);
    if (!x) return NULL;
    int64_t shape[CA_MAX_DIMS + 1];
    shape[0] = size;
    memcpy(shape + 1, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    ca_tensor *out = ca_tensor_new(ca_tdev(x), CA_F32, x->ndim + 1, shape);
    if (!out) return NULL;
    if (ca_comm_all_gather(cp, ca_tptr(x), ca_tptr(out), (size_t)x->numel, CA_F32, NULL) != CA_OK) {
        ca_error_context("context parallelism: all-gather of the keys and values");
        return NULL;
    }
    if (ca_needs_grad(1, &x)) {
        ca_node *n = ca_record(&gather_vt, out, 1, &x);
        if (!n) return NULL;
        n->ctx = cp;
    }
    return out;
}

static ca_status sum_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *all = ca_op_new_like(g);
    if (!all) return ca_last_status();
    g = ca_contiguous(g);
    ca_status s = g ? ca_comm_all_reduce(n->ctx, ca_tptr(g), ca_tptr(all), (size_t)g->numel, g->dtype, CA_OP_SUM, NULL)
                    : ca_last_status();
    if (s != CA_OK) return ca_error_context("context parallelism: the loss's gradient");
    return ca_op_accumulate_owned(n->in[0], all, 1.0f);
}
static const ca_node_vt sum_vt = {"cp_sum", sum_backward};

/* The sum over the cp ranks of y (each rank's part of the loss). Every rank's loss is then the whole
 * one and every rank runs its backward: the gradient reaching y is the sum of theirs, cp times one
 * rank's, which the average of the gradients over dp_cp (cp ranks among them) divides back. */
static ca_tensor *cp_sum(ca_tensor *y, ca_comm *cp) {
    ca_tensor *out = ca_mesh_sum(cp, &y, "context parallelism: the loss's sum");
    if (!out) return NULL;
    if (ca_needs_grad(1, &y)) {
        ca_node *n = ca_record(&sum_vt, out, 1, &y);
        if (!n) return NULL;
        n->ctx = cp;
    }
    return out;
}

/* ------------------------------------------------------------------ attention */

/* The whole sequence of keys or values x [B, Hkv, T / cp, D] (this rank's two chunks): gathered, then
 * chunk j taken from rank j (its first) for j < cp, from rank 2 cp - 1 - j (its second) after. */
static ca_tensor *gather_seq(ca_tensor *x) {
    int cp = cur.size;
    int64_t c = x->shape[2] / 2;
    ca_tensor *all = cp_all_gather(ca_cast(x, CA_F32), cur.comm, cp);
    if (!all) return NULL;
    ca_tensor **parts = malloc(sizeof *parts * (size_t)(2 * cp));
    if (!parts) {
        ca_error(CA_ERR_NOMEM, "out of host memory");
        return NULL;
    }
    for (int j = 0; j < 2 * cp; j++) {
        int owner = j < cp ? j : 2 * cp - 1 - j;
        ca_tensor *r = ca_reshape(ca_narrow(all, 0, owner, 1), 4, x->shape);
        parts[j] = ca_narrow(r, 2, j < cp ? 0 : c, c);
    }
    ca_tensor *whole = ca_concat(2 * cp, parts, 2);
    free(parts);
    return whole;
}

/* The causal cut of the queries of global chunk j (c rows) against the keys before its end: u8,
 * [c, (j + 1) c], 1 where the key's position is at most the query's. */
static ca_tensor *chunk_mask(ca_device *dev, int64_t j, int64_t c) {
    int64_t tk = (j + 1) * c;
    uint8_t *m = malloc((size_t)(c * tk));
    if (!m) {
        ca_error(CA_ERR_NOMEM, "out of host memory");
        return NULL;
    }
    for (int64_t i = 0; i < c; i++)
        for (int64_t t = 0; t < tk; t++) m[i * tk + t] = t <= j * c + i;
    ca_tensor *mask = ca_from_host(dev, CA_U8, 2, (int64_t[]){c, tk}, m);
    free(m);
    return mask;
}

static ca_tensor *refuse(const char *what) {
    ca_error(CA_ERR_UNSUPPORTED, "scaled_dot_product_attention under context parallelism (%s %d, from %s): %s",
             cp_key, cur.size, cur.origin, what);
    return NULL;
}

/* The hook of ca_scaled_dot_product_attention: this rank's queries (its two chunks) against the keys
 * and values of the whole sequence; each chunk attends to the keys up to its own end only. */
static ca_tensor *cp_attention(void *ctx, ca_tensor *q, ca_tensor *k, ca_tensor *v, ca_tensor *mask, bool causal,
                               double dropout_p, double scale) {
    (void)ctx;
    CA_OP_NULLCHECK2(q, k);
    CA_OP_NULLCHECK1(v);
    if (mask)
        return refuse("attention with a mask (padding) is not split yet (its columns would have to follow the keys' "
                      "chunks); context parallelism takes causal attention without one");
    if (!causal)
        return refuse("non-causal attention is not split yet (the load-balanced chunks serve a causal mask)");
    if (dropout_p > 0)
        return refuse("attention dropout is not supported yet (its random draws could not match one process's); "
                      "set the attention dropout to 0");
    int64_t tl = cur.seq / cur.size;
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || q->shape[2] != tl || k->shape[2] != tl || v->shape[2] != tl) {
        char qs[128];
        ca_error(CA_ERR_INVALID, "scaled_dot_product_attention under context parallelism (%s %d): q %s, expected "
                 "[B, H, %lld, D] with k and v alike (this rank's %lld tokens of %lld; split the batch with "
                 "ca_maybe_context_parallel)", cp_key, cur.size, ca_shape_str(q->ndim, q->shape, qs, sizeof qs),
                 (long long)tl, (long long)tl, (long long)cur.seq);
        return NULL;
    }
    if (cur.ring)   /* the host loops of cp_ring.c where the device's memory is the host's */
        return (ca_device_is_host(ca_tdev(q)) ? ca_cp_ring_attention : ca_cp_ring_attention_dev)(cur.comm, cur.rank,
                                                                                                  cur.size, q, k, v, scale);
    ca_tensor *kw = gather_seq(k), *vw = kw ? gather_seq(v) : NULL;
    CA_OP_NULLCHECK2(kw, vw);
    int64_t c = tl / 2;
    ca_tensor *out[2];
    for (int s = 0; s < 2; s++) {
        int64_t j = s == 0 ? cur.rank : 2 * cur.size - 1 - cur.rank;
        ca_tensor *m = chunk_mask(ca_tdev(q), j, c);
        CA_OP_NULLCHECK1(m);
        out[s] = ca_op_attention(ca_narrow(q, 2, s * c, c), ca_narrow(kw, 2, 0, (j + 1) * c),
                                 ca_narrow(vw, 2, 0, (j + 1) * c), m, false, 0.0, scale);
        CA_OP_NULLCHECK1(out[s]);
    }
    return ca_concat(2, out, 2);
}

/* ------------------------------------------------------------------ the split */

static ca_status split_check(ca_tensor **buffers, const int *seq_dims, int n, int cp, int64_t *seq) {
    *seq = -1;
    if (n < 1)
        return ca_error(CA_ERR_INVALID, "ca_maybe_context_parallel: no buffers (the sequence's length is read from "
                        "them)");
    for (int i = 0; i < n; i++) {
        const ca_tensor *b = buffers[i];
        int d = seq_dims[i];
        if (!b || d < 0 || d >= b->ndim)
            return ca_error(CA_ERR_INVALID, "ca_maybe_context_parallel: buffer %d is %s (sequence dimension %d)", i,
                            b ? "of fewer dimensions" : "NULL", d);
        if (*seq >= 0 && b->shape[d] != *seq)
            return ca_error(CA_ERR_INVALID, "ca_maybe_context_parallel: buffer %d has %lld positions along dimension "
                            "%d, buffer 0 %lld (every buffer holds the same sequence)", i, (long long)b->shape[d], d,
                            (long long)*seq);
        *seq = b->shape[d];
    }
    if (*seq % (2 * cp) != 0)
        return ca_error(CA_ERR_INVALID, "ca_maybe_context_parallel: a sequence of %lld tokens does not split into "
                        "2 x %s = %d equal chunks (each cp rank keeps two: the causal work stays even); pad or cut it "
                        "to a multiple of %d", (long long)*seq, cp_key, 2 * cp, 2 * cp);
    return CA_OK;
}

/* Rank r's chunks r and 2 cp - 1 - r of x along d, contiguous. */
static ca_tensor *split_one(ca_tensor *x, int d, int r, int cp) {
    int64_t c = x->shape[d] / (2 * cp);
    ca_tensor *two[2] = {ca_narrow(x, d, r * c, c), ca_narrow(x, d, (2 * cp - 1 - r) * c, c)};
    return ca_contiguous(ca_concat(2, two, d));
}

ca_status ca_maybe_context_parallel(ca_accelerator *acc, int n, ca_tensor **buffers, const int *seq_dims) {
    if (!acc || n < 1 || !buffers || !seq_dims)
        return ca_error(CA_ERR_INVALID, "ca_maybe_context_parallel: accelerator, buffers and their sequence "
                        "dimensions are required");
    if (!acc->mesh || acc->mesh->shape.size[CA_MESH_CP] <= 1) return CA_OK;
    if (cur.comm)
        return ca_error(CA_ERR_STATE, "ca_maybe_context_parallel: this thread's batch is already split (call "
                        "ca_context_parallel_end after its backward first)");
    int cp = acc->mesh->shape.size[CA_MESH_CP], r = acc->mesh->coord[CA_MESH_CP];
    int64_t seq;
    ca_status s = split_check(buffers, seq_dims, n, cp, &seq);
    ca_tensor **local = s == CA_OK ? calloc((size_t)(n ? n : 1), sizeof *local) : NULL;
    if (s == CA_OK && !local) s = ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int i = 0; s == CA_OK && i < n; i++)
        if (!(local[i] = split_one(buffers[i], seq_dims[i], r, cp))) s = ca_last_status();
    if (s == CA_OK) {
        memcpy(buffers, local, sizeof *local * (size_t)n);
        const char *strategy = ca_config_get(acc->cfg, "parallelism_config.parallelism_config_cp_comm_strategy");
        cur = (cp_split){.comm = acc->mesh->comm[CA_MESH_CP], .rank = r, .size = cp, .seq = seq,
                         .ring = strategy && strcmp(strategy, "alltoall") == 0,
                         .origin = ca_config_origin(acc->cfg, "parallelism_config.parallelism_config_cp_size")};
        ca_attention_set_hook(cp_attention, NULL);
    }
    free(local);
    if (s != CA_OK) ca_error_context("ca_maybe_context_parallel (%s %d, cp rank %d)", cp_key, cp, r);
    return s;
}

void ca_context_parallel_end(ca_accelerator *acc) {
    (void)acc;
    if (!cur.comm) return;
    ca_attention_set_hook(NULL, NULL);
    cur = (cp_split){0};
}

/* ------------------------------------------------------------------ the loss */

ca_tensor *ca_cp_mean(ca_tensor *sum, int64_t counted) {
    if (!sum) return NULL;
    if (!cur.comm) return ca_mul_scalar(sum, 1.0 / (double)counted);   /* none counted: NaN, as torch's mean */
    int64_t all = counted;
    ca_tensor *n = ca_from_host(ca_tdev(sum), CA_I64, 0, NULL, &all);
    if (!n || ca_comm_all_reduce(cur.comm, ca_tptr(n), ca_tptr(n), 1, CA_I64, CA_OP_SUM, NULL) != CA_OK ||
        ca_tensor_to_host(n, &all, sizeof all) != CA_OK) {
        ca_error_context("context parallelism: the loss's token count");
        return NULL;
    }
    return ca_mul_scalar(cp_sum(sum, cur.comm), 1.0 / (double)all);
}

bool ca_cp_active(void) { return cur.comm != NULL; }

/* ca_cross_entropy's mean under the split: the sum over this rank's labels that are not -100, counted
 * on the host. */
ca_tensor *ca_cp_cross_entropy(ca_tensor *logits, ca_tensor *labels) {
    if (!logits || !labels) return NULL;
    ca_tensor *l = ca_contiguous(labels->dtype == CA_I64 ? labels : ca_cast(labels, CA_I64));
    int64_t *h = l ? malloc(sizeof *h * (size_t)(l->numel ? l->numel : 1)) : NULL;
    if (l && !h) ca_error(CA_ERR_NOMEM, "out of host memory");
    if (!h || ca_tensor_to_host(l, h, sizeof *h * (size_t)l->numel) != CA_OK) {
        free(h);
        return NULL;
    }
    int64_t counted = 0;
    for (int64_t i = 0; i < l->numel; i++) counted += h[i] != -100;
    free(h);
    ca_cross_entropy_opts o = {.reduction = CA_REDUCTION_SUM};
    return ca_cp_mean(ca_cross_entropy_ex(logits, labels, &o), counted);
}
