/* caccel/causal_lm.h: Hugging Face decoder language models (LlamaForCausalLM, Qwen2ForCausalLM,
 * MistralForCausalLM, GPT2LMHeadModel) as modules with the state dict's parameter names, read from and written as
 * a Hugging Face checkpoint directory (config.json, generation_config.json, model.safetensors or
 * a sharded model.safetensors.index.json). docs/DECODER.md describes the families and what is
 * refused.
 *
 * Ownership: the module is an ordinary ca_module (ca_module_destroy frees it); the config passed
 * to ca_causal_lm_create is copied. Threading: as any module, one thread builds and trains one;
 * the config calls are reentrant. Errors: a status, with a message naming the file, the key or
 * tensor and what differs (ca_last_error). */
#ifndef CACCEL_CAUSAL_LM_H
#define CACCEL_CAUSAL_LM_H

#include <caccel/nn.h>
#include <caccel/status.h>

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ca_causal_lm_family {
    CA_CAUSAL_LM_LLAMA = 1,                /* model_type "llama", LlamaForCausalLM */
    CA_CAUSAL_LM_QWEN2 = 2,                /* "qwen2", Qwen2ForCausalLM: q/k/v biases */
    CA_CAUSAL_LM_MISTRAL = 3,              /* "mistral", MistralForCausalLM: sliding window */
    CA_CAUSAL_LM_GPT2 = 4,                 /* "gpt2", GPT2LMHeadModel: learned positions, LayerNorm,
                                              Conv1D weights [in, out], GELU MLP */
} ca_causal_lm_family;

#define CA_CAUSAL_LM_MAX_EOS 8
#define CA_CAUSAL_LM_MAX_TP_PLAN 24

/* The fields of the family's transformers config (4.39) that change the model, and
 * generation_config.json's. Absent keys take the family's transformers defaults. */
typedef struct ca_causal_lm_config {
    ca_causal_lm_family family;
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t num_key_value_heads;           /* divides num_attention_heads (grouped-query) */
    int64_t max_position_embeddings;
    double rms_norm_eps;                   /* the norms' eps (GPT-2: layer_norm_epsilon) */
    double rope_theta;
    char rope_scaling_type[16];            /* "" (none), "linear", "dynamic", "llama3", "yarn" (Llama only) */
    double rope_scaling_factor;            /* > 1 when rope_scaling_type is set */
    /* llama3 (Llama 3.1 and later): all three required; yarn: the original length optional (0) */
    double rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max_position_embeddings;
    double rope_beta_fast, rope_beta_slow;  /* yarn; 0: 32 and 1 */
    double rope_attention_factor;           /* yarn; 0: 0.1 ln(factor) + 1 */
    bool tie_word_embeddings;              /* lm_head uses model.embed_tokens.weight */
    bool qkv_bias;                         /* q/k/v_proj biases (Qwen2; Llama attention_bias) */
    bool o_bias;                           /* o_proj bias (Llama attention_bias) */
    int64_t sliding_window;                /* 0: none; else sequences longer are refused */
    bool use_sliding_window;               /* Qwen2's switch (the window applies only when on) */
    int64_t max_window_layers;             /* Qwen2's (kept for writing config.json back) */
    double attention_dropout;
    double initializer_range;
    int64_t pretraining_tp;                /* Llama's (kept; mathematically the same model) */
    int64_t bos_token_id, pad_token_id;    /* -1: none */
    int64_t eos_token_ids[CA_CAUSAL_LM_MAX_EOS];
    int n_eos;                             /* eos_token_id: an integer (1) or a list */
    /* generation_config.json (when the directory has one; else from config.json's ids) */
    bool has_generation_config;
    int64_t gen_bos_token_id, gen_pad_token_id;                      /* -1: none */
    int64_t gen_eos_token_ids[CA_CAUSAL_LM_MAX_EOS];
    int gen_n_eos;
    int64_t max_length;                    /* 0: not given (transformers' default 20) */
    int64_t max_new_tokens;                /* 0: not given */
    bool do_sample;
    double temperature;                    /* 1 when not given */
    int64_t top_k;                         /* 50 when not given */
    double top_p;                          /* 1 when not given */
    /* GPT-2 only (n_embd, n_layer, n_head, n_inner, n_positions fill the sizes above) */
    char activation_function[24];          /* "gelu_new" (tanh form), "gelu", "relu", ... */
    double resid_pdrop, embd_pdrop;        /* attn_pdrop is attention_dropout */
    bool scale_attn_weights;               /* scores / sqrt(head size) */
    bool scale_attn_by_inverse_layer_idx;  /* scores / (layer index + 1) */
    bool reorder_and_upcast_attn;          /* kept for config.json (the scores are f32 anyway) */
    char architectures[128];               /* comma-separated, as config.json lists them */
    /* Tensor parallelism: config.json's "base_model_tp_plan" (module pattern relative to the base model,
     * "layers.*.self_attn.q_proj", -> style "colwise", "rowwise", ...), which replaces the family's
     * transformers plan when present (n_tp_plan 0: the family's). Applied only at tp_size > 1. */
    int n_tp_plan;
    char tp_plan[CA_CAUSAL_LM_MAX_TP_PLAN][2][96];
    char config_file[512];                 /* the config.json read, named in messages; "" when none */
} ca_causal_lm_config;

