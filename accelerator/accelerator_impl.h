/* accelerator_impl.h: private state of the Accelerator (device, process group, buckets, accumulation). */
#ifndef CACCEL_ACCELERATOR_IMPL_H
#define CACCEL_ACCELERATOR_IMPL_H

#include "nn/nn_impl.h"
#include "data/data_impl.h"
#include "comm/procenv_impl.h"
#include <caccel/accelerator.h>
#include <caccel/checkpoint.h>
#include <caccel/tracking.h>

/* A gradient bucket: a flat f32 buffer on the device that the gradients of
 * its parameters are views of, so the all-reduce runs in place with no copy. */
typedef struct ca_bucket {
    ca_tensor *flat;             /* persistent [numel] */
    int nparams;
    ca_tensor **params;
    int64_t numel;
    int ready;                   /* parameters whose gradient is final this pass */
    bool launched;
    ca_work *work;
    int group;                   /* the prepared model it belongs to (0: the first) */
    ca_tensor *wire;             /* comm_hook fp16/bf16: the bucket as sent, [numel] 16-bit; else NULL */
    struct ca_psgd *psgd;        /* comm_hook power_sgd/batched_power_sgd: its state (powersgd.c); else NULL */
} ca_bucket;

/* Deterministic mode: one gradient row per virtual shard this rank holds. */
typedef struct ca_det {
    int shards, parts;           /* V virtual shards per global batch; V / world on this rank */
    bool device_set;             /* the device was put into deterministic mode */
    int64_t numel;               /* f32 elements of all parameters */
    int nparams;
    ca_tensor **params;
    ca_tensor *flat;             /* [numel]: every .grad is a view of it */
    ca_tensor *local;            /* [parts, numel]: this rank's shard gradients */
    ca_tensor *all;              /* [shards, numel]: every shard's (local when world is 1) */
    bool *written;               /* [parts]: row written since the last synchronising step */
} ca_det;

/* Sharded data parallelism (ZeRO stages 1 and 2; FSDP SHARD_GRAD_OP, DeepSpeed zero_stage). The
 * parameters, in the model's order, form one flat index space of numel elements padded to
 * world * shard; rank r owns [r * shard, (r + 1) * shard). */
typedef struct ca_zero_seg {     /* the part of one parameter inside this rank's shard */
    ca_tensor *param;
    int64_t poff, soff, n;       /* offset in the parameter, offset in the shard, length */
    ca_optimizer *opt;           /* the prepared optimizer that updates it (NULL: none) */
    int group;
    int64_t toff;                /* offset in the shard's optimizer state (-1: frozen, none) */
} ca_zero_seg;

/* Stage 3: a wrap unit, the parameters gathered together before its module's forward and backward. */
typedef struct ca_zero_unit {
    ca_module *mod;
    struct ca_accelerator *acc;
    int n;
    int ntrain;                  /* of them those with requires_grad: a unit of frozen ones reduces nothing */
    int *idx;                    /* its parameters, as indices into ca_zero.params */
    int64_t numel;
    int64_t slice;               /* the gather's per-rank count: the most of it one rank's shard holds */
    bool by_part;                /* gathered by all-gather, reduced by reduce-scatter (else all-reduces) */
    bool gathered;               /* the parameters' full storage exists now */
    bool in_forward;             /* gathered by this forward's pre-forward hook (released after it) */
    int done;                    /* parameters whose gradient is complete this backward */
    ca_tensor *grad;             /* [N * slice] the unit's full gradient, backward to its reduce-scatter */
    bool reduced;                /* reduce-scattered into gshard in this synchronising backward */
    int pos;                     /* place in the forward order (ca_zero.order); -1 before it is known */
    bool in_backward;            /* its backward hook ran in this backward (not to be prefetched again) */
    bool pending;                /* a gather was issued and not yet finished (send, recv, work below) */
    ca_tensor *send, *recv;      /* of dtype gdt */
    ca_dtype gdt;                /* the gather's dtype: mixed precision's, or f32 (summon, no mixed precision) */
    ca_work *work;
} ca_zero_unit;

