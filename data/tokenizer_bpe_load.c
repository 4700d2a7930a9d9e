/* Loading a BPE tokenizer.json (GPT-2's byte-level BPE, Llama 3 / Qwen2's Split regex + ByteLevel,
 * Llama 2 / Mistral's SentencePiece-style Metaspace + byte fallback): the model, the added tokens,
 * the normaliser, pre-tokenizer, decoder and post-processor. Whatever else tokenizer.json can say
 * is refused naming the file and the key, so no file silently gives other ids than tokenizers.
 * Regexes are Oniguruma's dialect (what tokenizers compiles); they are translated to PCRE2 where
 * the two differ (\s) and refused where a construct means something else (\h). */
#include "data/tokenizer_bpe_impl.h"
#include "core/json_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOMEM(path) ca_error(CA_ERR_NOMEM, "tokenizer '%s': out of memory", path)

/* GPT-2's pre-tokenizer regex, as tokenizers' ByteLevel holds it. */
static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static ca_status refuse(const char *path, const char *key, const char *what) {
    return ca_error(CA_ERR_UNSUPPORTED, "tokenizer '%s': %s: %s", path, key, what);
}

static ca_status refuse_type(const char *path, const char *key, const char *type,
                             const char *supported) {
    return ca_error(CA_ERR_UNSUPPORTED, "tokenizer '%s': %s.type '%s' is not supported (only %s)",
                    path, key, type ? type : "(missing)", supported);
}

void ca_bpe_free(ca_bpe *b) {
    if (!b) return;
    free(b->mkey);
    free(b->mrank);
    free(b->mnew);
    for (int i = 0; i < b->n_norm; i++) {
        free(b->norm[i].pattern);
        free(b->norm[i].content);
    }
    for (int i = 0; i < b->n_pre; i++) pcre2_code_free(b->pre[i].re);
    for (int i = 0; i < b->n_dec; i++) {
        free(b->dec[i].pattern);
        free(b->dec[i].content);
    }
    free(b->norm);
    free(b->pre);
    free(b->dec);
    free(b->single);
    free(b->pair);
    free(b);
}

/* ------------------------------------------------------------------ vocabulary */

/* Puts token `s` at id, or checks it is already there (an added token repeating model.vocab). */
static ca_status put_token(ca_tokenizer *t, int64_t id, const char *s, const char *path,
                           const char *where) {
    if (id < 0 || id >= t->n)
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': %s: id %lld is out of range", path, where,
                        (long long)id);
    if (t->tokens[id]) {
        if (strcmp(t->tokens[id], s) == 0) return CA_OK;
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': %s ('%s') has id %lld, which is '%s' "
                        "already", path, where, s, (long long)id, t->tokens[id]);
    }
    if (ca_vocab_find(t, s, strlen(s)) >= 0)
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': %s: the token '%s' has two ids", path,
                        where, s);
    if (!(t->tokens[id] = strdup(s))) return NOMEM(path);
    ca_vocab_insert(t, id);
    return CA_OK;
}

static int64_t json_id(json_object *v) {
    return v && json_object_is_type(v, json_type_int) ? json_object_get_int64(v) : -1;
}

/* The number of ids: one past the largest of model.vocab and added_tokens. */
static ca_status count_ids(json_object *vocab, json_object *added, int64_t *n, const char *path) {
    int64_t max = -1;
    json_object_object_foreach(vocab, key, val) {
        int64_t id = json_id(val);
        if (id < 0 || id >= ((int64_t)1 << 31))
            return ca_error(CA_ERR_INVALID, "tokenizer '%s': model.vocab['%s'] = %s is not an id "
                            "(0 .. 2^31-1)", path, key, json_object_to_json_string(val));
        if (id > max) max = id;
    }
    size_t na = json_object_is_type(added, json_type_array) ? json_object_array_length(added) : 0;
    for (size_t i = 0; i < na; i++) {
        int64_t id = json_id(ca_json_member(json_object_array_get_idx(added, i), "id"));
        if (id < 0 || id >= ((int64_t)1 << 31))
            return ca_error(CA_ERR_INVALID, "tokenizer '%s': added_tokens[%zu].id is missing or not "
                            "an id (0 .. 2^31-1)", path, i);
        if (id > max) max = id;
    }
    /* every id 0..n-1 must hold a token (a hole is named later, once the table is filled), so an id far
     * above the entries is refused here instead of sizing the table by it (an id of 2^31 - 1 in a small
     * file would ask for 16 GiB) */
    size_t entries = (size_t)json_object_object_length(vocab) + na;
    if ((uint64_t)(max + 1) > 2 * (uint64_t)entries + 64)
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': id %lld with %zu tokens in model.vocab and "
                        "added_tokens: the ids must be 0 .. %zu, each holding one token", path,
                        (long long)max, entries, entries ? entries - 1 : 0);
    *n = max + 1;
    return CA_OK;
}

