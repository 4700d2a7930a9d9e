/* tensor_impl.h: private layout of tensors, storage, scopes and tape nodes. */
#ifndef CACCEL_TENSOR_IMPL_H
#define CACCEL_TENSOR_IMPL_H

#include "core/device_impl.h"

#include <stdatomic.h>
#include <caccel/tensor.h>
#include <caccel/ops.h>

/* Device memory shared by a tensor and its views. */
typedef struct ca_storage {
    ca_device *dev;
    void *ptr;
    size_t bytes;
    _Atomic int refs;
    /* Set by an owner that freed ptr while tensors keep the storage (a stage-3 sharded parameter
     * between uses): the rest of a sentence saying why the values are not here and how to get them.
     * Every read or write of the values reports it (ca_tensor_check_present). NULL otherwise. */
    const char *absent;
    /* A parameter created without memory (ca_init_empty_weights, the meta device): ptr is NULL,
     * absent says so, and this records the fills that give its values (tensor/meta.c). NULL
     * otherwise, and once the values are materialised. */
    struct ca_meta_init *meta;
    /* Backward pass `done_pass` has finished with `done` of the tensors sharing this storage (outputs
     * of nodes it ran): when that reaches refs, nothing reads the values again (tensor/autograd.c). */
    uint64_t done_pass;
    int done;
    /* ca_forward_locals_free: the call that counted `local` of the tensors sharing this storage */
    uint64_t local_mark;
    int local;
} ca_storage;

typedef struct ca_node ca_node;

struct ca_tensor {
    ca_storage *storage;
    int64_t offset;                  /* in elements */
    ca_dtype dtype;
    int ndim;
    int64_t shape[CA_MAX_DIMS];
    int64_t stride[CA_MAX_DIMS];
    int64_t numel;
    bool requires_grad;
    bool persistent;
    ca_node *grad_fn;                /* op that produced it (NULL for leaves) */
    ca_scope *scope;                 /* owner when scoped */
    ca_tensor *scope_next;
    /* leaves: accumulated gradient (persistent) */
    ca_tensor *grad;
    bool grad_defined;               /* false: next backward writes (beta 0) */
    ca_grad_hook hook;
    void *hook_ctx;
    /* during backward: gradient of a non-leaf (scoped) */
    ca_tensor *bgrad;
    bool bgrad_defined;
    /* non-leaves, during backward: the ca_split (a nonzero id) whose parts alone have written bgrad since
     * it was zero-filled, and which of its parts (bits) have; 0 after any other write (ca_grad_written).
     * A part not yet written finds its region zero and copies its gradient there instead of adding. */
    uint64_t bgrad_split;
    uint64_t bgrad_split_parts;
    int pending_uses;                /* leaves: uses left before the hook fires */
    uint64_t done_pass;              /* the backward pass that counted it in storage->done */
    uint64_t backward_pass;
    char *name;
    /* parameters: bumped whenever the values change (optimizer step, copies);
     * the low-precision copy autocast uses is valid while versions match */
    uint64_t version;
    ca_tensor *lowp;
    uint64_t lowp_version;
    uint64_t serial;                 /* creation order on its thread (ca_forward_locals_*) */
};

/* Backward of one op: reads n->out's gradient `g` and accumulates into the
 * gradients of n->in[i] via ca_grad_target(). */
typedef ca_status (*ca_backward_fn)(ca_node *n, ca_tensor *g);

typedef struct ca_node_vt {
    const char *name;
    ca_backward_fn backward;
} ca_node_vt;

#define CA_NODE_MAX_IN 4
#define CA_NODE_MAX_SAVED 4