typedef struct ca_zero {
    int stage;                   /* 0: off (DDP), 1, 2, 3; asked: what the configuration asked */
    int asked;
    const char *origin;          /* the key that chose the stage */
    bool offload;                /* an offload key asks for host memory (a no-op on the CPU) */
    bool init_empty;             /* deepspeed_config.zero3_init_flag: models built until prepare are meta */
    bool scaler_set;             /* DeepSpeed's JSON gave fp16 loss-scaler options */
    ca_grad_scaler_opts scaler;
    char json[4096];             /* the DeepSpeed JSON read, if any */
    int nparams;
    ca_tensor **params;          /* stages 1 and 2: the trainable parameters; stage 3: every parameter */
    const char **names;          /* [nparams] their names in the model */
    int64_t *off;                /* params[i] starts at off[i] in the flat index space */
    int64_t numel, shard;
    ca_tensor *gflat;            /* [world * shard] local gradients; stage 2: only from backward to step */
    ca_tensor *gshard;           /* [shard] the averaged gradient of this rank's shard */
    ca_tensor *view;             /* a [shard] tensor whose .grad is gshard: what unscale and clipping see */
    ca_tensor *s1, *s2;          /* optimizer state of the shard (exp_avg / momentum, exp_avg_sq); on the
                                  * CPU device under offload */
    int64_t tshard;              /* elements of s1, s2: the shard's, or with frozen parameters in the shard
                                  * (stage 3) those of its trainable segments only (compact) */
    bool compact;
    float *hp, *hg;              /* offload: host (pinned) copies of the shard's parameters and gradient */
    int nsegs;
    ca_zero_seg *segs;
    bool reduced;                /* gshard holds this step's gradient */
    /* the shard group: every rank, or under HYBRID_SHARD the ranks of one machine (group_size) */
    int group_size;              /* asked: 0 every rank; else the hybrid shard group's size */
    ca_comm *comm;               /* the shard group (acc->comm, or own) */
    ca_comm *own;                /* HYBRID_SHARD: the shard group, owned */
    ca_comm *rep;                /* HYBRID_SHARD: the ranks holding the same shard on other machines, owned */
    int rank, world;             /* this rank and the shard count, in the shard group */
    /* stage 3 */
    ca_tensor *pshard;           /* [shard] this rank's parameter values (the full ones are freed) */
    int nunits;
    ca_zero_unit *units;
    int *unit_of;                /* [nparams] unit of each parameter */
    bool summoned;               /* ca_summon_full_params: every parameter gathered */
    bool full_gather;            /* gathers in f32 whatever the mixed precision (summoning) */
    ca_status err;               /* the first failure of a reduce-scatter run by a gradient hook */
    bool fwd_prefetch;           /* fsdp_forward_prefetch: the next unit's gather during a forward */
    int bwd_prefetch;            /* fsdp_backward_prefetch: 0 none, 1 BACKWARD_PRE, 2 BACKWARD_POST */
    int *order;                  /* [nunits] units in the order the first forward ran them */
    int norder;
    bool order_known;            /* set at the first backward: from then on prefetches follow order */
    uint64_t gathers, prefetched; /* gathers issued, and of them those issued ahead of their unit */
    size_t held;                 /* bytes of gathered parameters and unit gradients held now (a running
                                  * total: added where a unit is gathered or its gradient made, taken
                                  * off where released; the device's peak mark, memory_report.c) */
    size_t held_peak;            /* the most of held at once (estimate-memory --run's report) */
    bool check_held;             /* CACCEL_TEST_ZERO3_HELD: each change of held is checked against the
                                  * sum over the units; the counts are logged at ca_zero3_free */
    uint64_t held_checks, held_wrong;
    struct ca_zero_load *load;   /* a sharded checkpoint read and checked, not yet applied (zero_state.c) */
} ca_zero;

