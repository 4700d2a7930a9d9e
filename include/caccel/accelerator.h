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
 * more dataloaders (evaluation). */
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
 * (over all ranks) is at most max_norm; returns the norm before clipping. With
 * fp16 the gradients are unscaled first, once per step: the later
 * ca_optimizer_step does not unscale again. Configured clipping
 * (ACCELERATE_GRADIENT_CLIPPING, gradient_clipping) runs inside the step. */
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

/* printf on the main process only (stdout, flushed). */
CA_API void ca_print(const ca_accelerator *acc, const char *fmt, ...) CA_PRINTF(2, 3);
/* Seeds the process generator and the dataloaders' shuffles (same on every rank). */
CA_API ca_status ca_set_seed(ca_accelerator *acc, uint64_t seed);

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

#ifdef __cplusplus
}
#endif
#endif