static ca_tokenizer *alloc_tokenizer(int64_t n) {
    ca_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    uint64_t size = 16;
    while (size < 2 * (uint64_t)n) size *= 2;
    t->n = n;
    t->mask = size - 1;
    t->tokens = calloc((size_t)(n > 0 ? n : 1), sizeof *t->tokens);
    t->slots = malloc(size * sizeof *t->slots);
    t->bpe = calloc(1, sizeof *t->bpe);
    for (int i = 0; i < CA_TOKEN_COUNT; i++) t->special[i] = -1;
    if (!t->tokens || !t->slots || !t->bpe) {
        ca_tokenizer_destroy(t);
        return NULL;
    }
    memset(t->slots, 0xff, size * sizeof *t->slots);
    return t;
}

static ca_status add_flags(ca_tokenizer *t, json_object *a, int64_t id, const char *content,
                           const char *path) {
    ca_added_token *v = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *v);
    if (!v) return NOMEM(path);
    t->added = v;
    ca_added_token *x = &v[t->n_added];
    if (!(x->content = strdup(content))) return NOMEM(path);
    t->n_added++;
    x->len = strlen(content);
    x->id = id;
    x->special = ca_json_member_bool(a, "special", false);
    x->lstrip = ca_json_member_bool(a, "lstrip", false);
    x->rstrip = ca_json_member_bool(a, "rstrip", false);
    x->single_word = ca_json_member_bool(a, "single_word", false);
    x->normalized = ca_json_member_bool(a, "normalized", !x->special);
    t->bpe->added_first[x->normalized][(unsigned char)content[0]] = true;
    return CA_OK;
}

/* model.vocab and added_tokens into one table of ids 0..n-1, each id holding one token. */
static ca_status load_vocab(ca_tokenizer **out, json_object *root, const char *path) {
    json_object *vocab = ca_json_member(ca_json_member(root, "model"), "vocab");
    json_object *added = ca_json_member(root, "added_tokens");
    if (!vocab || !json_object_is_type(vocab, json_type_object))
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': model.vocab is missing or not an object",
                        path);
    int64_t n;
    ca_status st = count_ids(vocab, added, &n, path);
    if (st != CA_OK) return st;
    ca_tokenizer *t = alloc_tokenizer(n);
    if (!t) return NOMEM(path);
    char where[96];
    json_object_object_foreach(vocab, key, val) {
        if (st != CA_OK) break;
        snprintf(where, sizeof where, "model.vocab['%.60s']", key);
        st = put_token(t, json_id(val), key, path, where);
    }
    size_t na = json_object_is_type(added, json_type_array) ? json_object_array_length(added) : 0;
    for (size_t i = 0; st == CA_OK && i < na; i++) {
        json_object *a = json_object_array_get_idx(added, i);
        const char *content = ca_json_member_str(a, "content");
        int64_t id = json_id(ca_json_member(a, "id"));
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if (!content || !*content)
            st = ca_error(CA_ERR_INVALID, "tokenizer '%s': %s has no content", path, where);
        if (st == CA_OK) st = put_token(t, id, content, path, where);
        if (st == CA_OK) st = add_flags(t, a, id, content, path);
    }
    for (int64_t id = 0; st == CA_OK && id < n; id++)
        if (!t->tokens[id])
            st = ca_error(CA_ERR_INVALID, "tokenizer '%s': no token has id %lld; model.vocab and "
                          "added_tokens must cover the ids 0..%lld", path, (long long)id,
                          (long long)n - 1);
    if (st != CA_OK) {
        ca_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return CA_OK;
}

/* ------------------------------------------------------------------ the model */

static ca_status merge_insert(ca_bpe *b, int64_t left, int64_t right, int64_t rank, int64_t id) {
    uint64_t key = (uint64_t)left << 32 | (uint64_t)right;
    for (uint64_t i = (key * 0x9E3779B97F4A7C15ULL) >> 20 & b->mmask;; i = (i + 1) & b->mmask) {
        if (b->mkey[i] == UINT64_MAX || b->mkey[i] == key) {  /* a repeated pair: the later wins */
            b->mkey[i] = key;
            b->mrank[i] = rank;
            b->mnew[i] = id;
            return CA_OK;
        }
    }
}