/*
 * Reads dir's config.json (dir may also be the file itself; a generation_config.json beside it
 * is read when present). model_type picks the family; architectures, when given, must be that
 * family's *ForCausalLM or *Model. Every size is checked: positive, at most 1000 layers,
 * num_attention_heads dividing hidden_size into an even head size, num_key_value_heads dividing
 * num_attention_heads, each weight and the whole model within the memory there is. Refused by
 * name: an unknown model_type (CA_ERR_UNSUPPORTED), a rope_scaling type other than "linear",
 * "dynamic", "llama3" or "yarn" ('rope_scaling type "longrope" is not supported yet'; rope_scaling
 * only on Llama, as transformers 4.39 has it), a hidden_act other
 * than silu, a head_dim other than hidden_size / num_attention_heads, mlp_bias; for GPT-2 (whose
 * sizes are n_embd, n_layer, n_head, n_inner, n_positions) an activation_function caccel does not
 * compute and add_cross_attention; a key of the wrong type or out of range (CA_ERR_INVALID).
 * Messages name the file and the key.
 */
CA_API ca_status ca_causal_lm_config_load(const char *dir, ca_causal_lm_config *out);

/* A config with the family's transformers defaults (as an empty config.json gives). */
CA_API void ca_causal_lm_config_default(ca_causal_lm_family family, ca_causal_lm_config *out);

/* "llama", "qwen2", "mistral", "gpt2" (NULL for another value). */
CA_API const char *ca_causal_lm_model_type(ca_causal_lm_family family);

/*
 * Builds the family's *ForCausalLM for c: `model.embed_tokens`, `model.layers.N.{input_layernorm,
 * self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}`, `model.norm`
 * and `lm_head` (absent when tie_word_embeddings: the head uses model.embed_tokens.weight, one
 * parameter), so ca_module_param_name gives the state dict's names. GPT-2:
 * `transformer.{wte, wpe, h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}, ln_f}`
 * with Conv1D weights stored [in, out] as transformers keeps them (y = x W + b), and `lm_head`
 * only when not tied to wte. Initialisation is transformers': Linear, Conv1D and Embedding
 * weights ~ N(0, initializer_range) (GPT-2's c_proj: / sqrt(2 n_layer)), biases 0, the
 * pad_token_id row 0, norm weights 1 (LayerNorm biases 0). c is checked as ca_causal_lm_config_load checks it
 * before anything is allocated; on failure *out is NULL and nothing is left allocated.
 *
 * ca_module_forward(m, x) takes x as i64/i32 input ids [B, T] (every token attended) or
 * [B, 2, T] (row 0 the ids, row 1 the attention mask) and returns the logits [B, T, vocab]; the Llama family
 * also takes [B, 3, T], row 2 the position_ids (context parallelism: a rank's tokens of every sequence
 * with their global positions; there an all-ones mask is no mask).
 *
 * Tensor parallelism: when an accelerator with parallelism_config_tp_size above 1 prepares a Llama,
 * Qwen2 or Mistral model, the config's base_model_tp_plan (transformers 5's, or config.json's own) is
 * added to the model's plan under "model." (after any ca_tp_plan of the program): q/k/v_proj and
 * gate/up_proj colwise, o_proj and down_proj rowwise, each rank computing num_attention_heads / tp_size
 * heads; LoRA adapters on those layers are split with them. An untied lm_head whose vocab_size tp_size
 * divides is "colwise_gather_output" (transformers' model-level entry): each rank computes its vocabulary
 * slice of the logits, gathered whole on every rank. Attention dropout draws one process's masks
 * (ca_scaled_dot_product_attention_heads). A config.json plan with input_layernorm,
 * post_attention_layernorm and norm "sequence_parallel" runs the decoder sequence-parallel (the
 * residual stream on each rank's tokens; all three or none). Refused at ca_prepare, naming the key and
 * config.json: num_attention_heads, num_key_value_heads or intermediate_size that tp_size does not
 * divide, a plan style other than "colwise" / "rowwise" / "sequence_parallel" (CA_ERR_UNSUPPORTED,
 * naming the style and the pattern); GPT-2 (transformers has no plan for it; its Conv1D layers are not
 * split yet).
 */
