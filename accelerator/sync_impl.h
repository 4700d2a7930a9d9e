/* sync_impl.h: gradient synchronisation as one interface. Each strategy (a single process, DDP's
 * buckets, ZeRO stages 1 to 3, deterministic mode) is one ca_sync_strategy in its own file; the
 * accelerator picks one row of the table in strategy.c once, from the configuration, when it is
 * created, and from then on calls only these slots. A NULL slot means "nothing to do" (or, for
 * prepare_extra_model, "one model per accelerator"). */
#ifndef CACCEL_SYNC_IMPL_H
#define CACCEL_SYNC_IMPL_H

#include "accelerator/accelerator_impl.h"

struct ca_tp_file;
typedef struct ca_sync_strategy {
    const char *name;                /* "none", "ddp", "zero", "deterministic" */
    const char *key;                 /* the configuration key that chose it (for messages) */
    /* what it reduces in place of DDP's buckets (a comm_hook is then unused: warned), NULL: DDP */
    const char *own_reduction;
    /* every rank holds the whole model, equal, between steps (unless params_sharded says otherwise):
     * a load may read it on rank 0 and broadcast it (checkpoint.c) */
    bool replicated;
    /* the configuration asks for it (the first row of the table that says yes is taken) */
    bool (*selected)(const ca_accelerator *acc);
    /* at creation, once selected: checks its settings against the world (no collective yet) */
    ca_status (*configure)(ca_accelerator *acc);
    /* the first model, on the device and with rank 0's parameters: gradient layout, hooks */
    ca_status (*prepare_model)(ca_accelerator *acc, ca_module *m);
    /* a second, third, ... model (GANs, teacher/student); NULL: refused */
    ca_status (*prepare_extra_model)(ca_accelerator *acc, ca_module *m);
    ca_status (*prepare_optimizer)(ca_accelerator *acc, ca_optimizer *o);
    /* a prepared dataloader, and one handed back (the accelerator destroyed first) */
    ca_status (*prepare_loader)(ca_accelerator *acc, ca_dataloader *dl);
    void (*release_loader)(ca_accelerator *acc, ca_dataloader *dl);
    /* false while the active batch is not complete yet (deterministic mode's virtual shards) */
    bool (*batch_done)(const ca_accelerator *acc);
    /* around a backward; sync: this backward synchronises; failed: the backward itself failed */
    ca_status (*before_backward)(ca_accelerator *acc);
    ca_status (*after_backward)(ca_accelerator *acc, bool sync, bool failed);
    /* join_uneven_inputs (join.c): the collectives of the others' synchronising backward, issued by a
     * rank whose data ran out, with zero gradients (NULL: nothing to shadow) */
    ca_status (*shadow_backward)(ca_accelerator *acc);
    /* the update of o's parameters once its gradients are unscaled and clipped (NULL: o's own) */
    ca_status (*step)(ca_accelerator *acc, ca_optimizer *o);
    /* a step skipped for an fp16 overflow: state that followed the gradients goes back */
    ca_status (*skip_step)(ca_accelerator *acc);
    /* the gradients the optimizers see, where they are not the parameters' own: a tensor whose .grad
     * is them (NULL: the parameters' own), and the group over which a norm of them sums (NULL: none) */
    ca_tensor *(*shard_grads)(const ca_accelerator *acc, ca_comm **group);
    /* tensor parallelism: the sum of squares of shard_grads' elements that belong to tp-split parameters
     * (the tp ranks' sums of them add up to the split layers' part of a norm) added into the device f32
     * scalar at out */
    ca_status (*shard_split_sumsq)(ca_accelerator *acc, void *out);
    /* checkpoints: o's full optimizer state from every rank's part, back into the parts, dropped */
    ca_status (*gather_state)(ca_accelerator *acc, ca_optimizer *o);
    ca_status (*scatter_state)(ca_accelerator *acc, ca_optimizer *o);
    void (*drop_state)(ca_optimizer *o);
    /* the elements [*off, *off + *n) of param's optimizer state that this rank keeps after
     * scatter_state (NULL: all of them): a full checkpoint's load reads only those */
    void (*state_slice)(const ca_accelerator *acc, const ca_tensor *param, int64_t *off, int64_t *n);
    /* a full checkpoint's load: whether this rank reads only its slices of the optimizer state
     * (state_lean; NULL or false: the full tensors, then scatter_state), read_state_slices reading
     * those of o's state tensors in f into its part's host buffers (no full state made), then copied
     * into its part (apply) or dropped; tp non-NULL (beside tensor parallelism): the slices of the
     * rank's tp slices, read through tp's descriptor and hashed into its parts (tp_load.c) */
    bool (*state_lean)(const ca_accelerator *acc);
    ca_status (*read_state_slices)(ca_accelerator *acc, ca_optimizer *o, struct ca_st_file *f, struct ca_tp_file *tp);
    ca_status (*load_state_slices)(ca_accelerator *acc, bool apply);
    /* sharded checkpoints (each rank its part): whether save_state writes them, the part count, and
     * this rank's file written, an index checked against this run, the parts read */
    bool (*saves_shards)(const ca_accelerator *acc);
    int (*shard_count)(const ca_accelerator *acc);
    ca_status (*save_shard)(ca_accelerator *acc, const char *dir);
    ca_status (*check_shard)(ca_accelerator *acc, const char *dir, const ca_state_files *files);
    ca_status (*load_shard)(ca_accelerator *acc, const char *dir);
    /* parameters held in parts between steps: whether they are now, and gathering them whole (on)
     * or back into parts (off); collective */
    bool (*params_sharded)(const ca_accelerator *acc);
    ca_status (*summon)(ca_accelerator *acc, bool on);
    /* model group g (0: the first model) is being destroyed; last: no model is left */
    void (*forget_model)(ca_accelerator *acc, int g, bool last);
    void (*free)(ca_accelerator *acc);
} ca_sync_strategy;

/* The strategies (sync_none.c, sync_ddp.c, sync_zero.c, sync_deterministic.c). */
extern const ca_sync_strategy ca_sync_none, ca_sync_ddp, ca_sync_zero, ca_sync_deterministic;

/* strategy.c: reads what the strategies need from the configuration, takes the first row of the
 * table the configuration selects into acc->sync_ops and configures it. */
ca_status ca_sync_select(ca_accelerator *acc);

/* accumulate.c: the prepared loader that handed out the newest batch (NULL: none). */
const ca_dataloader *ca_active_loader(const ca_accelerator *acc);

#endif