struct ca_node {
    const ca_node_vt *vt;
    uint64_t id;
    int nin;
    ca_tensor *in[CA_NODE_MAX_IN];
    ca_tensor *out;
    ca_tensor *saved[CA_NODE_MAX_SAVED];
    /* bit i: saved[i] was made by the op for its backward alone (a dropout mask, a norm's
     * statistics), so its memory goes once that backward has run */
    unsigned owned_saved;
    /* its backward has run and freed what it saved: a later backward through it is refused */
    bool consumed;
    /* recorded inside a module's forward and not its result: no caller holds its output, so
     * backward frees it after use (ca_tape_private_begin) */
    bool private_out;
    double f[4];
    int64_t i[CA_MAX_DIMS];
    uint64_t visit;                  /* backward pass that collected it */
    /* leaves its backward writes besides in[] (a checkpointed region's
     * parameters): counted as uses so that leaf hooks wait for the recompute */
    ca_tensor **leaves;
    int nleaves;
    void *ctx;                       /* released by `release` when the node's scope ends */
    void (*release)(ca_node *n);
    /* backward runs even when out got no gradient (of a checkpoint's nodes,
     * one per output, the last to run does the work for all) */
    bool always;
    ca_scope *scope;
    ca_node *scope_next;
};

struct ca_scope {
    uint64_t id;                     /* unique per thread; scope structs are pooled, never freed
                                      * while the thread runs, so a stale handle stays readable */
    ca_scope *parent;
    ca_tensor *tensors;
    ca_node *nodes;
    bool is_root;
};

/* New tensor struct (no storage) in the current scope. */
ca_tensor *ca_tensor_alloc_struct(void);
/* Drops one reference to st (freed with the last). */
void ca_storage_release(ca_storage *st);
/* Moves scoped tensor t into scope s (a gradient lives as long as its leaf). */
void ca_tensor_move_to_scope(ca_tensor *t, ca_scope *s);
/* Unique id of an open scope (0 for NULL). */
uint64_t ca_scope_id(const ca_scope *s);
/* Ends s only if it is still open on this thread with this id: safe with a
 * handle whose scope an enclosing scope already ended. */
void ca_scope_end_id(ca_scope *s, uint64_t id);
/* Hands a node to the current scope (released with it). */
void ca_scope_add_node(ca_node *n);
/* CA_OK when t's values are in memory; else (its storage's owner released them: `absent`) an
 * error naming op, the tensor and the owner's reason, recorded as the last error. */
ca_status ca_tensor_check_present(const ca_tensor *t, const char *op);
/* ------------------------------------------------------------------ meta parameters (tensor/meta.c) */
/* A persistent parameter with t's shape and no memory on dev, recording its fills; what
 * ca_parameter_create makes under ca_init_empty_weights. */
ca_tensor *ca_meta_parameter_new(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape);
/* Makes st (ptr NULL) a meta storage: an empty fill record, absent saying why. */
ca_status ca_meta_storage(ca_storage *st);
/* Frees a storage's fill record (storage_release). */
void ca_meta_init_free(struct ca_meta_init *mi);
/* Writes the whole values of meta tensor t (t->numel elements of its dtype) into dst, memory of
 * dev: the recorded fills replayed, the same kernels and RNG counters an eager build ran (which
 * builds on the CPU: pass the CPU device for the eager values to the bit). */
ca_status ca_meta_fill(const ca_tensor *t, ca_device *dev, void *dst);
/* The fill record of meta tensor t as bytes (*bytes: its size; *count: its ops), to be sent to
 * other processes as is; NULL with *bytes 0 for an empty record. */
void *ca_meta_record(const ca_tensor *t, size_t *bytes, int64_t *count);
/* Makes t's record `count` ops long (an empty one to receive another process's bytes). */
ca_status ca_meta_record_resize(ca_tensor *t, int64_t count);
/* Elements [start, start + n) of meta tensor t's values into host memory dst, as ca_meta_fill on
 * the CPU makes them: of a tensor recorded from a file (ca_meta_record_file), only those bytes of the
 * file are read; otherwise the whole values are made in a scratch buffer and the range copied. */
ca_status ca_meta_fill_range(const ca_tensor *t, int64_t start, int64_t n, void *dst);
/* A load deferred to materialisation: meta tensor t's values become those of entry e of file f
 * (its dtype, or f16/bf16 widened to an f32 t), read when t is materialised (whole) or filled by
 * range (ca_meta_fill_range; ZeRO-3's shard). *src caches the file, kept open (the descriptor of the
 * file f checked) for every tensor recorded from it: NULL on the first call, released by the caller
 * with ca_meta_src_unref; each tensor holds its own reference until materialised. Errors name the
 * file and the tensor. Such a record is this process's own: ca_meta_record_resize refuses it. */
