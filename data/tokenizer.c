/* BERT's WordPiece tokenizer: the vocabulary, the normaliser, the pre-tokenizer, WordPiece and
 * BERT's template, as Hugging Face's `tokenizers` runs them (docs/TEXT.md). Unicode categories,
 * canonical decomposition and lower-casing come from utf8proc; the only hand-written character
 * tables are the short fixed lists the reference defines itself (White_Space, ASCII punctuation,
 * BERT's CJK blocks). Loading tokenizer.json and vocab.txt is in tokenizer_load.c. */
#include "data/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------ growable arrays */

static bool cp_push(ca_cpvec *v, int32_t c) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->v, cap * sizeof *p);
        if (!p) return false;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = c;
    return true;
}

bool ca_idvec_push(ca_idvec *v, int64_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int64_t *p = realloc(v->v, cap * sizeof *p);
        if (!p) return false;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = id;
    return true;
}

/* ------------------------------------------------------------------ vocabulary */

static uint64_t hash_bytes(const char *s, size_t len) {
    uint64_t h = 1469598103934665603ULL;             /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

int64_t ca_vocab_find(const ca_tokenizer *t, const char *s, size_t len) {
    for (uint64_t i = hash_bytes(s, len) & t->mask;; i = (i + 1) & t->mask) {
        int64_t id = t->slots[i];
        if (id < 0) return -1;
        const char *tok = t->tokens[id];
        if (strlen(tok) == len && memcmp(tok, s, len) == 0) return id;
    }
}

/* Maps tokens[id] to id; a token seen before is remapped (a later vocab.txt line wins, as in
 * Hugging Face's loaders). */
void ca_vocab_insert(ca_tokenizer *t, int64_t id) {
    const char *s = t->tokens[id];
    size_t len = strlen(s);
    for (uint64_t i = hash_bytes(s, len) & t->mask;; i = (i + 1) & t->mask) {
        int64_t old = t->slots[i];
        if (old < 0 || strcmp(t->tokens[old], s) == 0) {
            t->slots[i] = id;
            return;
        }
    }
}

/* ------------------------------------------------------------------ character classes */

/* Rust's char::is_whitespace (the Unicode White_Space property), which `tokenizers` uses. */
static bool is_ws(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* What BertNormalizer drops as control: categories Cc, Cf and Co (Cs cannot occur in valid
 * UTF-8), but not \t \n \r. Unassigned code points (Cn) are kept, as `tokenizers` keeps them
 * (its comment says Cn, its tables do not), so they end as [UNK]. */
static bool is_control(int32_t c) {
    if (c == '\t' || c == '\n' || c == '\r') return false;
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CO ||
           k == UTF8PROC_CATEGORY_CS;
}

/* BERT's punctuation: all ASCII non-alphanumeric printables (so $ + < = > ^ ` | ~ too), and
 * Unicode categories P*. */
static bool is_punct(int32_t c) {
    if (c < 128)
        return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
               (c >= 123 && c <= 126);
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* The CJK Unified Ideographs blocks BERT splits into single characters (its own list). */
static bool is_cjk(int32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* ------------------------------------------------------------------ normaliser */

/* Lower-cases c onto out: Unicode's full lower-case mapping (Rust's char::to_lowercase). It
 * differs from the simple mapping (utf8proc_tolower) only for U+0130, which becomes "i\u0307". */
static bool push_lower(ca_cpvec *out, int32_t c, bool lowercase) {
    if (!lowercase) return cp_push(out, c);
    if (c == 0x130) return cp_push(out, 'i') && cp_push(out, 0x307);
    return cp_push(out, utf8proc_tolower(c));
}

/* Accent stripping and lower-casing of one character (in this order, as BertNormalizer). */
static bool push_folded(const ca_tokenizer *t, ca_cpvec *out, int32_t c) {
    if (!t->strip_accents) return push_lower(out, c, t->lowercase);
    utf8proc_int32_t d[32];
    int boundclass = UTF8PROC_BOUNDCLASS_START;
    utf8proc_ssize_t n = utf8proc_decompose_char(c, d, 32, UTF8PROC_DECOMPOSE, &boundclass);
    if (n < 0 || n > 32) return push_lower(out, c, t->lowercase);
    for (utf8proc_ssize_t i = 0; i < n; i++) {
        if (utf8proc_category(d[i]) == UTF8PROC_CATEGORY_MN) continue;
        if (!push_lower(out, d[i], t->lowercase)) return false;
    }
    return true;
}

/* BertNormalizer over code points: clean text, CJK spacing, accents, lower case. */
static bool normalize(const ca_tokenizer *t, const int32_t *in, size_t n, ca_cpvec *out) {
    for (size_t i = 0; i < n; i++) {
        int32_t c = in[i];
        if (t->clean_text) {
            if (c == 0 || c == 0xFFFD || is_control(c)) continue;
            if (is_ws(c)) c = ' ';
        }
        if (t->handle_chinese_chars && is_cjk(c)) {
            if (!cp_push(out, ' ') || !push_folded(t, out, c) || !cp_push(out, ' ')) return false;
            continue;
        }
        if (!push_folded(t, out, c)) return false;
    }
    return true;
}

/* ------------------------------------------------------------------ WordPiece */

/* Greedy longest-match-first over the word's characters; a word with a piece that matches no
 * token, or longer than max_input_chars_per_word, is one [UNK]. buf and key hold 4 bytes per
 * character plus the prefix, off n + 1 offsets. */
static ca_status wordpiece(const ca_tokenizer *t, const int32_t *w, size_t n, ca_idvec *out,
                           char *buf, char *key, size_t *off) {
    int64_t unk = t->special[CA_TOKEN_UNK];
    if ((int64_t)n > t->max_chars)
        return ca_idvec_push(out, unk) ? CA_OK : ca_error(CA_ERR_NOMEM, "tokenizer: out of memory");
    size_t plen = strlen(t->prefix), bytes = 0;
    for (size_t i = 0; i < n; i++) {
        off[i] = bytes;
        bytes += (size_t)utf8proc_encode_char(w[i], (utf8proc_uint8_t *)buf + bytes);
    }
    off[n] = bytes;
    memcpy(key, t->prefix, plen);
    size_t first = out->n, start = 0;
    while (start < n) {
        int64_t id = -1;
        size_t end = n;
        for (; end > start; end--) {
            size_t len = off[end] - off[start];
            if (start == 0) {
                id = ca_vocab_find(t, buf, len);
            } else {
                memcpy(key + plen, buf + off[start], len);
                id = ca_vocab_find(t, key, plen + len);
            }
            if (id >= 0) break;
        }
        if (id < 0) {
            out->n = first;
            return ca_idvec_push(out, unk) ? CA_OK
                                           : ca_error(CA_ERR_NOMEM, "tokenizer: out of memory");
        }
        if (!ca_idvec_push(out, id)) return ca_error(CA_ERR_NOMEM, "tokenizer: out of memory");
        start = end;
    }
    return CA_OK;
}

/* BertPreTokenizer: words end at whitespace; each punctuation character is a word of its own. */
static ca_status pretokenize(const ca_tokenizer *t, const ca_cpvec *s, ca_idvec *out) {
    size_t cap = strlen(t->prefix) + 4 * s->n + 8;
    char *buf = malloc(cap), *key = malloc(cap);
    size_t *off = malloc((s->n + 1) * sizeof *off);
    ca_status st = (buf && key && off) ? CA_OK : ca_error(CA_ERR_NOMEM, "tokenizer: out of memory");
    size_t start = 0;
    for (size_t i = 0; st == CA_OK && i <= s->n; i++) {
        bool end = i == s->n || is_ws(s->v[i]);
        bool punct = !end && is_punct(s->v[i]);
        if (!end && !punct) continue;
        if (i > start) st = wordpiece(t, s->v + start, i - start, out, buf, key, off);
        if (st == CA_OK && punct) st = wordpiece(t, s->v + i, 1, out, buf, key, off);
        start = i + 1;
    }
    free(buf);
    free(key);
    free(off);
    return st;
}

/* Tokenizes text[0, len) (no special tokens in it); base is its offset in the caller's text. */
static ca_status tokenize_plain(const ca_tokenizer *t, const char *text, size_t len, size_t base,
                                ca_idvec *out) {
    ca_cpvec raw = {0}, norm = {0};
    ca_status st = CA_OK;
    for (size_t i = 0; i < len && st == CA_OK;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)text + i,
                                              (utf8proc_ssize_t)(len - i), &c);
        if (k <= 0)
            st = ca_error(CA_ERR_INVALID, "tokenizer: text is not valid UTF-8 at byte %zu",
                          base + i);
        else if (!cp_push(&raw, c))
            st = ca_error(CA_ERR_NOMEM, "tokenizer: out of memory");
        i += k > 0 ? (size_t)k : 0;
    }
    if (st == CA_OK && !normalize(t, raw.v, raw.n, &norm))
        st = ca_error(CA_ERR_NOMEM, "tokenizer: out of memory");
    if (st == CA_OK) st = pretokenize(t, &norm, out);
    free(raw.v);
    free(norm.v);
    return st;
}

/* The leftmost, then longest, special token in text[from, len): its start and index, or false. */
static bool next_special(const ca_tokenizer *t, const char *text, size_t from, size_t len,
                         size_t *at, int *which) {
    for (size_t i = from; i < len; i++) {
        int best = -1;
        for (int k = 0; k < t->n_added; k++) {
            size_t l = t->added[k].len;
            if (l > 0 && l <= len - i && memcmp(text + i, t->added[k].content, l) == 0 &&
                (best < 0 || l > t->added[best].len))
                best = k;
        }
        if (best >= 0) {
            *at = i;
            *which = best;
            return true;
        }
    }
    return false;
}

ca_status ca_tokenize_into(const ca_tokenizer *t, const char *text, ca_idvec *out) {
    if (t->bpe) return ca_bpe_tokenize_into(t, text, strlen(text), out);
    size_t len = strlen(text), pos = 0, at = 0;
    int which = 0;
    while (pos < len) {
        bool found = next_special(t, text, pos, len, &at, &which);
        size_t stop = found ? at : len;
        ca_status st = tokenize_plain(t, text + pos, stop - pos, pos, out);
        if (st != CA_OK) return st;
        if (!found) break;
        if (!ca_idvec_push(out, t->added[which].id))
            return ca_error(CA_ERR_NOMEM, "tokenizer: out of memory");
        pos = at + t->added[which].len;
    }
    return CA_OK;
}

/* ------------------------------------------------------------------ public calls */

int64_t ca_tokenizer_vocab_size(const ca_tokenizer *t) { return t ? t->n : 0; }

int64_t ca_tokenizer_token_id(const ca_tokenizer *t, const char *token) {
    return t && token ? ca_vocab_find(t, token, strlen(token)) : -1;
}

const char *ca_tokenizer_token(const ca_tokenizer *t, int64_t id) {
    return t && id >= 0 && id < t->n ? t->tokens[id] : NULL;
}

int64_t ca_tokenizer_special_id(const ca_tokenizer *t, ca_special_token which) {
    if (!t || (int)which < 0 || (int)which >= CA_TOKEN_COUNT) return -1;
    return t->special[which];
}

ca_status ca_tokenizer_tokenize(const ca_tokenizer *t, const char *text, int64_t **ids,
                                int64_t *n) {
    if (!t || !text || !ids || !n)
        return ca_error(CA_ERR_INVALID, "ca_tokenizer_tokenize: NULL argument");
    *ids = NULL;
    *n = 0;
    ca_idvec v = {0};
    ca_status st = ca_tokenize_into(t, text, &v);
    if (st != CA_OK) {
        free(v.v);
        return st;
    }
    *ids = v.v;
    *n = (int64_t)v.n;
    return CA_OK;
}

/* Lengths that fit `room` tokens: Hugging Face's LongestFirst (the shorter keeps all when it
 * fits in half the room, else both get half and the longer, or the second when equal, the odd
 * one). */
static void truncate_pair(size_t room, size_t *na, size_t *nb) {
    if (*na + *nb <= room) return;
    bool swap = *na > *nb;
    size_t s = swap ? *nb : *na, l;
    if (s > room / 2) {
        s = room / 2;
        l = s + room % 2;
    } else {
        l = room - s;
    }
    *na = swap ? l : s;
    *nb = swap ? s : l;
}

static void put(int64_t *ids, int64_t *types, int64_t *mask, size_t *k, int64_t id, int64_t ty) {
    ids[*k] = id;
    if (types) types[*k] = ty;
    if (mask) mask[*k] = 1;
    (*k)++;
}

/* BPE: the file's template around a (and b), truncated longest-first to max_length, padded with
 * the padding section's token (id 0 when the file names none). */
static ca_status bpe_encode(const ca_tokenizer *t, const char *a, const char *b,
                            int64_t max_length, int64_t *input_ids, int64_t *token_type_ids,
                            int64_t *attention_mask, int64_t *length) {
    size_t added = ca_bpe_template_added(t, b != NULL);
    if (max_length < (int64_t)added)
        return ca_error(CA_ERR_INVALID,
                        "ca_tokenizer_encode: max_length %lld cannot hold the %zu special tokens",
                        (long long)max_length, added);
    ca_idvec va = {0}, vb = {0}, ids = {0}, types = {0};
    ca_status st = ca_tokenize_into(t, a, &va);
    if (st == CA_OK && b) st = ca_tokenize_into(t, b, &vb);
    size_t na = va.n, nb = vb.n, room = (size_t)max_length - added;
    if (b) truncate_pair(room, &na, &nb);
    else if (na > room) na = room;
    if (st == CA_OK) st = ca_bpe_template(t, &va, b ? &vb : NULL, na, nb, &ids, &types);
    if (st == CA_OK) {
        int64_t pad = t->special[CA_TOKEN_PAD] >= 0 ? t->special[CA_TOKEN_PAD] : 0;
        for (size_t k = 0; k < (size_t)max_length; k++) {
            bool tok = k < ids.n;
            input_ids[k] = tok ? ids.v[k] : pad;
            if (token_type_ids) token_type_ids[k] = tok ? types.v[k] : 0;
            if (attention_mask) attention_mask[k] = tok;
        }
        if (length) *length = (int64_t)ids.n;
    }
    free(va.v);
    free(vb.v);
    free(ids.v);
    free(types.v);
    return st;
}

ca_status ca_tokenizer_encode(const ca_tokenizer *t, const char *a, const char *b,
                              int64_t max_length, int64_t *input_ids, int64_t *token_type_ids,
                              int64_t *attention_mask, int64_t *length) {
    if (!t || !a || !input_ids)
        return ca_error(CA_ERR_INVALID, "ca_tokenizer_encode: NULL argument");
    if (t->bpe)
        return bpe_encode(t, a, b, max_length, input_ids, token_type_ids, attention_mask, length);
    int64_t added = b ? 3 : 2;
    if (max_length < added)
        return ca_error(CA_ERR_INVALID,
                        "ca_tokenizer_encode: max_length %lld cannot hold the %lld special tokens",
                        (long long)max_length, (long long)added);
    ca_idvec va = {0}, vb = {0};
    ca_status st = ca_tokenize_into(t, a, &va);
    if (st == CA_OK && b) st = ca_tokenize_into(t, b, &vb);
    if (st == CA_OK) {
        size_t na = va.n, nb = vb.n, room = (size_t)(max_length - added), k = 0;
        if (b)
            truncate_pair(room, &na, &nb);
        else if (na > room)
            na = room;
        put(input_ids, token_type_ids, attention_mask, &k, t->special[CA_TOKEN_CLS], 0);
        for (size_t i = 0; i < na; i++) put(input_ids, token_type_ids, attention_mask, &k, va.v[i], 0);
        put(input_ids, token_type_ids, attention_mask, &k, t->special[CA_TOKEN_SEP], 0);
        for (size_t i = 0; b && i < nb; i++)
            put(input_ids, token_type_ids, attention_mask, &k, vb.v[i], 1);
        if (b) put(input_ids, token_type_ids, attention_mask, &k, t->special[CA_TOKEN_SEP], 1);
        if (length) *length = (int64_t)k;
        for (; k < (size_t)max_length; k++) {
            input_ids[k] = t->special[CA_TOKEN_PAD];
            if (token_type_ids) token_type_ids[k] = 0;
            if (attention_mask) attention_mask[k] = 0;
        }
    }
    free(va.v);
    free(vb.v);
    return st;
}

const char *ca_tokenizer_model(const ca_tokenizer *t) {
    return !t ? NULL : t->bpe ? "BPE" : "WordPiece";
}

/* tokenizers' cleanup of one decoded WordPiece token: punctuation and English contractions glued
 * back to the word before. s is rewritten in place (no replacement lengthens it). */
static void cleanup(char *s) {
    static const char *const from[] = {" .", " ?", " !", " ,", " ' ", " n't", " 'm", " do not",
                                       " 's", " 've", " 're"};
    static const char *const to[] = {".", "?", "!", ",", "'", "n't", "'m", " don't", "'s", "'ve",
                                     "'re"};
    for (size_t r = 0; r < sizeof from / sizeof *from; r++) {
        size_t fl = strlen(from[r]), tl = strlen(to[r]), w = 0;
        for (size_t i = 0; s[i];) {
            if (strncmp(s + i, from[r], fl) == 0) {
                memmove(s + w, to[r], tl);
                w += tl;
                i += fl;
            } else {
                s[w++] = s[i++];
            }
        }
        s[w] = '\0';
    }
}

/* WordPiece's decoder: continuations ("##ing") join the previous token, other tokens follow a
 * space, each then cleaned up as tokenizers does. */
static ca_status wordpiece_decode(const ca_tokenizer *t, const int64_t *ids, size_t n,
                                  bool skip_special, char **text) {
    size_t cap = 1, plen = strlen(t->prefix), k = 0, kept = 0;
    for (size_t i = 0; i < n; i++) cap += strlen(t->tokens[ids[i]]) + 1;
    char *s = malloc(cap);
    if (!s) return ca_error(CA_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) {
        bool special = false;
        for (int a = 0; a < t->n_added && skip_special; a++) special |= t->added[a].id == ids[i];
        if (special) continue;
        const char *tok = t->tokens[ids[i]];
        size_t start = k;
        if (kept > 0 && strncmp(tok, t->prefix, plen) == 0) tok += plen;
        else if (kept > 0) s[k++] = ' ';
        size_t l = strlen(tok);
        memcpy(s + k, tok, l);
        s[k + l] = '\0';
        cleanup(s + start);
        k = start + strlen(s + start);
        kept++;
    }
    s[k] = '\0';
    *text = s;
    return CA_OK;
}

ca_status ca_tokenizer_decode(const ca_tokenizer *t, const int64_t *ids, int64_t n,
                              bool skip_special_tokens, char **text) {
    if (!t || (!ids && n > 0) || n < 0 || !text)
        return ca_error(CA_ERR_INVALID, "ca_tokenizer_decode: NULL argument or negative count");
    *text = NULL;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n)
            return ca_error(CA_ERR_INVALID, "ca_tokenizer_decode: id %lld (at %lld) is not in the "
                            "vocabulary of %lld tokens", (long long)ids[i], (long long)i,
                            (long long)t->n);
    if (t->bpe) return ca_bpe_decode(t, ids, (size_t)n, skip_special_tokens, text);
    return wordpiece_decode(t, ids, (size_t)n, skip_special_tokens, text);
}
