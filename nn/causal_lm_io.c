/* A decoder LM's Hugging Face files: loading model.safetensors (or the shards a
 * model.safetensors.index.json names) into the module, and writing config.json and
 * generation_config.json. */
#include "base/half_impl.h"
#include "core/json_impl.h"
#include "base/file_impl.h"
#include "nn/nn_impl.h"
#include "tensor/safetensors_impl.h"

#include <caccel/causal_lm.h>

#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SINGLE "model.safetensors"
#define INDEX "model.safetensors.index.json"

/* The files of a checkpoint, each read whole. */
typedef struct shards {
    int n, cap;
    ca_st_file *files;
} shards;

static void shards_close(shards *s) {
    for (int i = 0; i < s->n; i++) ca_st_close(&s->files[i]);
    free(s->files);
}

static ca_status shards_add(shards *s, const char *path) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 4;
        ca_st_file *f = realloc(s->files, (size_t)cap * sizeof *f);
        if (!f) return ca_error(CA_ERR_NOMEM, "out of host memory opening '%s'", path);
        s->files = f;
        s->cap = cap;
    }
    ca_status st = ca_st_open(path, &s->files[s->n]);
    if (st != CA_OK) {
        ca_st_close(&s->files[s->n]);
        return st;
    }
    s->n++;
    return CA_OK;
}

/* Opens each distinct file the index's weight_map names (in the index's directory). */
static ca_status open_index(const char *index, shards *s) {
    char why[256], dir[4096], path[8192];
    ca_status st;
    json_object *root = ca_json_load(index, CA_FILE_INDEX, why, sizeof why, &st);
    if (!root) return why[0] ? ca_error(CA_ERR_INVALID, "index '%s': cannot read it: %s", index, why) : st;
    snprintf(dir, sizeof dir, "%s", index);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    json_object *map = NULL;
    st = json_object_object_get_ex(root, "weight_map", &map) && json_object_is_type(map, json_type_object)
             ? CA_OK : ca_error(CA_ERR_INVALID, "index '%s': no \"weight_map\" object", index);
    json_object *seen = json_object_new_object();
    json_object_object_foreach(map, name, val) {
        if (st != CA_OK) break;
        const char *f = json_object_is_type(val, json_type_string) ? json_object_get_string(val) : NULL;
        if (!f || strchr(f, '/') || !strcmp(f, "..") || !strcmp(f, "."))
            st = ca_error(CA_ERR_INVALID, "index '%s': weight_map: tensor '%s' maps to %s, not a file name in "
                          "the index's directory", index, name, json_object_to_json_string(val));
        else if (!json_object_object_get_ex(seen, f, NULL)) {
            json_object_object_add(seen, f, NULL);
            snprintf(path, sizeof path, "%s/%s", dir, f);
            st = shards_add(s, path);
            if (st != CA_OK) ca_error_context("index '%s'", index);
        }
    }
    json_object_put(seen);
    json_object_put(root);
    return st;
}

/* A directory: model.safetensors, else the index (as from_pretrained chooses); a file: itself. */
static ca_status open_checkpoint(const char *path, shards *s) {
    struct stat st;
    size_t n = strlen(path);
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode))
        return n > 5 && !strcmp(path + n - 5, ".json") ? open_index(path, s) : shards_add(s, path);
    char file[4096];
    snprintf(file, sizeof file, "%s/" SINGLE, path);
    if (access(file, F_OK) == 0) return shards_add(s, file);
    snprintf(file, sizeof file, "%s/" INDEX, path);
    if (access(file, F_OK) == 0) return open_index(file, s);
    return ca_error(CA_ERR_NOT_FOUND, "checkpoint '%s' holds neither " SINGLE " nor " INDEX, path);
}

static const ca_st_entry *find(const shards *s, const char *name, const ca_st_file **file) {
    for (int i = 0; i < s->n; i++) {
        const ca_st_entry *e = ca_st_find(&s->files[i], name);
        if (e) {
            *file = &s->files[i];
            return e;
        }
    }
    return NULL;
}

static ca_status check_entry(const ca_st_file *f, const ca_st_entry *e, const ca_tensor *t) {
    bool same = e->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = e->shape[d] == t->shape[d];
    char fs[128], ts[128];
    if (!same)
        return ca_error(CA_ERR_INVALID, "checkpoint '%s': tensor '%s' has shape %s; the model's parameter is %s",
                        f->path, e->name, ca_shape_str(e->ndim, e->shape, fs, sizeof fs),
                        ca_shape_str(t->ndim, t->shape, ts, sizeof ts));
    if (e->dtype != CA_F32 && e->dtype != CA_F16 && e->dtype != CA_BF16)
        return ca_error(CA_ERR_INVALID, "checkpoint '%s': tensor '%s' is %s; F32, F16 or BF16 is needed", f->path,
                        e->name, ca_st_dtype_name(e->dtype));
    return CA_OK;
}