typedef struct ca_meta_src ca_meta_src;
struct ca_st_file;
struct ca_st_entry;
ca_status ca_meta_record_file(ca_tensor *t, const struct ca_st_file *f, const struct ca_st_entry *e,
                              ca_meta_src **src);
void ca_meta_src_unref(ca_meta_src *src);
/* A slice of a row-major tensor: in each of `parts` equal blocks of dimension dim, [start, start + len)
 * (a tensor-parallel rank's rows or column block, ca_tensor_narrow_'s slice). */
typedef struct ca_slice {
    int dim, parts;
    int64_t start, len;
} ca_slice;
/* A source for file f's tensors (its descriptor kept open: the file checked is the file read), for
 * reads by byte range without a mapping; released with ca_meta_src_unref, which reports the bytes
 * read under CACCEL_TEST_ST_REPORT ("meta: <path>: <n> of <size> bytes read"). */
ca_status ca_meta_src_open(const struct ca_st_file *f, ca_meta_src **out);
/* Every read of src from now on also hands its file offset and the file's bytes to tap(ctx, ...) (a
 * checksum of what was read: ca_st_parts_add); NULL stops it. Not thread-safe against reads of src. */
void ca_meta_src_set_tap(ca_meta_src *src, void (*tap)(void *ctx, uint64_t off, const void *bytes, size_t len),
                         void *ctx);
/* Slice sl of the tensor of `shape` stored at byte foff of src's file as fdt, into host memory dst
 * (row-major, the slice's shape, dtype dt: fdt itself, or f32 widened from f16/bf16) with pread:
 * one read per run of adjacent elements (a slice of dimension 0 in one block: one read; a column
 * block: one per row). A file shorter than when it was checked is CA_ERR_IO naming it. */
ca_status ca_meta_src_read_slice(ca_meta_src *src, uint64_t foff, ca_dtype fdt, ca_dtype dt, int ndim,
                                 const int64_t *shape, const ca_slice *sl, void *dst);
/* Elements [start, start + count) of slice sl (in the slice's row-major order) read as
 * ca_meta_src_read_slice reads the whole slice: only their bytes (a shard of a tp slice). */
ca_status ca_meta_src_read_slice_range(ca_meta_src *src, uint64_t foff, ca_dtype fdt, ca_dtype dt, int ndim,
                                       const int64_t *shape, const ca_slice *sl, int64_t start, int64_t count,
                                       void *dst);
/* Meta tensor t, whose values a deferred load reads from a file, gets memory for slice sl alone and
 * those bytes of the file (ca_meta_src_read_slice), its dimension sl->dim now sl->len * sl->parts long:
 * ca_tensor_materialize_ then ca_tensor_narrow_ without the whole tensor. A tensor made by its
 * recorded initialisation (or not meta) is made whole and narrowed. */
ca_status ca_meta_materialize_slice_(ca_tensor *t, const ca_slice *sl);
/* A pretrained loader's copy of entry e of file f (checked: t's shape; its dtype or f16/bf16 for an
 * f32 t) into parameter t: while ca_init_empty_weights is on and t is meta, deferred
 * (ca_meta_record_file, *src as there); else t (given memory if meta) gets the values now. */
ca_status ca_meta_load_entry(ca_tensor *t, const struct ca_st_file *f, const struct ca_st_entry *e, ca_meta_src **src);
/* Whether meta tensor t's record reads a file (ca_meta_record_file): its values come from that file
 * on each process, not from another process's record. */
bool ca_meta_from_file(const ca_tensor *t);
/* Gives meta tensor t its memory without its recorded values (a load overwrites them all). */
ca_status ca_meta_allocate(ca_tensor *t);
/* A load that fails part-way leaves a meta parameter as it was: ca_meta_mark copies meta tensor t's
 * record before the load (NULL for a tensor with memory; on failure NULL with *s set), ca_meta_revert
 * puts t back to meta with that record (owned by t then), freeing the memory or dropping the deferred
 * read the load gave it; ca_meta_init_free discards an unused mark. Nothing may hold t's memory yet
 * (before ca_prepare: no view, no optimizer state of it). */
