/* caccel/tensor.h: tensors, their lifetime (scopes), and autograd controls. */
#ifndef CACCEL_TENSOR_H
#define CACCEL_TENSOR_H

#include <caccel/device.h>
#include <caccel/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A tensor is storage on a device + dtype + shape + strides. Views (reshape,
 * transpose, narrow, detach) share storage.
 *
 * THE LIFETIME RULE. A tensor is either
 *   - scoped: everything an op returns, and every tensor made with the
 *     functions below while a scope is open, belongs to the innermost open
 *     scope of the calling thread and is released when that scope ends; or
 *   - persistent: parameters, optimizer state, and tensors passed to
 *     ca_tensor_keep(). These live until ca_tensor_free().
 * A training step is a scope: a prepared dataloader ends the previous step's
 * scope each time it hands out a batch, so the loop in the README frees every
 * intermediate (activations, gradients of activations, the loss) without a
 * single free call. Storage is reference counted, so a view kept persistent
 * keeps its storage alive. Outside any scope, tensors go to the thread's root
 * scope, which ends at ca_scope_release_all() or thread exit.
 *
 * ERRORS. Ops return the result or NULL; the reason is in ca_last_error().
 * Passing NULL to an op returns NULL and keeps the first error, so a chain
 * like ca_cross_entropy(ca_module_forward(m, x), y) reports the first failure
 * at the CA_CHECK of the call that consumes it (ca_backward, ca_tensor_item).
 *
 * THREADS. Scopes, the tape and no_grad are per thread. A tensor may be read by
 * several threads; it may not be written concurrently.
 */
typedef struct ca_tensor ca_tensor;
typedef struct ca_scope ca_scope;

/* ------------------------------------------------------------- creation */

/* Uninitialised tensor of `shape` (ndim 0 = a scalar) in the current scope. */
CA_API ca_tensor *ca_empty(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape);
CA_API ca_tensor *ca_zeros(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape);
CA_API ca_tensor *ca_full(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape, double v);
/* Copies `data` (host memory, ca_dtype_size(dt) * numel bytes) to a new tensor. */
CA_API ca_tensor *ca_from_host(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape,
                               const void *data);
/* Random tensors from the process generator (see ca_manual_seed). */
CA_API ca_tensor *ca_rand_uniform(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape,
                                  float lo, float hi);
CA_API ca_tensor *ca_rand_normal(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape,
                                 float mean, float std);
/* Shape helpers: CA_SHAPE(2, 3) expands to 2, (int64_t[]){2, 3}. */
#define CA_SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

/* Persistent parameter (requires grad), uninitialised; owned by the caller
 * (usually a module). Free with ca_tensor_free. */
CA_API ca_status ca_parameter_create(ca_device *dev, ca_dtype dt, int ndim,
                                     const int64_t *shape, ca_tensor **out);

/* ------------------------------------------------ deferred initialisation (the meta device)
 * Accelerate's init_empty_weights / torch's device="meta": while ca_init_empty_weights(true) is on
 * (this thread only, until ca_init_empty_weights(false)), ca_parameter_create makes parameters with
 * a shape, dtype and device but no memory, and the layers' initialisation (ca_tensor_init_*_)
 * records what it would write, taking the same RNG counters from the process generator as an eager
 * build: materialised later (ca_prepare; ca_module_materialize in caccel/nn.h), such a parameter has
 * exactly the values the eager build gives. Any other use of a meta parameter fails with
 * CA_ERR_STATE naming it ("... has no storage: it was created under ca_init_empty_weights ...").
 * Under ZeRO-3 / FSDP FULL_SHARD ca_prepare makes only the process's shard of the values. */
CA_API ca_status ca_init_empty_weights(bool on);
CA_API bool ca_init_empty_weights_enabled(void);
/* True for a parameter created without storage and not materialised yet. */
CA_API bool ca_tensor_is_meta(const ca_tensor *t);
/* torch.nn.init's uniform_ / normal_ from the process generator, and constant_ over the elements
 * [start, start + n) of a contiguous tensor: run now, or recorded on a meta tensor. */
CA_API ca_status ca_tensor_init_uniform_(ca_tensor *t, float lo, float hi);
CA_API ca_status ca_tensor_init_normal_(ca_tensor *t, float mean, float std);
CA_API ca_status ca_tensor_init_fill_(ca_tensor *t, int64_t start, int64_t n, double value);
/* Gives a meta tensor its memory on its device and its recorded values (no-op for others). */
CA_API ca_status ca_tensor_materialize_(ca_tensor *t);

/* Moves t out of its scope: it becomes persistent and must be freed with
 * ca_tensor_free. Returns t (NULL passes through). */
