/* Sequence parallelism (Megatron-LM's, torch's SequenceParallel): between the tensor-parallel layers the
 * activations [B, T, ...] are split along the sequence over the tp ranks (rank r holds tokens
 * [r T/tp, (r + 1) T/tp)), so that the norms (and what else works per token) run on 1/tp of them. A colwise
 * layer all-gathers its input along the sequence (backward: reduce-scatter, which also sums the input's
 * gradient over tp, so it replaces the colwise all-reduce), a rowwise layer reduce-scatters its partial
 * outputs along the sequence instead of all-reducing them (backward: all-gather), and a norm planned
 * "sequence_parallel" sums its weight's gradients over tp (each rank saw its tokens only). */
#include "accelerator/mesh_impl.h"
#include "nn/nn_impl.h"
#include "tensor/ops_impl.h"

#include <caccel/collective.h>

#include <stdlib.h>
#include <string.h>

/* x [B, T, ...] seen as [B, T, R]: block r (tokens [r T/tp, (r + 1) T/tp)) copied into a contiguous
 * [B, T/tp, R] buffer at `part`. */
static ca_status seq_copy(const ca_tensor *x, int tp, int r, void *part) {
    int64_t B = x->shape[0], T = x->shape[1], bt = B * T, R = bt > 0 ? x->numel / bt : 0, t = T / tp;
    int64_t shape[3] = {B, t, R}, ws[3] = {T * R, R, 1}, ps[3] = {t * R, R, 1};
    const char *w = (const char *)ca_tptr(x) + (size_t)(r * t * R) * ca_dtype_size(x->dtype);
    return CA_KCALL(ca_tdev(x), copy_strided, .dt = x->dtype, .ndim = 3, .shape = shape, .x = w, .x_stride = ws,
                    .y = part, .y_stride = ps);
}