struct ca_accelerator {
    ca_config *cfg;
    ca_settings st;
    ca_device *device;
    ca_comm *comm;
    ca_procenv pe;
    bool infer_type;             /* several processes with distributed_type NO */
    int rank, world, local_rank, local_world;
    uint64_t seed;
    bool seeded;
    /* prepared objects */
    ca_module *model;
    /* frozen.c: each prepared model's trainable set at ca_prepare (requires_grad per parameter) */
    int nsnaps;
    struct ca_trainable_snap *snaps;
    int nopts;
    ca_optimizer **opts;
    int nloaders;
    ca_dataloader **loaders;
    /* gradient synchronisation: the strategy chosen at creation (sync_impl.h) */
    const struct ca_sync_strategy *sync_ops;
    /* data parallel */
    const struct ca_bucket_hook *bucket_hook;   /* comm_hook (NULL: none; sync_ddp.c) */
    int nbuckets;
    ca_bucket *buckets;
    int next_launch;             /* buckets launch strictly in index order on every rank */
    bool in_backward;
    ca_status bucket_status;
    /* fp16 loss scaling */
    ca_grad_scaler_opts scaler_opts;
    ca_grad_scaler_state scaler;
    bool found_inf;              /* this step's gradients overflowed (on some rank) */
    bool model_unscaled;         /* no optimizer prepared: the model's gradients were unscaled */
    /* accumulation */
    int64_t micro_step;          /* micro-steps inside CA_ACCUMULATE so far */
    bool sync;                   /* this micro-step synchronises and steps */
    bool in_accumulate;
    /* save_state / load_state */
    int ncustom;
    ca_checkpointable *custom;   /* registered objects (names owned) */
    int64_t iteration;           /* automatic checkpoint naming: the next checkpoint's number */
    bool iteration_known;        /* read from the configuration at first use */
    int nsaves;                  /* save_state calls so far (the test hook counts them) */
    struct ss_async *async;      /* asynchronous saves (state.c): the one in flight, its thread and communicator */
    /* deterministic mode (st.deterministic) */
    ca_det det;
    /* sharded data parallelism */
    ca_zero zero;
    /* accumulate.c: no_sync and trigger_sync_in_backward scopes, sync_gradients set by the program,
     * the trigger flag */
    int no_sync_depth, force_sync_depth;
    ca_tristate sync_set;        /* outside CA_ACCUMULATE: CA_NO holds steps and synchronisation back */
    bool trigger;
    /* join.c: inside ca_join_uneven_inputs with join enabled */
    bool joining;
    /* several models (GANs, teacher/student): those prepared after acc->model, plain data parallel
     * only; each model's buckets are a contiguous group [group_begin[g], group_begin[g + 1]) that
     * launches in its own order */
    int nextra;
    ca_module **extra;
    int ngroups;
    int *group_begin, *group_next;
    /* mixed_precision bf16 on xla turned the device's bf16 storage on; destroy turns it off */
    bool bf16_storage_set;
    bool profiling;                /* this accelerator began the running profile (profile.c) */
    /* autocast.c: the thread's autocast before each open CA_AUTOCAST scope */
    int autocast_depth;
    ca_dtype autocast_saved[16];
    /* experiment trackers (tracking.c): NULL until ca_init_trackers */
    struct ca_trackers *trackers;
    /* progress.c: the open bar that ca_log_metrics gives its loss (NULL: none) */
    struct ca_progress *progress;
    /* mesh.c: the device mesh's communicators and tp.c's split layers (NULL: no tensor parallelism) */
    struct ca_mesh *mesh;
    /* throughput.c: the meter, made by the first ca_throughput_step (NULL: none) */
    struct ca_throughput_meter *meter;
};

/* A DDP communication hook (comm_hook): how a bucket is sent. The plain f32 average needs none; the
 * fp16/bf16 compression hooks are sync_ddp.c's, PowerSGD's (powersgd.c: its state from
 * comm_state_option; batched: the whole bucket as one square matrix) run where the bucket's
 * all-reduce would be issued. NULL slots: nothing to do. */
typedef struct ca_bucket_hook {
    const char *name;
    ca_status (*init)(ca_accelerator *acc, ca_bucket *bk);   /* its state for a new bucket */
    /* the bucket's reduction, at its turn; *done false: the plain f32 average instead */
    ca_status (*launch)(ca_accelerator *acc, ca_bucket *bk, bool *done);
    ca_status (*finish)(ca_bucket *bk);                      /* after the wait for what launch issued */
    ca_status (*reset)(ca_bucket *bk);                       /* after an overflow skipped the step */
    void (*free)(ca_bucket *bk);
} ca_bucket_hook;
extern const ca_bucket_hook ca_bucket_hook_power_sgd, ca_bucket_hook_batched_power_sgd;

