/* Fuzz target: the tokenizer files, WordPiece and BPE. The first byte picks tokenizer.json (even)
 * or vocab.txt (odd); a loaded tokenizer then tokenizes, decodes and encodes fixed texts (BPE's
 * hard cases among them: added tokens, long runs, emoji, byte fallback). */
#include "tests/fuzz/fuzz_util.h"

#include <caccel/tokenizer.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char path[128];
    fz_write(data[0] & 1 ? "vocab.txt" : "tokenizer.json", data + 1, size - 1, path, sizeof path);
    ca_tokenizer *t = NULL;
    if (ca_tokenizer_load(path, &t) != CA_OK) return 0;
    int64_t *ids = NULL, n = 0, in[16], type[16], mask[16], len = 0;
    static const char *const texts[] = {
        "Hello, world! Un caf\xc3\xa9 tr\xc3\xa8s ##unaffable 123",
        "<s>ab</s> <|endoftext|>x<mask>y  word  \xc2\x85\n\n  \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9 'S",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa                \xe6\x88\x91\xe7\x88\xb1"};
    for (int k = 0; k < 3; k++) {
        if (ca_tokenizer_tokenize(t, texts[k], &ids, &n) != CA_OK) continue;
        char *text = NULL;
        if (ca_tokenizer_decode(t, ids, n, k == 1, &text) == CA_OK) free(text);
        free(ids);
    }
    ca_tokenizer_encode(t, "the quick brown fox", "jumps over", 16, in, type, mask, &len);
    for (int64_t i = 0; i < ca_tokenizer_vocab_size(t) && i < 64; i++) ca_tokenizer_token(t, i);
    ca_tokenizer_destroy(t);
    return 0;
}
