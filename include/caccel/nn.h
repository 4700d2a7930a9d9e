/* caccel/nn.h: modules with named parameters (PyTorch's names and default initialisation). */
#ifndef CACCEL_NN_H
#define CACCEL_NN_H

#include <caccel/ops.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A module owns its parameters (persistent tensors) and its children. Names
 * follow PyTorch: a Linear child "fc1" of the root gives "fc1.weight" and
 * "fc1.bias"; a Sequential's unnamed children are "0", "1", ...
 * Modules are created on the CPU; ca_prepare moves them to the training device.
 * Not thread-safe: one thread builds and trains a module.
 */
typedef struct ca_module ca_module;

/* forward for a custom module: returns the output (or NULL with an error). */
typedef ca_tensor *(*ca_forward_fn)(ca_module *self, ca_tensor *x, void *ctx);

/* Initialisation uses the process generator: call ca_manual_seed (or
 * ca_set_seed) first for reproducible weights. */

/* Linear(in, out): weight [out, in] and bias [out] ~ U(-1/sqrt(in), 1/sqrt(in)),
 * as torch.nn.Linear's kaiming_uniform_(a=sqrt(5)) default. */
CA_API ca_status ca_linear_create(int64_t in_features, int64_t out_features, bool bias,
                                  ca_module **out);
/* Embedding(num, dim): weight [num, dim] ~ N(0, 1). */
CA_API ca_status ca_embedding_create(int64_t num_embeddings, int64_t dim, ca_module **out);
/* LayerNorm(dim): weight = 1, bias = 0, eps (0: 1e-5). */
CA_API ca_status ca_layer_norm_create(int64_t dim, double eps, ca_module **out);
/* Parameter-free layers. */
CA_API ca_status ca_relu_create(ca_module **out);
CA_API ca_status ca_gelu_create(ca_module **out);
CA_API ca_status ca_tanh_create(ca_module **out);
CA_API ca_status ca_dropout_create(double p, ca_module **out);
CA_API ca_status ca_flatten_create(ca_module **out);
/* Sequential: applies its children in order. */
CA_API ca_status ca_sequential_create(ca_module **out);
/* Transformer layers. Embedding with torch's padding_idx (-1: none): that row
 * starts at zero and gets no gradient from lookups. */
CA_API ca_status ca_embedding_create_ex(int64_t num_embeddings, int64_t dim, int64_t padding_idx,
                                        ca_module **out);
/* RMSNorm(dim): weight = 1; eps (0: torch's default, float32's machine epsilon). */
CA_API ca_status ca_rms_norm_create(int64_t dim, double eps, ca_module **out);
/* GELU with the exact erf form (torch.nn.GELU()); ca_gelu_create is the tanh form. */
CA_API ca_status ca_gelu_erf_create(ca_module **out);
CA_API ca_status ca_silu_create(ca_module **out);
/* A module running `fn`; ctx is freed with ctx_free (may be NULL) on destroy. */
CA_API ca_status ca_module_create(const char *type, ca_forward_fn fn, void *ctx,
                                  void (*ctx_free)(void *), ca_module **out);

/* Adds `child` under `name` (NULL: the next index, "0", "1", ...). The
 * parent takes ownership of child, also on failure. */
CA_API ca_status ca_module_add(ca_module *parent, const char *name, ca_module *child);
/* Registers a persistent tensor as parameter `name`; the module takes ownership. */
CA_API ca_status ca_module_add_param(ca_module *m, const char *name, ca_tensor *param);

CA_API ca_tensor *ca_module_forward(ca_module *m, ca_tensor *x);
/* Children by name ("fc1" or "encoder.0"), or NULL. */
CA_API ca_module *ca_module_child(ca_module *m, const char *path);
/* A parameter by full name ("fc1.weight"), or NULL. */
CA_API ca_tensor *ca_module_param(ca_module *m, const char *name);
CA_API const char *ca_module_type(const ca_module *m);    /* "Linear", "Sequential", ... */

/* All parameters in registration order (depth first), with full names. The
 * arrays are owned by the module and valid until it changes or is destroyed. */