/* frozen.c: the trainable set (requires_grad of each parameter) of a model as ca_prepare laid out its
 * buckets or shards; check: CA_ERR_STATE naming the first parameter changed since (torch's DDP refuses
 * the same); forget: the model is gone; free: all of them. */
ca_status ca_trainable_snapshot(ca_accelerator *acc, ca_module *m);
ca_status ca_trainable_check(const ca_accelerator *acc);
void ca_trainable_forget(ca_accelerator *acc, const void *m);
void ca_trainable_free(ca_accelerator *acc);

/* zero_config.c: the stage from distributed_type FSDP / DEEPSPEED, their keys and DeepSpeed's JSON
 * (fills acc->zero.stage and overrides the settings the JSON gives). */
/* memory_report.c: with CACCEL_MEMORY_REPORT set, the first real optimizer step writes the device's
 * memory by category to CACCEL_MEMORY_REPORT.<rank> and ends the process (estimate-memory --run). */
ca_status ca_memory_report_step(ca_accelerator *acc, ca_optimizer *o);
ca_status ca_zero_configure(ca_accelerator *acc);
/* zero.c: sharded data parallelism. zero_buffers.c: the helpers over flat f32 buffers (zero3.c's
 * too): a float pointer into a device tensor, a device copy of n floats, a zeroed buffer kept past scopes. */
float *ca_zero_fptr(const ca_tensor *t, int64_t off);
ca_status ca_zero_copy_f32(ca_device *d, const float *x, float *y, int64_t n);
ca_tensor *ca_zero_persistent_zeros(ca_device *d, int64_t n);
ca_tensor *ca_zero_kept_zeros(ca_device *d, ca_dtype dt, int64_t n);   /* of any dtype */
/* A kept contiguous view of base's storage at element off (relative to base). */
ca_tensor *ca_zero_flat_view(ca_tensor *base, int ndim, const int64_t *shape, int64_t off);
/* Lays the model's parameters out in the flat index space and allocates this rank's shard. */
ca_status ca_zero_build(ca_accelerator *acc, ca_module *m);
/* Assigns the shard's segments to the optimizer's groups and allocates the shard's state. */
ca_status ca_zero_add_optimizer(ca_accelerator *acc, ca_optimizer *o);
/* Before a backward: stage 2 allocates the flat gradient the parameters' .grad view. */
ca_status ca_zero_before_backward(ca_accelerator *acc);
/* After a synchronising backward: the averaged gradient of this rank's shard into gshard. */
ca_status ca_zero_reduce(ca_accelerator *acc);
/* The sum of squares of the gradient shard's segments of tensor-parallel split parameters, added into
 * the device f32 scalar at out (clip_grad_norm under tp: the tp ranks' sums of them add up). */
ca_status ca_zero_split_sumsq(ca_accelerator *acc, void *out);
/* The update of o's part of the shard, then the all-gather of the parameters. */
ca_status ca_zero_step(ca_accelerator *acc, ca_optimizer *o);
/* A compact state buffer (s1, s2) as a shard-sized one on its device (zeros where the shard holds
 * frozen parameters), kept: the caller frees it unless it is st itself (not compact); and back. */
ca_tensor *ca_zero_state_unpack(ca_accelerator *acc, ca_tensor *st);
ca_status ca_zero_state_pack(ca_accelerator *acc, ca_tensor *full, ca_tensor *st);
/* Full optimizer state tensors of o from every rank's shard (for a full state dict), and back. */
ca_status ca_zero_gather_state(ca_accelerator *acc, ca_optimizer *o);
ca_status ca_zero_scatter_state(ca_accelerator *acc, ca_optimizer *o);
/* Frees the per-parameter state tensors again (the shard keeps the state). */
void ca_zero_drop_state(ca_optimizer *o);
/* The elements of param in this rank's shard, [*off, *off + *n) of it (*n = 0: none). */
void ca_zero_state_slice(const ca_accelerator *acc, const ca_tensor *param, int64_t *off, int64_t *n);
void ca_zero_free(ca_accelerator *acc);
/* zero3.c: stage 3 (parameters sharded between steps). */
/* Wrap units from fsdp_auto_wrap_policy, pshard from the parameters, hooks on the units' modules;
 * frees the full parameters. */