/* The base model's prefix: a file saved from GPT2Model or LlamaModel (the hub's gpt2 is) names
 * its tensors without it, and from_pretrained adds it back. */
static const char *base_prefix(const ca_module *m) {
    return ca_causal_lm_module_config(m)->family == CA_CAUSAL_LM_GPT2 ? "transformer." : "model.";
}

/* Does the file's tensor `name` go to a parameter of m (with or without the base prefix)? */
static bool used(ca_module *m, const char *name) {
    char full[256];
    snprintf(full, sizeof full, "%s%s", base_prefix(m), name);
    return ca_module_param(m, name) || ca_module_param(m, full);
}

/* Every parameter's entry, checked; then the first unused tensor for info. */
static ca_status match(ca_module *m, const shards *s, const ca_st_entry **entries, const ca_st_file **files,
                       ca_causal_lm_load_info *info) {
    int n = ca_module_num_params(m);
    const char *prefix = base_prefix(m);
    size_t pl = strlen(prefix);
    for (int i = 0; i < n; i++) {
        const char *name = ca_module_param_name(m, i);
        entries[i] = find(s, name, &files[i]);
        if (!entries[i] && !strncmp(name, prefix, pl)) entries[i] = find(s, name + pl, &files[i]);
        if (!entries[i])
            return ca_error(CA_ERR_INVALID, "checkpoint '%s': tensor '%s' is missing", s->files[0].path, name);
        ca_status st = check_entry(files[i], entries[i], ca_module_param_at(m, i));
        if (st != CA_OK) return st;
        info->loaded++;
    }
    int64_t total = 0;
    for (int f = 0; f < s->n; f++) {
        total += s->files[f].n;
        for (int j = 0; j < s->files[f].n && !info->first_unused[0]; j++)
            if (!used(m, s->files[f].entries[j].name))
                snprintf(info->first_unused, sizeof info->first_unused, "%s", s->files[f].entries[j].name);
    }
    info->unused = total - info->loaded;
    return CA_OK;
}

ca_status ca_causal_lm_load_pretrained(ca_module *m, const char *path, ca_causal_lm_load_info *info) {
    if (!ca_causal_lm_module_config(m) || !path)
        return ca_error(CA_ERR_INVALID, "ca_causal_lm_load_pretrained: a module made by ca_causal_lm_create and a "
                        "path are required");
    ca_causal_lm_load_info local;
    if (!info) info = &local;
    memset(info, 0, sizeof *info);
    shards s = {0, 0, NULL};
    ca_status st = open_checkpoint(path, &s);
    int n = ca_module_num_params(m);
    const ca_st_entry **entries = calloc((size_t)n, sizeof *entries);
    const ca_st_file **files = calloc((size_t)n, sizeof *files);
    if (st == CA_OK && (!entries || !files)) st = ca_error(CA_ERR_NOMEM, "out of host memory");
    if (st == CA_OK) st = match(m, &s, entries, files, info);
    ca_meta_src **src = st == CA_OK ? calloc((size_t)s.n + 1, sizeof *src) : NULL;   /* one per shard file */
    if (st == CA_OK && !src) st = ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int i = 0; st == CA_OK && i < n; i++)   /* under ca_init_empty_weights: read at ca_prepare */
        st = ca_meta_load_entry(ca_module_param_at(m, i), files[i], entries[i], &src[files[i] - s.files]);
    for (int i = 0; src && i < s.n; i++) ca_meta_src_unref(src[i]);
    free(src);
    info->files = s.n;
    free(entries);
    free(files);
    shards_close(&s);
    return st;
}

/* ------------------------------------------------------------------ config.json */

/* A double written as its shortest decimal ("1e-06", "10000.0" as transformers writes it). */
static json_object *real(double d) {
    char buf[40];
    snprintf(buf, sizeof buf, "%.9g", d);
    if (!strpbrk(buf, ".en")) strcat(buf, ".0");
    return json_object_new_double_s(d, buf);
}

static json_object *id_or_null(int64_t id) { return id >= 0 ? json_object_new_int64(id) : NULL; }

static json_object *ids_json(const int64_t *ids, int n) {
    if (n == 0) return NULL;
    if (n == 1) return json_object_new_int64(ids[0]);
    json_object *a = json_object_new_array();
    for (int i = 0; a && i < n; i++) json_object_array_add(a, json_object_new_int64(ids[i]));
    return a;
}