CA_API ca_tensor *ca_tensor_keep(ca_tensor *t);
/* Frees a persistent tensor (and its .grad). Scoped tensors: no-op, released
 * with their scope. Accepts NULL. */
CA_API void ca_tensor_free(ca_tensor *t);

/* Copies to a persistent tensor on another device (same dtype). */
CA_API ca_status ca_tensor_to_device(const ca_tensor *t, ca_device *dev, ca_tensor **out);
/* Replaces t's storage by a copy on `dev` in place (parameters, at prepare). */
CA_API ca_status ca_tensor_move_(ca_tensor *t, ca_device *dev);

/* ------------------------------------------------------------- queries */

CA_API ca_dtype ca_tensor_dtype(const ca_tensor *t);
CA_API int ca_tensor_ndim(const ca_tensor *t);
CA_API const int64_t *ca_tensor_shape(const ca_tensor *t);
CA_API const int64_t *ca_tensor_strides(const ca_tensor *t);   /* in elements */
CA_API int64_t ca_tensor_dim(const ca_tensor *t, int d);         /* negative d counts from the end */
CA_API int64_t ca_tensor_numel(const ca_tensor *t);
CA_API size_t ca_tensor_nbytes(const ca_tensor *t);
CA_API ca_device *ca_tensor_device(const ca_tensor *t);
CA_API bool ca_tensor_is_contiguous(const ca_tensor *t);
/* Device pointer to the first element (never dereference it on the host
 * unless ca_device_is_host). NULL (error recorded) when the values are not in
 * memory: a parameter sharded by FSDP FULL_SHARD / ZeRO-3 between its uses. */
CA_API void *ca_tensor_data(const ca_tensor *t);
CA_API bool ca_tensor_requires_grad(const ca_tensor *t);
CA_API void ca_tensor_set_requires_grad(ca_tensor *t, bool on);
/* The accumulated gradient of a leaf (NULL before the first backward or after
 * zero_grad). Owned by t. */
CA_API ca_tensor *ca_tensor_grad(const ca_tensor *t);
/* Drops the gradient (the next backward writes instead of adding) and frees its memory, as torch's
 * zero_grad(set_to_none=True): a pointer from ca_tensor_grad is invalid afterwards. A gradient that is
 * a view of a shared buffer (data-parallel buckets, ZeRO) keeps its memory. */
CA_API void ca_tensor_zero_grad(ca_tensor *t);
CA_API const char *ca_tensor_name(const ca_tensor *t);           /* "" if unnamed */
CA_API ca_status ca_tensor_set_name(ca_tensor *t, const char *name);

/* Copies the elements (row-major, contiguous) to host memory. `bytes` must be
 * at least ca_tensor_nbytes. Synchronises the device. This and the other reads
 * and writes of the values below fail with CA_ERR_STATE, naming the parameter,
 * on a parameter sharded by FSDP FULL_SHARD / ZeRO-3 outside its module's
 * forward and backward: read it inside ca_summon_full_params (accelerator.h). */
CA_API ca_status ca_tensor_to_host(const ca_tensor *t, void *dst, size_t bytes);
/* Copies host data into t (contiguous tensors). */
CA_API ca_status ca_tensor_copy_from_host(ca_tensor *t, const void *src, size_t bytes);
/* Copies src into dst (same shape and dtype; any devices). */
CA_API ca_status ca_tensor_copy_(ca_tensor *dst, const ca_tensor *src);
/* The value of a one-element tensor as double (synchronises). */
CA_API ca_status ca_tensor_item(const ca_tensor *t, double *out);
/* Convenience: the value, or NaN on error (error recorded). */
CA_API double ca_item(const ca_tensor *t);
/* Prints shape, dtype, device and the first values to stderr (debugging). */
CA_API void ca_tensor_print(const ca_tensor *t, const char *label);

/* ------------------------------------------------------------- scopes */

/* Opens a scope on this thread; tensors created until the matching
 * ca_scope_end belong to it. */
CA_API ca_scope *ca_scope_begin(void);
/* Releases every tensor and tape node of s, and of scopes opened inside it that
 * are still open. Accepts NULL. */
CA_API void ca_scope_end(ca_scope *s);
/* Number of live tensors in the calling thread's scopes (tests, leak checks). */
CA_API int64_t ca_scope_live_tensors(void);
/* Ends every scope of this thread, including the root. */
CA_API void ca_scope_release_all(void);

/* CA_SCOPE { ... } runs the block in a scope. Leave it by falling off the end,
 * not with break/return/goto (the scope would then end with its parent). */
