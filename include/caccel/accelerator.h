/* caccel/accelerator.h: the Accelerator: device and process selection from configuration, prepare, backward, and the distributed helpers. */
#ifndef CACCEL_ACCELERATOR_H
#define CACCEL_ACCELERATOR_H

#include <caccel/collective.h>
#include <caccel/config.h>
#include <caccel/data.h>
#include <caccel/optim.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * One per process. Created from the merged configuration (ca_config_load):
 * it picks the device (use_cpu, the CUDA plugin when present), the process
 * group (distributed_type, how the process was started), the precision and
 * the accumulation. The training program does not change between a laptop,
 * mpirun, caccel launch and a GPU. Not thread-safe: use it from the thread
 * that trains.
 */
typedef struct ca_accelerator ca_accelerator;

typedef enum ca_tristate { CA_UNSET = 0, CA_YES = 1, CA_NO = 2 } ca_tristate;

/* Programmatic options: the lowest layer of the configuration (a file, the
 * environment and the command line override them). A zeroed struct is valid. */
typedef struct ca_options {
    int argc;                           /* configuration flags are read from argv; */
    char **argv;                        /* others are left for the program */
    const char *const *settings;        /* "key=value" pairs, NULL-terminated */
    const char *mixed_precision;        /* "no", "fp16", "bf16" (NULL: unset) */
    ca_tristate use_cpu;
    int gradient_accumulation_steps;    /* 0: unset */
    const char *config_file;            /* like --config_file, but below it */
    const char *log_with;               /* trackers (caccel/tracking.h): "json,csv" (NULL: unset) */
} ca_options;

/* Creates the accelerator (NULL opts = defaults). Errors carry the config
 * key/file/line, or the rank and peer for process-group failures. */
CA_API ca_status ca_accelerator_create(const ca_options *opts, ca_accelerator **out);
/* Waits for outstanding work, tears down the process group. Accepts NULL. */
CA_API void ca_accelerator_destroy(ca_accelerator *acc);

/* Places the model's parameters (and the optimizer's state) on the device,
 * makes every rank start from rank 0's parameters, and gives the dataloader
 * its device and this rank's shard. Any argument may be NULL; call again for
 * more dataloaders (evaluation), optimizers and models (a GAN's generator and
 * critic, teacher and student: plain data parallelism only, each model with its
 * own gradient buckets, reduced by the backwards that reach it; ca_save_state
 * holds one model). With the key dispatch_batches and more than one process,
 * the loader's data is read by rank 0 alone and each ca_dataloader_next becomes
 * a collective (every rank calls it, in step) that broadcasts the global batch;
 * that fails, naming the key, over a custom batch sampler (docs/DATA.md).
 * Frozen parameters (requires_grad false) get no gradient bucket slot, no
 * ZeRO gradient or state shard (stage 3 still shards their values); the
 * trainable set is fixed here: under DDP, ZeRO or deterministic mode a later
 * change of requires_grad makes the next ca_backward fail with CA_ERR_STATE
 * naming the parameter (docs/DISTRIBUTED.md, "Frozen parameters"). */
CA_API ca_status ca_prepare(ca_accelerator *acc, ca_module *model, ca_optimizer *opt,
                            ca_dataloader *dl);
CA_API ca_status ca_prepare_dataloader(ca_accelerator *acc, ca_dataloader *dl);

/* Backward from the scalar loss of this micro-step: scales it (fp16) and by
 * 1/gradient_accumulation_steps, runs autograd and, on a synchronising step,
 * all-reduces the gradients in buckets while backward is still running. */
CA_API ca_status ca_backward(ca_accelerator *acc, ca_tensor *loss);

/* ----------------------------------------------------------- accumulation */
/* CA_ACCUMULATE(acc, model) { forward; backward; step; zero_grad; }
 * Inside, steps are real only every gradient_accumulation_steps micro-steps
 * (and at the end of the dataloader); gradients are synchronised only then. */
