/* A Hugging Face decoder checkpoint's config.json (LlamaConfig, Qwen2Config, MistralConfig of
 * transformers 4.39) and generation_config.json, read into ca_causal_lm_config and checked. */
#include "nn/nn_impl.h"
#include "core/json_impl.h"
#include "base/file_impl.h"

#include <caccel/causal_lm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* The deepest Transformers published have about 1,000 layers (as BERT's reader). */
#define MAX_LAYERS 1000

static const struct {
    ca_causal_lm_family family;
    const char *model_type, *arch_prefix;
} families[] = {
    {CA_CAUSAL_LM_LLAMA, "llama", "Llama"},
    {CA_CAUSAL_LM_QWEN2, "qwen2", "Qwen2"},
    {CA_CAUSAL_LM_MISTRAL, "mistral", "Mistral"},
    {CA_CAUSAL_LM_GPT2, "gpt2", "GPT2"},
};

/* GPT-2's activations transformers' ACT2FN maps that caccel computes the same way. */
static const char *const gpt2_acts[] = {"gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu", "relu",
                                        "silu", "swish", "tanh"};

/* GPT2Config's defaults (gpt2, the 124M model). */
static void gpt2_defaults(ca_causal_lm_config *c) {
    c->vocab_size = 50257;
    c->hidden_size = 768;
    c->num_hidden_layers = 12;
    c->num_attention_heads = c->num_key_value_heads = 12;
    c->intermediate_size = 4 * 768;
    c->max_position_embeddings = 1024;
    c->rms_norm_eps = 1e-5;
    c->sliding_window = 0;
    c->tie_word_embeddings = true;
    c->qkv_bias = c->o_bias = true;
    snprintf(c->activation_function, sizeof c->activation_function, "gelu_new");
    c->resid_pdrop = c->embd_pdrop = c->attention_dropout = 0.1;
    c->scale_attn_weights = true;
    c->bos_token_id = c->eos_token_ids[0] = c->gen_bos_token_id = c->gen_eos_token_ids[0] = 50256;
}

const char *ca_causal_lm_model_type(ca_causal_lm_family family) {
    for (size_t i = 0; i < sizeof families / sizeof *families; i++)
        if (families[i].family == family) return families[i].model_type;
    return NULL;
}

void ca_causal_lm_config_default(ca_causal_lm_family family, ca_causal_lm_config *c) {
    memset(c, 0, sizeof *c);
    c->family = family;
    c->vocab_size = family == CA_CAUSAL_LM_QWEN2 ? 151936 : 32000;
    c->hidden_size = 4096;
    c->intermediate_size = family == CA_CAUSAL_LM_LLAMA ? 11008 : family == CA_CAUSAL_LM_QWEN2 ? 22016 : 14336;
    c->num_hidden_layers = 32;
    c->num_attention_heads = 32;
    c->num_key_value_heads = family == CA_CAUSAL_LM_MISTRAL ? 8 : 32;
    c->max_position_embeddings = family == CA_CAUSAL_LM_LLAMA ? 2048 : family == CA_CAUSAL_LM_QWEN2 ? 32768 : 131072;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->rope_scaling_factor = 1.0;
    c->qkv_bias = family == CA_CAUSAL_LM_QWEN2;
    c->sliding_window = family == CA_CAUSAL_LM_LLAMA ? 0 : 4096;
    c->max_window_layers = family == CA_CAUSAL_LM_QWEN2 ? 28 : 0;
    c->initializer_range = 0.02;
    c->pretraining_tp = 1;
    /* Llama's and Mistral's configs default bos 1 and eos 2; Qwen2's leaves them unset */
    bool ids = family != CA_CAUSAL_LM_QWEN2;
    c->bos_token_id = ids ? 1 : -1;
    c->pad_token_id = -1;
    c->n_eos = ids ? 1 : 0;
    c->eos_token_ids[0] = 2;
    c->gen_bos_token_id = c->bos_token_id;
    c->gen_pad_token_id = -1;
    c->gen_n_eos = c->n_eos;
    c->gen_eos_token_ids[0] = 2;
    c->temperature = 1.0;
    c->top_k = 50;
    c->top_p = 1.0;
    if (family == CA_CAUSAL_LM_GPT2) gpt2_defaults(c);
}

