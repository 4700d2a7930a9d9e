/* Fuzz target: BERT's config.json (ca_bert_config_load). A config it accepts then goes where a
 * Hugging Face checkpoint directory's config goes next: its tensor names are made, a small
 * model.safetensors (2 layers of hidden size 4) is checked against it, and a model small enough
 * to build in a moment is built and destroyed. */
#include "tests/fuzz/fuzz_util.h"

#include <caccel/bert.h>

/* A safetensors file of the tensors of BertModel with hidden 4, 2 layers, intermediate 8, vocab
 * 10, 16 positions, 2 token types (zeros; pooler absent), written once. */
static const char *checkpoint(void) {
    static char path[128];
    if (path[0]) return path;
    ca_bert_config c = {.vocab_size = 10, .hidden_size = 4, .num_hidden_layers = 2, .num_attention_heads = 2,
                        .intermediate_size = 8, .max_position_embeddings = 16, .type_vocab_size = 2};
    ca_bert_tensor t[40];
    int64_t n = ca_bert_tensor_names(&c, t, 40) - 2;   /* without the pooler */
    static char hdr[8192];
    size_t k = (size_t)snprintf(hdr, sizeof hdr, "{");
    uint64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)(t[i].shape[0] * (t[i].ndim > 1 ? t[i].shape[1] : 1)) * 4;
        char shape[48];
        snprintf(shape, sizeof shape, t[i].ndim > 1 ? "%lld,%lld" : "%lld", (long long)t[i].shape[0],
                 (long long)t[i].shape[1]);
        k += (size_t)snprintf(hdr + k, sizeof hdr - k, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],"
                              "\"data_offsets\":[%llu,%llu]}", i ? "," : "", t[i].name, shape,
                              (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    k += (size_t)snprintf(hdr + k, sizeof hdr - k, "}");
    size_t total = 8 + k + off;
    uint8_t *buf = calloc(1, total);
    if (!buf) abort();
    uint64_t hl = k;
    for (int b = 0; b < 8; b++) buf[b] = (uint8_t)(hl >> (8 * b));   /* little-endian */
    memcpy(buf + 8, hdr, k);
    fz_write("model.safetensors", buf, total, path, sizeof path);
    free(buf);
    return path;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *ckpt = checkpoint();
    char path[128];
    fz_write("config.json", data, size, path, sizeof path);
    ca_bert_config c;
    if (ca_bert_config_load(path, &c) != CA_OK) return 0;
    ca_bert_tensor t[64];
    int64_t n = ca_bert_tensor_names(&c, t, 64);
    if (n != 5 + 16 * c.num_hidden_layers + 2) abort();   /* the count the header promises */
    ca_bert_check_checkpoint(ckpt, &c, NULL);
    /* the parameters (with the classifier): build the model when it is small */
    double params = (double)c.num_labels * (double)(c.hidden_size + 1);
    for (int64_t i = 0; i < (n < 64 ? n : 64); i++)
        params += (double)t[i].shape[0] * (double)(t[i].ndim > 1 ? t[i].shape[1] : 1);
    if (n <= 64 && params <= 65536) {
        ca_module *m = NULL;
        if (ca_bert_for_sequence_classification_create(&c, 0, &m) == CA_OK) ca_module_destroy(m);
        else if (m) abort();                            /* a failed constructor leaves *out NULL */
    }
    ca_scope_release_all();
    return 0;
}