CA_API int ca_accumulate_begin(ca_accelerator *acc, ca_module *model);
CA_API void ca_accumulate_end(ca_accelerator *acc);
#define CA_ACCUMULATE(acc, model) CA_ACCUMULATE_(acc, model, CA_CAT(ca_acc_v_, __LINE__))
#define CA_ACCUMULATE_(acc, model, v)                                                     \
    for (int v = ca_accumulate_begin((acc), (model)); v; ca_accumulate_end(acc), v = 0)
/* True on a micro-step where gradients are synchronised and the optimizer steps. */
CA_API bool ca_sync_gradients(const ca_accelerator *acc);

/* Clips the gradients of every prepared parameter so that their global norm
 * (over all ranks) is at most max_norm, with torch.nn.utils.clip_grad_norm_'s
 * arithmetic on the device in f32 (coef = min(max_norm / (norm + 1e-6), 1),
 * every gradient multiplied by coef). total_norm (may be NULL) gets the norm
 * before clipping; only then is anything read back to the host (a GPU waits, a
 * lazy device runs its graph), so pass NULL inside a training step. With
 * fp16 the gradients are unscaled first, once per step: the later
 * ca_optimizer_step does not unscale again. Configured clipping
 * (ACCELERATE_GRADIENT_CLIPPING, gradient_clipping) runs inside the step and
 * reads nothing back. Not thread-safe against other calls on acc. Errors: the
 * kernels' or the collectives' status. */
CA_API ca_status ca_clip_grad_norm(ca_accelerator *acc, double max_norm, double *total_norm);
CA_API ca_status ca_clip_grad_value(ca_accelerator *acc, double clip_value);

/* ----------------------------------------------------------- fp16 loss scaling */
/* With mixed_precision fp16 the loss is scaled in ca_backward; before the
 * step the gradients are unscaled once and checked for Inf/NaN on every rank
 * together: all ranks skip the step (ca_optimizer_step_was_skipped) and halve
 * the scale, or none does; after growth_interval clean steps the scale grows. */
typedef struct ca_grad_scaler_opts {
    double init_scale;         /* Accelerate's defaults: 65536 */
    double growth_factor;      /* 2 */
    double backoff_factor;     /* 0.5 */
    int64_t growth_interval;   /* 2000 */
} ca_grad_scaler_opts;
/* The scaler's state: plain numbers a checkpoint holds. */
typedef struct ca_grad_scaler_state {
    double scale;
    int64_t growth_tracker;    /* clean steps since the scale last changed */
} ca_grad_scaler_state;
/* Replaces the options (like Accelerate's GradScalerKwargs) and resets the
 * state. A field left 0 takes its default, so {.growth_interval = 100}
 * changes only that. */
CA_API ca_status ca_grad_scaler_configure(ca_accelerator *acc, const ca_grad_scaler_opts *opts);
CA_API ca_status ca_grad_scaler_get(const ca_accelerator *acc, ca_grad_scaler_state *out);
CA_API ca_status ca_grad_scaler_set(ca_accelerator *acc, const ca_grad_scaler_state *state);

/* ----------------------------------------------------------- queries */
CA_API ca_device *ca_accelerator_device(const ca_accelerator *acc);
CA_API const ca_config *ca_accelerator_config(const ca_accelerator *acc);
CA_API const ca_settings *ca_accelerator_settings(const ca_accelerator *acc);
CA_API ca_mixed_precision ca_accelerator_mixed_precision(const ca_accelerator *acc);
CA_API ca_distributed_type ca_accelerator_distributed_type(const ca_accelerator *acc);
CA_API int ca_process_index(const ca_accelerator *acc);          /* global rank */
CA_API int ca_local_process_index(const ca_accelerator *acc);
CA_API int ca_num_processes(const ca_accelerator *acc);
CA_API bool ca_is_main_process(const ca_accelerator *acc);
CA_API bool ca_is_local_main_process(const ca_accelerator *acc);
CA_API bool ca_is_last_process(const ca_accelerator *acc);
/* The process group (NULL before creation finishes). */
CA_API ca_comm *ca_accelerator_comm(const ca_accelerator *acc);