/* x's shape with dimension 1 multiplied by num / den. */
static ca_tensor *seq_new(const ca_tensor *x, int64_t num, int64_t den) {
    int64_t shape[CA_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[1] = shape[1] * num / den;
    return ca_tensor_new(ca_tdev(x), x->dtype, x->ndim, shape);
}

/* One collective per batch row b, issued together and then waited for: rank r's tokens of a row are
 * contiguous ([T, R] holds the ranks' [T/tp, R] blocks in rank order), so a row's all-gather
 * (gather: part -> whole) or reduce-scatter (whole -> part) reads and writes the tensors in place. A
 * packed whole-size copy would be freed into the caching allocator and then serve the half-size tensors
 * after it (a miss takes a free block of up to twice its size), which would undo what the split saves. */
static ca_status seq_rows(ca_comm *c, bool gather, const ca_tensor *part, void *whole_ptr, void *part_ptr) {
    int tp = ca_comm_size(c);
    int64_t B = part->shape[0], n = B ? part->numel / B : 0;   /* a row of the part: T/tp tokens */
    size_t es = ca_dtype_size(part->dtype);
    ca_work **w = calloc((size_t)(B ? B : 1), sizeof *w);
    if (!w) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ca_status s = CA_OK;
    for (int64_t b = 0; s == CA_OK && b < B; b++) {
        char *pp = (char *)part_ptr + (size_t)(b * n) * es, *wp = (char *)whole_ptr + (size_t)(b * n * tp) * es;
        s = gather ? ca_comm_all_gather(c, pp, wp, (size_t)n, part->dtype, &w[b])
                   : ca_comm_reduce_scatter(c, wp, pp, (size_t)n, part->dtype, CA_OP_SUM, &w[b]);
    }
    for (int64_t b = 0; b < B; b++) {
        ca_status ws = w[b] ? ca_work_wait(w[b], -1) : CA_OK;
        if (s == CA_OK) s = ws;
        ca_work_free(w[b]);
    }
    free(w);
    return s;
}

/* shard [B, T/tp, ...] of every rank -> whole [B, T, ...] (no gradient). */
static ca_tensor *seq_all_gather(ca_comm *c, ca_tensor *shard, const char *what) {
    int tp = ca_comm_size(c);
    shard = ca_contiguous(shard);
    ca_tensor *out = shard ? seq_new(shard, tp, 1) : NULL;
    if (!out) return NULL;
    if (seq_rows(c, true, shard, ca_tptr(out), ca_tptr(shard)) != CA_OK) {
        ca_error_context("sequence parallelism: all-gathering %s along the sequence", what);
        return NULL;
    }
    return out;
}

/* whole [B, T, ...] (each rank's partial sum, or the same on every rank) -> this rank's tokens [B, T/tp, ...],
 * summed over tp (sum) or only taken (no communication). No gradient. */
static ca_tensor *seq_scatter(ca_comm *c, ca_tensor *whole, bool sum, const char *what) {
    int tp = ca_comm_size(c), r = ca_comm_rank(c);
    whole = ca_contiguous(whole);
    ca_tensor *out = whole ? seq_new(whole, 1, tp) : NULL;
    if (!out) return NULL;
    ca_status s = sum ? seq_rows(c, false, out, ca_tptr(whole), ca_tptr(out))
                      : seq_copy(whole, tp, r, ca_tptr(out));
    if (s != CA_OK) {
        ca_error_context("sequence parallelism: %s %s along the sequence", sum ? "reduce-scattering" : "splitting", what);
        return NULL;
    }
    return out;
}

/* The three ops: forward and backward are the pairs above. n->ctx: the tp communicator; n->i[0] the
 * backward's kind. */
enum { SEQ_BW_GATHER, SEQ_BW_REDUCE_SCATTER, SEQ_BW_SLICE };

static ca_status seq_backward(ca_node *n, ca_tensor *g) {
    ca_comm *c = n->ctx;
    ca_tensor *dx = n->i[0] == SEQ_BW_GATHER ? seq_all_gather(c, g, "a gradient")
                                             : seq_scatter(c, g, n->i[0] == SEQ_BW_REDUCE_SCATTER, "a gradient");
    return dx ? ca_op_accumulate_owned(n->in[0], dx, 1.0f) : ca_last_status();
}
static const ca_node_vt seq_vt = {"tp_sequence", seq_backward};

static ca_tensor *seq_record(ca_tensor *x, ca_tensor *y, ca_comm *c, int backward) {
    if (!y || !ca_needs_grad(1, &x)) return y;
    ca_node *n = ca_record(&seq_vt, y, 1, &x);
    if (!n) return NULL;
    n->ctx = c;
    n->i[0] = backward;
    return y;
}

static bool seq_check(ca_comm *c, const ca_tensor *x, int64_t factor, const char *what) {
    if (!x) return false;
    if (x->ndim >= 2 && (x->shape[1] * factor) % ca_comm_size(c) == 0) return true;
    ca_error(CA_ERR_INVALID, "sequence parallelism: %s of %d dimensions and %lld tokens (dimension 1), which "
             "parallelism_config_tp_size %d does not divide", what, x->ndim, x->ndim >= 2 ? (long long)x->shape[1] : 0LL,
             ca_comm_size(c));
    return false;
}

ca_tensor *ca_tp_seq_colwise_input(ca_comm *c, ca_tensor *x) {
    if (!seq_check(c, x, ca_comm_size(c), "a colwise layer's input")) return NULL;
    return seq_record(x, seq_all_gather(c, x, "a colwise layer's input"), c, SEQ_BW_REDUCE_SCATTER);
}

ca_tensor *ca_tp_seq_rowwise_output(ca_comm *c, ca_tensor *y) {
    if (!seq_check(c, y, 1, "a rowwise layer's output")) return NULL;
    return seq_record(y, seq_scatter(c, y, true, "a rowwise layer's output"), c, SEQ_BW_GATHER);
}

/* ------------------------------------------------------------------ the program's side */

/* ca_tp_sequence_split / ca_tp_sequence_gather of a module the plan split (nn/module.c calls them through
 * the module's ca_module_seq, as nn does not use communicators itself). */
static ca_tensor *seq_split(void *ctx, ca_tensor *x) {
    ca_comm *c = ctx;
    if (!seq_check(c, x, 1, "ca_tp_sequence_split: the input")) return NULL;
    return seq_record(x, seq_scatter(c, x, false, "the input"), c, SEQ_BW_GATHER);
}

static ca_tensor *seq_gather(void *ctx, ca_tensor *x) {
    ca_comm *c = ctx;
    if (!seq_check(c, x, ca_comm_size(c), "ca_tp_sequence_gather: the input")) return NULL;
    return seq_record(x, seq_all_gather(c, x, "the output"), c, SEQ_BW_SLICE);
}

const ca_module_seq *ca_tp_seq_ops(ca_mesh *m) {
    m->seq_ops = (ca_module_seq){.ctx = m->comm[CA_MESH_TP], .size = ca_comm_size(m->comm[CA_MESH_TP]),
                                 .rank = ca_comm_rank(m->comm[CA_MESH_TP]),
                                 .split = seq_split, .gather = seq_gather};
    return &m->seq_ops;
}
