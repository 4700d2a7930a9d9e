/* Loading a BERT tokenizer: Hugging Face's tokenizer.json (the WordPiece model, the BertNormalizer
 * flags, the special tokens and BERT's template) or a plain vocab.txt. Everything else that
 * tokenizer.json can describe is refused by name, so a non-BERT tokenizer never silently gives
 * other ids than Hugging Face. */
#include "data/tokenizer_impl.h"
#include "core/json_impl.h"
#include "base/file_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void ca_tokenizer_options_default(ca_tokenizer_options *o) {
    if (!o) return;
    o->lowercase = true;
    o->strip_accents = -1;
    o->handle_chinese_chars = true;
    o->clean_text = true;
    o->max_input_chars_per_word = 100;
}

void ca_tokenizer_destroy(ca_tokenizer *t) {
    if (!t) return;
    for (int64_t i = 0; t->tokens && i < t->n; i++) free(t->tokens[i]);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->tokens);
    free(t->slots);
    free(t->added);
    free(t->prefix);
    ca_bpe_free(t->bpe);
    free(t);
}

static ca_status read_file(const char *path, char **buf, size_t *len) {
    return ca_file_read(path, CA_FILE_TOKENIZER, buf, len);
}

/* A tokenizer with room for n tokens (tokens zeroed, table empty). */
static ca_tokenizer *alloc_tokenizer(int64_t n) {
    ca_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    uint64_t size = 16;
    while (size < 2 * (uint64_t)n) size *= 2;
    t->n = n;
    t->mask = size - 1;
    t->tokens = calloc((size_t)(n > 0 ? n : 1), sizeof *t->tokens);
    t->slots = malloc(size * sizeof *t->slots);
    t->prefix = strdup("##");
    for (int i = 0; i < CA_TOKEN_COUNT; i++) t->special[i] = -1;
    if (!t->tokens || !t->slots || !t->prefix) {
        ca_tokenizer_destroy(t);
        return NULL;
    }
    memset(t->slots, 0xff, size * sizeof *t->slots);
    return t;
}

static ca_status add_token(ca_tokenizer *t, const char *content, int64_t id, const char *path) {
    ca_added_token *a = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *a);
    if (!a) return ca_error(CA_ERR_NOMEM, "tokenizer '%s': out of memory", path);
    t->added = a;
    if (!(a[t->n_added].content = strdup(content)))
        return ca_error(CA_ERR_NOMEM, "tokenizer '%s': out of memory", path);
    a[t->n_added].len = strlen(content);
    a[t->n_added++].id = id;
    return CA_OK;
}

/* BERT's special tokens, by ca_special_token (BOS and EOS are BPE's). */
static const char *const special_names[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
#define BERT_SPECIALS ((int)(sizeof special_names / sizeof *special_names))

/* ------------------------------------------------------------------ vocab.txt */

static ca_status parse_vocab_txt(ca_tokenizer **out, char *buf, size_t len, const char *path) {
    int64_t n = 0;
    for (size_t i = 0; i < len; i++) n += buf[i] == '\n';
    if (len > 0 && buf[len - 1] != '\n') n++;
    if (n == 0) return ca_error(CA_ERR_INVALID, "vocab '%s': the file is empty", path);
    ca_tokenizer *t = alloc_tokenizer(n);
    if (!t) return ca_error(CA_ERR_NOMEM, "vocab '%s': out of memory", path);
    char *line = buf;
    for (int64_t id = 0; id < n; id++) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        size_t l = strlen(line);
        if (l > 0 && line[l - 1] == '\r') line[--l] = '\0';
        if (!(t->tokens[id] = strdup(line))) {
            ca_tokenizer_destroy(t);
            return ca_error(CA_ERR_NOMEM, "vocab '%s': out of memory", path);
        }
        ca_vocab_insert(t, id);
        line = nl ? nl + 1 : line + l;
    }
    *out = t;
    return CA_OK;
}

