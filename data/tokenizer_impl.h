/* tokenizer_impl.h: the tokenizer object shared by data/tokenizer.c (WordPiece tokenizing),
 * data/tokenizer_load.c (tokenizer.json, vocab.txt), data/tokenizer_bpe.c and
 * data/tokenizer_bpe_load.c (byte-level and SentencePiece-style BPE) and data/fortunes.c. */
#ifndef CACCEL_TOKENIZER_IMPL_H
#define CACCEL_TOKENIZER_IMPL_H

#include <caccel/tokenizer.h>

#include <stddef.h>
#include <stdint.h>

#define CA_TOKEN_COUNT 7

/* A token matched in the raw text before normalisation ([CLS], [SEP], ... in BERT), or, when
 * `normalized`, in the normalised text. The flags are tokenizer.json's (BPE files only). */
typedef struct ca_added_token {
    char *content;
    size_t len;
    int64_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} ca_added_token;

/* The BPE model and its pipeline (tokenizer_bpe.c); NULL in a WordPiece tokenizer. */
typedef struct ca_bpe ca_bpe;

struct ca_tokenizer {
    int64_t n;                 /* vocabulary size; ids are 0..n-1 */
    char **tokens;             /* id -> token, owned */
    int64_t *slots;            /* open-addressing table of ids, -1 = empty */
    uint64_t mask;             /* table size - 1 (a power of two, at least 2n) */
    bool lowercase, strip_accents, handle_chinese_chars, clean_text;
    int64_t max_chars;         /* max_input_chars_per_word */
    char *prefix;              /* continuing_subword_prefix, "##" */
    int64_t special[CA_TOKEN_COUNT];   /* by ca_special_token, -1 = none */
    ca_added_token *added;
    int n_added;
    ca_bpe *bpe;
};

typedef struct ca_cpvec {
    int32_t *v;
    size_t n, cap;
} ca_cpvec;

typedef struct ca_idvec {
    int64_t *v;
    size_t n, cap;
} ca_idvec;

bool ca_idvec_push(ca_idvec *v, int64_t id);
/* The id of token s[0, len), or -1. */
int64_t ca_vocab_find(const ca_tokenizer *t, const char *s, size_t len);
/* Indexes tokens[id] (tokens and slots allocated, slots all -1). */
void ca_vocab_insert(ca_tokenizer *t, int64_t id);
struct json_object;
/* Loads a tokenizer.json whose model.type is "BPE" (root: the parsed file). */
ca_status ca_bpe_load(ca_tokenizer **out, struct json_object *root, const char *path);
/* Frees a BPE model (NULL accepted). */
void ca_bpe_free(ca_bpe *b);
/* Appends the BPE ids of text[0, len) (added tokens recognised, none added by the template). */
ca_status ca_bpe_tokenize_into(const ca_tokenizer *t, const char *text, size_t len,
                               ca_idvec *out);
/* The BPE post-processor's ids around a (and b when not NULL), type ids alongside. */
ca_status ca_bpe_template(const ca_tokenizer *t, const ca_idvec *a, const ca_idvec *b,
                          size_t keep_a, size_t keep_b, ca_idvec *ids, ca_idvec *types);
/* How many ids the template adds (single or pair). */
size_t ca_bpe_template_added(const ca_tokenizer *t, bool pair);
/* The text of ids through the tokenizer.json decoder; malloc'd. */
ca_status ca_bpe_decode(const ca_tokenizer *t, const int64_t *ids, size_t n, bool skip_special,
                        char **text);
/* Appends the ids of text (special tokens recognised, none added) to out. */
ca_status ca_tokenize_into(const ca_tokenizer *t, const char *text, ca_idvec *out);

#endif