static json_object *get(json_object *o, const char *key) {
    json_object *v = NULL;
    return json_object_object_get_ex(o, key, &v) ? v : NULL;
}

static bool is_null(json_object *o) { return !o || json_object_is_type(o, json_type_null); }

/* Integer key: absent (or null when null_ok) keeps *v; present must be an integer in [lo, 2^40]. */
static ca_status get_int(json_object *root, const char *key, int64_t lo, int64_t *v, const char *path) {
    json_object *o = get(root, key);
    if (is_null(o)) return CA_OK;
    if (!json_object_is_type(o, json_type_int) || json_object_get_int64(o) < lo ||
        json_object_get_int64(o) > ((int64_t)1 << 40))
        return ca_error(CA_ERR_INVALID, "config '%s': \"%s\" is %s; an integer in [%lld, 2^40] is needed",
                        path, key, json_object_to_json_string(o), (long long)lo);
    *v = json_object_get_int64(o);
    return CA_OK;
}

static ca_status get_real(json_object *root, const char *key, double lo, double hi, double *v, const char *path) {
    json_object *o = get(root, key);
    if (is_null(o)) return CA_OK;
    double d = json_object_get_double(o);
    if (!(json_object_is_type(o, json_type_double) || json_object_is_type(o, json_type_int)) || !(d >= lo && d <= hi))
        return ca_error(CA_ERR_INVALID, "config '%s': \"%s\" is %s; a number in [%g, %g] is needed", path, key,
                        json_object_to_json_string(o), lo, hi);
    *v = d;
    return CA_OK;
}

static ca_status get_bool(json_object *root, const char *key, bool *v, const char *path) {
    json_object *o = get(root, key);
    if (is_null(o)) return CA_OK;
    if (!json_object_is_type(o, json_type_boolean))
        return ca_error(CA_ERR_INVALID, "config '%s': \"%s\" is %s; true or false is needed", path, key,
                        json_object_to_json_string(o));
    *v = json_object_get_boolean(o);
    return CA_OK;
}

/* A token id key: null (-1), an integer, or for eos a list of integers. */
static ca_status get_ids(json_object *root, const char *key, int64_t *ids, int *n, int cap, const char *path) {
    json_object *o = get(root, key);
    if (!o) return CA_OK;
    *n = 0;
    if (json_object_is_type(o, json_type_null)) {
        if (cap == 1) ids[0] = -1;
        return CA_OK;
    }
    bool list = json_object_is_type(o, json_type_array) && cap > 1;
    size_t len = list ? json_object_array_length(o) : 1;
    for (size_t i = 0; i < len; i++) {
        json_object *e = list ? json_object_array_get_idx(o, i) : o;
        if (!json_object_is_type(e, json_type_int) || json_object_get_int64(e) < 0 || i >= (size_t)cap)
            return ca_error(CA_ERR_INVALID, "config '%s': \"%s\" is %s; a token id (an integer >= 0)%s is "
                            "needed", path, key, json_object_to_json_string(o),
                            cap > 1 ? " or a list of at most 8" : "");
        ids[(*n)++] = json_object_get_int64(e);
    }
    return CA_OK;
}

static ca_status get_id(json_object *root, const char *key, int64_t *id, const char *path) {
    int n = 1;
    return get_ids(root, key, id, &n, 1, path);
}

