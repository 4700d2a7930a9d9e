/* caccel/checkpoint.h: model files other tools read (safetensors, as Accelerate's save_model), and
 * the whole training state (Accelerate's save_state / load_state) for exact resumption. */
#ifndef CACCEL_CHECKPOINT_H
#define CACCEL_CHECKPOINT_H

#include <caccel/accelerator.h>
#include <caccel/nn.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * FILES. A model is saved as safetensors: `dir/model.safetensors`, or, when its parameters take
 * more than max_shard_size bytes, `dir/model-00001-of-0000N.safetensors` ... plus
 * `dir/model.safetensors.index.json` ({"metadata": {"total_size": ...}, "weight_map": {...}}),
 * the layout Hugging Face's save_pretrained and Accelerate's save_model write. Tensor names are
 * the module's parameter names ("fc1.weight", "0.bias"), so PyTorch's load_state_dict and the
 * `safetensors` package read the files directly (docs/CHECKPOINTS.md).
 *
 * ATOMICITY. Every file is written as name.tmp, fsync'd, renamed over name, and the directory
 * fsync'd: a crash leaves the old file or the new one, never a torn one.
 *
 * THREADS. Not thread-safe with respect to the model: no other thread may train or change it
 * during a save or a load. acc may be NULL for a program without an accelerator (one process).
 *
 * ERRORS. Messages name the file and the tensor, and say what differs (shape, dtype, a missing or
 * extra tensor, a corrupt header). A failed load leaves every parameter unchanged.
 */

/* Saves the parameters of `model` under `dir` (which must exist). The main process writes the
 * files (parameters on a device are copied to the host); every rank must call it, and it returns
 * on every rank only once the files exist; other ranks return CA_ERR_PEER when rank 0 failed.
 * max_shard_size: the most bytes of tensor data per file; 0 = one file. A tensor larger than
 * max_shard_size gets a file of its own. */
CA_API ca_status ca_save_model(ca_accelerator *acc, ca_module *model, const char *dir,
                               size_t max_shard_size);

/* Loads a model saved by ca_save_model (or by PyTorch/safetensors with the same names) into
 * `model`: dir_or_file is a directory holding model.safetensors or model.safetensors.index.json,
 * a .safetensors file, or an index .json file. Every tensor must match a parameter of the same
 * name, shape and dtype, and every parameter must be present; everything is checked before the
 * first parameter is written. Each rank reads the files itself. Into a model prepared at stage 3
 * (FSDP FULL_SHARD, ZeRO-3) with fsdp_cpu_ram_efficient_loading true (the default), each rank copies
 * only the slices of its shard, never gathering the model; false gathers it whole, loads, keeps the
 * shard. Into a meta model (ca_init_empty_weights) not yet prepared, each parameter gets its memory
 * and the file's values (docs/DISTRIBUTED.md, "Deferred initialisation"). Into a prepared model every
 * rank holds whole (DDP, ZeRO 1-2) on several processes, rank 0 reads and broadcasts; a broadcast
 * that fails (a peer died, stopped, timed out) puts every surviving rank's parameters back as they
 * were (each keeps a host copy of them during the load) and returns the error, naming the peer. */
CA_API ca_status ca_load_model(ca_accelerator *acc, ca_module *model, const char *dir_or_file);

/* ------------------------------------------------------------------ training state */