static ca_status apply_options(ca_tokenizer *t, const ca_tokenizer_options *o, const char *path) {
    ca_tokenizer_options d;
    ca_tokenizer_options_default(&d);
    if (!o) o = &d;
    t->lowercase = o->lowercase;
    t->strip_accents = o->strip_accents < 0 ? o->lowercase : o->strip_accents != 0;
    t->handle_chinese_chars = o->handle_chinese_chars;
    t->clean_text = o->clean_text;
    t->max_chars = o->max_input_chars_per_word > 0 ? o->max_input_chars_per_word : 100;
    for (int k = 0; k < BERT_SPECIALS; k++) {
        int64_t id = ca_tokenizer_token_id(t, special_names[k]);
        if (id < 0 && k != CA_TOKEN_MASK)
            return ca_error(CA_ERR_INVALID, "vocab '%s': no %s token", path, special_names[k]);
        t->special[k] = id;
        if (id >= 0) {
            ca_status st = add_token(t, special_names[k], id, path);
            if (st != CA_OK) return st;
        }
    }
    return CA_OK;
}

ca_status ca_tokenizer_load_vocab(const char *vocab_txt, const ca_tokenizer_options *o,
                                  ca_tokenizer **out) {
    if (!vocab_txt || !out) return ca_error(CA_ERR_INVALID, "ca_tokenizer_load_vocab: NULL argument");
    *out = NULL;
    char *buf;
    size_t len;
    ca_status st = read_file(vocab_txt, &buf, &len);
    if (st != CA_OK) return st;
    ca_tokenizer *t = NULL;
    st = parse_vocab_txt(&t, buf, len, vocab_txt);
    free(buf);
    if (st == CA_OK) st = apply_options(t, o, vocab_txt);
    if (st != CA_OK) {
        ca_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return CA_OK;
}

/* ------------------------------------------------------------------ tokenizer.json */

static ca_status unsupported(const char *path, const char *field, const char *got,
                             const char *want) {
    return ca_error(CA_ERR_UNSUPPORTED, "tokenizer '%s': %s is %s%s%s; only %s (BERT) is supported",
                    path, field, got ? "'" : "", got ? got : "missing", got ? "'" : "", want);
}

/* model: WordPiece with its vocab object (ids 0..n-1), unk_token, prefix, max chars. */
static ca_status load_model(ca_tokenizer **out, json_object *model, const char *path) {
    const char *type = ca_json_member_str(model, "type");
    if (!type || strcmp(type, "WordPiece") != 0)
        return unsupported(path, "model.type", type, "'WordPiece' or 'BPE'");
    json_object *vocab = ca_json_member(model, "vocab");
    if (!vocab || !json_object_is_type(vocab, json_type_object))
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': model.vocab is missing or not an object",
                        path);
    int64_t n = json_object_object_length(vocab);
    ca_tokenizer *t = alloc_tokenizer(n);
    if (!t) return ca_error(CA_ERR_NOMEM, "tokenizer '%s': out of memory", path);
    ca_status st = CA_OK;
    json_object_object_foreach(vocab, key, val) {
        int64_t id = json_object_is_type(val, json_type_int) ? json_object_get_int64(val) : -1;
        if (id < 0 || id >= n || t->tokens[id]) {
            st = ca_error(CA_ERR_INVALID,
                          "tokenizer '%s': model.vocab['%s'] = %s: ids must be 0..%lld, each once",
                          path, key, json_object_to_json_string(val), (long long)n - 1);
            break;
        }
        if (!(t->tokens[id] = strdup(key))) {
            st = ca_error(CA_ERR_NOMEM, "tokenizer '%s': out of memory", path);
            break;
        }
        ca_vocab_insert(t, id);
    }
    const char *prefix = ca_json_member_str(model, "continuing_subword_prefix");
    if (st == CA_OK && prefix) {
        free(t->prefix);
        if (!(t->prefix = strdup(prefix))) st = ca_error(CA_ERR_NOMEM, "out of memory");
    }
    json_object *mc = ca_json_member(model, "max_input_chars_per_word");
    t->max_chars = mc && json_object_is_type(mc, json_type_int) ? json_object_get_int64(mc) : 100;
    const char *unk = ca_json_member_str(model, "unk_token");
    if (st == CA_OK && (t->special[CA_TOKEN_UNK] = unk ? ca_tokenizer_token_id(t, unk) : -1) < 0)
        st = ca_error(CA_ERR_INVALID, "tokenizer '%s': model.unk_token '%s' is not in model.vocab",
                      path, unk ? unk : "(missing)");
    if (st != CA_OK) {
        ca_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return CA_OK;
}

static ca_status load_normalizer(ca_tokenizer *t, json_object *root, const char *path) {
    json_object *nz = ca_json_member(root, "normalizer");
    const char *type = ca_json_member_str(nz, "type");
    if (!type || strcmp(type, "BertNormalizer") != 0)
        return unsupported(path, "normalizer.type", type, "'BertNormalizer'");
    t->clean_text = ca_json_member_bool(nz, "clean_text", true);
    t->handle_chinese_chars = ca_json_member_bool(nz, "handle_chinese_chars", true);
    t->lowercase = ca_json_member_bool(nz, "lowercase", true);
    t->strip_accents = ca_json_member_bool(nz, "strip_accents", t->lowercase);  /* null: as lowercase */
    const char *pt = ca_json_member_str(ca_json_member(root, "pre_tokenizer"), "type");
    if (!pt || strcmp(pt, "BertPreTokenizer") != 0)
        return unsupported(path, "pre_tokenizer.type", pt, "'BertPreTokenizer'");
    return CA_OK;
}

/* One template item: {"SpecialToken": {"id": s, "type_id": n}} or {"Sequence": {...}}. */
static bool template_item(json_object *list, size_t i, const char *kind, const char **id,
                          int64_t type_id) {
    json_object *it = json_object_array_get_idx(list, i);
    json_object *body = ca_json_member(it, kind);
    json_object *ty = ca_json_member(body, "type_id");
    *id = ca_json_member_str(body, "id");
    return body && *id && ty && json_object_get_int64(ty) == type_id;
}

static int64_t special_ids(json_object *specials, const char *name, const ca_tokenizer *t) {
    json_object *ids = ca_json_member(ca_json_member(specials, name), "ids");
    if (!specials) return ca_tokenizer_token_id(t, name);
    if (!ids || !json_object_is_type(ids, json_type_array) || json_object_array_length(ids) != 1)
        return -1;
    return json_object_get_int64(json_object_array_get_idx(ids, 0));
}

/* BertProcessing's ["[CLS]", 101]: the id, or -1. */
static int64_t pair_id(json_object *pair) {
    json_object *id = json_object_is_type(pair, json_type_array) &&
                              json_object_array_length(pair) == 2
                          ? json_object_array_get_idx(pair, 1)
                          : NULL;
    return json_object_is_type(id, json_type_int) ? json_object_get_int64(id) : -1;
}

/* TemplateProcessing shaped as BERT's ([CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1) or BertProcessing. */
static ca_status load_template(ca_tokenizer *t, json_object *root, const char *path) {
    json_object *pp = ca_json_member(root, "post_processor");
    const char *type = ca_json_member_str(pp, "type");
    if (type && strcmp(type, "BertProcessing") == 0) {
        t->special[CA_TOKEN_CLS] = pair_id(ca_json_member(pp, "cls"));
        t->special[CA_TOKEN_SEP] = pair_id(ca_json_member(pp, "sep"));
    } else if (type && strcmp(type, "TemplateProcessing") == 0) {
        json_object *single = ca_json_member(pp, "single"), *pair = ca_json_member(pp, "pair");
        const char *c0, *a, *s0, *c1, *a1, *s1, *b, *s2;
        bool ok = json_object_is_type(single, json_type_array) &&
                  json_object_array_length(single) == 3 &&
                  json_object_is_type(pair, json_type_array) && json_object_array_length(pair) == 5 &&
                  template_item(single, 0, "SpecialToken", &c0, 0) &&
                  template_item(single, 1, "Sequence", &a, 0) &&
                  template_item(single, 2, "SpecialToken", &s0, 0) &&
                  template_item(pair, 0, "SpecialToken", &c1, 0) &&
                  template_item(pair, 1, "Sequence", &a1, 0) &&
                  template_item(pair, 2, "SpecialToken", &s1, 0) &&
                  template_item(pair, 3, "Sequence", &b, 1) &&
                  template_item(pair, 4, "SpecialToken", &s2, 1) && !strcmp(a, "A") &&
                  !strcmp(a1, "A") && !strcmp(b, "B") && !strcmp(c0, c1) && !strcmp(s0, s1) &&
                  !strcmp(s0, s2);
        if (!ok)
            return ca_error(CA_ERR_UNSUPPORTED,
                            "tokenizer '%s': post_processor is not BERT's template "
                            "([CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1)",
                            path);
        json_object *specials = ca_json_member(pp, "special_tokens");
        t->special[CA_TOKEN_CLS] = special_ids(specials, c0, t);
        t->special[CA_TOKEN_SEP] = special_ids(specials, s0, t);
    } else {
        return unsupported(path, "post_processor.type", type,
                           "'TemplateProcessing' or 'BertProcessing'");
    }
    if (t->special[CA_TOKEN_CLS] < 0 || t->special[CA_TOKEN_CLS] >= t->n ||
        t->special[CA_TOKEN_SEP] < 0 || t->special[CA_TOKEN_SEP] >= t->n)
        return ca_error(CA_ERR_INVALID,
                        "tokenizer '%s': post_processor's [CLS]/[SEP] ids are missing or not in "
                        "model.vocab",
                        path);
    return CA_OK;
}

/* added_tokens: matched in the raw text; BERT's are [PAD] [UNK] [CLS] [SEP] [MASK]. */
static ca_status load_added(ca_tokenizer *t, json_object *root, const char *path) {
    json_object *list = ca_json_member(root, "added_tokens");
    size_t n = list && json_object_is_type(list, json_type_array) ? json_object_array_length(list) : 0;
    for (size_t i = 0; i < n; i++) {
        json_object *a = json_object_array_get_idx(list, i);
        const char *content = ca_json_member_str(a, "content");
        json_object *idv = ca_json_member(a, "id");
        int64_t id = idv ? json_object_get_int64(idv) : -1;
        if (!content || id < 0 || id >= t->n || strcmp(t->tokens[id], content) != 0)
            return ca_error(CA_ERR_INVALID,
                            "tokenizer '%s': added_tokens[%zu] ('%s', id %lld) is not that "
                            "entry of model.vocab",
                            path, i, content ? content : "?", (long long)id);
        if (ca_json_member_bool(a, "normalized", false) || ca_json_member_bool(a, "single_word", false) ||
            ca_json_member_bool(a, "lstrip", false) || ca_json_member_bool(a, "rstrip", false))
            return ca_error(CA_ERR_UNSUPPORTED,
                            "tokenizer '%s': added_tokens[%zu] ('%s') sets normalized, "
                            "single_word, lstrip or rstrip; only plain tokens are supported",
                            path, i, content);
        ca_status st = add_token(t, content, id, path);
        if (st != CA_OK) return st;
    }
    const char *pad = ca_json_member_str(ca_json_member(root, "padding"), "pad_token");
    t->special[CA_TOKEN_PAD] = ca_tokenizer_token_id(t, pad ? pad : "[PAD]");
    t->special[CA_TOKEN_MASK] = ca_tokenizer_token_id(t, "[MASK]");
    if (t->special[CA_TOKEN_PAD] < 0)
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': no padding token ('%s') in model.vocab",
                        path, pad ? pad : "[PAD]");
    return CA_OK;
}