struct ca_meta_init *ca_meta_mark(const ca_tensor *t, ca_status *s);
void ca_meta_revert(ca_tensor *t, struct ca_meta_init *mark);
/* Live meta parameters in the process (0: no check needed). */
int ca_meta_live(void);
/* Keeps, of each of `parts` equal blocks of dimension dim of contiguous persistent tensor t (1: the whole
 * dimension; 3: a fused q, k, v projection), only elements [start, start + len) of the block, in place
 * (the tensor stays the same object: an optimizer or a module holding it keeps it), in new contiguous
 * storage on its device; its gradient and low-precision copy go. Tensor parallelism shards a parameter
 * with it at prepare. CA_ERR_INVALID for a slice outside a block or a view. */
ca_status ca_tensor_narrow_(ca_tensor *t, int dim, int parts, int64_t start, int64_t len);
/* The inverse of ca_tensor_narrow_: dimension dim of contiguous persistent tensor t becomes len long, its
 * values the contiguous host copy `host` of the new shape, in place (the same object) in new storage on its
 * device; its gradient and low-precision copy go. Tensor parallelism makes its split parameters whole with
 * it while a checkpoint is saved or loaded. CA_ERR_INVALID for a view. */
ca_status ca_tensor_resize_dim_(ca_tensor *t, int dim, int64_t len, const void *host);
/* Contiguous strides for t->shape; sets numel. */
void ca_tensor_set_contiguous(ca_tensor *t);
/* A scoped tensor with fresh storage on dev. */
ca_tensor *ca_tensor_new(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape);
/* A scoped view of t's storage with the given shape/strides/offset. */
ca_tensor *ca_tensor_view(ca_tensor *t, int ndim, const int64_t *shape, const int64_t *stride,
                          int64_t offset);
/* Device pointer of element 0 (typed arithmetic done here, never a dereference). NULL when the
 * storage's memory is gone (an activation backward freed): the kernel's argument check refuses it,
 * where a view's offset would have turned NULL into a wild address. */
static inline void *ca_tptr(const ca_tensor *t) {
    if (!t->storage->ptr) return NULL;
    return (char *)t->storage->ptr + (size_t)t->offset * ca_dtype_size(t->dtype);
}
static inline ca_device *ca_tdev(const ca_tensor *t) { return t->storage->dev; }

/* True when grad mode is on and any of the inputs requires grad. */
bool ca_needs_grad(int n, ca_tensor *const *in);
/* Records a node producing `out` from `in` (out becomes requires_grad). */
ca_node *ca_record(const ca_node_vt *vt, ca_tensor *out, int nin, ca_tensor *const *in);
/* The buffer to write (beta 0) or add (beta 1) the gradient of `t` into; NULL
 * when t needs no gradient. Call ca_grad_written(t) after writing. */
ca_tensor *ca_grad_target(ca_tensor *t, float *beta);
void ca_grad_written(ca_tensor *t);
/* Makes g itself the gradient of non-leaf t, with no copy, when t has none yet this pass (the
 * way PyTorch hands a gradient through a view or an add). g must be contiguous, t's dtype and
 * element count, and read or written by nothing else afterwards: a backward's fresh result, or
 * the output's gradient given to its last reader (whose node has finished with it). False (and
 * nothing changed) when any of that does not hold: then accumulate as usual. */
bool ca_grad_adopt(ca_tensor *t, ca_tensor *g);
/* The tensor whose gradient x's gradient is a part of: x is its elements through views (ca_node_is_view,
 * sharing its storage), none with a gradient yet this pass, down to a contiguous non-leaf
 * whose gradient is not written yet either (x itself when x is such a tensor); NULL when there is none.
 * A backward may then write x's gradient straight into that tensor's (ca_grad_target, at x's storage
 * offset and strides, then ca_grad_written), sparing the views' backward copies: no gradient reaches
 * the views' nodes, which are skipped unless another reader gives them one (then added, beta 1). */
ca_tensor *ca_grad_view_root(ca_tensor *x);
/* Whether n's output is its input's elements, each once, in another shape or order (transpose, narrow,
 * reshape: tensor/ops_shape.c); where the two share storage, a gradient of the output is the input's at
 * the same elements. */