/* ----------------------------------------------------------- device mesh
 * Accelerate's ParallelismConfig (parallelism_config_dp_replicate_size, _dp_shard_size, _cp_size,
 * _tp_size): the processes laid out as dp_replicate x dp_shard x cp x tp, tp innermost (ca_config_mesh in
 * caccel/config.h). ca_accelerator_mesh: the mesh's sizes and this rank's coordinates (coord may be
 * NULL); without tensor parallelism it is the plain data-parallel one (dp_replicate = the process count,
 * or HSDP's dp sizes). CA_ERR_INVALID for NULL acc or shape. */
CA_API ca_status ca_accelerator_mesh(const ca_accelerator *acc, ca_mesh_shape *shape, int coord[CA_MESH_NDIMS]);
/* The communicator of one mesh dimension, by name: "tp", "cp", "dp_shard", "dp_replicate", "dp" (the
 * ranks sharing this rank's cp and tp coordinates, which read different batches), or "dp_cp" under
 * context parallelism (the ranks sharing its tp coordinate: gradients are averaged over it; without
 * context parallelism over "dp"). Owned by the
 * accelerator (valid until ca_accelerator_destroy; do not destroy it); its collectives name the dimension
 * when they fail ("in the tp group of ranks 0, 1"). The same threading rules as ca_accelerator_comm. Made
 * at ca_accelerator_create when parallelism_config_tp_size or cp_size is above 1; otherwise NULL with
 * CA_ERR_NOT_FOUND ("no device mesh"), as for an unknown name (CA_ERR_INVALID). */
CA_API ca_comm *ca_mesh_comm(ca_accelerator *acc, const char *dim);

/* Context parallelism (parallelism_config_cp_size above 1; Accelerate's maybe_context_parallel): splits
 * each of the n buffers (input ids, labels, positions: the same sequence, along seq_dims[i]) so that this
 * cp rank keeps its T / cp tokens: the sequence cut into 2 cp chunks, rank r keeping chunks r and
 * 2 cp - 1 - r (torch's and Megatron's load balancing: the causal work is the same on every rank).
 * buffers[i] is replaced by this rank's part (a tensor of the current scope; the caller's stays as it
 * was: Accelerate's no_restore_buffers). Until ca_context_parallel_end, on the calling thread,
 * ca_scaled_dot_product_attention runs causal attention of the local queries against the keys and values
 * of the whole sequence (all-gathered over the cp communicator; their gradients reduce-scattered back in
 * backward) and ca_tp_cross_entropy means over the tokens of every cp rank. Positions must be split with
 * the ids: learned position and rotary embeddings take the global positions. Collective over cp (every
 * cp rank reads the same batch and calls it); the forward and backward in between too. A no-op at cp 1.
 * (ca_cross_entropy inside the split is this rank's mean: averaged over the ranks it is one process's
 * only when every rank counts the same labels.) CA_ERR_INVALID for NULL arguments or none (n < 1), a
 * missing dimension, buffers of different lengths, or a length that is not a multiple of 2 cp;
 * CA_ERR_STATE when the thread's batch is split already. Attention with a mask, non-causal or with
 * dropout is refused (CA_ERR_UNSUPPORTED) in between. */
CA_API ca_status ca_maybe_context_parallel(ca_accelerator *acc, int n, ca_tensor **buffers, const int *seq_dims);
/* Ends the calling thread's split (after its backward): attention and the loss are one rank's again. */
CA_API void ca_context_parallel_end(ca_accelerator *acc);

/* printf on the main process only (stdout, flushed). */
CA_API void ca_print(const ca_accelerator *acc, const char *fmt, ...) CA_PRINTF(2, 3);
/* Seeds the process generator and the dataloaders' shuffles (same on every rank). */
CA_API ca_status ca_set_seed(ca_accelerator *acc, uint64_t seed);

/* Stage 3 (FSDP FULL_SHARD, zero_stage 3) keeps only a shard of the parameters between steps: on
 * gathers every parameter of the prepared model whole (collective: every rank calls it), so that
 * they can be read or written; off writes this rank's part back into its shard and frees them
 * again. Parameters stay whole, following each update, until off. Under tensor parallelism
 * (parallelism_config_tp_size above 1) on gathers each split layer's slices (and their optimizer
 * state) over the tp ranks, and the split layers run their plain forward, as one process runs the
 * model (generation on one rank, a LoRA adapter's save: ca_lora_save writes PEFT's whole tensors), until
 * off gives each rank its slices and the tensor-parallel forwards back; do not train in between. A
 * no-op in other modes. */