/* One merge: "a b" (one space) or ["a", "b"]; both parts and their concatenation in the vocab. */
static ca_status load_merge(ca_tokenizer *t, json_object *m, size_t i, const char *path) {
    const char *a = NULL, *b = NULL;
    char *line = NULL;
    if (json_object_is_type(m, json_type_string)) {
        line = strdup(json_object_get_string(m));
        if (!line) return NOMEM(path);
        char *sp = strchr(line, ' ');
        if (sp && !strchr(sp + 1, ' ')) {
            *sp = '\0';
            a = line;
            b = sp + 1;
        }
    } else if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2) {
        json_object *x = json_object_array_get_idx(m, 0), *y = json_object_array_get_idx(m, 1);
        if (json_object_is_type(x, json_type_string) && json_object_is_type(y, json_type_string)) {
            a = json_object_get_string(x);
            b = json_object_get_string(y);
        }
    }
    ca_status st = CA_OK;
    if (!a || !b) {
        st = ca_error(CA_ERR_INVALID, "tokenizer '%s': model.merges[%zu] is neither \"a b\" nor "
                      "[\"a\", \"b\"]", path, i);
    } else {
        size_t la = strlen(a), lb = strlen(b);
        char *ab = malloc(la + lb + 1);
        if (!ab) {
            free(line);
            return NOMEM(path);
        }
        memcpy(ab, a, la);
        memcpy(ab + la, b, lb + 1);
        int64_t ia = ca_vocab_find(t, a, la), ib = ca_vocab_find(t, b, lb),
                iab = ca_vocab_find(t, ab, la + lb);
        if (ia < 0 || ib < 0 || iab < 0)
            st = ca_error(CA_ERR_INVALID, "tokenizer '%s': model.merges[%zu] ('%s' '%s'): '%s' is "
                          "not in model.vocab", path, i, a, b, ia < 0 ? a : ib < 0 ? b : ab);
        else
            st = merge_insert(t->bpe, ia, ib, (int64_t)i, iab);
        free(ab);
    }
    free(line);
    return st;
}

static ca_status load_merges(ca_tokenizer *t, json_object *model, const char *path) {
    json_object *merges = ca_json_member(model, "merges");
    if (merges && !json_object_is_type(merges, json_type_array))
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': model.merges is not a list", path);
    size_t n = merges ? json_object_array_length(merges) : 0;
    ca_bpe *b = t->bpe;
    uint64_t size = 16;
    while (size < 2 * (uint64_t)n) size *= 2;
    b->mmask = size - 1;
    b->mkey = malloc(size * sizeof *b->mkey);
    b->mrank = malloc(size * sizeof *b->mrank);
    b->mnew = malloc(size * sizeof *b->mnew);
    if (!b->mkey || !b->mrank || !b->mnew) return NOMEM(path);
    memset(b->mkey, 0xff, size * sizeof *b->mkey);
    for (size_t i = 0; i < n; i++) {
        ca_status st = load_merge(t, json_object_array_get_idx(merges, i), i, path);
        if (st != CA_OK) return st;
    }
    return CA_OK;
}

/* A key that must be absent, null, or the neutral value (empty string, false, 0.0). */
static ca_status refuse_set(json_object *model, const char *key, const char *path) {
    json_object *v = ca_json_member(model, key);
    bool neutral = !v || (json_object_is_type(v, json_type_string) && !*json_object_get_string(v)) ||
                   (json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v)) ||
                   (json_object_is_type(v, json_type_double) && json_object_get_double(v) == 0.0);
    if (neutral) return CA_OK;
    char k[64];
    snprintf(k, sizeof k, "model.%s", key);
    return refuse(path, k, "is set; caccel's BPE supports neither subword prefixes/suffixes nor "
                  "BPE-dropout (no tokenizer of GPT-2, Llama or Mistral sets them)");
}