CA_API int ca_module_num_params(ca_module *m);
CA_API ca_tensor *ca_module_param_at(ca_module *m, int i);
CA_API const char *ca_module_param_name(ca_module *m, int i);
/* Number of scalar parameters (sum of numel). */
CA_API int64_t ca_module_param_count(ca_module *m);

/* Training mode (dropout active) or evaluation mode; recursive. */
CA_API void ca_module_train(ca_module *m, bool training);
CA_API bool ca_module_is_training(const ca_module *m);
/* Activation checkpointing of m (ca_checkpoint in caccel/tensor.h): while grad
 * is enabled, m's forward keeps only its input and output, and reruns during
 * backward with the same random state and autocast, trading compute for the
 * memory of its activations. Gradients are unchanged. A module with its own
 * forward (ca_module_create, Sequential, ...) is checkpointed by
 * ca_module_forward; a container without one (a BERT layer, the GPT example's
 * blocks) is checkpointed by the model's forward, which asks
 * ca_module_checkpointing. Not recursive. CA_ERR_INVALID for a NULL module.
 * Set it before training, from the thread that trains. */
CA_API ca_status ca_module_set_checkpointing(ca_module *m, bool on);
CA_API bool ca_module_checkpointing(const ca_module *m);
/* Marks the model's layers (what fsdp_activation_checkpointing marks): in
 * every stack of at least two children of one type with parameters (BERT's
 * encoder.layer, GPT's transformer.h), each child; without such a stack, each
 * child of m that has parameters. *marked (may be NULL) gets the count. */
CA_API ca_status ca_module_checkpoint_layers(ca_module *m, bool on, int *marked);
/* Moves every parameter to dev. */
CA_API ca_status ca_module_to(ca_module *m, ca_device *dev);
/* Deferred initialisation (ca_init_empty_weights in caccel/tensor.h: Accelerate's
 * init_empty_weights): a model built while it is on has parameters without storage (meta).
 * ca_module_is_meta: whether any parameter of m is still meta. ca_module_materialize (torch's
 * to_empty + the recorded init): gives each meta parameter its memory on its device and the values
 * an eager build would have had; ca_prepare does it itself (under ZeRO-3 / FULL_SHARD only the
 * process's shard is ever made, see docs/DISTRIBUTED.md). A forward of a model with a meta
 * parameter fails with CA_ERR_STATE naming the parameter. */
CA_API bool ca_module_is_meta(ca_module *m);
CA_API ca_status ca_module_materialize(ca_module *m);
/* Drops the gradients of every parameter. */
CA_API void ca_module_zero_grad(ca_module *m);

/* ----------------------------------------------------------- frozen parameters
 * torch's Module.requires_grad_(on): sets requires_grad on every parameter of
 * the subtree m (a frozen parameter gets no gradient from backward, no
 * optimizer state and no step, no DDP bucket slot, no ZeRO gradient or state
 * shard; see docs/DISTRIBUTED.md). Freezing also drops the parameters'
 * gradients. Freeze before ca_prepare: a prepared model refuses a changed
 * trainable set at its next ca_backward (as torch's DDP does). CA_ERR_INVALID
 * for a NULL module. Not thread-safe against a running forward/backward. */
CA_API ca_status ca_module_requires_grad(ca_module *m, bool on);
/* PEFT's get_nb_trainable_parameters: scalar counts of the parameters with
 * requires_grad and of all parameters (either pointer may be NULL). */
CA_API void ca_module_get_nb_trainable_parameters(ca_module *m, int64_t *trainable, int64_t *all);
CA_API int64_t ca_module_num_trainable_params(ca_module *m);
/* Bytes of the trainable parameters in their own dtypes. */
CA_API int64_t ca_module_trainable_bytes(ca_module *m);
/* "trainable params: 1,843,200 || all params: 775,873,280 || trainable%: 0.2376"
 * (PEFT's print_trainable_parameters line) into buf (truncated to size), and
 * printed to stdout. */