static ca_status check_identity(json_object *root, ca_causal_lm_config *c, const char *path) {
    json_object *mt = get(root, "model_type");
    const char *type = mt && json_object_is_type(mt, json_type_string) ? json_object_get_string(mt) : NULL;
    size_t f = 0;
    while (f < sizeof families / sizeof *families && !(type && !strcmp(type, families[f].model_type))) f++;
    if (f == sizeof families / sizeof *families)
        return ca_error(CA_ERR_UNSUPPORTED, "config '%s': \"model_type\" is %s; supported: \"llama\", \"qwen2\", "
                        "\"mistral\", \"gpt2\"", path, mt ? json_object_to_json_string(mt) : "missing");
    ca_causal_lm_config_default(families[f].family, c);
    json_object *arch = get(root, "architectures");
    if (!is_null(arch) && !json_object_is_type(arch, json_type_array))
        return ca_error(CA_ERR_INVALID, "config '%s': \"architectures\" is not a list", path);
    size_t n = is_null(arch) ? 0 : json_object_array_length(arch);
    for (size_t i = 0; i < n; i++) {
        const char *a = json_object_get_string(json_object_array_get_idx(arch, i));
        const char *p = families[f].arch_prefix;
        if (!a || strncmp(a, p, strlen(p)) != 0)
            return ca_error(CA_ERR_UNSUPPORTED, "config '%s': \"architectures\"[%zu] is '%s'; model_type \"%s\" "
                            "needs a %s* class (%sForCausalLM)", path, i, a ? a : "?", type, p, p);
        size_t used = strlen(c->architectures);
        snprintf(c->architectures + used, sizeof c->architectures - used, "%s%s", i ? "," : "", a);
    }
    return CA_OK;
}

