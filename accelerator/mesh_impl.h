/* mesh_impl.h: the device mesh's communicators (mesh.c) and tensor-parallel Linear (tp.c). */
#ifndef CACCEL_MESH_IMPL_H
#define CACCEL_MESH_IMPL_H

#include "accelerator/accelerator_impl.h"
#include "tensor/ops_impl.h"

/* A split parameter made whole for a checkpoint (tp_state.c). */
typedef struct ca_tp_whole {
    ca_tensor *p;
    int dim, parts;                    /* how the plan split it: dimension, fused blocks */
    int64_t slice;                     /* its length along dim on this rank */
    ca_tensor *grad;                   /* its gradient (a DDP bucket's view) set aside: a resize drops it */
    bool grad_defined;
} ca_tp_whole;

/* comm[CA_MESH_DP_CP]: under context parallelism, the ranks of the same tp coordinate (Accelerate's
 * "dp_cp"), over which gradients average: the cp ranks hold the same parameters and each saw part of
 * every sequence. */
#define CA_MESH_DP_CP (CA_MESH_NDIMS + 1)

typedef struct ca_mesh {
    ca_mesh_shape shape;
    int coord[CA_MESH_NDIMS];          /* this rank's */
    ca_comm *comm[CA_MESH_NDIMS + 2];  /* one per dimension, [CA_MESH_NDIMS] "dp": the data-parallel ranks
                                        * (same cp and tp coordinates), which read different batches, and
                                        * [CA_MESH_DP_CP] (NULL at cp 1) */
    int ntp;                           /* Linear modules made tensor-parallel at prepare */
    ca_module **tp;
    ca_forward_fn *tp_plain;           /* each one's forward before the split (ca_summon_full_params runs it) */
    ca_forward_fn *tp_fwd;             /* and the tensor-parallel one the plan gave it (its style) */
    void **tp_plain_ctx;               /* the plain forward's context */
    bool seq;                          /* the plan has "sequence_parallel" entries: colwise and rowwise
                                        * layers take and give this rank's tokens (tp_seq.c) */
    ca_module_seq seq_ops;             /* what the split modules' tp_seq point at (ca_tp_seq_ops) */
    int summons;                       /* ca_tp_summon(on) calls not yet undone (nested: a save while summoned) */
    ca_tp_whole *whole;                /* between ca_tp_summon(acc, true) and (acc, false) */
    int nwhole;
} ca_mesh;

/* Sequence parallelism (tp_seq.c; the split layers call them): a colwise layer's input x [B, T/tp, ...]
 * (this rank's tokens) all-gathered along dimension 1 (backward: the gradient reduce-scattered, summed over
 * tp); a rowwise layer's partial output y [B, T, ...] reduce-scattered to this rank's tokens (backward:
 * all-gathered). Collective over c. NULL with the error set (a T that tp does not divide, a failed
 * collective). */
ca_tensor *ca_tp_seq_colwise_input(ca_comm *c, ca_tensor *x);
ca_tensor *ca_tp_seq_rowwise_output(ca_comm *c, ca_tensor *y);
/* m's sequence split and gather over its tp communicator, for the split modules' tp_seq (kept in m). */
const ca_module_seq *ca_tp_seq_ops(ca_mesh *m);

/* The sum over c's ranks of *y in a new tensor, without an autograd node: tp.c and cp.c record their own
 * backward (the identity for a split layer's partial output, the gradients' sum for cp's loss) against
 * *y, which becomes its contiguous copy where it was not. `what` names the sum in an error. Collective
 * over c; NULL with the error set. */
static inline ca_tensor *ca_mesh_sum(ca_comm *c, ca_tensor **y, const char *what) {
    if (!*y) return NULL;
    if (!ca_tensor_is_contiguous(*y)) *y = ca_contiguous(*y);
    ca_tensor *out = *y ? ca_op_new_like(*y) : NULL;
    if (!out) return NULL;
    if (ca_comm_all_reduce(c, ca_tptr(*y), ca_tptr(out), (size_t)(*y)->numel, (*y)->dtype, CA_OP_SUM, NULL) != CA_OK) {
        ca_error_context("%s", what);
        return NULL;
    }
    return out;
}