CA_API ca_status ca_summon_full_params(ca_accelerator *acc, bool on);

/* ----------------------------------------------------------- batch size */
/* A training function for ca_find_executable_batch_size: runs (or tries) the training at
 * batch_size and returns CA_ERR_NOMEM when it ran out of memory; it frees what it made persistent
 * before returning (tensors it left scoped are released by the caller). */
typedef ca_status (*ca_batch_size_fn)(void *ctx, int64_t batch_size);

/* Accelerate's find_executable_batch_size: calls fn(ctx, b) with b = starting_batch_size and, while
 * it returns CA_ERR_NOMEM (a device or host allocation failed, or the cap of
 * ca_device_set_memory_limit was reached), releases the tensors the try left in scope and the
 * allocator's cache and calls it again at floor(0.9 * b): 64, 57, 51, 45, 40, ... 1. *found is the
 * batch size with which fn returned CA_OK.
 * acc may be NULL (one process; the CPU device's cache is emptied). With several processes it is
 * collective (every rank calls it): after each try the ranks sum their outcomes, and one rank out of
 * memory makes all retry at the same smaller size, so they keep one batch size. fn should therefore
 * not leave a collective half-done when it fails (a peer would wait in it until its timeout).
 * Errors: CA_ERR_NOMEM "find_executable_batch_size: no batch size down to 1 fit in memory (started
 * at N; last out-of-memory error: ...)"; fn's own status and message when it fails otherwise (the
 * other ranks then return CA_ERR_PEER naming how many ranks failed), CA_ERR_INVALID for a start below
 * 1 or a NULL fn or found. *found is 0 after a failure. Call it from one thread per process. */
CA_API ca_status ca_find_executable_batch_size(ca_accelerator *acc, int64_t starting_batch_size,
                                               ca_batch_size_fn fn, void *ctx, int64_t *found);

/* ----------------------------------------------------------- collectives */
/* Blocks until every rank arrives (with the timeout and desync check). */
CA_API ca_status ca_wait_for_everyone(ca_accelerator *acc);
/* torch_xla's xm.mark_step(): on the xla device, runs the graph recorded so far (compiled once per
 * structure, then from the cache). The prepared dataloader calls it at each batch. No-op elsewhere. */
CA_API ca_status ca_mark_step(ca_accelerator *acc);
/* Sum or mean of t over ranks, in place. */
CA_API ca_status ca_reduce(ca_accelerator *acc, ca_tensor *t, ca_reduce_op op);
/* Concatenates every rank's t along dim 0 into a new tensor [world*n, ...]. */
CA_API ca_tensor *ca_gather(ca_accelerator *acc, ca_tensor *t);
/* ca_gather, then drops the samples the loader repeated to keep ranks even
 * (pass the batch the tensor was computed from). */
CA_API ca_tensor *ca_gather_for_metrics(ca_accelerator *acc, ca_tensor *t, const ca_batch *b);
/* Copies rank root's t to every rank, in place. */
CA_API ca_status ca_broadcast(ca_accelerator *acc, ca_tensor *t, int root);
/* This rank's part [*begin, *end) of n items (the first n % world ranks get one more). */
CA_API void ca_split_between_processes(const ca_accelerator *acc, int64_t n, int64_t *begin,
                                       int64_t *end);
/* main_process_first: the main process runs the block, then the others. */
CA_API ca_status ca_main_process_first_begin(ca_accelerator *acc);
CA_API ca_status ca_main_process_first_end(ca_accelerator *acc);

/* ----------------------------------------------------------- synchronisation control */
/* CA_NO_SYNC(acc, model) { forward; backward; }: Accelerate's no_sync. Backward inside keeps the
 * gradients local (no all-reduce) and they accumulate across passes; the first backward outside
 * synchronises the sum. Unlike CA_ACCUMULATE nothing is counted and steps are not held back. With
 * several prepared models it holds back every model's synchronisation, not only model's. */