/* llama3's and yarn's own keys (modeling_rope_utils' names); llama3 needs all three. */
static ca_status read_rope_extras(json_object *rs, ca_causal_lm_config *c, const char *path) {
    bool llama3 = !strcmp(c->rope_scaling_type, "llama3");
    static const char *const need[] = {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
    for (int i = 0; llama3 && i < 3; i++)
        if (is_null(get(rs, need[i])))
            return ca_error(CA_ERR_INVALID, "config '%s': rope_scaling type \"llama3\" needs \"%s\"", path, need[i]);
    ca_status s = get_real(rs, "low_freq_factor", 1e-9, 1e9, &c->rope_low_freq_factor, path);
    if (s == CA_OK) s = get_real(rs, "high_freq_factor", 1e-9, 1e9, &c->rope_high_freq_factor, path);
    if (s == CA_OK) s = get_int(rs, "original_max_position_embeddings", 1, &c->rope_original_max_position_embeddings, path);
    if (s == CA_OK) s = get_real(rs, "beta_fast", 1e-9, 1e9, &c->rope_beta_fast, path);
    if (s == CA_OK) s = get_real(rs, "beta_slow", 1e-9, 1e9, &c->rope_beta_slow, path);
    if (s == CA_OK) s = get_real(rs, "attention_factor", 1e-9, 1e9, &c->rope_attention_factor, path);
    if (s == CA_OK && llama3 && !(c->rope_low_freq_factor < c->rope_high_freq_factor))
        return ca_error(CA_ERR_INVALID, "config '%s': rope_scaling \"low_freq_factor\" %g is not below "
                        "\"high_freq_factor\" %g", path, c->rope_low_freq_factor, c->rope_high_freq_factor);
    return s;
}

/* rope_scaling: null, or {"type" or "rope_type": "linear" | "dynamic" | "llama3" | "yarn",
 * "factor": > 1, and llama3's and yarn's keys} (Llama only, as transformers 4.39 has it). */
static ca_status read_rope_scaling(json_object *root, ca_causal_lm_config *c, const char *path) {
    json_object *rs = get(root, "rope_scaling");
    if (is_null(rs)) return CA_OK;
    if (!json_object_is_type(rs, json_type_object))
        return ca_error(CA_ERR_INVALID, "config '%s': \"rope_scaling\" is %s; null or an object is needed", path,
                        json_object_to_json_string(rs));
    json_object *t = get(rs, "type");
    if (!t) t = get(rs, "rope_type");
    const char *type = t && json_object_is_type(t, json_type_string) ? json_object_get_string(t) : NULL;
    ca_rope_scaling_type known;
    if (!type || ca_rope_scaling_parse(type, &known) != CA_OK || known == CA_ROPE_SCALING_NONE ||
        c->family != CA_CAUSAL_LM_LLAMA)
        return ca_error(CA_ERR_INVALID, "config '%s': rope_scaling type %s is not supported yet%s", path,
                        t ? json_object_to_json_string(t) : "(missing)",
                        c->family == CA_CAUSAL_LM_LLAMA ? " (\"linear\", \"dynamic\", \"llama3\" and \"yarn\" are)"
                                                        : " (this family has no rope_scaling in transformers 4.39)");
    snprintf(c->rope_scaling_type, sizeof c->rope_scaling_type, "%s", type);
    json_object *f = get(rs, "factor");
    bool number = f && (json_object_is_type(f, json_type_double) || json_object_is_type(f, json_type_int));
    c->rope_scaling_factor = number ? json_object_get_double(f) : 0;
    if (!(c->rope_scaling_factor > 1 && c->rope_scaling_factor <= 1e9))
        return ca_error(CA_ERR_INVALID, "config '%s': rope_scaling \"factor\" is %s; a number > 1 is needed", path,
                        f ? json_object_to_json_string(f) : "missing");
    return read_rope_extras(rs, c, path);
}

/* Keys that change the model in ways this implementation does not follow. */
static ca_status read_refusals(json_object *root, const ca_causal_lm_config *c, const char *path) {
    json_object *act = get(root, "hidden_act");
    if (act && (!json_object_is_type(act, json_type_string) ||
                (strcmp(json_object_get_string(act), "silu") && strcmp(json_object_get_string(act), "swish"))))
        return ca_error(CA_ERR_UNSUPPORTED, "config '%s': \"hidden_act\" is %s; only \"silu\" (SwiGLU) is "
                        "supported", path, json_object_to_json_string(act));
    bool mlp_bias = false;
    ca_status s = get_bool(root, "mlp_bias", &mlp_bias, path);
    if (s == CA_OK && mlp_bias)
        s = ca_error(CA_ERR_UNSUPPORTED, "config '%s': \"mlp_bias\" true is not supported", path);
    int64_t head_dim = 0;
    if (s == CA_OK) s = get_int(root, "head_dim", 1, &head_dim, path);
    if (s == CA_OK && head_dim && c->num_attention_heads > 0 && head_dim * c->num_attention_heads != c->hidden_size)
        s = ca_error(CA_ERR_UNSUPPORTED, "config '%s': \"head_dim\" %lld is not \"hidden_size\" / "
                     "\"num_attention_heads\" (%lld / %lld); a separate head size is not supported", path,
                     (long long)head_dim, (long long)c->hidden_size, (long long)c->num_attention_heads);
    return s;
}

static ca_status read_sizes(json_object *root, ca_causal_lm_config *c, const char *path) {
    ca_status s = get_int(root, "vocab_size", 1, &c->vocab_size, path);
    if (s == CA_OK) s = get_int(root, "hidden_size", 1, &c->hidden_size, path);
    if (s == CA_OK) s = get_int(root, "intermediate_size", 1, &c->intermediate_size, path);
    if (s == CA_OK) s = get_int(root, "num_hidden_layers", 1, &c->num_hidden_layers, path);
    if (s == CA_OK) s = get_int(root, "num_attention_heads", 1, &c->num_attention_heads, path);
    c->num_key_value_heads = c->num_attention_heads;          /* transformers: None means as many */
    if (s == CA_OK) s = get_int(root, "num_key_value_heads", 1, &c->num_key_value_heads, path);
    if (s == CA_OK) s = get_int(root, "max_position_embeddings", 1, &c->max_position_embeddings, path);
    if (s == CA_OK) s = get_int(root, "pretraining_tp", 1, &c->pretraining_tp, path);
    if (s == CA_OK) s = get_int(root, "max_window_layers", 0, &c->max_window_layers, path);
    /* "sliding_window": null (Mistral v0.2's) is no window; json-c gives NULL for it, as for no key */
    if (s == CA_OK && json_object_object_get_ex(root, "sliding_window", NULL) && !get(root, "sliding_window"))
        c->sliding_window = 0;
    if (s == CA_OK) s = get_int(root, "sliding_window", 1, &c->sliding_window, path);
    return s;
}

static ca_status read_gpt2_act(json_object *root, ca_causal_lm_config *c, const char *path) {
    json_object *o = get(root, "activation_function");
    if (!o) return CA_OK;
    const char *a = json_object_is_type(o, json_type_string) ? json_object_get_string(o) : NULL;
    for (size_t i = 0; a && i < sizeof gpt2_acts / sizeof *gpt2_acts; i++)
        if (!strcmp(a, gpt2_acts[i])) {
            snprintf(c->activation_function, sizeof c->activation_function, "%s", a);
            return CA_OK;
        }
    return ca_error(CA_ERR_UNSUPPORTED, "config '%s': \"activation_function\" is %s; supported: gelu_new, "
                    "gelu_pytorch_tanh, gelu_fast, gelu, relu, silu, swish, tanh", path, json_object_to_json_string(o));
}

/* GPT2Config: n_* names for the sizes, n_inner null meaning 4 * n_embd. */
static ca_status read_gpt2(json_object *root, ca_causal_lm_config *c, const char *path) {
    ca_status s = get_int(root, "vocab_size", 1, &c->vocab_size, path);
    if (s == CA_OK) s = get_int(root, "n_embd", 1, &c->hidden_size, path);
    if (s == CA_OK) s = get_int(root, "n_layer", 1, &c->num_hidden_layers, path);
    if (s == CA_OK) s = get_int(root, "n_head", 1, &c->num_attention_heads, path);
    c->num_key_value_heads = c->num_attention_heads;
    c->intermediate_size = 4 * c->hidden_size;
    if (s == CA_OK) s = get_int(root, "n_inner", 1, &c->intermediate_size, path);
    if (s == CA_OK) s = get_int(root, "n_positions", 1, &c->max_position_embeddings, path);
    if (s == CA_OK) s = get_real(root, "layer_norm_epsilon", 0, 1, &c->rms_norm_eps, path);
    if (s == CA_OK) s = get_real(root, "resid_pdrop", 0, 1, &c->resid_pdrop, path);
    if (s == CA_OK) s = get_real(root, "embd_pdrop", 0, 1, &c->embd_pdrop, path);
    if (s == CA_OK) s = get_real(root, "attn_pdrop", 0, 1, &c->attention_dropout, path);
    if (s == CA_OK) s = get_real(root, "initializer_range", 0, 1e3, &c->initializer_range, path);
    if (s == CA_OK) s = get_bool(root, "scale_attn_weights", &c->scale_attn_weights, path);
    if (s == CA_OK) s = get_bool(root, "scale_attn_by_inverse_layer_idx", &c->scale_attn_by_inverse_layer_idx, path);
    if (s == CA_OK) s = get_bool(root, "reorder_and_upcast_attn", &c->reorder_and_upcast_attn, path);
    if (s == CA_OK) s = get_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, path);
    if (s == CA_OK) s = read_gpt2_act(root, c, path);
    bool cross = false;
    if (s == CA_OK) s = get_bool(root, "add_cross_attention", &cross, path);
    if (s == CA_OK && cross)
        s = ca_error(CA_ERR_UNSUPPORTED, "config '%s': \"add_cross_attention\" true (an encoder-decoder GPT-2) "
                     "is not supported", path);
    return s;
}