/* Makes acc->mesh when parallelism_config_tp_size or cp_size is above 1 (collective: after the process
 * group), refusing what does not compose with them yet; nothing otherwise. */
ca_status ca_mesh_setup(ca_accelerator *acc);
void ca_mesh_free(ca_accelerator *acc);
/* Where gradients are averaged: the mesh's dp_cp communicator under context parallelism, else its dp
 * one, or the whole process group. */
ca_comm *ca_mesh_grad_comm(const ca_accelerator *acc);
/* The ranks that read different batches: the mesh's dp communicator, or the whole process group. */
ca_comm *ca_mesh_data_comm(const ca_accelerator *acc);
/* This rank's data shard: its place among the data-parallel ranks (the tp ranks of a group read the
 * same batches). */
void ca_mesh_data_rank(const ca_accelerator *acc, int *rank, int *world);
/* Whether parameter t is one rank's part of a split layer (its gradient's norm is summed over tp). */
bool ca_tp_is_split(const ca_accelerator *acc, const ca_tensor *t);
/* The dimension along which parameter t is split (0: a colwise Linear's weight and bias, an Embedding's
 * rows; 1: a rowwise Linear's weight), or -1 when it is whole. */
int ca_tp_split_dim(const ca_accelerator *acc, const ca_tensor *t);
/* How the plan split parameter p of the prepared model (tp_state.c): *dim the dimension (-1: whole, or no
 * mesh), *parts its fused blocks (each split alike). CA_ERR_INTERNAL for a split parameter the model does
 * not hold. */
ca_status ca_tp_param_split(const ca_accelerator *acc, const ca_tensor *p, int *dim, int *parts);
/* Full-state checkpoints (tp_state.c). on: every split parameter of the prepared model, and the optimizers'
 * state of it, gathered over the tp communicator into the whole tensor on every rank (collective; the same
 * objects, resized in place), so that save_state / save_model write what one process writes and
 * load_state / load_model read it; off: each rank keeps its slice again (local), gradients as they were.
 * Nothing without a mesh. Calls nest (a save inside ca_summon_full_params): only the first `on` gathers
 * and the last `off` splits. A failed `on` leaves every tensor split and counts nothing. */
ca_status ca_tp_summon(ca_accelerator *acc, bool on);
/* ca_summon_full_params under tensor parallelism: on, every split parameter whole (ca_tp_summon) and the
 * split layers running their plain forward, as one process runs the model (generation, an adapter's save);
 * off, each rank's slices and the tensor-parallel forwards again. Collective over tp. */
ca_status ca_tp_full_params(ca_accelerator *acc, bool on);
/* The split layers' forwards: plain (one process's, for whole parameters) or tensor-parallel (tp.c). */
void ca_tp_set_plain(ca_accelerator *acc, bool plain);
/* Applies model m's ca_tp_plan over the tp communicator (tp.c): with a mesh, a model without a plan is
 * refused; without one, nothing. */
ca_status ca_tp_apply(ca_accelerator *acc, ca_module *m);
/* Whether the accelerator splits layers over tp ranks (parallelism_config_tp_size above 1): a load
 * then reads only this rank's slices of the split parameters (tp.c, checkpoint.c). */
bool ca_tp_reads_slices(const ca_accelerator *acc);
/* How the plan split parameter p, `name` of the model (a Linear's "weight" or "bias", an Embedding's
 * "weight"): along ca_tp_split_dim's dimension (a colwise Linear's output features, a rowwise one's input
 * features, an Embedding's vocabulary rows), in the plan's fused parts (tp_state.c). A style without a
 * full-state checkpoint is CA_ERR_UNSUPPORTED naming the parameter. */
ca_status ca_tp_split_of(const ca_accelerator *acc, ca_module *model, const ca_tensor *p, const char *name, int *dim,
                         int *parts);
