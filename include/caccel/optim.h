/* caccel/optim.h: SGD and AdamW (one fused kernel per parameter group) and learning-rate schedules. */
#ifndef CACCEL_OPTIM_H
#define CACCEL_OPTIM_H

#include <caccel/nn.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * An optimizer holds parameter groups (each with its own hyper-parameters)
 * and per-parameter state as persistent f32 tensors on the parameters'
 * device. State is plain tensors and numbers, listed by ca_optimizer_state_*
 * for checkpoints. Not thread-safe.
 */
typedef struct ca_optimizer ca_optimizer;

/* Zeroed fields take PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8,
 * weight_decay 0.01. To ask for a real zero, set the *_set flag. */
typedef struct ca_adamw_opts {
    double lr, beta1, beta2, eps, weight_decay;
    bool weight_decay_set;     /* weight_decay is meant even if 0 */
} ca_adamw_opts;

/* Zeroed fields: lr 0.01 (PyTorch requires one; we choose 0.01), momentum 0,
 * dampening 0, weight_decay 0, nesterov false. */
typedef struct ca_sgd_opts {
    double lr, momentum, dampening, weight_decay;
    bool nesterov;
} ca_sgd_opts;

/* Creates an optimizer over every parameter of m (one group). NULL opts =
 * defaults. Nesterov without momentum is CA_ERR_INVALID, as in PyTorch. */
CA_API ca_status ca_adamw_create(ca_module *m, const ca_adamw_opts *opts, ca_optimizer **out);
CA_API ca_status ca_sgd_create(ca_module *m, const ca_sgd_opts *opts, ca_optimizer **out);
/* Same, over an explicit list of parameters (not owned). */
CA_API ca_status ca_adamw_create_params(ca_tensor *const *params, int n, const ca_adamw_opts *opts,
                                        ca_optimizer **out);
CA_API ca_status ca_sgd_create_params(ca_tensor *const *params, int n, const ca_sgd_opts *opts,
                                      ca_optimizer **out);
/* Adds a parameter group with its own options (same optimizer kind). The
 * group's parameters must not already be in the optimizer. */
CA_API ca_status ca_optimizer_add_group(ca_optimizer *o, ca_tensor *const *params, int n,
                                        const void *opts /* ca_adamw_opts* or ca_sgd_opts* */);
CA_API void ca_optimizer_destroy(ca_optimizer *o);     /* accepts NULL */

/* One update of every group from the current gradients (parameters without a
 * gradient are skipped, as in PyTorch). When the optimizer has been prepared,
 * this goes through the accelerator: on a non-boundary accumulation micro-step
 * it does nothing, with fp16 it unscales, checks for overflow on every rank and
 * skips the whole step on overflow, and it applies configured clipping. */
CA_API ca_status ca_optimizer_step(ca_optimizer *o);
/* Drops the gradients (on a non-boundary accumulation micro-step of a
 * prepared optimizer: does nothing). */
CA_API void ca_optimizer_zero_grad(ca_optimizer *o);
/* True when the last ca_optimizer_step changed nothing (fp16 overflow). */
CA_API bool ca_optimizer_step_was_skipped(const ca_optimizer *o);

/* Learning rate of group g (after the schedule). */
CA_API double ca_optimizer_get_lr(const ca_optimizer *o, int group);
CA_API ca_status ca_optimizer_set_lr(ca_optimizer *o, int group, double lr);
CA_API int ca_optimizer_num_groups(const ca_optimizer *o);
/* Real (applied) steps so far. */
CA_API int64_t ca_optimizer_steps(const ca_optimizer *o);

/* ----------------------------------------------------------- schedules */
typedef enum ca_schedule_kind {
    CA_SCHED_CONSTANT = 0,     /* lr (after warm-up) */
    CA_SCHED_LINEAR = 1,       /* linear warm-up, then linear decay to min_lr_ratio*lr */
    CA_SCHED_COSINE = 2        /* linear warm-up, then cosine decay to min_lr_ratio*lr */
} ca_schedule_kind;
typedef struct ca_lr_schedule {
    ca_schedule_kind kind;
    int64_t warmup_steps;      /* lr rises linearly from 0 over these steps */
    int64_t total_steps;       /* decay ends here (LINEAR, COSINE) */
    double min_lr_ratio;       /* final lr / base lr (0 = decay to 0) */
} ca_lr_schedule;
/* Attaches a schedule: every real optimizer step sets each group's lr to
 * base_lr * factor(step) (base_lr = the group's lr now). Like Accelerate, the
 * schedule advances on real optimizer steps only (not on accumulation
 * micro-steps), and an optimizer prepared on N processes advances it N steps
 * per optimizer step (Accelerate steps a prepared scheduler once per process
 * when batches are not split): count total_steps and warmup_steps as for one
 * process, e.g. batches of the unprepared loader x epochs / accumulation. With
 * split_batches the loader's batch is the global one on any N, and the
 * schedule advances one step per optimizer step, as Accelerate's.
 * Not thread-safe against a concurrent step of the same optimizer.
 * Errors: CA_ERR_INVALID for negative warm-up, min_lr_ratio outside [0, 1], or
 * total_steps <= 0 with a decay. */
CA_API ca_status ca_optimizer_set_schedule(ca_optimizer *o, const ca_lr_schedule *s);
/* The factor the schedule gives at `step` (for tests and plots). */
CA_API double ca_lr_schedule_factor(const ca_lr_schedule *s, int64_t step);

/* ----------------------------------------------------------- state */
/* Every state tensor with its name ("state.<param index>.exp_avg",
 * "state.<i>.exp_avg_sq", "state.<i>.momentum_buffer"), for checkpoints. */
CA_API int ca_optimizer_num_state(ca_optimizer *o);
CA_API ca_tensor *ca_optimizer_state_at(ca_optimizer *o, int i, const char **name);
/* Bytes of the per-parameter state tensors the optimizer holds now (0 for a
 * prepared optimizer under ZeRO, whose state lives in the shard). A frozen
 * parameter (requires_grad false) gets no state and is not stepped, also when
 * it was frozen after the optimizer was made (torch skips a parameter whose
 * .grad is None; state it had already is kept in memory for when it is
 * unfrozen). ca_optimizer_state_at lists the trainable parameters' state only,
 * so checkpoints hold only theirs. */
CA_API int64_t ca_optimizer_state_bytes(const ca_optimizer *o);
/* Scalar state: step count. */
CA_API ca_status ca_optimizer_set_steps(ca_optimizer *o, int64_t steps);

#ifdef __cplusplus
}
#endif
#endif
