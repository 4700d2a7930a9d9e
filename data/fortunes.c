/* The fortunes dataset: fortune files (Debian's fortunes package) as a labelled text corpus,
 * the collection an entry comes from being its label, tokenized for BERT. */
#include "data/tokenizer_impl.h"
#include "base/file_impl.h"

#include <caccel/log.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

#define FORTUNES_DEBIAN_DIR "/usr/share/games/fortunes"
#define FORTUNES_HINT "install the Debian package fortunes, or set $CACCEL_FORTUNES_DIR"

/* Four topical collections of 580-700 entries each in Debian's fortunes 1:1.99.1. */
static const char *const default_collections[] = {"science", "work", "politics", "men-women"};

const char *const *ca_fortunes_default_collections(int *n) {
    if (n) *n = (int)(sizeof default_collections / sizeof *default_collections);
    return default_collections;
}

void ca_fortunes_free(char **entries, int64_t n) {
    for (int64_t i = 0; entries && i < n; i++) free(entries[i]);
    free(entries);
}

static bool blank(const char *s) {
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r') return false;
    return true;
}

/* Appends entry text[0, len) to the list unless it is blank; the trailing newline is dropped. */
static ca_status push_entry(char ***list, int64_t *n, size_t *cap, const char *text, size_t len,
                            const char *path) {
    while (len > 0 && text[len - 1] == '\n') len--;
    char *e = strndup(text, len);
    if (!e) return ca_error(CA_ERR_NOMEM, "fortunes '%s': out of memory", path);
    if (blank(e)) {
        free(e);
        return CA_OK;
    }
    if ((size_t)*n == *cap) {
        *cap = *cap ? *cap * 2 : 256;
        char **p = realloc(*list, *cap * sizeof *p);
        if (!p) {
            free(e);
            return ca_error(CA_ERR_NOMEM, "fortunes '%s': out of memory", path);
        }
        *list = p;
    }
    (*list)[(*n)++] = e;
    return CA_OK;
}

/* 1-based line of byte `at` in buf, for messages. */
static long line_of(const char *buf, size_t at) {
    long line = 1;
    for (size_t i = 0; i < at; i++) line += buf[i] == '\n';
    return line;
}

static ca_status split_entries(const char *buf, size_t len, const char *path, char ***entries,
                               int64_t *n) {
    utf8proc_ssize_t bad = 0;
    for (size_t i = 0; i < len; i += (size_t)bad) {
        utf8proc_int32_t c;
        bad = utf8proc_iterate((const utf8proc_uint8_t *)buf + i, (utf8proc_ssize_t)(len - i), &c);
        if (bad <= 0)
            return ca_error(CA_ERR_INVALID, "fortunes '%s': line %ld is not valid UTF-8", path,
                            line_of(buf, i));
    }
    size_t cap = 0, start = 0;
    ca_status st = CA_OK;
    for (size_t i = 0; i <= len && st == CA_OK;) {
        const char *nl = i < len ? memchr(buf + i, '\n', len - i) : NULL;
        size_t end = nl ? (size_t)(nl - buf) : len;
        bool sep = end - i == 1 && buf[i] == '%';
        if (sep || end == len) {
            st = push_entry(entries, n, &cap, buf + start, (sep ? i : len) - start, path);
            start = end + 1;
        }
        i = end + 1;
    }
    return st;
}

ca_status ca_fortunes_read(const char *path, char ***entries, int64_t *n) {
    if (!path || !entries || !n) return ca_error(CA_ERR_INVALID, "ca_fortunes_read: NULL argument");
    *entries = NULL;
    *n = 0;
    char *buf = NULL;
    size_t len = 0;
    ca_status st = ca_file_read(path, CA_FILE_FORTUNES, &buf, &len);
    if (st != CA_OK) {
        if (access(path, F_OK) != 0) ca_error_hint(FORTUNES_HINT);
        return st;
    }
    st = split_entries(buf, len, path, entries, n);
    free(buf);
    if (st != CA_OK) {
        ca_fortunes_free(*entries, *n);
        *entries = NULL;
        *n = 0;
    }
    return st;
}

/* ------------------------------------------------------------------ the dataset */

typedef struct {
    int64_t *x, *y;     /* samples: [n, 2, L] and [n] */
    int64_t n, cap, L;
} build_state;

/* Open-addressing set of texts, to drop entries repeated across or within collections. */
typedef struct {
    const char **slot;
    size_t mask;
} text_set;