CA_API void ca_module_trainable_summary(ca_module *m, char *buf, size_t size);
CA_API void ca_module_print_trainable_parameters(ca_module *m);
/* ------------------------------------------------------------------ tensor-parallel plan
 * Hugging Face's base_model_tp_plan for the program's own modules: the Linear and Embedding children of m
 * whose names (relative to m, "fc1", "h.0.attn.c_attn") match `pattern` are split over the device mesh's tp
 * dimension when an accelerator with parallelism_config_tp_size above 1 prepares m (docs/DISTRIBUTED.md):
 *   "colwise": the weight split on the output features (and the bias with it); the output stays split
 *              over the tp ranks; backward all-reduces the input's gradient over tp. An output layer
 *              (lm_head) so split gives each rank its slice of the vocabulary's logits: ca_tp_cross_entropy.
 *   "colwise_gather_output": split as "colwise", and the output's slices all-gathered along the last
 *              dimension over tp, so that every rank gets the whole output (transformers' plan for a
 *              decoder's lm_head: each rank computes its vocabulary's logits); backward keeps the rank's
 *              slice of the gradient.
 *   "sequence_parallel": on a LayerNorm or RMSNorm (torch's SequenceParallel, Megatron's
 *              --sequence-parallel): the model runs sequence-parallel. The norm stays whole and runs on this
 *              rank's tokens [B, T/tp, ...] (its weight's gradient summed over tp); every colwise layer
 *              all-gathers its input along dimension 1 (the sequence) and every rowwise layer
 *              reduce-scatters its output along it instead of the all-reduce, so between them the
 *              activations are this rank's tokens. The program splits the whole activations into its
 *              tokens with ca_tp_sequence_split and gathers them with ca_tp_sequence_gather, and drops
 *              on them with ca_tp_sequence_dropout. A LoRA adapter's r-wide product follows its base
 *              (all-gathered before a colwise one's lora_B, reduce-scattered after a rowwise one's
 *              lora_A). A "colwise_gather_output" layer takes whole tokens (after ca_tp_sequence_gather)
 *              and gives whole ones.
 *   "rowwise": the weight split on the input features, whose input is the split output of a colwise
 *              layer; forward all-reduces the output over tp, then adds the (whole) bias.
 *              On an Embedding (torch's RowwiseParallel on nn.Embedding, Megatron's VocabParallelEmbedding):
 *              its rows, the vocabulary, split (the vocabulary size must be a multiple of tp_size:
 *              CA_ERR_CONFIG naming both at prepare; no padding_idx); each rank looks up the ids in its
 *              rows, zeros for the others, and forward all-reduces the sum over tp; backward reaches its
 *              own rows only. ca_embedding_attend makes it a tied output layer.
 * A Linear wrapped by a LoRA adapter (ca_lora_apply) is split with its adapter (lora_B by the output rows
 * of a colwise layer, lora_A by the input columns of a rowwise one). A Llama, Qwen2 or Mistral model of
 * caccel/causal_lm.h adds its config's base_model_tp_plan at prepare, after the program's entries.
 * In a pattern "*" stands for one dotted component ("layers.*.mlp.up_proj"). Entries add up; the first
 * that matches a name decides. With tp_size 1 the plan does nothing. Errors: CA_ERR_INVALID for a NULL
 * or empty argument, CA_ERR_UNSUPPORTED naming the style for Hugging Face's other styles
 * ("colwise_rep", "local_colwise", "sequence_parallel", "gather", ...: not yet), CA_ERR_NOMEM.
 * Not thread-safe: call before ca_prepare from the thread that builds m. */
typedef enum ca_tp_style {
    CA_TP_COLWISE = 1, CA_TP_ROWWISE = 2, CA_TP_COLWISE_GATHER = 3, CA_TP_SEQUENCE = 4
} ca_tp_style;
CA_API ca_status ca_tp_plan(ca_module *m, const char *pattern, const char *style);
/* ca_tp_plan for a Linear whose split dimension stacks `parts` equal blocks (a fused q, k, v projection
 * such as GPT-2's c_attn: 3, colwise): each block is split alike, so that tp rank r holds the q, k and v
 * rows of the same heads. parts 1 is ca_tp_plan. CA_ERR_INVALID for parts < 1. */
CA_API ca_status ca_tp_plan_fused(ca_module *m, const char *pattern, const char *style, int parts);
/* The plan's style for the module named `name` (relative to m), 0 when no entry matches; *parts (may be
 * NULL) gets the entry's block count. */