/*
 * ca_save_state / ca_load_state are Accelerate's save_state / load_state: everything a run needs
 * to continue where it stopped. A checkpoint directory holds (docs/CHECKPOINTS.md):
 *   model.safetensors                  the prepared model (as ca_save_model writes it)
 *   optimizer.safetensors, optimizer_1.safetensors, ...   each prepared optimizer's state tensors,
 *                                      named as PyTorch's optimizer.state_dict()["state"] flattened:
 *                                      "state.<param index>.exp_avg", ".exp_avg_sq",
 *                                      ".momentum_buffer"
 *   caccel_state.json                  optimizer scalars (steps, per-group lr and base lr,
 *                                      hyper-parameters), the LR schedule, the fp16 loss scaler,
 *                                      each prepared dataloader (epoch, batches handed out, shuffle
 *                                      seed), the accumulation counter, the iteration
 *   random_states_<rank>.json          each rank's generator (seed, counter offset)
 *   custom_checkpoint_<i>.bin          objects given to ca_register_for_checkpointing
 *                                      (custom_checkpoint_<i>_<rank>.bin when per_rank)
 *   caccel_config.json                 the merged configuration that produced the run: each key's
 *                                      value and origin ("cfg.yaml:3", "env ...", "--flag")
 *   complete.json                      the completion marker, written last: every file's size and
 *                                      CRC-32
 *
 * PROJECT. The configuration keys project_dir, automatic_checkpoint_naming, total_limit and
 * iteration are Accelerate's ProjectConfiguration (docs/CONFIGURATION.md). With dir NULL the
 * state goes to <project_dir>/checkpoints/checkpoint_<iteration> (automatic_checkpoint_naming
 * must be on), iteration then increments, and beyond total_limit the oldest complete
 * checkpoints there are removed.
 *
 * COLLECTIVE. Every rank calls both, at the same point of the run, at an accumulation boundary
 * (gradients are not saved). The directory must be visible to every rank (one machine, or a shared
 * file system). Rank 0 writes the replicated state once, every rank its own files; the save
 * completes only after every rank has written (statuses are exchanged): every rank returns the
 * same status, and a rank whose write failed is named.
 *
 * ATOMIC. Files go to <dir>.tmp, each fsync'd, the directory is fsync'd and renamed to <dir>, and
 * complete.json is written last. A reader refuses a directory without it. A crash (kill -9 on any
 * rank) at any moment leaves the previous checkpoints loadable.
 *
 * ERRORS. A missing marker, a truncated or corrupt file, a tensor or key that is missing or of
 * another shape, dtype or model fails with the file, the tensor or key and what differs. Every
 * file is checked on every rank before anything is applied: a failed load changes nothing, on
 * any rank.
 *
 * THREADS. Not thread-safe: call from the thread that trains, with no other thread using the
 * accelerator or its prepared objects.
 */

/* Saves the state into `dir` (created; an existing checkpoint there is replaced), or with dir
 * NULL into the next automatically named checkpoint. In an elastic job (caccel launch --num_machines
 * MIN:MAX) with a machine waiting to join, a complete synchronous save does not return: every process
 * waits there for its launcher to stop it, and the grown group resumes from this checkpoint
 * (docs/DISTRIBUTED.md, Elastic membership). */
CA_API ca_status ca_save_state(ca_accelerator *acc, const char *dir);

/* ASYNCHRONOUS SAVES (Accelerate-style save_state(..., async=True); docs/CHECKPOINTS.md,
 * "Asynchronous saves"). With async set (or the configuration key async_save true for
 * ca_save_state), the calling thread does every collective the save needs (the gathers of sharded
 * state, the ZeRO-3 parameters) and copies every file's bytes into host buffers, then returns: the
 * parameters, optimizer state, generators and registered objects may change at once. A background
 * thread writes the files, fsyncs them and publishes the checkpoint as a synchronous save does (the
 * same files, byte for byte; the same steps of "Atomicity", its status exchanges on a host-memory
 * communicator of its own split from the accelerator's at the first asynchronous save, whatever the
 * device: the lazy xla device and GPUs too), then applies total_limit. A write that fails on any
 * rank keeps rank 0 from publishing.
 * One save is in flight at a time: a new save, ca_load_state and teardown first wait for it (or the
 * save returns CA_ERR_STATE at once with refuse_if_busy, on every rank when any rank's is in flight).
 * A background failure is never lost: the next ca_save_state*, ca_wait_for_save or ca_load_state
 * returns it (naming the directory), once; a failure still unreported at teardown is logged. Where
 * the background thread cannot have collectives of its own (several processes over an MPI library
 * that did not give MPI_THREAD_MULTIPLE) the save is synchronous, with a warning at the first one. The host copy holds the whole state
 * (about 3x the model for AdamW) until the write is done. */