static uint64_t hash_text(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* Adds s (not copied); false when it was there already. */
static bool set_add(text_set *set, const char *s) {
    for (size_t i = hash_text(s) & set->mask;; i = (i + 1) & set->mask) {
        if (!set->slot[i]) {
            set->slot[i] = s;
            return true;
        }
        if (strcmp(set->slot[i], s) == 0) return false;
    }
}

static ca_status grow(build_state *b) {
    if (b->n < b->cap) return CA_OK;
    int64_t cap = b->cap ? b->cap * 2 : 1024;
    int64_t *x = realloc(b->x, (size_t)(cap * 2 * b->L) * sizeof *x);
    if (x) b->x = x;
    int64_t *y = realloc(b->y, (size_t)cap * sizeof *y);
    if (y) b->y = y;
    if (!x || !y) return ca_error(CA_ERR_NOMEM, "fortunes: out of memory");
    b->cap = cap;
    return CA_OK;
}

static const char *fortunes_dir(const ca_fortunes_opts *o) {
    if (o->dir) return o->dir;
    const char *env = getenv("CACCEL_FORTUNES_DIR");
    return env && *env ? env : FORTUNES_DEBIAN_DIR;
}

/* Tokenizes this split's entries of one collection into b. */
static ca_status add_collection(const ca_tokenizer *tok, const ca_fortunes_opts *o, int label,
                                char **entries, int64_t n, text_set *seen, build_state *b,
                                ca_fortunes_info *info) {
    for (int64_t i = 0; i < n; i++) {
        if (!set_add(seen, entries[i])) {
            info->duplicates++;
            continue;
        }
        if ((i % 5 == 4) == o->train) continue;
        ca_status st = grow(b);
        if (st != CA_OK) return st;
        int64_t *x = b->x + b->n * 2 * b->L, len = 0, total = 0, *all = NULL;
        st = ca_tokenizer_encode(tok, entries[i], NULL, b->L, x, NULL, x + b->L, &len);
        if (st == CA_OK && len == b->L && ca_tokenizer_tokenize(tok, entries[i], &all, &total) ==
                                               CA_OK && total + 2 > b->L)
            info->truncated++;
        free(all);
        if (st != CA_OK)
            return ca_error_context("fortunes '%s/%s' entry %lld", fortunes_dir(o),
                                    o->collections[label], (long long)i);
        b->y[b->n++] = label;
        info->count[label]++;
    }
    return CA_OK;
}

/* Reads every collection (all of them, so duplicates are dropped the same way in both splits). */
static ca_status build(const ca_tokenizer *tok, const ca_fortunes_opts *o, build_state *b,
                       ca_fortunes_info *info) {
    char **lists[CA_FORTUNES_MAX_CLASSES] = {0};
    int64_t counts[CA_FORTUNES_MAX_CLASSES] = {0}, total = 0;
    ca_status st = CA_OK;
    for (int c = 0; c < o->num_collections && st == CA_OK; c++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", fortunes_dir(o), o->collections[c]);
        st = ca_fortunes_read(path, &lists[c], &counts[c]);
        total += counts[c];
    }
    text_set seen = {0};
    size_t size = 16;
    while (size < 2 * (size_t)total + 2) size *= 2;
    if (st == CA_OK && !(seen.slot = calloc(size, sizeof *seen.slot)))
        st = ca_error(CA_ERR_NOMEM, "fortunes: out of memory");
    seen.mask = size - 1;
    for (int c = 0; c < o->num_collections && st == CA_OK; c++)
        st = add_collection(tok, o, c, lists[c], counts[c], &seen, b, info);
    free(seen.slot);
    for (int c = 0; c < o->num_collections; c++) ca_fortunes_free(lists[c], counts[c]);
    return st;
}

ca_status ca_fortunes_open(const ca_tokenizer *tok, const ca_fortunes_opts *opts, ca_dataset **out,
                           ca_fortunes_info *info) {
    if (!tok || !out) return ca_error(CA_ERR_INVALID, "ca_fortunes_open: NULL argument");
    *out = NULL;
    ca_fortunes_opts o = opts ? *opts : (ca_fortunes_opts){.train = true};
    if (!o.collections) o.collections = ca_fortunes_default_collections(&o.num_collections);
    if (o.num_collections < 1 || o.num_collections > CA_FORTUNES_MAX_CLASSES)
        return ca_error(CA_ERR_INVALID, "ca_fortunes_open: %d collections (1 to %d are possible)",
                        o.num_collections, CA_FORTUNES_MAX_CLASSES);
    if (o.max_length == 0) o.max_length = 128;
    if (o.max_length < 2)
        return ca_error(CA_ERR_INVALID, "ca_fortunes_open: max_length %lld is below 2",
                        (long long)o.max_length);
    ca_fortunes_info local;
    if (!info) info = &local;
    memset(info, 0, sizeof *info);
    info->num_classes = o.num_collections;
    for (int c = 0; c < o.num_collections; c++)
        snprintf(info->names[c], sizeof info->names[c], "%s", o.collections[c]);
    build_state b = {.L = o.max_length};
    ca_status st = build(tok, &o, &b, info);
    info->total = b.n;
    if (st == CA_OK && b.n == 0)
        st = ca_error(CA_ERR_INVALID, "fortunes '%s': the %s split of the collections is empty",
                      fortunes_dir(&o), o.train ? "training" : "held-out");
    if (st == CA_OK) {
        ca_sample_spec xs = {.dtype = CA_I64, .ndim = 2, .shape = {2, o.max_length}};
        ca_sample_spec ys = {.dtype = CA_I64, .ndim = 0};
        st = ca_dataset_from_memory(&xs, b.x, &ys, b.y, b.n, out);
    }
    free(b.x);
    free(b.y);
    return st;
}
