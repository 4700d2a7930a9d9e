/* caccel/tokenizer.h: BERT's WordPiece tokenizer (Hugging Face tokenizer.json or vocab.txt), the
 * byte-level and SentencePiece-style BPE of decoder models (GPT-2, Llama 2/3, Mistral, Qwen2:
 * tokenizer.json with model.type "BPE"), and the fortunes text-classification dataset.
 *
 * The tokenizer gives the ids Hugging Face's `tokenizers` gives for the same tokenizer.json:
 * BertNormalizer (clean text, CJK spacing, NFD accent stripping, lower-casing), BertPreTokenizer
 * (whitespace and punctuation splitting), WordPiece (greedy longest match, "##" continuations,
 * [UNK] for words past max_input_chars_per_word), the special tokens matched in the raw text, and
 * BERT's template ([CLS] A [SEP] / [CLS] A [SEP] B [SEP]) with longest-first truncation and right
 * padding. A BPE tokenizer.json runs its added tokens, normaliser (NFC, Prepend, Replace),
 * pre-tokenizers (ByteLevel, Split with a regex, Metaspace), BPE merges (byte_fallback,
 * ignore_merges), template (BOS) and decoder as tokenizers does; ca_tokenizer_encode then uses the
 * file's template instead of BERT's. docs/TEXT.md describes the details and the known differences.
 *
 * Ownership: a ca_tokenizer is created by ca_tokenizer_load*, owned by the caller and released with
 * ca_tokenizer_destroy. Threading: a loaded tokenizer is immutable; any number of threads may
 * encode with it at once. Errors: every call returns a status; the message (ca_last_error) names
 * the file and what is wrong in it. */
#ifndef CACCEL_TOKENIZER_H
#define CACCEL_TOKENIZER_H

#include <caccel/data.h>

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ca_tokenizer ca_tokenizer;

/* The normaliser and WordPiece settings of a vocab.txt tokenizer (tokenizer.json carries its own). */
typedef struct ca_tokenizer_options {
    bool lowercase;                    /* BERT uncased: true */
    int strip_accents;                 /* -1: as lowercase (BERT's default), 0: keep, 1: strip */
    bool handle_chinese_chars;         /* spaces around CJK ideographs: true */
    bool clean_text;                   /* drop control chars, map whitespace to ' ': true */
    int64_t max_input_chars_per_word;  /* longer words become [UNK]: 100 */
} ca_tokenizer_options;

/* BERT uncased's settings (bert-base-uncased's vocab.txt). */
CA_API void ca_tokenizer_options_default(ca_tokenizer_options *o);

/* Loads a tokenizer from `path`: a tokenizer.json, a vocab.txt (one token per line, id = line
 * number, BERT uncased's settings), or a directory holding either (tokenizer.json first). BERT-style
 * WordPiece files (BertNormalizer, BertPreTokenizer, BERT's template) and BPE files (see above)
 * load; anything else fails with CA_ERR_UNSUPPORTED naming the file and the key. */
CA_API ca_status ca_tokenizer_load(const char *path, ca_tokenizer **out);
/* A vocab.txt with explicit settings (NULL: ca_tokenizer_options_default). */
CA_API ca_status ca_tokenizer_load_vocab(const char *vocab_txt, const ca_tokenizer_options *o,
                                         ca_tokenizer **out);
CA_API void ca_tokenizer_destroy(ca_tokenizer *t);     /* accepts NULL */

CA_API int64_t ca_tokenizer_vocab_size(const ca_tokenizer *t);
/* Id of `token` (exact, e.g. "##ing"), or -1. */
CA_API int64_t ca_tokenizer_token_id(const ca_tokenizer *t, const char *token);
/* The token of id (owned by the tokenizer), or NULL when out of range. */
CA_API const char *ca_tokenizer_token(const ca_tokenizer *t, int64_t id);

typedef enum ca_special_token {
    CA_TOKEN_PAD = 0,
    CA_TOKEN_UNK = 1,
    CA_TOKEN_CLS = 2,
    CA_TOKEN_SEP = 3,
    CA_TOKEN_MASK = 4,
    CA_TOKEN_BOS = 5,      /* BPE: the template's special token before $A (<s>, <|begin_of_text|>) */
    CA_TOKEN_EOS = 6       /* BPE: the template's special token after $A, if any */
} ca_special_token;
/* Id of a special token, or -1 when the tokenizer has none ([MASK] may be absent; a BPE
 * tokenizer has PAD only when its file has a padding section, UNK only with model.unk_token). */
CA_API int64_t ca_tokenizer_special_id(const ca_tokenizer *t, ca_special_token which);

