/* tokenizer_impl.h: the tokenizer object shared by data/tokenizer.c (tokenizing),
 * data/tokenizer_load.c (tokenizer.json, vocab.txt) and data/fortunes.c. */
#ifndef CACCEL_TOKENIZER_IMPL_H
#define CACCEL_TOKENIZER_IMPL_H

#include <caccel/tokenizer.h>

#include <stddef.h>
#include <stdint.h>

#define CA_TOKEN_COUNT 5

/* A token matched in the raw text before normalisation ([CLS], [SEP], ... in BERT). */
typedef struct ca_added_token {
    char *content;
    size_t len;
    int64_t id;
} ca_added_token;

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
/* Appends the ids of text (special tokens recognised, none added) to out. */
ca_status ca_tokenize_into(const ca_tokenizer *t, const char *text, ca_idvec *out);

#endif