/* transformers 5's "base_model_tp_plan" key: an object of module pattern -> style (strings), kept as it is
 * (a style caccel does not split is refused only when tensor parallelism applies it). */
static ca_status read_tp_plan(json_object *root, ca_causal_lm_config *c, const char *path) {
    json_object *o = get(root, "base_model_tp_plan");
    if (!o) return CA_OK;
    if (!json_object_is_type(o, json_type_object))
        return ca_error(CA_ERR_INVALID, "config '%s': \"base_model_tp_plan\" must be an object of module name -> "
                        "style, not %s", path, json_object_to_json_string(o));
    json_object_object_foreach(o, key, val) {
        const char *style = json_object_is_type(val, json_type_string) ? json_object_get_string(val) : NULL;
        if (!style || strlen(key) >= sizeof c->tp_plan[0][0] || strlen(style) >= sizeof c->tp_plan[0][1])
            return ca_error(CA_ERR_INVALID, "config '%s': \"base_model_tp_plan\" entry \"%.200s\": the style must be "
                            "a string and both below %zu characters", path, key, sizeof c->tp_plan[0][0]);
        if (c->n_tp_plan == CA_CAUSAL_LM_MAX_TP_PLAN)
            return ca_error(CA_ERR_UNSUPPORTED, "config '%s': \"base_model_tp_plan\" has more than %d entries",
                            path, CA_CAUSAL_LM_MAX_TP_PLAN);
        snprintf(c->tp_plan[c->n_tp_plan][0], sizeof c->tp_plan[0][0], "%s", key);
        snprintf(c->tp_plan[c->n_tp_plan++][1], sizeof c->tp_plan[0][1], "%s", style);
    }
    return CA_OK;
}