bool ca_node_is_view(const ca_node *n);
/* Whether n's backward reads its output's gradient through that gradient's strides (attention's, on a
 * device whose kernels read them: tensor/ops_attention.c), so that a strided view may be handed over as
 * that gradient (ca_grad_adopt_view). */
bool ca_node_takes_strided_grad(const ca_node *n);
/* ca_grad_adopt for a gradient v of t's shape that may be strided (a view of another gradient, read by
 * nothing else afterwards); only for a t whose node takes strided gradients. */
bool ca_grad_adopt_view(ca_tensor *t, ca_tensor *v);
/* Frees the memory of non-leaf t's gradient of this pass once nothing will read it (its node's
 * backward has run) and drops it (t->bgrad NULL). Nothing when it shares its storage (a view) or
 * has none; the tensor itself stays in its scope, its storage saying why its values are gone. */
void ca_grad_release(ca_tensor *t);
/* Backward from several outputs at once, within backward pass `pass` (a
 * checkpoint node's recompute runs inside its caller's pass): grads[i]
 * (contiguous, outs[i]'s shape; NULL: skipped) is added into outs[i]'s gradient. */
ca_status ca_backward_roots(int n, ca_tensor *const *outs, ca_tensor *const *grads, uint64_t pass);
/* The calling thread's no_grad depth; ca_no_grad_set_depth restores one. */
int ca_no_grad_depth(void);
void ca_no_grad_set_depth(int depth);
/* A view of y whose backward calls fn(ctx) before passing the gradient on to y: the first node of
 * y's history to run in backward (sharded parameters are gathered there). y itself when no gradient
 * flows through it. NULL (error recorded) on failure. */
ca_tensor *ca_backward_hook(ca_tensor *y, ca_status (*fn)(void *ctx), void *ctx);
/* Between these, nodes record outputs that only the tape holds (the locals of a module's forward,
 * which torch frees with the graph): backward frees their values once the last node reading them
 * has run. ca_tape_private_end(y) with the forward's result y (NULL allowed): once the outermost
 * forward ends, y is the caller's and keeps its values. Per thread, nested. */
void ca_tape_private_begin(void);
void ca_tape_private_end(ca_tensor *y);
/* A forward's locals under no_grad. Nothing records them for a backward, and C has no reference
 * count to say when the last reader is done, so without this every intermediate of an evaluation
 * forward would live to its scope's end (torch frees each one when its last reference goes).
 * ca_forward_locals_mark() before a module's forward, ca_forward_locals_free(mark, y) after it:
 * the values of the tensors created since the mark on this thread (in the scope current at both
 * calls) are freed, except y's storage, persistent tensors, and storages that a tensor made before
 * the mark or kept shares (a view of a parameter, of the input). The structs stay: a later read
 * fails naming the tensor and why, as for a freed activation. */
typedef struct ca_locals_mark {
    ca_scope *scope;
    uint64_t scope_id, serial;
} ca_locals_mark;
ca_locals_mark ca_forward_locals_mark(void);
void ca_forward_locals_free(ca_locals_mark mark, const ca_tensor *y);
/* The id the next recorded node gets (nodes are numbered in recording order). */
uint64_t ca_next_node_id(void);

/* ------------------------------------------------------------------ autocast */
/* The calling thread's autocast dtype: CA_F32 when off, else f16/bf16. */
ca_dtype ca_autocast_dtype(void);
/* Sets it and returns the previous one (the accelerator wraps forward with it). */
ca_dtype ca_autocast_set(ca_dtype dt);
/* A persistent low-precision copy of parameter w, made once per version (not per use). */
ca_tensor *ca_autocast_weight(ca_tensor *w, ca_dtype dt);
/* Under autocast, a float input of an op that runs in f32 (softmax, losses,
 * norms, reductions, exp/log/pow) is cast up; otherwise x itself. */
ca_tensor *ca_autocast_f32(ca_tensor *x);

/* Element count of a shape. */
int64_t ca_shape_numel(int ndim, const int64_t *shape);
/* "[128, 784]" into buf. */
const char *ca_shape_str(int ndim, const int64_t *shape, char *buf, size_t len);

#endif
