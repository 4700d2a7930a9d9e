/* caccel/bert.h: BertModel and BertForSequenceClassification as modules with Hugging Face's
 * parameter names, loaded from and written as a Hugging Face checkpoint directory.
 *
 * Ownership: the modules are ordinary ca_modules (ca_module_destroy frees them); the caller owns
 * the config it passes (copied). Threading: as any module, one thread builds and trains one.
 * Errors: a status, with a message naming the file, the tensor and what differs (ca_last_error). */
#ifndef CACCEL_BERT_H
#define CACCEL_BERT_H

#include <caccel/bert_config.h>
#include <caccel/nn.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * MODULES. ca_bert_model_create builds transformers' BertModel for config c: children
 * `embeddings` (word/position/token_type embeddings, LayerNorm), `encoder.layer.N` (attention.self
 * query/key/value, attention.output dense + LayerNorm, intermediate.dense, output dense +
 * LayerNorm) and `pooler.dense`, so ca_module_param_name gives exactly the names of BertModel's
 * state dict ("embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight",
 * ..., "pooler.dense.weight"). Initialisation is BertPreTrainedModel's: Linear and Embedding
 * weights ~ N(0, 0.02) (initializer_range), biases 0, the pad_token_id row 0, LayerNorm 1 and 0.
 *
 * ca_bert_for_sequence_classification_create builds BertForSequenceClassification: the BertModel
 * under `bert` ("bert.embeddings...") and `classifier` Linear(hidden, num_labels)
 * ("classifier.weight", "classifier.bias"); num_labels <= 0 takes c->num_labels.
 *
 * Both check c's sizes as ca_bert_config_load does (positive, at most 1000 layers, heads dividing
 * hidden_size, each weight and the whole model within the memory there is) before they allocate
 * anything, failing with CA_ERR_INVALID naming the key ("BertModel: \"intermediate_size\" ...").
 * Memory that runs out while the parameters are allocated fails with CA_ERR_NOMEM naming the
 * layer. On any failure *out is NULL and nothing is left allocated.
 *
 * FORWARD. ca_module_forward(m, x) takes x as i64 (or i32) [B, L] input ids, every position
 * attended, or [B, 2, L] with row 0 the input ids and row 1 the attention mask (1: a token, 0:
 * padding), which is what the fortunes dataset's samples hold; token type ids are 0. BertModel
 * returns the pooled output [B, hidden]; BertForSequenceClassification the logits [B, num_labels].
 * The computation is transformers' (eager attention): embeddings = LayerNorm(word + position +
 * token_type) -> dropout; per layer, self-attention through ca_scaled_dot_product_attention with
 * the key-padding mask and attention dropout, dense -> dropout -> LayerNorm(+ residual), dense ->
 * activation (hidden_act) -> dense -> dropout -> LayerNorm(+ residual); the pooler is dense ->
 * tanh on the first ([CLS]) position; the classifier is dropout(hidden_dropout_prob) -> Linear.
 * Dropout is active in training mode (ca_module_train).
 */
CA_API ca_status ca_bert_model_create(const ca_bert_config *c, ca_module **out);
CA_API ca_status ca_bert_for_sequence_classification_create(const ca_bert_config *c,
                                                            int64_t num_labels, ca_module **out);

/* The config a BERT module was built from (a BertModel, or the classifier holding one), or NULL. */
CA_API const ca_bert_config *ca_bert_module_config(const ca_module *m);

/* BertModel's two outputs. */
typedef struct ca_bert_output {
    ca_tensor *last_hidden_state;          /* [B, L, hidden] */
    ca_tensor *pooler_output;              /* [B, hidden] */
} ca_bert_output;

/* Runs the BertModel of m (m itself, or the `bert` child of a classifier) on input_ids [B, L]
 * (i32/i64). attention_mask [B, L] (any dtype, nonzero = attend) and token_type_ids [B, L]
 * (i32/i64) may be NULL (all attended; all type 0). The outputs are in the current scope. */
CA_API ca_status ca_bert_forward(ca_module *m, ca_tensor *input_ids, ca_tensor *attention_mask,
                                 ca_tensor *token_type_ids, ca_bert_output *out);

/* What ca_bert_load_pretrained did. */
typedef struct ca_bert_load_info {
    char prefix[16];                       /* the file's prefix: "" or "bert." */
    int64_t loaded;                        /* parameters read from the file */
    int64_t initialized;                   /* parameters the file lacks, left as initialised */
    int64_t unused;                        /* tensors of the file the model does not use */
    char first_initialized[96];            /* e.g. "classifier.weight" ("" when none) */
} ca_bert_load_info;

/*
 * Loads a Hugging Face BERT checkpoint into m (built by the calls above from the same config):
 * path is a directory holding model.safetensors, or the file itself. The file's BertModel tensors
 * may carry the "bert." prefix of the Bert*For* classes or none, and LayerNorm parameters may be
 * named gamma/beta; buffers (embeddings.position_ids) and other heads' tensors (cls.*) are
 * ignored, as from_pretrained ignores them. The BertModel's tensors must all be there (the pooler
 * may be absent: it keeps its initialisation); a classifier's head is read when the file has it
 * (a fine-tuned checkpoint), else it keeps its initialisation, as from_pretrained does. F32, F16
 * and BF16 tensors are read (converted to f32). Everything is checked before any parameter is
 * written: a missing tensor, a wrong shape or dtype fails with CA_ERR_INVALID naming the file,
 * the tensor and both shapes, and leaves the model unchanged. Each process reads the file itself;
 * called while ca_init_empty_weights is on on a model built under it, the read is deferred: the
 * parameters stay meta, recording where their values lie, and ca_prepare reads them (each rank its
 * shard's bytes under ZeRO-3 / FULL_SHARD, rank 0 for all under DDP; docs/CHECKPOINTS.md).
 * info may be NULL.
 */
CA_API ca_status ca_bert_load_pretrained(ca_module *m, const char *path, ca_bert_load_info *info);

/*
 * Writes config.json for the BERT module m into directory dir (atomically), with every BertConfig
 * field transformers reads, "model_type": "bert" and "architectures": [BertModel or
 * BertForSequenceClassification, after m]. For a classifier, num_labels and id2label/label2id
 * come from labels[0..num_labels) (NULL: "LABEL_0", ...). With ca_save_model(acc, m, dir, 0)
 * and a copy of tokenizer.json this is a directory transformers' from_pretrained loads.
 */
CA_API ca_status ca_bert_save_config(const ca_module *m, const char *dir,
                                     const char *const *labels);

#ifdef __cplusplus
}
#endif
#endif