/* Loads by byte range under tensor parallelism (tp_load.c). ca_tp_file_shape: the shape a checkpoint
 * holds for parameter p of the prepared model: p's, a split one's dimension tp times this rank's slice
 * (acc NULL: p's). ca_tp_read_entry: this rank's tp slice of tensor e of file f (a split parameter p of
 * the prepared model, or the state of one) or e whole (p replicated), read with pread through src into
 * buf, e's dtype kept: its elements [start, start + count) in the slice's order (count -1: all, p's
 * size; a stage-3 shard's part of the slice); parts non-NULL: the bytes read are added to the chunks' sums where this
 * rank is the one to hash them (its slices; tp rank 0 the replicated tensors). ca_tp_verify_parts:
 * collective over tp (and dp), every rank with the same n files (their parts: NULL for a file without chunk
 * sums, verified whole here): the chunks of each file verified from the sums of the tp group (dp NULL: each
 * rank read its tp slices) or of the tp x dp group (dp: ZeRO's shard group, whose ranks each read their
 * shard's part of their tp slices; the bytes outside the tensors are hashed by tp rank 0's dp rank 0), one
 * all-gather over each; a corrupt chunk is the same CA_ERR_IO on every rank of the group, naming the file
 * and the chunk. */
struct ca_st_file;
struct ca_st_entry;
struct ca_st_parts;
void ca_tp_file_shape(const ca_accelerator *acc, const ca_tensor *p, int64_t *shape);
/* ca_tp_file_read: every tensor of file f read as this rank's part (ca_tp_read_entry) into out's buffers,
 * by entry index; param_of(ctx, name) gives the parameter of the prepared model whose split the tensor
 * follows (the parameter of a state tensor), NULL for none (CA_ERR_INTERNAL: callers check the names
 * first); sums: with the chunks' sums (out->parts, NULL where f has no chunk sums). No collective. */
typedef struct ca_tp_file {
    ca_meta_src *src;
    struct ca_st_parts *parts;
    void **buf;
    int n;
} ca_tp_file;
ca_status ca_tp_file_read(ca_accelerator *acc, struct ca_st_file *f,
                          const ca_tensor *(*param_of)(void *ctx, const char *name), void *ctx, bool sums,
                          ca_tp_file *out);
void ca_tp_file_free(ca_tp_file *t);   /* accepts a zeroed one */

ca_status ca_tp_read_entry(ca_accelerator *acc, ca_meta_src *src, const struct ca_st_file *f,
                           const struct ca_st_entry *e, const ca_tensor *p, int64_t start, int64_t count, void *buf,
                           struct ca_st_parts *parts);
ca_status ca_tp_verify_parts(ca_accelerator *acc, struct ca_st_file *const *files, struct ca_st_parts *const *parts, int n,
                             ca_comm *dp);
/* The accelerator goes: its tensor-parallel modules can no longer run (their communicator is gone). */
void ca_tp_release(ca_accelerator *acc);

/* Context parallelism (cp.c). Whether ca_maybe_context_parallel has split the calling thread's batch. */
bool ca_cp_active(void);
/* sum / counted: a mean over the labels; under the split, over every cp rank's (both reduced over cp: the
 * loss of one process on the whole sequence, backward scaled for dp_cp's average). */
ca_tensor *ca_cp_mean(ca_tensor *sum, int64_t counted);
/* ca_cross_entropy (mean over the labels that are not -100) through ca_cp_mean. */
ca_tensor *ca_cp_cross_entropy(ca_tensor *logits, ca_tensor *labels);
/* Ring attention (cp_ring.c; parallelism_config_cp_comm_strategy alltoall): causal attention of this cp
 * rank's two load-balanced chunks q [B, H, 2c, D] against the whole sequence, k and v [B, Hkv, 2c, D]
 * (its own chunks) passed round the ring of `comm` (rank `rank` of `size`) by sendrecv. f32 on host
 * memory; the recorded backward rotates them again with their gradients. scale <= 0: 1 / sqrt(D). */
ca_tensor *ca_cp_ring_attention(ca_comm *comm, int rank, int size, ca_tensor *q, ca_tensor *k, ca_tensor *v,
                                double scale);
/* ca_cp_ring_attention on a device's own memory (cp_ring_dev.c; the lazy device, where the host loops of
 * cp_ring.c cannot read the values): every exchange, attention and merge a device operation, in order. */
ca_tensor *ca_cp_ring_attention_dev(ca_comm *comm, int rank, int size, ca_tensor *q, ca_tensor *k, ca_tensor *v,
                                    double scale);

#endif
