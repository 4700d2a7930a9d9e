/* caccel/bert_config.h: a Hugging Face BERT checkpoint directory's config.json (BertConfig) and
 * the tensor names and shapes its model.safetensors must hold.
 *
 * Ownership: plain structs filled by the caller's storage; nothing to free. Threading: the calls
 * are reentrant. Errors: a status, with a message naming the file, the key or tensor, and what
 * differs (ca_last_error). */
#ifndef CACCEL_BERT_CONFIG_H
#define CACCEL_BERT_CONFIG_H

#include <caccel/status.h>
#include <caccel/types.h>

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* BertConfig's fields. A key config.json lacks takes BertConfig's default, as transformers does
 * (vocab 30522, hidden 768, 12 layers, 12 heads, intermediate 3072, "gelu", dropouts 0.1,
 * 512 positions, 2 token types, eps 1e-12, pad 0, 2 labels). */
typedef struct ca_bert_config {
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t intermediate_size;
    char hidden_act[32];                  /* "gelu" (erf), "gelu_new", "relu", ... */
    double hidden_dropout_prob;
    double attention_probs_dropout_prob;
    int64_t max_position_embeddings;
    int64_t type_vocab_size;
    double layer_norm_eps;
    int64_t pad_token_id;
    int64_t num_labels;                   /* id2label's size, else num_labels, else 2 */
    char architectures[128];              /* comma-separated, e.g. "BertModel"; "" if absent */
} ca_bert_config;

/* Reads `path` (a config.json, or a directory holding one). Fails with CA_ERR_UNSUPPORTED when
 * model_type is not "bert", an architecture is not a Bert* class, position_embedding_type is not
 * "absolute", or hidden_act is unknown; CA_ERR_INVALID for a key of the wrong type or a value out
 * of range (hidden_size not a multiple of num_attention_heads, more than 1000 layers, ...), and
 * for sizes whose model could not be built: a weight (e.g. intermediate_size x hidden_size), or
 * the whole model (with a classifier of num_labels), larger in f32 than the memory there is
 * (physical memory, or the RLIMIT_AS / RLIMIT_DATA limit when lower). Messages name the file and
 * the key. */
CA_API ca_status ca_bert_config_load(const char *path, ca_bert_config *out);

/* One tensor BertModel's state dict holds, with Hugging Face's name. */
typedef struct ca_bert_tensor {
    char name[96];                        /* "encoder.layer.0.attention.self.query.weight" */
    int ndim;
    int64_t shape[2];
} ca_bert_tensor;

/* The parameters of BertModel for config c (embeddings, every encoder layer, the pooler), in
 * state-dict order, with their shapes: 5 + 16 * layers + 2 entries. Writes at most cap entries
 * to out (out may be NULL with cap 0) and returns how many there are. */
CA_API int64_t ca_bert_tensor_names(const ca_bert_config *c, ca_bert_tensor *out, int64_t cap);

/* What ca_bert_check_checkpoint found. */
typedef struct ca_bert_check {
    char prefix[16];                      /* "" (BertModel) or "bert." (Bert*For* heads) */
    int64_t matched;                      /* BertModel tensors found with the right shape */
    int64_t extra;                        /* other tensors (heads, buffers like position_ids) */
    bool has_pooler;
    bool gamma_beta;                      /* LayerNorms stored as "LayerNorm.gamma"/".beta" */
} ca_bert_check;

/* Checks that the safetensors file at `path` holds every BertModel tensor of config c with the
 * shape c implies and a floating-point dtype, under the names Hugging Face writes (with the
 * "bert." prefix of the Bert*For* classes, detected; LayerNorm weight/bias may be stored under
 * the older names gamma/beta, which transformers also accepts). The pooler may be absent
 * (has_pooler false). A missing tensor, a wrong shape or dtype, or encoder layers beyond num_hidden_layers
 * fail with CA_ERR_INVALID naming the file, the tensor, and the shapes. Fewer layers in the file
 * than c asks for fail first, in a time that depends on the file, not on c ("no tensor
 * 'encoder.layer.12.attention.self.query.weight': the config asks for 1000000 layers, the file
 * has 12"). result may be NULL. */
CA_API ca_status ca_bert_check_checkpoint(const char *path, const ca_bert_config *c,
                                          ca_bert_check *result);

#ifdef __cplusplus
}
#endif
#endif