#define CA_CAT_(a, b) a##b
#define CA_CAT(a, b) CA_CAT_(a, b)
#define CA_SCOPE CA_SCOPE_(CA_CAT(ca_scope_v_, __LINE__))
#define CA_SCOPE_(v) for (ca_scope *v = ca_scope_begin(); v; ca_scope_end(v), v = NULL)

/* ------------------------------------------------------------- autograd */

/* Computes gradients of the scalar `loss` with respect to every tensor that
 * requires grad and that loss depends on; leaves accumulate into .grad. The
 * tape nodes used stay until their scope ends, but the activations only the
 * tape holds (the locals of a module's forward: what ops inside
 * ca_module_forward made, other than its result; masks and statistics ops made
 * for their backward) are freed as soon as the last node reading them has run,
 * as torch without retain_graph: such a tensor read afterwards fails with
 * CA_ERR_STATE ("freed by backward"). What an op returned outside a module's
 * forward, the module's result, `loss`, parameters and storage a view outside
 * the graph shares (ca_detach) keep their values. A second backward through the
 * same nodes is CA_ERR_STATE. Inside a training loop use ca_backward(acc, loss), which also
 * scales (fp16) and synchronises gradients. */
CA_API ca_status ca_autograd_backward(ca_tensor *loss);
/* Like ca_autograd_backward with an explicit upstream gradient for `out`
 * (same shape); used by gradient checks. */
CA_API ca_status ca_autograd_backward_with(ca_tensor *out, const ca_tensor *grad_out);

/* Activation checkpointing. fn computes n_out outputs from n_in inputs; it must
 * use only ops (no host reads that change what it computes) and be deterministic
 * given the generator's state and the autocast in force, because
 * ca_checkpoint runs it twice: now, keeping only the outputs (every tensor the
 * region makes in between is freed before ca_checkpoint returns), and again in
 * backward, with the generator and autocast replayed so that dropout masks match,
 * to rebuild its tape and backpropagate through it. Gradients equal those without
 * checkpointing (bit for bit on the CPU, where the same kernels run in the same
 * order). Outputs are new tensors of the current scope; `in` is left untouched and
 * must stay alive (as for any op) until backward. Parameters the region uses are
 * found on its own; a tensor with autograd history that fn reads but is not among
 * `in` is refused (CA_ERR_INVALID). On failure out[] is all NULL. out may be the
 * array `in` itself if fn reads its inputs before writing its outputs. Limits:
 * 1..8 outputs, at most 4 inputs that require grad (others, e.g. masks, are
 * unlimited). Under no_grad fn just runs once.
 * Errors: CA_ERR_INVALID for bad arguments; a recompute that draws different random
 * numbers or makes different shapes fails its backward with CA_ERR_STATE. The
 * generator is process-wide: another thread drawing from it between forward and
 * backward does not change the replay, but one drawing during the recompute races
 * with it. Per thread like the tape; ctx is borrowed and must outlive backward. */
typedef ca_status (*ca_checkpoint_fn)(void *ctx, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out);
CA_API ca_status ca_checkpoint(ca_checkpoint_fn fn, void *ctx, int n_in, ca_tensor *const *in, int n_out,
                               ca_tensor **out);

/* A view of t that records no history and requires no grad. */
CA_API ca_tensor *ca_detach(ca_tensor *t);

/* No-grad regions: ops record nothing while the count is > 0. Per thread. */
CA_API void ca_no_grad_begin(void);
CA_API void ca_no_grad_end(void);
CA_API bool ca_grad_enabled(void);
#define CA_NO_GRAD CA_NO_GRAD_(CA_CAT(ca_ng_v_, __LINE__))
#define CA_NO_GRAD_(v) for (int v = (ca_no_grad_begin(), 1); v; ca_no_grad_end(), v = 0)

/* Called when a leaf's gradient is complete for the current backward pass
 * (the data-parallel runtime starts its all-reduce from here). */
typedef void (*ca_grad_hook)(ca_tensor *leaf, void *ctx);
CA_API void ca_tensor_set_grad_hook(ca_tensor *leaf, ca_grad_hook fn, void *ctx);

/* ------------------------------------------------------------- random */

/* Seeds the process generator (Philox; counter reset to 0). Thread-safe. */
CA_API void ca_manual_seed(uint64_t seed);
/* The generator's state (seed and next counter), for checkpoints. */
CA_API void ca_rng_get_state(uint64_t *seed, uint64_t *offset);
CA_API void ca_rng_set_state(uint64_t seed, uint64_t offset);
/* Reserves `counters` counters and returns the first (kernels take it as offset). */
CA_API uint64_t ca_rng_reserve(uint64_t counters);

#ifdef __cplusplus
}
#endif
#endif
