/* caccel/lora.h: LoRA adapters on a model's Linear layers, as PEFT's LoraConfig and
 * get_peft_model make them, saved and loaded as PEFT's adapter files (docs/LORA.md).
 *
 * Ownership: the adapter's parameters belong to the model (ca_module_destroy frees them); the
 * config is copied by ca_lora_apply, the caller keeps its own. Threading: as any module, one thread
 * applies, trains, merges, saves and loads. Errors: a status, with a message (ca_last_error) that
 * names the file, the key or tensor, or the module involved. */
#ifndef CACCEL_LORA_H
#define CACCEL_LORA_H

#include <caccel/nn.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * PEFT's LoraConfig (peft 0.10), the fields caccel implements. Targets are matched against each
 * module's full name ("encoder.layer.0.attention.self.query") by PEFT's rules
 * (check_target_module_exists): with target_modules, a name matches when it equals one of the
 * names or ends with "." + one of them; with target_regex, when the regular expression matches the
 * whole name (Python's re.fullmatch, here through PCRE2, whose syntax is Python's for everything
 * but a few rare constructs). Exactly one of the two is set.
 */
typedef struct ca_lora_config {
    int64_t r;                              /* rank, > 0 (PEFT's default 8) */
    double lora_alpha;                      /* scaling = lora_alpha / r (PEFT's default 8) */
    double lora_dropout;                    /* dropout on the adapter's input, [0, 1) */
    const char *const *target_modules;      /* n_target_modules names, or NULL */
    int n_target_modules;
    const char *target_regex;               /* or a regular expression, or NULL */
    const char *bias;                       /* NULL or "none": the only one implemented */
    bool fan_in_fan_out;                    /* weights stored [in, out] (GPT-2's Conv1D) */
    bool init_lora_weights;                 /* true: PEFT's (A kaiming-uniform, B zero); false: B random too */
    bool use_rslora;                        /* scaling = lora_alpha / sqrt(r) */
    const char *task_type;                  /* PEFT's task_type ("CAUSAL_LM", "SEQ_CLS"), or NULL */
    const char *base_model_name_or_path;    /* written to adapter_config.json, or NULL */
} ca_lora_config;

/* PEFT's defaults: r 8, lora_alpha 8, no dropout, bias "none", init_lora_weights true; no targets. */
CA_API void ca_lora_config_init(ca_lora_config *cfg);

/* Whether the module called `name` is a target of cfg (PEFT's rules above). CA_ERR_INVALID for a
 * config without targets or with both forms, or a regular expression that does not compile. */
CA_API ca_status ca_lora_target_matches(const ca_lora_config *cfg, const char *name, bool *match);

/*
 * Wraps every targeted module of `model` in place. A target must be a Linear (weight [out, in],
 * y = x W^T + b) or a Conv1D (weight [in, out], GPT-2's layout); as PEFT does, fan_in_fan_out is
 * taken from the layer's layout, with a warning when cfg says otherwise. A wrapped module keeps
 * its parameters and their names ("<name>.weight", "<name>.bias": checkpoints of the base are
 * unchanged) and gains "<name>.lora_A.weight" [r, in] and "<name>.lora_B.weight" [out, r] on the
 * base weight's device. Its forward is PEFT's: base(x) + lora_B(lora_A(dropout(x))) * scaling.
 * Every other parameter of the model gets requires_grad false (PEFT's mark_only_lora_as_trainable
 * with bias "none"). Initialisation uses the process generator (ca_manual_seed first for
 * reproducible adapters). *n_wrapped (may be NULL) gets the count.
 * Refused (CA_ERR_INVALID, nothing changed): a bad config (r <= 0, dropout outside [0, 1), a bias
 * other than "none", no targets or both forms, a regex that does not compile), a target that is
 * not a Linear or Conv1D, a target that already has an adapter, and no target found in the model.
 */
CA_API ca_status ca_lora_apply(ca_module *model, const ca_lora_config *cfg, int *n_wrapped);

/* Adds scaling * B A to each wrapped weight (transposed for fan_in_fan_out) and marks the layer
 * merged, so its forward is the base layer's alone; ca_lora_unmerge subtracts it again. Layers
 * already merged (or not) are left as they are. CA_ERR_INVALID for a model without adapters. */
CA_API ca_status ca_lora_merge(ca_module *model);
CA_API ca_status ca_lora_unmerge(ca_module *model);
/* PEFT's merge_and_unload: merges, then removes the adapters, leaving plain layers with the
 * model's own parameter names. */
CA_API ca_status ca_lora_merge_and_unload(ca_module *model);

/*
 * PEFT's save_pretrained: writes `dir` (created if missing) with adapter_model.safetensors
 * (only the adapter tensors, named "base_model.model.<name>.lora_A.weight" /
 * ".lora_B.weight" as peft 0.10 names them) and adapter_config.json with the keys peft 0.10
 * writes. Each file is written atomically (name.tmp, fsync, rename). A merged adapter is saved
 * as its A and B (unchanged by merging).
 */
CA_API ca_status ca_lora_save(ca_module *model, const char *dir);

/*
 * PEFT's PeftModel.from_pretrained: reads an adapter directory as PEFT writes it. A model without
 * adapters is first wrapped with the config of adapter_config.json; a model with adapters must
 * have the file's r, lora_alpha and use_rslora. Refused (CA_ERR_INVALID or CA_ERR_UNSUPPORTED, or
 * CA_ERR_NOT_FOUND for a missing file), with the file and the key or tensor named: a peft_type
 * other than "LORA", a config key of the wrong type or range, options caccel does not implement
 * (use_dora, bias other than "none", modules_to_save, layers_to_transform, rank_pattern,
 * alpha_pattern), a missing tensor, a tensor of another shape or of no wrapped layer. Everything
 * is checked before the model is changed: a failed load leaves it as it was.
 */
CA_API ca_status ca_lora_load(ca_module *model, const char *dir);

/*
 * `caccel merge-weights --adapter`: PEFT's merge_and_unload + save_pretrained on files, for any
 * architecture. Reads base_dir/model.safetensors and the adapter directory, adds
 * scaling * B A to the base tensor "<name>.weight" of each "<name>.lora_A.weight" (the adapter's
 * fan_in_fan_out says the base weight is [in, out]), in f32, written back in the base tensor's
 * dtype (F32, F16, BF16); every other tensor is copied unchanged. Writes out_dir/model.safetensors
 * and a copy of base_dir/config.json when there is one (out_dir is created if missing; each file
 * atomically). Every tensor is checked (present, shapes agreeing) before anything is written.
 */
CA_API ca_status ca_lora_merge_files(const char *adapter_dir, const char *base_dir, const char *out_dir);

#ifdef __cplusplus
}
#endif
#endif