/* The token ids of `text` (UTF-8) without special tokens, truncation or padding. *ids is
 * malloc'd (the caller frees it; NULL when *n is 0). Fails with CA_ERR_INVALID on bad UTF-8,
 * naming the byte offset (Python's tokenizers cannot be given such text either), and, for BPE,
 * on a text over 64 MiB. */
CA_API ca_status ca_tokenizer_tokenize(const ca_tokenizer *t, const char *text, int64_t **ids,
                                       int64_t *n);

/* The text of ids (UTF-8, malloc'd, the caller frees it) as tokenizers' decode gives it: the
 * file's decoder for BPE (ByteLevel, or Metaspace / Replace + ByteFallback + Fuse + Strip), the
 * WordPiece decoder with its cleanup for BERT. skip_special_tokens leaves the special added
 * tokens out. An id outside the vocabulary fails with CA_ERR_INVALID naming it. */
CA_API ca_status ca_tokenizer_decode(const ca_tokenizer *t, const int64_t *ids, int64_t n,
                                     bool skip_special_tokens, char **text);

/* "WordPiece" or "BPE": the model of the loaded tokenizer.json (vocab.txt: WordPiece). */
CA_API const char *ca_tokenizer_model(const ca_tokenizer *t);

/* Encodes text `a` (and `b` when not NULL) as BERT's input of exactly max_length positions:
 * [CLS] a [SEP] (b [SEP]), truncated longest-first to fit, padded on the right with [PAD].
 * A BPE tokenizer puts its template's tokens instead (e.g. <s> a), with the template's type ids,
 * and pads with the padding section's pad_id (0 when the file has none; the mask says where).
 * input_ids gets max_length ids; token_type_ids (0 for [CLS] a [SEP], 1 for b [SEP], 0 for
 * padding) and attention_mask (1 for tokens, 0 for padding) likewise when not NULL; *length (when
 * not NULL) the number of tokens before padding. max_length must be at least 2 (3 with b). */
CA_API ca_status ca_tokenizer_encode(const ca_tokenizer *t, const char *a, const char *b,
                                     int64_t max_length, int64_t *input_ids,
                                     int64_t *token_type_ids, int64_t *attention_mask,
                                     int64_t *length);

/* ------------------------------------------------------------- fortunes */

/* The entries of one fortune file (strfile's format: entries separated by lines holding only
 * '%'), without the trailing newline; blank entries are skipped. *entries is a malloc'd array
 * of malloc'd strings: free them with ca_fortunes_free. Errors name the file (missing, not UTF-8
 * with the line). */
CA_API ca_status ca_fortunes_read(const char *path, char ***entries, int64_t *n);
CA_API void ca_fortunes_free(char **entries, int64_t n);

#define CA_FORTUNES_MAX_CLASSES 16

typedef struct ca_fortunes_opts {
    /* Directory of the fortune files; NULL: $CACCEL_FORTUNES_DIR, else /usr/share/games/fortunes
     * (Debian's fortunes package). */
    const char *dir;
    /* Collections (file names) = classes, label = index; NULL: ca_fortunes_default_collections. */
    const char *const *collections;
    int num_collections;
    bool train;             /* the training split, else the held-out one */
    int64_t max_length;     /* 0: 128 */
} ca_fortunes_opts;

/* What a fortunes dataset holds (filled by ca_fortunes_open when asked). */
typedef struct ca_fortunes_info {
    int num_classes;
    char names[CA_FORTUNES_MAX_CLASSES][64];
    int64_t count[CA_FORTUNES_MAX_CLASSES];       /* entries of each class in this split */
    int64_t total;
    int64_t truncated;      /* entries longer than max_length tokens (cut) */
    int64_t duplicates;     /* entries skipped because an earlier collection holds the same text */
} ca_fortunes_info;

/* The four default collections, of similar size: "science", "work", "politics", "men-women". */
CA_API const char *const *ca_fortunes_default_collections(int *n);

/* A classification dataset over fortune collections: the label of an entry is the index of its
 * collection. Split: within each collection, every fifth entry (index % 5 == 4, in file order) is
 * held out, the rest is training data; an entry whose text already appeared in an earlier
 * collection (or earlier in the same one) is skipped, so no text is in both splits or in two
 * classes. Sample x: i64 [2, max_length], row 0 the input ids and row 1 the attention mask
 * (token type ids are all 0 for one sentence); y: i64 scalar, the label. All entries are
 * tokenized when the dataset is opened; the tokenizer is not kept. info may be NULL. */
CA_API ca_status ca_fortunes_open(const ca_tokenizer *tok, const ca_fortunes_opts *opts,
                                  ca_dataset **out, ca_fortunes_info *info);

#ifdef __cplusplus
}
#endif
#endif