static ca_status parse_json(ca_tokenizer **out, const char *buf, size_t len, const char *path) {
    const char *why;
    size_t where;
    json_object *root = ca_json_parse(buf, len, &why, &where);
    if (!root)
        return ca_error(CA_ERR_INVALID, "tokenizer '%s': not valid JSON: %s at byte %zu", path, why, where);
    ca_tokenizer *t = NULL;
    const char *type = ca_json_member_str(ca_json_member(root, "model"), "type");
    if (type && strcmp(type, "BPE") == 0) {
        ca_status st = ca_bpe_load(out, root, path);
        json_object_put(root);
        return st;
    }
    ca_status st = load_model(&t, ca_json_member(root, "model"), path);
    if (st == CA_OK) st = load_normalizer(t, root, path);
    if (st == CA_OK) st = load_template(t, root, path);
    if (st == CA_OK) st = load_added(t, root, path);
    json_object_put(root);
    if (st != CA_OK) {
        ca_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return CA_OK;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

ca_status ca_tokenizer_load(const char *path, ca_tokenizer **out) {
    if (!path || !out) return ca_error(CA_ERR_INVALID, "ca_tokenizer_load: NULL argument");
    *out = NULL;
    if (is_dir(path)) {
        char file[4096];
        struct stat st;
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        if (stat(file, &st) == 0) return ca_tokenizer_load(file, out);
        snprintf(file, sizeof file, "%s/vocab.txt", path);
        if (stat(file, &st) == 0) return ca_tokenizer_load_vocab(file, NULL, out);
        return ca_error(CA_ERR_NOT_FOUND, "tokenizer: '%s' holds neither tokenizer.json nor "
                        "vocab.txt", path);
    }
    if (!ends_with(path, ".json")) return ca_tokenizer_load_vocab(path, NULL, out);
    char *buf;
    size_t len;
    ca_status st = read_file(path, &buf, &len);
    if (st != CA_OK) return st;
    st = parse_json(out, buf, len, path);
    free(buf);
    return st;
}