/* llama3's and yarn's keys of rope_scaling, those the config has. */
static void rope_extras(json_object *rs, const ca_causal_lm_config *c) {
    if (c->rope_low_freq_factor > 0) json_object_object_add(rs, "low_freq_factor", real(c->rope_low_freq_factor));
    if (c->rope_high_freq_factor > 0) json_object_object_add(rs, "high_freq_factor", real(c->rope_high_freq_factor));
    if (c->rope_original_max_position_embeddings > 0)
        json_object_object_add(rs, "original_max_position_embeddings",
                               json_object_new_int64(c->rope_original_max_position_embeddings));
    if (c->rope_beta_fast > 0) json_object_object_add(rs, "beta_fast", real(c->rope_beta_fast));
    if (c->rope_beta_slow > 0) json_object_object_add(rs, "beta_slow", real(c->rope_beta_slow));
    if (c->rope_attention_factor > 0) json_object_object_add(rs, "attention_factor", real(c->rope_attention_factor));
}

static void family_keys(json_object *o, const ca_causal_lm_config *c) {
    if (c->family == CA_CAUSAL_LM_LLAMA) {
        json_object_object_add(o, "attention_bias", json_object_new_boolean(c->o_bias));
        json_object_object_add(o, "pretraining_tp", json_object_new_int64(c->pretraining_tp));
        json_object *rs = NULL;
        if (c->rope_scaling_type[0]) {
            rs = json_object_new_object();
            json_object_object_add(rs, "type", json_object_new_string(c->rope_scaling_type));
            json_object_object_add(rs, "factor", real(c->rope_scaling_factor));
            rope_extras(rs, c);
        }
        json_object_object_add(o, "rope_scaling", rs);
    }
    if (c->family != CA_CAUSAL_LM_LLAMA)
        json_object_object_add(o, "sliding_window", c->sliding_window ? json_object_new_int64(c->sliding_window)
                                                                      : NULL);
    if (c->family == CA_CAUSAL_LM_QWEN2) {
        json_object_object_add(o, "use_sliding_window", json_object_new_boolean(c->use_sliding_window));
        json_object_object_add(o, "max_window_layers", json_object_new_int64(c->max_window_layers));
    }
}

/* GPT2Config's keys (n_* sizes, its dropouts and attention switches). */
static json_object *gpt2_config_json(const ca_causal_lm_config *c) {
    json_object *o = json_object_new_object(), *a = json_object_new_array();
    json_object_array_add(a, json_object_new_string("GPT2LMHeadModel"));
    json_object_object_add(o, "architectures", a);
    json_object_object_add(o, "model_type", json_object_new_string("gpt2"));
    json_object_object_add(o, "vocab_size", json_object_new_int64(c->vocab_size));
    json_object_object_add(o, "n_embd", json_object_new_int64(c->hidden_size));
    json_object_object_add(o, "n_layer", json_object_new_int64(c->num_hidden_layers));
    json_object_object_add(o, "n_head", json_object_new_int64(c->num_attention_heads));
    json_object_object_add(o, "n_inner", c->intermediate_size == 4 * c->hidden_size
                                             ? NULL : json_object_new_int64(c->intermediate_size));
    json_object_object_add(o, "n_positions", json_object_new_int64(c->max_position_embeddings));
    json_object_object_add(o, "activation_function", json_object_new_string(c->activation_function));
    json_object_object_add(o, "resid_pdrop", real(c->resid_pdrop));
    json_object_object_add(o, "embd_pdrop", real(c->embd_pdrop));
    json_object_object_add(o, "attn_pdrop", real(c->attention_dropout));
    json_object_object_add(o, "layer_norm_epsilon", real(c->rms_norm_eps));
    json_object_object_add(o, "initializer_range", real(c->initializer_range));
    json_object_object_add(o, "scale_attn_weights", json_object_new_boolean(c->scale_attn_weights));
    json_object_object_add(o, "scale_attn_by_inverse_layer_idx",
                           json_object_new_boolean(c->scale_attn_by_inverse_layer_idx));
    json_object_object_add(o, "reorder_and_upcast_attn", json_object_new_boolean(c->reorder_and_upcast_attn));
    json_object_object_add(o, "tie_word_embeddings", json_object_new_boolean(c->tie_word_embeddings));
    json_object_object_add(o, "use_cache", json_object_new_boolean(1));
    json_object_object_add(o, "bos_token_id", id_or_null(c->bos_token_id));
    json_object_object_add(o, "eos_token_id", ids_json(c->eos_token_ids, c->n_eos));
    if (c->pad_token_id >= 0) json_object_object_add(o, "pad_token_id", json_object_new_int64(c->pad_token_id));
    json_object_object_add(o, "torch_dtype", json_object_new_string("float32"));
    return o;
}

