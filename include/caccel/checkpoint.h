/* caccel/checkpoint.h: model files other tools read (safetensors, as Accelerate's save_model). */
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
 * first parameter is written. Each rank reads the files itself. */
CA_API ca_status ca_load_model(ca_accelerator *acc, ca_module *model, const char *dir_or_file);

#ifdef __cplusplus
}
#endif
#endif