static ca_status load_model(ca_tokenizer *t, json_object *model, const char *path) {
    ca_status st = CA_OK;
    const char *keys[] = {"continuing_subword_prefix", "end_of_word_suffix", "dropout"};
    for (int i = 0; i < 3 && st == CA_OK; i++) st = refuse_set(model, keys[i], path);
    if (st == CA_OK) st = load_merges(t, model, path);
    if (st != CA_OK) return st;
    ca_bpe *b = t->bpe;
    b->byte_fallback = ca_json_member_bool(model, "byte_fallback", false);
    b->ignore_merges = ca_json_member_bool(model, "ignore_merges", false);
    b->fuse_unk = ca_json_member_bool(model, "fuse_unk", false);
    const char *unk = ca_json_member_str(model, "unk_token");
    b->unk = unk ? ca_tokenizer_token_id(t, unk) : -1;
    if (unk && b->unk < 0)
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': model.unk_token '%s' is not in "
                        "model.vocab", path, unk);
    t->special[CA_TOKEN_UNK] = b->unk;
    for (int c = 0; c < 256; c++) {
        char tok[8];
        snprintf(tok, sizeof tok, "<0x%02X>", c);
        b->byte_id[c] = ca_tokenizer_token_id(t, tok);
    }
    return CA_OK;
}

/* ------------------------------------------------------------------ regexes */

/* Whether p (after "(?") is an option group: letters of "imx-", then ':' or ')'. */
static bool option_group(const char *p) {
    size_t n = strspn(p, "imx-");
    return n > 0 && (p[n] == ':' || p[n] == ')');
}

/* Oniguruma's \s: the Unicode White_Space property (25 code points). */
#define ONIG_SPACE "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}" \
                   "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* Whether the '}' at p[end] closes an interval quantifier ({n}, {n,}, {n,m}, {,m}). */
static bool is_interval(const char *p, size_t end) {
    size_t i = end;
    while (i > 0 && ((p[i - 1] >= '0' && p[i - 1] <= '9') || p[i - 1] == ',')) i--;
    if (i == 0 || i == end || p[i - 1] != '{') return false;
    size_t b = i - 1;    /* not \{ nor the brace of \x{..} \o{..} \p{..} \P{..} \u{..} */
    return !(b >= 1 && p[b - 1] == '\\') &&
           !(b >= 2 && p[b - 2] == '\\' && strchr("xopPu", p[b - 1]));
}

/* Oniguruma's pattern as PCRE2 takes it. Both read \p{L}, \p{N}, (?i:...), (?!...), possessive
 * and atomic groups alike; their \s differ: PCRE2's (UCP) also matches U+180E (MONGOLIAN VOWEL
 * SEPARATOR, no longer White_Space since Unicode 6.3), Oniguruma's is exactly White_Space, so \s
 * and \S become that list; Oniguruma's \v is VT alone (PCRE2's: all vertical space), so it
 * becomes \x{0B}; \uHHHH becomes \x{HHHH}; the option (?m) (dot-all in Oniguruma) becomes (?s);
 * ^ and $ match at lines in both (compile's PCRE2_MULTILINE). Refused, *why
 * saying which: \h (a hex digit in Oniguruma, horizontal space in PCRE2), \w and \b (Oniguruma's
 * word characters include combining marks), {n,m}+ (a repeated interval in Oniguruma, possessive
 * in PCRE2), \S inside a class, nested classes. Not translated: Oniguruma's multi-character case
 * folding ((?i)ss also matches "ß"); GPT-2's, Llama 3's and Qwen2's (?i:'s|'t|...) hold no
 * sequence a character folds to. */