static ca_status read_fields(json_object *root, ca_causal_lm_config *c, const char *path) {
    ca_status s = check_identity(root, c, path);
    if (s == CA_OK) s = read_tp_plan(root, c, path);
    if (s == CA_OK && c->family == CA_CAUSAL_LM_GPT2) {
        s = read_gpt2(root, c, path);
        if (s == CA_OK) s = get_id(root, "bos_token_id", &c->bos_token_id, path);
        if (s == CA_OK) s = get_id(root, "pad_token_id", &c->pad_token_id, path);
        if (s == CA_OK) s = get_ids(root, "eos_token_id", c->eos_token_ids, &c->n_eos, CA_CAUSAL_LM_MAX_EOS, path);
        char what[4200];
        snprintf(what, sizeof what, "config '%s'", path);
        return s == CA_OK ? ca_causal_lm_check_sizes(c, what) : s;
    }
    if (s == CA_OK) s = read_sizes(root, c, path);
    if (s == CA_OK) s = read_refusals(root, c, path);
    if (s == CA_OK) s = read_rope_scaling(root, c, path);
    if (s == CA_OK) s = get_real(root, "rms_norm_eps", 0, 1, &c->rms_norm_eps, path);
    if (s == CA_OK) s = get_real(root, "rope_theta", 1e-9, 1e30, &c->rope_theta, path);
    if (s == CA_OK) s = get_real(root, "attention_dropout", 0, 1, &c->attention_dropout, path);
    if (s == CA_OK) s = get_real(root, "initializer_range", 0, 1e3, &c->initializer_range, path);
    if (s == CA_OK) s = get_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, path);
    if (s == CA_OK) s = get_bool(root, "use_sliding_window", &c->use_sliding_window, path);
    bool bias = false;
    if (s == CA_OK && c->family == CA_CAUSAL_LM_LLAMA) s = get_bool(root, "attention_bias", &bias, path);
    if (bias) c->qkv_bias = c->o_bias = true;
    if (s == CA_OK) s = get_id(root, "bos_token_id", &c->bos_token_id, path);
    if (s == CA_OK) s = get_id(root, "pad_token_id", &c->pad_token_id, path);
    if (s == CA_OK) s = get_ids(root, "eos_token_id", c->eos_token_ids, &c->n_eos, CA_CAUSAL_LM_MAX_EOS, path);
    if (s != CA_OK) return s;
    char what[4200];
    snprintf(what, sizeof what, "config '%s'", path);
    return ca_causal_lm_check_sizes(c, what);
}

static ca_status read_generation(json_object *root, ca_causal_lm_config *c, const char *path) {
    int n = 0;
    ca_status s = get_id(root, "bos_token_id", &c->gen_bos_token_id, path);
    if (s == CA_OK) s = get_id(root, "pad_token_id", &c->gen_pad_token_id, path);
    if (s == CA_OK && get(root, "eos_token_id"))
        s = get_ids(root, "eos_token_id", c->gen_eos_token_ids, &n, CA_CAUSAL_LM_MAX_EOS, path), c->gen_n_eos = n;
    if (s == CA_OK) s = get_int(root, "max_length", 1, &c->max_length, path);
    if (s == CA_OK) s = get_int(root, "max_new_tokens", 1, &c->max_new_tokens, path);
    if (s == CA_OK) s = get_int(root, "top_k", 0, &c->top_k, path);
    if (s == CA_OK) s = get_real(root, "temperature", 0, 1e9, &c->temperature, path);
    if (s == CA_OK) s = get_real(root, "top_p", 0, 1, &c->top_p, path);
    if (s == CA_OK) s = get_bool(root, "do_sample", &c->do_sample, path);
    return s;
}

