/* tokenizer_bpe_impl.h: the BPE model and the pipeline around it (normalisers, pre-tokenizers,
 * decoders, template) as data/tokenizer_bpe_load.c builds them from tokenizer.json and
 * data/tokenizer_bpe.c runs them. */
#ifndef CACCEL_TOKENIZER_BPE_IMPL_H
#define CACCEL_TOKENIZER_BPE_IMPL_H

#include "data/tokenizer_impl.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* The longest text one call encodes (bytes): past it the call fails naming the size. Bounds the
 * memory of one call to a small multiple of it. */
#define CA_BPE_MAX_TEXT ((size_t)64 << 20)

enum { CA_NORM_NFC, CA_NORM_NFD, CA_NORM_NFKC, CA_NORM_NFKD, CA_NORM_PREPEND, CA_NORM_REPLACE };

typedef struct ca_bpe_norm {
    int kind;
    char *pattern, *content;   /* Prepend: content; Replace: pattern -> content (literal) */
} ca_bpe_norm;

enum { CA_PRE_SPLIT, CA_PRE_BYTELEVEL, CA_PRE_METASPACE };
/* tokenizers' SplitDelimiterBehavior. */
enum { CA_SPLIT_REMOVED, CA_SPLIT_ISOLATED, CA_SPLIT_PREVIOUS, CA_SPLIT_NEXT, CA_SPLIT_CONTIGUOUS };
enum { CA_PREPEND_ALWAYS, CA_PREPEND_FIRST, CA_PREPEND_NEVER };

typedef struct ca_bpe_pretok {
    int kind;
    pcre2_code *re;            /* Split, ByteLevel with use_regex */
    int behavior;
    bool invert;
    bool add_prefix_space;     /* ByteLevel */
    int prepend;               /* Metaspace: CA_PREPEND_* */
    bool split;                /* Metaspace */
    char repl[8];              /* Metaspace's replacement character, UTF-8 */
} ca_bpe_pretok;

enum { CA_DEC_BYTELEVEL, CA_DEC_METASPACE, CA_DEC_REPLACE, CA_DEC_BYTEFALLBACK, CA_DEC_FUSE,
       CA_DEC_STRIP };

typedef struct ca_bpe_dec {
    int kind;
    char *pattern, *content;   /* Replace (literal), Strip's content character */
    int start, stop;           /* Strip */
    int prepend;               /* Metaspace */
    char repl[8];              /* Metaspace */
} ca_bpe_dec;

/* One item of TemplateProcessing: a special token (seq -1) or sequence A (0) / B (1). */
typedef struct ca_bpe_item {
    int seq;
    int64_t id;
    int64_t type_id;
} ca_bpe_item;

struct ca_bpe {
    uint64_t *mkey;            /* merges: (left id << 32 | right id), UINT64_MAX = empty */
    int64_t *mrank, *mnew;     /* the merge's rank and the id of the merged token */
    uint64_t mmask;
    bool byte_fallback, ignore_merges, fuse_unk;
    int64_t unk;               /* -1: none (unknown characters are dropped, as tokenizers) */
    int64_t byte_id[256];      /* byte_fallback's <0xNN> tokens, -1 when absent */
    ca_bpe_norm *norm;
    int n_norm;
    ca_bpe_pretok *pre;
    int n_pre;
    ca_bpe_dec *dec;
    int n_dec;
    ca_bpe_item *single, *pair;
    int n_single, n_pair;
    bool added_first[2][256];  /* [normalized][byte]: an added token starts with that byte */
};

/* The merge of (a, b): its rank and new id, or false. */
bool ca_bpe_merge_find(const ca_bpe *b, int64_t left, int64_t right, int64_t *rank, int64_t *id);

#endif