static char *onig_to_pcre2(const char *p, const char **why) {
    size_t len = strlen(p), k = 0;
    char *o = malloc(64 * len + 1);
    bool cls = false;
    *why = NULL;
    for (size_t i = 0; o && i < len && !*why; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < len) {
            char d = p[++i];
            const char *rep = d == 's' ? (cls ? ONIG_SPACE : "[" ONIG_SPACE "]")
                              : d == 'S' && !cls ? "[^" ONIG_SPACE "]" : NULL;
            if (d == 'v') rep = "\\x{0B}";     /* Oniguruma's \v is VT alone, PCRE2's a class */
            if (d == 'h' || d == 'H' || d == 'V')
                *why = "\\h, \\H or \\V (\\h is a hex digit in Oniguruma, horizontal space in "
                       "PCRE2)";
            else if (d == 'w' || d == 'W' || ((d == 'b' || d == 'B') && !cls))
                *why = "\\w, \\W, \\b or \\B (Oniguruma's word characters include combining "
                       "marks, PCRE2's do not)";
            else if (d == 'S' && cls) *why = "\\S inside a character class";
            if (d == 'u' && i + 4 < len && strspn(p + i + 1, "0123456789abcdefABCDEF") >= 4) {
                k += (size_t)sprintf(o + k, "\\x{%.4s}", p + i + 1);   /* \uHHHH */
                i += 4;
                continue;
            }
            if (rep) {
                memcpy(o + k, rep, strlen(rep));
                k += strlen(rep);
            } else {
                o[k++] = '\\';
                o[k++] = d;
            }
            continue;
        }
        if (!cls && c == '(' && p[i + 1] == '?' && option_group(p + i + 2)) {
            o[k++] = c;      /* (?m) is dot-all in Oniguruma: PCRE2's (?s) */
            o[k++] = p[++i];
            while (strchr("imx-", p[i + 1])) o[k++] = p[++i] == 'm' ? 's' : p[i];
            continue;
        }
        if (cls && c == '[' && p[i + 1] != ':') *why = "a nested character class";
        if (cls && c == '&' && p[i + 1] == '&') *why = "a class intersection (&&)";
        if (!cls && c == '[') {
            cls = true;
            o[k++] = c;
            if (p[i + 1] == '^') o[k++] = p[++i];
            if (p[i + 1] == ']') o[k++] = p[++i];
            continue;
        }
        if (cls && c == '[') {      /* [:alpha:] */
            const char *e = strstr(p + i, ":]");
            size_t n = e ? (size_t)(e - (p + i)) + 2 : 1;
            memcpy(o + k, p + i, n);
            k += n;
            i += n - 1;
            continue;
        }
        if (cls && c == ']') cls = false;
        if (!cls && c == '}' && p[i + 1] == '+' && is_interval(p, i))
            *why = "an interval followed by + ({n,m}+ repeats the interval in Oniguruma, is "
                   "possessive in PCRE2)";
        o[k++] = c;
    }
    if (o) o[k] = '\0';
    return o;
}

/* Compiles an Oniguruma pattern (or a literal string) with UTF and Unicode properties, JIT when
 * the library has it; errors name the file and the key. */
static ca_status compile(const char *pattern, bool literal, pcre2_code **re, const char *path,
                         const char *key) {
    const char *why = NULL;
    char *pat = literal ? strdup(pattern) : onig_to_pcre2(pattern, &why);
    if (!pat) return NOMEM(path);
    if (why) {
        free(pat);
        return ca_error(CA_ERR_UNSUPPORTED, "tokenizer '%s': %s: the regex '%s' uses %s, which "
                        "caccel does not translate to PCRE2", path, key, pattern, why);
    }
    int err;
    PCRE2_SIZE off;
    /* Oniguruma's ^ and $ (Ruby syntax) match at every line: PCRE2's multiline mode */
    uint32_t opt = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : PCRE2_MULTILINE);
    *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opt, &err, &off, NULL);
    free(pat);
    if (!*re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ca_error(CA_ERR_UNSUPPORTED, "tokenizer '%s': %s: the regex '%s' does not compile "
                        "under PCRE2: %s (at %zu)", path, key, pattern, (const char *)msg,
                        (size_t)off);
    }
    pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE);   /* without JIT the interpreter runs it */
    return CA_OK;
}

/* ------------------------------------------------------------------ normalizer */

static ca_status str_pattern(json_object *o, const char *path, const char *key, char **out) {
    const char *s = ca_json_member_str(ca_json_member(o, "pattern"), "String");
    if (!s) return refuse(path, key, "only a String pattern is supported (not Regex)");
    return (*out = strdup(s)) ? CA_OK : NOMEM(path);
}