CA_API int ca_no_sync_begin(ca_accelerator *acc, ca_module *model);
CA_API void ca_no_sync_end(ca_accelerator *acc);
#define CA_NO_SYNC(acc, model) CA_NO_SYNC_(acc, model, CA_CAT(ca_ns_v_, __LINE__))
#define CA_NO_SYNC_(acc, model, v) for (int v = ca_no_sync_begin((acc), (model)); v; ca_no_sync_end(acc), v = 0)
/* CA_TRIGGER_SYNC_IN_BACKWARD(acc, model) { backward; }: a backward inside synchronises even in
 * CA_NO_SYNC or on an accumulation micro-step (Accelerate's trigger_sync_in_backward). */
CA_API int ca_trigger_sync_begin(ca_accelerator *acc, ca_module *model);
CA_API void ca_trigger_sync_end(ca_accelerator *acc);
#define CA_TRIGGER_SYNC_IN_BACKWARD(acc, model) CA_TRIGGER_SYNC_(acc, model, CA_CAT(ca_ts_v_, __LINE__))
#define CA_TRIGGER_SYNC_(acc, model, v) \
    for (int v = ca_trigger_sync_begin((acc), (model)); v; ca_trigger_sync_end(acc), v = 0)
/* accelerator.sync_gradients = v (GradientState): false holds optimizer steps and gradient
 * synchronisation back until set true again; inside CA_ACCUMULATE it overrides this micro-step
 * only (the next CA_ACCUMULATE decides again). */
CA_API ca_status ca_set_sync_gradients(ca_accelerator *acc, bool sync);
/* accelerator.gradient_accumulation_steps = k (k >= 1), from the next micro-step on. */
CA_API ca_status ca_set_gradient_accumulation_steps(ca_accelerator *acc, int k);
CA_API int ca_gradient_accumulation_steps(const ca_accelerator *acc);
/* set_trigger / check_trigger: any rank raises the flag; ca_check_trigger (collective: every rank
 * calls it) sums the flags over ranks, sets *raised on every rank when some rank raised it, and
 * lowers it again. */
CA_API ca_status ca_set_trigger(ca_accelerator *acc);
CA_API ca_status ca_check_trigger(ca_accelerator *acc, bool *raised);

/* ----------------------------------------------------------- LocalSGD */
/* Accelerate's LocalSGD (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD"): from
 * ca_local_sgd_begin to ca_local_sgd_end the model's gradients stay local (as in CA_NO_SYNC) and every
 * local_sgd_steps calls of ca_local_sgd_step (one per optimizer step) the parameters are averaged
 * over the processes; ca_local_sgd_end averages them once more. Each process's optimizer state stays
 * its own. With one process, or enabled false, it does nothing.
 *   ca_local_sgd *ls;
 *   CA_CHECK(ca_local_sgd_begin(acc, model, 8, true, &ls));
 *   while (ca_dataloader_next(dl, &b)) { forward; ca_backward; ca_optimizer_step; zero_grad;
 *                                        CA_CHECK(ca_local_sgd_step(ls)); }
 *   CA_CHECK(ca_local_sgd_end(ls));
 * begin: local_sgd_steps >= 1; model prepared by acc. Fails with CA_ERR_UNSUPPORTED for
 * distributed types other than NO, MULTI_CPU and MULTI_GPU (FSDP, DeepSpeed, XLA: as Accelerate) and
 * in deterministic mode, naming the key. *out is owned by the caller until ca_local_sgd_end, which
 * frees it (also when the final average fails). step and end are collectives: every process calls
 * them alike, from the training thread. */
typedef struct ca_local_sgd ca_local_sgd;
CA_API ca_status ca_local_sgd_begin(ca_accelerator *acc, ca_module *model, int local_sgd_steps, bool enabled,
                                    ca_local_sgd **out);
CA_API ca_status ca_local_sgd_step(ca_local_sgd *ls);
CA_API ca_status ca_local_sgd_end(ca_local_sgd *ls);

/* ----------------------------------------------------------- objects and padding */
/* gather_object for byte buffers: every rank's buffer, in rank order, concatenated into *out
 * (malloc'ed, the caller frees) with counts[r] the length of rank r's part (counts: world
 * entries, may be NULL). Collective. */
