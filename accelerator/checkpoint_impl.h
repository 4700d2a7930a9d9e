/* checkpoint_impl.h: the model-file pieces of checkpoint.c that save_state/load_state (state.c)
 * build on: one writer and one validating reader of the model's safetensors files. */
#ifndef CACCEL_CHECKPOINT_IMPL_H
#define CACCEL_CHECKPOINT_IMPL_H

#include <caccel/checkpoint.h>

#include "base/file_impl.h"

#include <json-c/json.h>

/* Writes model.safetensors (or shards + index) of `model` into the existing `dir`, on this
 * process only (no collective). */
ca_status ca_ck_save_model_files(ca_module *model, const char *dir, size_t max_shard_size);

/* Opens the model files at `where` (as ca_load_model takes it) and checks every tensor against
 * `model` (names, dtypes, shapes, none missing or extra) without writing anything. */
typedef struct ca_ck_model_src ca_ck_model_src;
ca_status ca_ck_model_open(const char *where, ca_module *model, ca_ck_model_src **out);
/* Copies the checked tensors into the model's parameters (ca_ck_model_read_tp's buffers where it read). */
ca_status ca_ck_model_apply(const ca_ck_model_src *m, ca_module *model);
/* ca_ck_model_open for one safetensors file already opened (load_state maps and verifies it once):
 * the file is taken (*f is left empty, and closed on failure). */
struct ca_st_file;
struct ca_st_parts;
struct ca_accelerator;
/* tp non-NULL: a model prepared under tensor parallelism, whose split parameters the file holds whole. */
ca_status ca_ck_model_adopt(struct ca_st_file *f, ca_module *model, const struct ca_accelerator *tp,
                            ca_ck_model_src **out);
/* Under tensor parallelism (acc's prepared model, checked with ca_ck_model_adopt's tp): this rank's tp
 * slice of every tensor (replicated ones whole) read with pread into host buffers m keeps, which
 * ca_ck_model_apply then copies; sums: the bytes read are hashed for the chunks' sums
 * (ca_tp_verify_parts). No collective. ca_ck_model_file: m's file i (NULL past the last) and its sums'
 * parts (NULL: none). */
ca_status ca_ck_model_read_tp(struct ca_accelerator *acc, ca_ck_model_src *m, bool sums);
/* The same at stage 3 beside tensor parallelism: only this rank's shard's part of its tp slice of every
 * tensor (stage 3's segments), which ca_ck_model_apply_shard then copies into the shard. No collective. */
ca_status ca_ck_model_read_tp_shard(struct ca_accelerator *acc, ca_ck_model_src *m, bool sums);
struct ca_st_file *ca_ck_model_file(ca_ck_model_src *m, int i, struct ca_st_parts **parts);
void ca_ck_model_close(ca_ck_model_src *m);    /* accepts NULL */
/* A model prepared at stage 3 (ca_zero3_loads_lean): verify_shard verifies, against the sums the
 * files were opened with, only the byte ranges of the slices this rank's shard keeps (each chunk
 * once); apply_shard copies those slices from the files straight into the shard, nothing gathered. */
struct ca_accelerator;
ca_status ca_ck_model_verify_shard(struct ca_accelerator *acc, ca_ck_model_src *m);
ca_status ca_ck_model_apply_shard(struct ca_accelerator *acc, ca_ck_model_src *m);

/* Whether a load into `model` reads on rank 0 alone and broadcasts (a prepared model that every rank
 * holds whole and equal, several processes, fsdp_cpu_ram_efficient_loading true: the default), and
 * rank 0's parameters to every rank (collective; each one's version advanced). `who` begins the
 * error context ("load_model", "load_state"). */
bool ca_ck_rank0_reads(const struct ca_accelerator *acc, const ca_module *model);
ca_status ca_ck_broadcast_params(struct ca_accelerator *acc, ca_module *model, const char *who);

/* A host copy of what a load changes, taken before it changes anything, put back when it fails
 * part-way (a peer killed or stopped in the middle of rank 0's broadcasts). keep_params: the model's
 * parameters (ca_load_model); keep_state: the rank's training state, as much host memory as the
 * parameters and optimizer state tensors the rank holds (its shard's under ZeRO; ca_load_state,
 * which applies the registered objects only after every rank has everything else). A meta parameter
 * (a model not yet prepared) keeps its record only, and is made meta again. *out is set even on
 * failure (free it). restore copies every kept value back, locally (no collective), frees optimizer
 * state slots the load made, and puts the scalars, generator and loaders back; once (the meta
 * records are then the parameters'). Not thread-safe against training on the same accelerator. */
typedef struct ca_ck_kept ca_ck_kept;
ca_status ca_ck_keep_params(ca_module *model, int rank, const char *who, ca_ck_kept **out);
ca_status ca_ck_keep_state(struct ca_accelerator *acc, ca_ck_kept **out);
ca_status ca_ck_restore(struct ca_accelerator *acc, ca_ck_kept *k);
size_t ca_ck_kept_bytes(const ca_ck_kept *k);
void ca_ck_kept_free(ca_ck_kept *k);   /* accepts NULL */

/* The bytes of t where a save can write them without a copy (a contiguous tensor in host memory,
 * its device synchronised), else NULL: the caller copies it to the host. */
const void *ca_ck_host_data(ca_tensor *t);
/* x as a tensor for the safetensors writer: its bytes where they lie (ca_ck_host_data), else a fill
 * that copies it off its device when the file is made (straight into an asynchronous save's host
 * copy: one copy, no staging buffer). x must outlive the write. */
struct ca_st_tensor;
void ca_ck_st_tensor(ca_tensor *x, const char *name, struct ca_st_tensor *out);

#endif