static json_object *config_json(const ca_causal_lm_config *c) {
    static const char *const arch[] = {"", "LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"};
    if (c->family == CA_CAUSAL_LM_GPT2) return gpt2_config_json(c);
    json_object *o = json_object_new_object(), *a = json_object_new_array();
    json_object_array_add(a, json_object_new_string(arch[c->family]));
    json_object_object_add(o, "architectures", a);
    json_object_object_add(o, "model_type", json_object_new_string(ca_causal_lm_model_type(c->family)));
    json_object_object_add(o, "vocab_size", json_object_new_int64(c->vocab_size));
    json_object_object_add(o, "hidden_size", json_object_new_int64(c->hidden_size));
    json_object_object_add(o, "intermediate_size", json_object_new_int64(c->intermediate_size));
    json_object_object_add(o, "num_hidden_layers", json_object_new_int64(c->num_hidden_layers));
    json_object_object_add(o, "num_attention_heads", json_object_new_int64(c->num_attention_heads));
    json_object_object_add(o, "num_key_value_heads", json_object_new_int64(c->num_key_value_heads));
    json_object_object_add(o, "hidden_act", json_object_new_string("silu"));
    json_object_object_add(o, "max_position_embeddings", json_object_new_int64(c->max_position_embeddings));
    json_object_object_add(o, "initializer_range", real(c->initializer_range));
    json_object_object_add(o, "rms_norm_eps", real(c->rms_norm_eps));
    json_object_object_add(o, "rope_theta", real(c->rope_theta));
    json_object_object_add(o, "attention_dropout", real(c->attention_dropout));
    json_object_object_add(o, "tie_word_embeddings", json_object_new_boolean(c->tie_word_embeddings));
    json_object_object_add(o, "use_cache", json_object_new_boolean(1));
    json_object_object_add(o, "bos_token_id", id_or_null(c->bos_token_id));
    json_object_object_add(o, "eos_token_id", ids_json(c->eos_token_ids, c->n_eos));
    if (c->pad_token_id >= 0) json_object_object_add(o, "pad_token_id", json_object_new_int64(c->pad_token_id));
    json_object_object_add(o, "torch_dtype", json_object_new_string("float32"));
    family_keys(o, c);
    return o;
}

static json_object *generation_json(const ca_causal_lm_config *c) {
    json_object *o = json_object_new_object();
    if (c->gen_bos_token_id >= 0) json_object_object_add(o, "bos_token_id", json_object_new_int64(c->gen_bos_token_id));
    if (c->gen_n_eos) json_object_object_add(o, "eos_token_id", ids_json(c->gen_eos_token_ids, c->gen_n_eos));
    if (c->gen_pad_token_id >= 0) json_object_object_add(o, "pad_token_id", json_object_new_int64(c->gen_pad_token_id));
    if (c->max_length) json_object_object_add(o, "max_length", json_object_new_int64(c->max_length));
    if (c->max_new_tokens) json_object_object_add(o, "max_new_tokens", json_object_new_int64(c->max_new_tokens));
    if (c->do_sample) json_object_object_add(o, "do_sample", json_object_new_boolean(1));
    if (c->temperature != 1.0) json_object_object_add(o, "temperature", real(c->temperature));
    if (c->top_k != 50) json_object_object_add(o, "top_k", json_object_new_int64(c->top_k));
    if (c->top_p != 1.0) json_object_object_add(o, "top_p", real(c->top_p));
    return o;
}

static ca_status write_json(json_object *o, const char *dir, const char *name) {
    if (!o) return ca_error(CA_ERR_NOMEM, "out of host memory writing %s", name);
    const char *text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const void *parts[2] = {text, "\n"};
    size_t lens[2] = {strlen(text), 1};
    ca_status s = ca_st_write_atomic(path, parts, lens, 2);
    json_object_put(o);
    return s;
}

ca_status ca_causal_lm_save_config(const ca_module *m, const char *dir) {
    const ca_causal_lm_config *c = ca_causal_lm_module_config(m);
    if (!c || !dir)
        return ca_error(CA_ERR_INVALID, "ca_causal_lm_save_config: a module made by ca_causal_lm_create and a "
                        "directory are required");
    ca_status s = write_json(config_json(c), dir, "config.json");
    return s == CA_OK ? write_json(generation_json(c), dir, "generation_config.json") : s;
}
