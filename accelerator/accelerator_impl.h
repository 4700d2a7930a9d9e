/* accelerator_impl.h: private state of the Accelerator (device, process group, buckets, accumulation). */
#ifndef CACCEL_ACCELERATOR_IMPL_H
#define CACCEL_ACCELERATOR_IMPL_H

#include "nn/nn_impl.h"
#include "data/data_impl.h"
#include "core/procenv_impl.h"
#include <caccel/accelerator.h>
#include <caccel/checkpoint.h>

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
    int nopts;
    ca_optimizer **opts;
    int nloaders;
    ca_dataloader **loaders;
    /* data parallel */
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
    /* deterministic mode (st.deterministic) */
    ca_det det;
};

/* ddp.c: data parallelism over acc->comm. */
/* Broadcasts every parameter of m from rank 0 (collective: every rank calls it). */
ca_status ca_ddp_broadcast_params(ca_accelerator *acc, ca_module *m);
/* Makes each parameter's .grad a view into f32 buckets of at most bucket_cap_mb and installs the
 * hook that launches a bucket's all-reduce (average) once all its gradients are final. */
ca_status ca_ddp_build_buckets(ca_accelerator *acc, ca_module *m);
/* After a synchronising backward: launches what unused parameters held back and waits for all. */
ca_status ca_ddp_finish_buckets(ca_accelerator *acc);
void ca_ddp_free_buckets(ca_accelerator *acc);

/* state.c: frees what ca_register_for_checkpointing kept. */
void ca_state_free(ca_accelerator *acc);
/* determinism.c: deterministic mode. */
/* Checks deterministic_shards against the world size and puts the device into deterministic mode. */
ca_status ca_det_configure(ca_accelerator *acc);
/* Makes every parameter's .grad a view of one flat buffer and allocates the shard rows. */
ca_status ca_det_build(ca_accelerator *acc, ca_module *m);
/* After the backward of micro-batch `part`: adds .grad into that shard's row and frees .grad. */
ca_status ca_det_collect(ca_accelerator *acc, int part);
/* At the synchronising step: .grad = (sum of every shard's row, in shard order) / shards. */
ca_status ca_det_reduce(ca_accelerator *acc);
void ca_det_free(ca_accelerator *acc);

#endif