CA_API ca_status ca_gather_object(ca_accelerator *acc, const void *buf, size_t len, void **out, size_t *out_len,
                                  size_t *counts);
/* broadcast_object_list for byte buffers: n buffers of rank `root` to every rank. On other ranks
 * bufs[i] is replaced by a malloc'ed copy (the old pointer is not freed) and lens[i] set. */
CA_API ca_status ca_broadcast_object_list(ca_accelerator *acc, void **bufs, size_t *lens, int n, int root);
/* pad_across_processes: a new tensor with t's dimension `dim` grown to the largest size over the
 * ranks, the new elements pad_index, appended (or, pad_first, prepended). Collective. */
CA_API ca_tensor *ca_pad_across_processes(ca_accelerator *acc, ca_tensor *t, int dim, double pad_index,
                                          bool pad_first);
/* Accelerate's reduce(tensor, reduction, scale): "sum", "mean", "max" or "none" (a sum, as
 * Accelerate's) over ranks, in place, then times scale (1.0: unchanged). Accelerate applies scale on
 * XLA only; caccel on every device, so that a program means the same everywhere. */
CA_API ca_status ca_reduce_scaled(ca_accelerator *acc, ca_tensor *t, const char *reduction, double scale);
/* synchronize_rng_states: every rank takes rank 0's process generator (seed and counter). */
CA_API ca_status ca_synchronize_rng_states(ca_accelerator *acc);

/* ----------------------------------------------------------- uneven inputs */
/* join_uneven_inputs (PyTorch's Join over DDP, as Accelerate): between begin and end, a rank whose
 * dataloader runs out calls end and shadows the gradient all-reduces of the ranks still training
 * (with zero gradients; the average stays over the whole world), so training ends without a hang;
 * then every rank takes the parameters of the last rank to finish. even_batches (CA_UNSET: the
 * configured one) overrides the prepared loaders' even_batches until end; with even batches there
 * is nothing to join. Only MULTI_CPU / MULTI_GPU; elsewhere a warning and no effect. Inside, the
 * ranks' only collectives must be ca_backward's (fp16 and deterministic mode are refused). */
CA_API ca_status ca_join_uneven_inputs_begin(ca_accelerator *acc, ca_tristate even_batches);
CA_API ca_status ca_join_uneven_inputs_end(ca_accelerator *acc);

/* ----------------------------------------------------------- autocast */
/* CA_AUTOCAST(acc, &opts) { ... }: Accelerate's accelerator.autocast(AutocastKwargs(enabled)). Ops
 * called inside (a loss, a metric, an unprepared module) run under the autocast policy
 * (docs/MIXED_PRECISION.md) in mixed_precision's dtype; enabled CA_NO turns it off inside; scopes
 * nest, the innermost wins, and the end restores the enclosing one. dtype CA_F16 / CA_BF16 chooses
 * the low precision (a caccel addition; CA_F32, the zero value: mixed_precision's). With
 * mixed_precision "no" and no dtype the scope changes nothing, as Accelerate's. A prepared model's
 * forward always runs in mixed_precision, also inside a disabling scope (Accelerate wraps the
 * model's forward the same way). A NULL opts is {0}. On an invalid dtype or more than 16 nested
 * scopes the block is skipped and ca_last_status() says why. */
typedef struct ca_autocast_opts {
    ca_tristate enabled;        /* CA_UNSET / CA_YES: on; CA_NO: off */
    ca_dtype dtype;             /* CA_F16, CA_BF16, or CA_F32: mixed_precision's */
} ca_autocast_opts;
CA_API ca_status ca_autocast_begin(ca_accelerator *acc, const ca_autocast_opts *opts);
CA_API void ca_autocast_end(ca_accelerator *acc);
#define CA_AUTOCAST(acc, opts) CA_AUTOCAST_(acc, opts, CA_CAT(ca_ac_v_, __LINE__))
#define CA_AUTOCAST_(acc, opts, v) \
    for (int v = ca_autocast_begin((acc), (opts)) == CA_OK; v; ca_autocast_end(acc), v = 0)

#ifdef __cplusplus
}
#endif
#endif