/* Reads `path` as a JSON object and hands it to fn. */
static ca_status parse(const char *path, ca_causal_lm_config *c,
                       ca_status (*fn)(json_object *, ca_causal_lm_config *, const char *)) {
    char why[256];
    ca_status rs;
    json_object *root = ca_json_load(path, CA_FILE_MODEL_CONFIG, why, sizeof why, &rs);
    if (!root && !why[0]) return rs;   /* the reader's error names the file */
    if (!root) return ca_error(CA_ERR_INVALID, "config '%s': not valid JSON: %s", path, why);
    ca_status st = json_object_is_type(root, json_type_object)
                       ? fn(root, c, path)
                       : ca_error(CA_ERR_INVALID, "config '%s': not a JSON object but a JSON %s", path,
                                  json_type_to_name(json_object_get_type(root)));
    json_object_put(root);
    return st;
}

ca_status ca_causal_lm_config_load(const char *dir, ca_causal_lm_config *out) {
    if (!dir || !out) return ca_error(CA_ERR_INVALID, "ca_causal_lm_config_load: NULL argument");
    char file[4096], base[4096];
    struct stat st;
    bool is_dir = stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
    snprintf(base, sizeof base, "%s", dir);
    char *slash = is_dir ? NULL : strrchr(base, '/');
    if (slash) *slash = '\0';
    else if (!is_dir) snprintf(base, sizeof base, ".");
    snprintf(file, sizeof file, is_dir ? "%s/config.json" : "%s", dir);
    ca_causal_lm_config c;
    ca_causal_lm_config_default(CA_CAUSAL_LM_LLAMA, &c);
    ca_status s = parse(file, &c, read_fields);
    snprintf(c.config_file, sizeof c.config_file, "%s", file);   /* after parse, which sets the family's defaults */
    /* generation_config.json starts from the model config's ids, as GenerationConfig.from_model_config */
    c.gen_bos_token_id = c.bos_token_id;
    c.gen_pad_token_id = c.pad_token_id;
    c.gen_n_eos = c.n_eos;
    memcpy(c.gen_eos_token_ids, c.eos_token_ids, sizeof c.eos_token_ids);
    snprintf(file, sizeof file, "%s/generation_config.json", base);
    if (s == CA_OK && stat(file, &st) == 0) {
        c.has_generation_config = true;
        s = parse(file, &c, read_generation);
    }
    if (s == CA_OK) *out = c;
    return s;
}

/* ------------------------------------------------------------------ sizes */

/* The memory the parameters may take: physical memory, or RLIMIT_AS / RLIMIT_DATA when lower. */
static double memory_there_is(void) {
    double mem = 1e300;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) mem = (double)pages * (double)page;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (double)rl.rlim_cur < mem)
        mem = (double)rl.rlim_cur;
    if (getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (double)rl.rlim_cur < mem)
        mem = (double)rl.rlim_cur;
    return mem;
}

