/* Fuzz target: the tokenizer files. The first byte picks tokenizer.json (even) or vocab.txt (odd);
 * a loaded tokenizer then tokenizes and encodes a fixed pair of texts. */
#include "tests/fuzz/fuzz_util.h"

#include <caccel/tokenizer.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char path[128];
    fz_write(data[0] & 1 ? "vocab.txt" : "tokenizer.json", data + 1, size - 1, path, sizeof path);
    ca_tokenizer *t = NULL;
    if (ca_tokenizer_load(path, &t) != CA_OK) return 0;
    int64_t *ids = NULL, n = 0, in[16], type[16], mask[16], len = 0;
    if (ca_tokenizer_tokenize(t, "Hello, world! Un café très ##unaffable 123", &ids, &n) == CA_OK) free(ids);
    ca_tokenizer_encode(t, "the quick brown fox", "jumps over", 16, in, type, mask, &len);
    for (int64_t i = 0; i < ca_tokenizer_vocab_size(t) && i < 64; i++) ca_tokenizer_token(t, i);
    ca_tokenizer_destroy(t);
    return 0;
}