typedef struct ca_save_state_options {
    bool async;            /* copy to host memory and write on a background thread */
    bool refuse_if_busy;   /* a save still in flight: CA_ERR_STATE instead of waiting for it */
} ca_save_state_options;

/* ca_save_state with options; opts NULL: the configuration's (async_save). Collective. */
CA_API ca_status ca_save_state_ex(ca_accelerator *acc, const char *dir, const ca_save_state_options *opts);

/* Waits for the asynchronous save in flight, if any, and returns its status, or that of the last
 * one if it failed and was not returned yet (CA_OK otherwise; each failure is returned once). Not
 * collective: every rank may call it at any time from the training thread. */
CA_API ca_status ca_wait_for_save(ca_accelerator *acc);

/* Loads a state saved by ca_save_state into the prepared objects (the same model, optimizers,
 * dataloaders and registered objects, prepared and registered in the same order). dir NULL: the
 * newest complete checkpoint under <project_dir>/checkpoints, passing over incomplete ones with a
 * warning; automatic naming then continues after it. At the same world size the run continues
 * exactly (bit for bit on the CPU with the same thread count); at another world size the
 * dataloaders continue at the same global sample position, rounded down to the new world's
 * step (docs/CHECKPOINTS.md). requires_grad of the model's parameters is set as
 * saved (the checkpoint records the frozen ones); a checkpoint whose trainable set
 * differs from the one DDP, ZeRO or deterministic mode laid out at ca_prepare is
 * CA_ERR_INVALID, naming the parameter. Optimizer files hold the trainable
 * parameters' state only. */
CA_API ca_status ca_load_state(ca_accelerator *acc, const char *dir);

/* User state saved with the accelerator's (Accelerate's register_for_checkpointing). */
typedef struct ca_checkpointable {
    const char *name;          /* unique among the registered objects; copied */
    /* Serialises the state into *data (malloc'd; caccel frees it) of *len bytes. */
    ca_status (*save)(void *ctx, void **data, size_t *len);
    /* Called twice per load: with apply false, only checks the bytes (an error names what is
     * wrong and nothing changes); then, once every file of the checkpoint checked out, with apply
     * true to restore them (must not fail for bytes that passed the check). */
    ca_status (*load)(void *ctx, const void *data, size_t len, bool apply);
    void *ctx;                 /* not owned */
    bool per_rank;             /* every rank saves and loads its own copy (else rank 0 saves one) */
} ca_checkpointable;

/* Registers obj (copied; ctx must outlive the accelerator or the last save/load). Objects are
 * saved in registration order as custom_checkpoint_<i>; a load needs the same names in the same
 * order. CA_ERR_INVALID for a missing callback or a name registered twice. */
CA_API ca_status ca_register_for_checkpointing(ca_accelerator *acc, const ca_checkpointable *obj);

/* A checkpoint saved by ca_save_state under sharded data parallelism with fsdp_state_dict_type
 * SHARDED_STATE_DICT holds each rank's shard (zero_shard_<rank>.safetensors) and an index
 * (zero_index.json). Writes its parameters as one `out/model.safetensors` (creating the directory
 * out), as `accelerate merge-weights` does; ca_load_model reads it. The checkpoint is checked first
 * as ca_load_state checks it (complete.json, each file's size and CRC-32), then every field of the
 * index (types, ranges, at most CA_MAX_DIMS dimensions, sizes that overflow); CA_ERR_NOT_FOUND or
 * CA_ERR_IO name the file and the key, and nothing is written (a directory out that this call
 * created is removed again). */
CA_API ca_status ca_merge_weights(const char *dir, const char *out);

#ifdef __cplusplus
}
#endif
#endif