static ca_status add_norm(ca_bpe *b, json_object *n, const char *path, const char *key) {
    const char *type = ca_json_member_str(n, "type");
    if (type && strcmp(type, "Sequence") == 0) {
        json_object *list = ca_json_member(n, "normalizers");
        size_t cnt = json_object_is_type(list, json_type_array) ? json_object_array_length(list) : 0;
        char k[128];
        for (size_t i = 0; i < cnt; i++) {
            snprintf(k, sizeof k, "%.90s.normalizers[%zu]", key, i);
            ca_status st = add_norm(b, json_object_array_get_idx(list, i), path, k);
            if (st != CA_OK) return st;
        }
        return CA_OK;
    }
    static const char *const names[] = {"NFC", "NFD", "NFKC", "NFKD", "Prepend", "Replace"};
    int kind = -1;
    for (int i = 0; i < 6; i++)
        if (type && strcmp(type, names[i]) == 0) kind = i;
    if (kind < 0)
        return refuse_type(path, key, type, "NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence");
    ca_bpe_norm *v = realloc(b->norm, (size_t)(b->n_norm + 1) * sizeof *v);
    if (!v) return NOMEM(path);
    b->norm = v;
    ca_bpe_norm *x = &v[b->n_norm++];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    if (kind == CA_NORM_PREPEND || kind == CA_NORM_REPLACE) {
        const char *what = ca_json_member_str(n, kind == CA_NORM_PREPEND ? "prepend" : "content");
        if (!what) return ca_error(CA_ERR_INVALID, "tokenizer '%s': %s has no %s", path, key,
                                   kind == CA_NORM_PREPEND ? "prepend" : "content");
        if (!(x->content = strdup(what))) return NOMEM(path);
    }
    return kind == CA_NORM_REPLACE ? str_pattern(n, path, key, &x->pattern) : CA_OK;
}

/* ------------------------------------------------------------------ pre-tokenizer */

static ca_bpe_pretok *new_pretok(ca_bpe *b, int kind) {
    ca_bpe_pretok *v = realloc(b->pre, (size_t)(b->n_pre + 1) * sizeof *v);
    if (!v) return NULL;
    b->pre = v;
    ca_bpe_pretok *x = &v[b->n_pre++];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    return x;
}

/* The replacement character of Metaspace (one character, as tokenizers requires). */
static ca_status replacement(json_object *o, char *repl, const char *path, const char *key) {
    const char *r = ca_json_member_str(o, "replacement");
    if (!r || !*r || strlen(r) > 4)
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': %s.replacement is missing or not one "
                        "character", path, key);
    strcpy(repl, r);
    return CA_OK;
}

/* Metaspace's prepend_scheme, or the older add_prefix_space (false: never). */
static ca_status prepend_scheme(json_object *o, int *out, const char *path, const char *key) {
    const char *s = ca_json_member_str(o, "prepend_scheme");
    *out = CA_PREPEND_ALWAYS;
    if (!ca_json_member_bool(o, "add_prefix_space", true)) *out = CA_PREPEND_NEVER;
    else if (s && strcmp(s, "first") == 0) *out = CA_PREPEND_FIRST;
    else if (s && strcmp(s, "never") == 0) *out = CA_PREPEND_NEVER;
    else if (s && strcmp(s, "always") != 0)
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': %s.prepend_scheme '%s' is not always, "
                        "first or never", path, key, s);
    return CA_OK;
}

static ca_status split_pretok(ca_bpe_pretok *x, json_object *p, const char *path,
                              const char *key) {
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    const char *beh = ca_json_member_str(p, "behavior");
    x->behavior = -1;
    for (int i = 0; i < 5; i++)
        if (beh && strcmp(beh, names[i]) == 0) x->behavior = i;
    if (x->behavior < 0)
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': %s.behavior '%s' is not Removed, Isolated, "
                        "MergedWithPrevious, MergedWithNext or Contiguous", path, key,
                        beh ? beh : "(missing)");
    x->invert = ca_json_member_bool(p, "invert", false);
    json_object *pat = ca_json_member(p, "pattern");
    const char *rx = ca_json_member_str(pat, "Regex"), *lit = ca_json_member_str(pat, "String");
    char k[128];
    snprintf(k, sizeof k, "%.90s.pattern.%s", key, rx ? "Regex" : "String");
    if (!rx && !lit)
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': %s.pattern is neither {\"Regex\": ...} nor "
                        "{\"String\": ...}", path, key);
    if (lit && !*lit) return refuse(path, k, "an empty String pattern");
    return compile(rx ? rx : lit, !rx, &x->re, path, k);
}