static ca_status check_memory(const ca_causal_lm_config *c, const char *what) {
    double mem = memory_there_is(), H = (double)c->hidden_size, I = (double)c->intermediate_size;
    double V = (double)c->vocab_size, KV = (double)c->num_key_value_heads * (H / (double)c->num_attention_heads);
    if (V * H * 4 > mem || I * H * 4 > mem)
        return ca_error(CA_ERR_INVALID, "%s: \"%s\" %lld makes a weight larger than the %.3g bytes of memory there "
                        "is", what, V > I ? "vocab_size" : "intermediate_size",
                        (long long)(V > I ? c->vocab_size : c->intermediate_size), mem);
    double layer = 2 * H * H + 2 * H * KV + 3 * H * I + 4 * H;
    double P = c->family == CA_CAUSAL_LM_GPT2 ? (double)c->max_position_embeddings : 0;
    double n = V * H * (c->tie_word_embeddings ? 1 : 2) + (double)c->num_hidden_layers * layer + 2 * H + P * H;
    if (P * H * 4 > mem)
        return ca_error(CA_ERR_INVALID, "%s: \"n_positions\" %lld makes a weight larger than the %.3g bytes of "
                        "memory there is", what, (long long)c->max_position_embeddings, mem);
    if (n * 4 > mem)
        return ca_error(CA_ERR_INVALID, "%s: %lld layers (\"num_hidden_layers\") of \"hidden_size\" %lld and "
                        "\"intermediate_size\" %lld make %.3g parameters, more than the %.3g bytes of memory "
                        "there is hold in f32", what, (long long)c->num_hidden_layers, (long long)c->hidden_size,
                        (long long)c->intermediate_size, n, mem);
    return CA_OK;
}

/* The config.json keys of the sizes, in check_sizes's order: GPT2Config names them n_*. */
static const char *const size_keys[2][7] = {
    {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
     "num_key_value_heads", "max_position_embeddings"},
    {"vocab_size", "n_embd", "n_inner", "n_layer", "n_head", "n_head", "n_positions"},
};

ca_status ca_causal_lm_check_sizes(const ca_causal_lm_config *c, const char *what) {
    if (!ca_causal_lm_model_type(c->family))
        return ca_error(CA_ERR_INVALID, "%s: unknown family %d", what, (int)c->family);
    bool rope = c->family != CA_CAUSAL_LM_GPT2;
    const char *const *key = size_keys[!rope];
    const int64_t v[7] = {c->vocab_size, c->hidden_size, c->intermediate_size, c->num_hidden_layers,
                          c->num_attention_heads, c->num_key_value_heads, c->max_position_embeddings};
    for (int i = 0; i < 7; i++)
        if (v[i] < 1 || v[i] > ((int64_t)1 << 40))
            return ca_error(CA_ERR_INVALID, "%s: \"%s\" is %lld; it must be in [1, 2^40]", what, key[i], (long long)v[i]);
    if (c->num_hidden_layers > MAX_LAYERS)
        return ca_error(CA_ERR_INVALID, "%s: \"%s\" is %lld; at most %d layers are supported", what, key[3],
                        (long long)c->num_hidden_layers, MAX_LAYERS);
    if (c->hidden_size % c->num_attention_heads || (rope && (c->hidden_size / c->num_attention_heads) % 2))
        return ca_error(CA_ERR_INVALID, "%s: \"%s\" %lld is not \"%s\" %lld heads%s", what, key[1],
                        (long long)c->hidden_size, key[4], (long long)c->num_attention_heads,
                        rope ? " of an even size (rotary embeddings rotate pairs of channels)" : " of one size");
    if (c->num_attention_heads % c->num_key_value_heads || (!rope && c->num_key_value_heads != c->num_attention_heads))
        return ca_error(CA_ERR_INVALID, "%s: \"num_key_value_heads\" %lld does not divide \"num_attention_heads\" "
                        "%lld%s", what, (long long)c->num_key_value_heads, (long long)c->num_attention_heads,
                        rope ? "" : " (GPT-2 has as many key/value heads as heads)");
    if (c->pad_token_id >= c->vocab_size)
        return ca_error(CA_ERR_INVALID, "%s: \"pad_token_id\" %lld is not below \"vocab_size\" %lld", what,
                        (long long)c->pad_token_id, (long long)c->vocab_size);
    if (c->sliding_window < 0 || !(c->rms_norm_eps >= 0) || !(c->rope_theta > 0))
        return ca_error(CA_ERR_INVALID, "%s: \"sliding_window\", \"rms_norm_eps\" or \"rope_theta\" is out of "
                        "range", what);
    return check_memory(c, what);
}