ca_status ca_zero3_build(ca_accelerator *acc, ca_module *m);
/* At the start of a backward: no unit reduced yet. */
void ca_zero3_before_backward(ca_accelerator *acc);
/* End of a synchronising backward: reduce-scatters the units no gradient hook reduced (in unit order). */
ca_status ca_zero3_reduce(ca_accelerator *acc);
/* Releases every gathered unit (end of backward: parameters no gradient reached). */
void ca_zero3_release_all(ca_accelerator *acc);
/* Gathers every unit (on) or writes this rank's segments back into pshard and releases (off). */
ca_status ca_zero3_summon(ca_accelerator *acc, bool on);
/* Model files into a stage-3 model without gathering it (fsdp_cpu_ram_efficient_loading): each rank
 * copies only the slices of its shard, seg_data(ctx, sg) giving the sg->n f32 values of segment sg in
 * host memory (the file's bytes from sg->poff of the parameter's; mapped, only the pages of those
 * slices are read; or a buffer they were read into). */
ca_status ca_zero3_load_shard(ca_accelerator *acc, const float *(*seg_data)(void *ctx, const ca_zero_seg *sg),
                              void *ctx);
/* fsdp_config.fsdp_cpu_ram_efficient_loading (true by default, as Accelerate's): whether loads read
 * only what each rank keeps (rank 0 alone for replicated tensors, each rank its shard or tp slices) rather
 * than the files whole on every rank; false keeps the whole-file loads (under tp: the tensors made whole,
 * with_full_params). Local. */
static inline bool ca_ram_efficient_loading(const ca_accelerator *acc) {
    bool on = true;   /* validated when the configuration was read: a bad value never reaches here */
    if (ca_config_get_bool(acc->cfg, "fsdp_config.fsdp_cpu_ram_efficient_loading", &on) != CA_OK) ca_clear_error();
    return on;
}
/* Whether a load into acc's model copies into the shard without gathering (above, and load_state):
 * a model prepared at stage 3, not summoned, with fsdp_cpu_ram_efficient_loading true (the default,
 * as in Accelerate). False: the parameters are gathered whole on every rank, loaded, and the shard
 * taken from them. */
bool ca_zero3_loads_lean(const ca_accelerator *acc);
/* The same whatever the mesh: beside tensor parallelism (FULL_SHARD over dp_shard, tp_size > 1) the shard
 * is of each rank's tp slices, and ca_load_model reads only its shard's part of them (checkpoint.c). */
bool ca_zero3_shard_loads_lean(const ca_accelerator *acc);
/* Every rank's status of reading its part of a deferred load's files (collective): s where this rank
 * failed, else CA_ERR_PEER "<who>: N other rank(s) failed to read their <part> of the model's files"
 * where another did. */
ca_status ca_agree_file_reads(ca_accelerator *acc, ca_status s, const char *who, const char *part);
void ca_zero3_free(ca_accelerator *acc);

/* zero_offload.c: the optimizer state and update of the shard in host memory (offload_optimizer,
 * fsdp_offload_params). wanted: offload asked and the device is not host memory (or
 * CACCEL_OFFLOAD_ON_CPU=1). init: the host buffers; fetch: parameters and gradient of the shard to
 * them; store: the updated parameters back; free: the buffers. */