static ca_status add_pretok(ca_bpe *b, json_object *p, const char *path, const char *key) {
    const char *type = ca_json_member_str(p, "type");
    if (type && strcmp(type, "Sequence") == 0) {
        json_object *list = ca_json_member(p, "pretokenizers");
        size_t cnt = json_object_is_type(list, json_type_array) ? json_object_array_length(list) : 0;
        char k[128];
        for (size_t i = 0; i < cnt; i++) {
            snprintf(k, sizeof k, "%.90s.pretokenizers[%zu]", key, i);
            ca_status st = add_pretok(b, json_object_array_get_idx(list, i), path, k);
            if (st != CA_OK) return st;
        }
        return CA_OK;
    }
    int kind = !type ? -1 : !strcmp(type, "Split") ? CA_PRE_SPLIT
                          : !strcmp(type, "ByteLevel") ? CA_PRE_BYTELEVEL
                          : !strcmp(type, "Metaspace") ? CA_PRE_METASPACE : -1;
    if (kind < 0) return refuse_type(path, key, type, "ByteLevel, Split, Metaspace, Sequence");
    ca_bpe_pretok *x = new_pretok(b, kind);
    if (!x) return NOMEM(path);
    if (kind == CA_PRE_SPLIT) return split_pretok(x, p, path, key);
    if (kind == CA_PRE_METASPACE) {
        x->split = ca_json_member_bool(p, "split", true);
        ca_status st = replacement(p, x->repl, path, key);
        return st == CA_OK ? prepend_scheme(p, &x->prepend, path, key) : st;
    }
    x->add_prefix_space = ca_json_member_bool(p, "add_prefix_space", true);
    x->behavior = CA_SPLIT_ISOLATED;
    char k[128];
    snprintf(k, sizeof k, "%.90s (GPT-2's regex)", key);
    return ca_json_member_bool(p, "use_regex", true) ? compile(GPT2_REGEX, false, &x->re, path, k) : CA_OK;
}

/* ------------------------------------------------------------------ decoder */

static ca_status add_dec(ca_bpe *b, json_object *d, const char *path, const char *key) {
    const char *type = ca_json_member_str(d, "type");
    if (type && strcmp(type, "Sequence") == 0) {
        json_object *list = ca_json_member(d, "decoders");
        size_t cnt = json_object_is_type(list, json_type_array) ? json_object_array_length(list) : 0;
        char k[128];
        for (size_t i = 0; i < cnt; i++) {
            snprintf(k, sizeof k, "%.90s.decoders[%zu]", key, i);
            ca_status st = add_dec(b, json_object_array_get_idx(list, i), path, k);
            if (st != CA_OK) return st;
        }
        return CA_OK;
    }
    static const char *const names[] = {"ByteLevel", "Metaspace", "Replace", "ByteFallback",
                                        "Fuse", "Strip"};
    int kind = -1;
    for (int i = 0; i < 6; i++)
        if (type && strcmp(type, names[i]) == 0) kind = i;
    if (kind < 0)
        return refuse_type(path, key, type,
                           "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence");
    ca_bpe_dec *v = realloc(b->dec, (size_t)(b->n_dec + 1) * sizeof *v);
    if (!v) return NOMEM(path);
    b->dec = v;
    ca_bpe_dec *x = &v[b->n_dec++];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    if (kind == CA_DEC_METASPACE) {
        ca_status st = replacement(d, x->repl, path, key);
        return st == CA_OK ? prepend_scheme(d, &x->prepend, path, key) : st;
    }
    if (kind == CA_DEC_REPLACE || kind == CA_DEC_STRIP) {
        const char *c = ca_json_member_str(d, "content");
        if (!c) return ca_error(CA_ERR_INVALID, "tokenizer '%s': %s has no content", path, key);
        if (!(x->content = strdup(c))) return NOMEM(path);
        x->start = (int)json_id(ca_json_member(d, "start"));
        x->stop = (int)json_id(ca_json_member(d, "stop"));
    }
    return kind == CA_DEC_REPLACE ? str_pattern(d, path, key, &x->pattern) : CA_OK;
}

/* ------------------------------------------------------------------ post-processor */

/* One TemplateProcessing list: special tokens (one id each) and sequences A / B. */
static ca_status load_items(json_object *pp, const char *which, ca_bpe_item **out, int *n,
                            const char *path) {
    json_object *list = ca_json_member(pp, which), *specials = ca_json_member(pp, "special_tokens");
    size_t cnt = json_object_is_type(list, json_type_array) ? json_object_array_length(list) : 0;
    *out = calloc(cnt + 1, sizeof **out);
    if (!*out) return NOMEM(path);
    for (size_t i = 0; i < cnt; i++) {
        json_object *it = json_object_array_get_idx(list, i);
        json_object *sp = ca_json_member(it, "SpecialToken"), *sq = ca_json_member(it, "Sequence");
        json_object *body = sp ? sp : sq;
        const char *id = ca_json_member_str(body, "id");
        ca_bpe_item *x = &(*out)[i];
        x->type_id = json_id(ca_json_member(body, "type_id"));
        json_object *ids = ca_json_member(ca_json_member(specials, id ? id : ""), "ids");
        x->seq = sq && id && !strcmp(id, "A") ? 0 : sq && id && !strcmp(id, "B") ? 1 : -1;
        if (sp && id && json_object_is_type(ids, json_type_array) &&
            json_object_array_length(ids) == 1)
            x->id = json_id(json_object_array_get_idx(ids, 0));
        if (!body || !id || x->type_id < 0 || (sq && x->seq < 0) ||
            (sp && (x->id < 0 || x->id >= ((int64_t)1 << 31))))
            return ca_error(CA_ERR_UNSUPPORTED, "tokenizer '%s': post_processor.%s[%zu] is neither "
                            "a sequence A/B nor a special token of one id in special_tokens", path,
                            which, i);
    }
    *n = (int)cnt;
    return CA_OK;
}