CA_API int ca_tp_plan_match(const ca_module *m, const char *name, int *parts);
/* The logits of x [..., D] against an Embedding's rows, x weight^T -> [..., V]: an output layer tied to the
 * embedding (GPT-2's). When the plan split the embedding rowwise, this rank's vocabulary slice
 * [..., V / tp_size] (x's gradient all-reduced over tp): pass it to ca_tp_cross_entropy with the same module.
 * NULL with CA_ERR_INVALID for a NULL embedding; a NULL x passes through (the error that made it stays
 * the last); an op (ops.h) otherwise. */
CA_API ca_tensor *ca_embedding_attend(ca_module *embedding, ca_tensor *x);
/* Which heads of the attention the output of `proj` (the colwise layer that gives the heads: a q
 * projection, a fused q, k, v) holds when it gives local_heads of them: under tensor parallelism tp rank r's
 * *head0 = r local_heads of *heads = tp local_heads, else 0 of local_heads. For
 * ca_scaled_dot_product_attention_heads, so that attention dropout at tp draws one process's masks.
 * Local, no communication. CA_ERR_INVALID for a NULL argument or local_heads < 1. */
CA_API ca_status ca_tp_heads(ca_module *proj, int64_t local_heads, int64_t *head0, int64_t *heads);
/* Sequence parallelism (a plan with "sequence_parallel" entries, prepared at tp_size > 1); m is any module
 * the plan split. ca_tp_sequence_split: x [B, T, ...], the same on every tp rank, -> this rank's tokens
 * [B, T/tp, ...] (backward all-gathers the gradient). ca_tp_sequence_gather: this rank's tokens -> the whole
 * [B, T, ...] on every rank (all-gathered; backward keeps this rank's tokens of the gradient, which must be
 * the same on every rank: a tied head's or a colwise layer's input sums its own over tp). x itself when m
 * does not run sequence-parallel. Collective over tp. NULL with CA_ERR_INVALID for a NULL module or a T
 * (dimension 1) that tp_size does not divide; a failed collective's error. */
CA_API ca_tensor *ca_tp_sequence_split(ca_module *m, ca_tensor *x);
CA_API ca_tensor *ca_tp_sequence_gather(ca_module *m, ca_tensor *x);
/* ca_dropout of this rank's tokens x [B, T/tp, ...] under sequence parallelism (m as above): they drop as
 * the same tokens of one process's dropout of the whole [B, T, ...] (ca_dropout_part), and the generator
 * advances as for the whole, so a dropout on the residual stream gives one process's masks on every tp
 * rank. ca_dropout(x, p, training) when m does not run sequence-parallel. Local (no communication).
 * NULL with CA_ERR_INVALID for a NULL module or an x of fewer than 2 dimensions; ca_dropout_part's
 * errors. */
CA_API ca_tensor *ca_tp_sequence_dropout(ca_module *m, ca_tensor *x, double p, bool training);
/* ca_cross_entropy (mean over the labels that are not -100) of the logits that output layer `head` gave.
 * When the plan split head over tp (a colwise Linear, or a rowwise Embedding through ca_embedding_attend),
 * the logits [..., V / tp_size] are this rank's vocabulary columns and never whole on any rank: Megatron's
 * vocab_parallel_cross_entropy, with all-reduces over tp of the rows' maxima, of their sums of exp and of
 * the labels' logits (from the rank holding each label's column); backward gives each rank the gradient of
 * its own columns. The labels are read on the host (a GPU waits for them). Every tp rank must call it with
 * the same labels (it is collective) and gets the whole loss. Otherwise ca_cross_entropy. Between
 * ca_maybe_context_parallel and ca_context_parallel_end (context parallelism: each cp rank holds part of
 * every sequence) the mean is over the labels of all cp ranks (the sum and the count all-reduced over cp):
 * every cp rank gets the loss one process gets on the whole sequence (collective over cp). CA_ERR_INVALID
 * for logits that are not head's output (their columns or rows against the labels, named), or a label
 * outside the vocabulary. */
CA_API ca_tensor *ca_tp_cross_entropy(const ca_module *head, ca_tensor *logits, ca_tensor *labels);