CA_API ca_status ca_causal_lm_create(const ca_causal_lm_config *c, ca_module **out);

/* The config a causal LM module was built from, or NULL for another module. */
CA_API const ca_causal_lm_config *ca_causal_lm_module_config(const ca_module *m);

/*
 * Runs m on input_ids [B, T] (i32/i64). attention_mask [B, T] (any dtype, nonzero = a token, 0 =
 * padding; NULL: all tokens) masks padded keys on top of causal attention; position_ids [B, T]
 * (i32/i64; NULL: 0..T-1 for every row, as transformers' forward) pick the rotary angles (GPT-2:
 * the rows of wpe, each below n_positions).
 * *logits [B, T, vocab] is in the current scope. The computation is transformers' eager one:
 * per layer, x + o_proj(attention(RoPE(q), RoPE(k), v)) over RMSNorm(x), then
 * x + down_proj(silu(gate_proj(h)) * up_proj(h)) over RMSNorm(x), grouped-query heads shared as
 * repeat_kv orders them (in the attention op, without copying k and v); attention dropout in training mode. GPT-2: (wte + wpe) -> dropout, per block
 * x + attn(ln_1(x)), x + mlp(ln_2(x)) with the activation_function, ln_f, the tied head; the
 * embedding, attention and residual dropouts in training mode. A sequence longer than the sliding window
 * (Mistral; Qwen2 with use_sliding_window) is refused with CA_ERR_INVALID naming sliding_window
 * and the length. A padded query position that may attend to no key (left padding) gives
 * attention output 0 there, where transformers averages every key: logits at padded positions
 * are not meaningful in either.
 */
CA_API ca_status ca_causal_lm_forward(ca_module *m, ca_tensor *input_ids, ca_tensor *attention_mask,
                                      ca_tensor *position_ids, ca_tensor **logits);

/* transformers' causal LM loss: cross-entropy of logits[:, :-1] against labels[:, 1:] (labels
 * [B, T] i32/i64, -100 ignored), the mean over the counted tokens (a scalar; NaN when none is
 * counted, as PyTorch). NULL with an error for shapes that do not match. */
CA_API ca_tensor *ca_causal_lm_loss(ca_tensor *logits, ca_tensor *labels);

/* What ca_causal_lm_load_pretrained did. */
typedef struct ca_causal_lm_load_info {
    int files;                             /* safetensors files read (shards) */
    int64_t loaded;                        /* parameters read */
    int64_t unused;                        /* tensors of the files the model does not use */
    char first_unused[96];                 /* e.g. "model.layers.0.self_attn.rotary_emb.inv_freq" */
} ca_causal_lm_load_info;

/*
 * Loads a Hugging Face checkpoint into m (built from the same config): path is a directory
 * holding model.safetensors or model.safetensors.index.json (shards), or a .safetensors file.
 * Every parameter must be in the files with its shape and a floating-point dtype (F32, F16, BF16,
 * converted to f32), under the state dict's names or, for a file saved from the base model
 * (GPT2Model, LlamaModel), without the "transformer." / "model." prefix; other tensors (buffers
 * of older checkpoints, a tied lm_head.weight) are
 * counted as unused, as from_pretrained ignores them. Everything is checked before a parameter is
 * written: a missing tensor or a wrong shape or dtype fails with CA_ERR_INVALID naming the file,
 * the tensor and both shapes, and leaves m unchanged. info may be NULL. Called while
 * ca_init_empty_weights is on on a model built under it, the read is deferred to ca_prepare (each
 * rank its shard's bytes under ZeRO-3 / FULL_SHARD, rank 0 for all under DDP; docs/CHECKPOINTS.md).
 */
CA_API ca_status ca_causal_lm_load_pretrained(ca_module *m, const char *path,
                                              ca_causal_lm_load_info *info);

/*
 * Writes config.json (every key the family's transformers config reads, model_type and
 * architectures) and generation_config.json into directory dir, each atomically. With
 * ca_save_model(acc, m, dir, max_shard_size) for the weights, this is a directory
 * AutoModelForCausalLM.from_pretrained loads.
 */
CA_API ca_status ca_causal_lm_save_config(const ca_module *m, const char *dir);

#ifdef __cplusplus
}
#endif
#endif