bool ca_zero_offload_wanted(const ca_accelerator *acc);
ca_status ca_zero_offload_init(ca_accelerator *acc);
ca_status ca_zero_offload_fetch(ca_accelerator *acc);
ca_status ca_zero_offload_store(ca_accelerator *acc);
void ca_zero_offload_free(ca_accelerator *acc);
/* zero_state.c: sharded state dicts (fsdp_state_dict_type SHARDED_STATE_DICT). */
/* This rank's zero_shard_<rank>.safetensors (parameter and optimizer-state shard); rank 0 the index. */
ca_status ca_zero_save_shard(ca_accelerator *acc, const char *dir);
/* The index's name: a checkpoint whose complete.json lists it is sharded; and each shard's. */
#define CA_ZERO_INDEX "zero_index.json"
#define CA_ZERO_SHARD_FMT "zero_shard_%d.safetensors"
/* state.c: the checkpoint a load is checking, as ca_state_open_file opens its files. */
typedef struct ca_state_files ca_state_files;
struct ca_st_file;
/* File `name` of that checkpoint (one complete.json lists), mapped and verified against the sums
 * recorded there: whole, or only its header (the caller verifies with ca_st_verify_range the
 * ranges it reads before reading them). The caller closes f. */
ca_status ca_state_open_file(const ca_state_files *files, const char *name, bool whole, struct ca_st_file *f);
/* The index against this run (parameter names, shapes, offsets; any world size, stage or HSDP
 * grouping), and the slices of the old shard files this rank needs read into host buffers, each
 * byte range verified (complete.json's chunk sums) before it is read; changes nothing of the run. */
ca_status ca_zero_check_shard(ca_accelerator *acc, const char *dir, const ca_state_files *files);
/* The shard files the checked checkpoint has (its world size; this run's before a check). */
int ca_zero_load_shards(const ca_accelerator *acc);
/* What ca_zero_check_shard read, applied: every parameter, this rank's optimizer-state shard. */
ca_status ca_zero_load_shard(ca_accelerator *acc, const char *dir);
/* Drops what ca_zero_check_shard read (a load that another rank refused). */
void ca_zero_load_free(ca_accelerator *acc);
/* Whether a FULL_STATE_DICT load reads only this rank's slices of the optimizer state into its
 * shard (below) instead of building the full state on every rank: at stages 1 and 2 (whole
 * parameters, a shard of the state) and at stage 3 when ca_zero3_loads_lean, under
 * fsdp_cpu_ram_efficient_loading true (the default). */
bool ca_zero_loads_state_lean(const ca_accelerator *acc);
/* A FULL_STATE_DICT checkpoint's optimizer state under a lean load: only this rank's slice of each of
 * o's state tensors in f, verified and read into host buffers of a shard each (changes nothing of the
 * run); then copied into the shard's state (apply) or dropped. */
struct ca_tp_file;
ca_status ca_zero_read_state_slices(ca_accelerator *acc, ca_optimizer *o, struct ca_st_file *f, struct ca_tp_file *tp);
ca_status ca_zero_load_state_slices(ca_accelerator *acc, bool apply);

/* accumulate.c: whether this backward all-reduces (the step's decision, no_sync, trigger_sync_in_backward). */
bool ca_backward_syncs(const ca_accelerator *acc);
/* join.c: an active rank's part of the join protocol before a backward (collective under join). */
ca_status ca_join_notify(ca_accelerator *acc, bool sync);

/* state.c: frees what ca_register_for_checkpointing kept. */
void ca_state_free(ca_accelerator *acc);
/* state.c: a saved checkpoint's integrity: `dir` has complete.json and every file it lists has the
 * size and CRC-32 recorded there. Errors name the file; `who` ("load_state") begins the others. */
ca_status ca_state_check_files(const char *who, const char *dir);
/* progress.c: ca_log_metrics passes its values to the open bar (a loss is shown); the accelerator
 * detaches the bar when it is destroyed first. */
void ca_progress_note_metrics(struct ca_progress *p, const ca_metric *values, size_t n);
void ca_progress_detach(struct ca_progress *p);

/* The profiler (profile.c): begun from the configuration at create, a step per optimizer step,
 * ended (the trace written) at destroy. */
ca_status ca_accelerator_profile_begin(ca_accelerator *acc);
void ca_accelerator_profile_step(ca_accelerator *acc, const ca_optimizer *o);
void ca_accelerator_profile_end(ca_accelerator *acc);
/* throughput.c: frees the meter and stops its FLOP counting (destroy). */
void ca_throughput_free(ca_accelerator *acc);

#endif