static ca_status add_post(ca_tokenizer *t, json_object *pp, const char *path, const char *key) {
    const char *type = ca_json_member_str(pp, "type");
    if (type && strcmp(type, "Sequence") == 0) {
        json_object *list = ca_json_member(pp, "processors");
        size_t cnt = json_object_is_type(list, json_type_array) ? json_object_array_length(list) : 0;
        char k[128];
        for (size_t i = 0; i < cnt; i++) {
            snprintf(k, sizeof k, "%.90s.processors[%zu]", key, i);
            ca_status st = add_post(t, json_object_array_get_idx(list, i), path, k);
            if (st != CA_OK) return st;
        }
        return CA_OK;
    }
    if (type && strcmp(type, "ByteLevel") == 0) return CA_OK;   /* offsets only */
    if (!type || strcmp(type, "TemplateProcessing") != 0)
        return refuse_type(path, key, type, "TemplateProcessing, ByteLevel, Sequence");
    ca_bpe *b = t->bpe;
    if (b->single) return refuse(path, key, "a second TemplateProcessing");
    ca_status st = load_items(pp, "single", &b->single, &b->n_single, path);
    if (st == CA_OK) st = load_items(pp, "pair", &b->pair, &b->n_pair, path);
    for (int i = 0; st == CA_OK && i < b->n_single + b->n_pair; i++) {
        const ca_bpe_item *x = i < b->n_single ? &b->single[i] : &b->pair[i - b->n_single];
        if (x->seq < 0 && x->id >= t->n)
            st = ca_error(CA_ERR_INVALID, "tokenizer '%s': %s: special token id %lld is not in the "
                          "vocabulary", path, key, (long long)x->id);
    }
    return st;
}

/* BOS / EOS: the template's special tokens before and after $A; PAD: the padding section's. */
static void find_specials(ca_tokenizer *t, json_object *root) {
    const ca_bpe *b = t->bpe;
    bool seen_a = false;
    for (int i = 0; i < b->n_single; i++) {
        if (b->single[i].seq == 0) seen_a = true;
        else if (!seen_a && t->special[CA_TOKEN_BOS] < 0) t->special[CA_TOKEN_BOS] = b->single[i].id;
        else if (seen_a) t->special[CA_TOKEN_EOS] = b->single[i].id;
    }
    json_object *pad = ca_json_member(ca_json_member(root, "padding"), "pad_id");
    int64_t id = json_id(pad);
    if (id >= 0 && id < t->n) t->special[CA_TOKEN_PAD] = id;
}

static json_object *present(json_object *root, const char *key) {
    json_object *v = ca_json_member(root, key);
    return v && !json_object_is_type(v, json_type_null) ? v : NULL;
}

ca_status ca_bpe_load(ca_tokenizer **out, json_object *root, const char *path) {
    ca_tokenizer *t = NULL;
    ca_status st = load_vocab(&t, root, path);
    if (st != CA_OK) return st;
    st = load_model(t, ca_json_member(root, "model"), path);
    json_object *v;
    if (st == CA_OK && (v = present(root, "normalizer"))) st = add_norm(t->bpe, v, path, "normalizer");
    if (st == CA_OK && (v = present(root, "pre_tokenizer")))
        st = add_pretok(t->bpe, v, path, "pre_tokenizer");
    if (st == CA_OK && (v = present(root, "decoder"))) st = add_dec(t->bpe, v, path, "decoder");
    if (st == CA_OK && (v = present(root, "post_processor")))
        st = add_post(t, v, path, "post_processor");
    if (st == CA_OK) find_specials(t, root);
    if (st != CA_OK) {
        ca_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return CA_OK;
}