/* Frees the module, its children and parameters. Accepts NULL. */
CA_API void ca_module_destroy(ca_module *m);
/* Prints the module tree with parameter shapes (like print(model)). */
CA_API void ca_module_print(ca_module *m);

/* ------------------------------------------------------------------ rotary position tables */

/* rope_scaling's type, as a Hugging Face config names it. */
typedef enum ca_rope_scaling_type {
    CA_ROPE_SCALING_NONE = 0,  /* no rope_scaling (or rope_type "default") */
    CA_ROPE_SCALING_LINEAR,    /* positions divided by factor */
    CA_ROPE_SCALING_DYNAMIC,   /* NTK: the base grows once positions pass max_position_embeddings */
    CA_ROPE_SCALING_LLAMA3,    /* Llama 3.1: long wavelengths divided by factor, a smooth band between */
    CA_ROPE_SCALING_YARN,      /* YaRN: ramp between interpolation and extrapolation, cos/sin scaled */
} ca_rope_scaling_type;

/* What the tables need from a model's config. Zero fields take the default named. */
typedef struct ca_rope_config {
    int64_t head_dim;          /* D, required */
    int64_t rotary_dim;        /* rot: even, <= head_dim (int(head_dim * partial_rotary_factor)); 0: head_dim */
    double theta;              /* rope_theta, the base; 0: 10000 */
    ca_rope_scaling_type type;
    double factor;             /* linear, dynamic, llama3, yarn: > 0 (yarn: transformers >= 4.48 takes
                                * max_position_embeddings / original_max_position_embeddings when the config
                                * names the latter: pass that) */
    int64_t max_position_embeddings;           /* dynamic (and yarn without the original) */
    int64_t original_max_position_embeddings;  /* llama3 (required), yarn (0: max_position_embeddings) */
    double low_freq_factor, high_freq_factor;  /* llama3: 0 < low < high */
    double beta_fast, beta_slow;               /* yarn; 0: 32 and 1 */
    double attention_factor;   /* yarn: the cos/sin scale; 0: 0.1 ln(factor) + 1 (1 when factor <= 1), or the
                                * mscale ratio when both mscale and mscale_all_dim are set */
    double mscale, mscale_all_dim;             /* yarn (DeepSeek's); 0: unset */
} ca_rope_config;

/* rope_scaling's "type" (or "rope_type") by name into *out: NULL, "", "default" and "none" are
 * CA_ROPE_SCALING_NONE; others than linear, dynamic, llama3 and yarn fail with CA_ERR_INVALID,
 * 'rope_scaling type "longrope" is not supported (linear, dynamic, llama3, yarn)'. */
CA_API ca_status ca_rope_scaling_parse(const char *name, ca_rope_scaling_type *out);
/* The name of a type ("default" for none). */
CA_API const char *ca_rope_scaling_name(ca_rope_scaling_type t);

/* The rot/2 inverse frequencies, computed in f32 operation for operation as transformers does
 * (LlamaRotaryEmbedding and its linear/dynamic variants in 4.39; modeling_rope_utils' llama3 and
 * yarn), into inv_freq, and the cos/sin scale (yarn's attention factor, else 1) into *scale (may be
 * NULL). seq_len (the largest position + 1) matters only to dynamic. CA_ERR_INVALID naming the
 * field for a config out of range. */
CA_API ca_status ca_rope_inv_freq(const ca_rope_config *c, int64_t seq_len, float *inv_freq, float *scale);

/* The cos and sin tables ca_rope takes, on dev: positions NULL: 0 .. t-1, tables [t, rot/2];
 * else positions [batch, t] (host memory, row-major), tables [batch, t, rot/2] (per-batch
 * positions, as position_ids). angle = f32(inv_freq[i] * f32(position)) (linear: the position
 * divided by factor first); cos/sin of the f32 angle, times the scale. New tensors in the current
 * scope (ca_tensor_keep to hold them beyond it); *cos and *sin are set to NULL first and both set
 * only on success. */
CA_API ca_status ca_rope_tables(ca_device *dev, const ca_rope_config *c, const int64_t *positions, int64_t batch,
                                int64_t t, ca_tensor **cos, ca_tensor **sin);

#ifdef __cplusplus
}
#endif
#endif
