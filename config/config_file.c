/* Reading Accelerate config files (YAML, or JSON by content) with libyaml into the configuration, with file:line. */
#include "config/config_impl.h"
#include "base/base_impl.h"
#include "base/file_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* One value the file sets, gathered before anything is applied so that a
 * bad file changes nothing. */
typedef struct pending {
    char *key;
    char *value;          /* NULL: null */
    int line;
    char note[48];        /* appended to the origin: " (fp16: true)" */
    bool outside_schema;  /* a key caccel does not know (kept, reported) */
} pending;

/* A node of the file, built from libyaml's events (not its document
 * loader) so that depth and aliases are bounded before anything expands.
 * An alias is the anchored node itself: the tree is a DAG. */
typedef enum ynode_type { YN_SCALAR, YN_SEQUENCE, YN_MAPPING } ynode_type;
typedef struct ynode {
    ynode_type type;
    int line;
    char *text;         /* scalar */
    bool null;          /* a plain null, ~ or nothing */
    char *anchor;
    size_t *kids;       /* sequence: items; mapping: key, value, key, value, ... */
    size_t nkids, cap;
    size_t weight;      /* values once aliases are expanded (saturating) */
    int height;         /* levels, this one included, aliases expanded */
} ynode;

typedef struct loader {
    const char *path;
    ynode *nodes;
    size_t nnodes, capnodes;
    ca_strmap anchors;
    size_t alias_values;
    pending *items;
    size_t n, cap;
    /* unknown top-level keys, reported together */
    char unknown[1536];
    size_t unknown_len;
    int nunknown;
} loader;

static ca_status nomem(void) { return ca_error(CA_ERR_NOMEM, "out of memory reading a config file"); }

static int line_of(const ynode *n) { return n ? n->line : 0; }
static ynode *node(loader *L, size_t i) { return &L->nodes[i]; }

/* Scalars are text; YAML 1.1's yes/no/on/off are read by each key's type,
 * never turned into booleans here. Only a plain null/~/empty is null. */
static bool scalar_is_null(const ynode *n) { return n->type == YN_SCALAR && n->null; }
static const char *scalar_text(const ynode *n) { return n->text; }

static ca_status add(loader *L, const char *key, const char *value, int line, const char *note, bool outside) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 32;
        pending *ni = realloc(L->items, cap * sizeof *ni);
        if (!ni) return nomem();
        L->items = ni;
        L->cap = cap;
    }
    pending *p = &L->items[L->n];
    memset(p, 0, sizeof *p);
    p->key = strdup(key);
    p->value = value ? strdup(value) : NULL;
    if (!p->key || (value && !p->value)) {
        free(p->key);
        free(p->value);
        return nomem();
    }
    p->line = line;
    p->outside_schema = outside;
    if (note) snprintf(p->note, sizeof p->note, "%s", note);
    L->n++;
    return CA_OK;
}

/* A sequence as ["a", "b"] (JSON-style quoting), the stored form of lists. */
static ca_status encode_list(loader *L, const ynode *seq, const char *key, char **out) {
    size_t cap = 64, len = 0;
    char *buf = malloc(cap);
    if (!buf) return nomem();
    buf[len++] = '[';
    bool first = true;
    for (size_t it = 0; it < seq->nkids; it++) {
        const ynode *n = node(L, seq->kids[it]);
        if (n->type != YN_SCALAR) {
            free(buf);
            return ca_error(CA_ERR_CONFIG, "%s:%d: key '%s': a list may only hold plain values", L->path,
                            line_of(n), key);
        }
        bool null = scalar_is_null(n);
        const char *t = null ? "null" : scalar_text(n);
        size_t need = len + 2 * strlen(t) + 8;
        if (need > cap) {
            while (need > cap) cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); return nomem(); }
            buf = nb;
        }
        if (!first) { buf[len++] = ','; buf[len++] = ' '; }
        first = false;
        if (!null) buf[len++] = '"';
        for (const char *p = t; *p; p++) {
            if (!null && (*p == '"' || *p == '\\')) buf[len++] = '\\';
            buf[len++] = *p;
        }
        if (!null) buf[len++] = '"';
    }
    buf[len++] = ']';
    buf[len] = '\0';
    *out = buf;
    return CA_OK;
}

static ca_status gather_node(loader *L, const char *key, const ynode *val, int line, bool outside);

/* A mapping below `prefix`: each entry becomes the dotted key prefix.sub. */
static ca_status gather_mapping(loader *L, const char *prefix, const ynode *map, bool outside) {
    for (size_t i = 0; i + 1 < map->nkids; i += 2) {
        const ynode *k = node(L, map->kids[i]), *v = node(L, map->kids[i + 1]);
        if (k->type != YN_SCALAR)
            return ca_error(CA_ERR_CONFIG, "%s:%d: keys under '%s' must be plain names", L->path, line_of(k),
                            prefix);
        /* as long as the names are: a key is never cut */
        size_t n = strlen(prefix) + strlen(scalar_text(k)) + 2;
        char *full = malloc(n);
        if (!full) return nomem();
        snprintf(full, n, "%s.%s", prefix, scalar_text(k));
        const ca_key_def *d = ca_config_key_find(full);
        ca_status s = gather_node(L, full, v, line_of(k), outside || !d);
        free(full);
        if (s != CA_OK) return s;
    }
    return CA_OK;
}

static ca_status gather_node(loader *L, const char *key, const ynode *val, int line, bool outside) {
    const ca_key_def *d = ca_config_key_find(key);
    char allowed[512];
    switch (val->type) {
    case YN_SCALAR:
        if (d && d->type == CA_KT_MAP && !scalar_is_null(val))
            return ca_error(CA_ERR_CONFIG, "%s:%d: key '%s' is a section and needs a mapping of keys, not '%s'",
                            L->path, line, key, scalar_text(val));
        return add(L, key, scalar_is_null(val) ? NULL : scalar_text(val), line, NULL, outside);
    case YN_SEQUENCE: {
        if (d && d->type != CA_KT_LIST) {
            ca_config_describe_allowed(d, allowed, sizeof allowed);
            return ca_error(CA_ERR_CONFIG, "%s:%d: key '%s' takes one value, not a list (allowed: %s)", L->path, line,
                            key, allowed);
        }
        char *text = NULL;
        ca_status s = encode_list(L, val, key, &text);
        if (s != CA_OK) return s;
        s = add(L, key, text, line, NULL, outside);
        free(text);
        return s;
    }
    case YN_MAPPING:
        if (d && d->type != CA_KT_MAP) {
            ca_config_describe_allowed(d, allowed, sizeof allowed);
            return ca_error(CA_ERR_CONFIG, "%s:%d: key '%s' takes one value, not a mapping (allowed: %s)", L->path,
                            line, key, allowed);
        }
        if (d) {
            /* the section itself: present (maybe empty) at this line */
            ca_status s = add(L, key, "{}", line, NULL, false);
            if (s != CA_OK) return s;
        }
        return gather_mapping(L, key, val, outside);
    }
    return add(L, key, NULL, line, NULL, outside);
}

static void note_unknown(loader *L, const char *key, int line, const char *why) {
    char hint[160];
    const char *near = ca_config_closest_key(key, NULL);
    if (why)
        snprintf(hint, sizeof hint, ", %s", why);
    else if (near)
        snprintf(hint, sizeof hint, ", did you mean '%s'?", near);
    else
        hint[0] = '\0';
    int n = snprintf(L->unknown + L->unknown_len, sizeof L->unknown - L->unknown_len, "%s'%s' (line %d%s)",
                     L->nunknown ? ", " : "", key, line, hint);
    if (n > 0) {
        L->unknown_len += (size_t)n;
        if (L->unknown_len >= sizeof L->unknown) L->unknown_len = sizeof L->unknown - 1;
    }
    L->nunknown++;
}

/* Reads the file: a regular one of at most CA_FILE_MAX_CONFIG bytes, refused before it is read. */
static ca_status read_all(const char *path, char **out, size_t *len) {
    ca_status s = ca_file_read(path, CA_FILE_CONFIG, out, len);
    if (s == CA_ERR_CONFIG)
        ca_error_hint("an Accelerate config file is a few hundred bytes; is '%s' the right file?", path);
    return s;
}

/* JSON is read by the same YAML parser (its flow syntax is JSON's). JSON
 * allows tabs between tokens where YAML does not; inside JSON strings a raw
 * tab is invalid anyway, so every tab can become a space. */
static bool looks_like_json(const char *path, const char *text) {
    size_t pl = strlen(path);
    if (pl >= 5 && strcmp(path + pl - 5, ".json") == 0) return true;
    const char *p = text;
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
    return *p == '{';
}

static const ynode *top_value(loader *L, const ynode *root, const char *key, int *line) {
    for (size_t i = 0; i + 1 < root->nkids; i += 2) {
        const ynode *k = node(L, root->kids[i]);
        if (k->type == YN_SCALAR && strcmp(scalar_text(k), key) == 0) {
            if (line) *line = line_of(k);
            return node(L, root->kids[i + 1]);
        }
    }
    return NULL;
}

/* Which Accelerate class reads this file (sagemaker or cluster) and whether unknown keys are
 * allowed are known before any key is judged. */
static bool unknown_allowed(ca_config *c, loader *L, const ynode *root) {
    bool allow = ca_config_unknown_allowed(c), b;
    const ynode *au = top_value(L, root, "allow_unknown_keys", NULL);
    /* The file's own switch counts unless a higher layer already decided. */
    if (au && au->type == YN_SCALAR && ca_config_parse_bool(scalar_text(au), &b) &&
        ca_config_source_of(c, "allow_unknown_keys") <= CA_SRC_FILE)
        allow = b;
    return allow;
}

/* Every top-level key into L's pending list; unknown ones are noted, and an error unless allowed. */
static ca_status gather_keys(loader *L, const ynode *root, bool sagemaker, bool allow) {
    for (size_t i = 0; i + 1 < root->nkids; i += 2) {
        const ynode *k = node(L, root->kids[i]), *v = node(L, root->kids[i + 1]);
        if (k->type != YN_SCALAR)
            return ca_error(CA_ERR_CONFIG, "%s:%d: keys must be plain names", L->path, line_of(k));
        const char *name = scalar_text(k);
        const ca_key_def *d = strchr(name, '.') ? NULL : ca_config_key_find(name);
        unsigned cls = sagemaker ? CA_KF_SAGEMAKER : CA_KF_CLUSTER;
        bool known = d && (d->flags & cls);
        if (!known)
            note_unknown(L, name, line_of(k),
                         d ? (sagemaker ? "not a key of AMAZON_SAGEMAKER files" : "only in AMAZON_SAGEMAKER files")
                           : NULL);
        if (known || allow) {
            ca_status s = gather_node(L, name, v, line_of(k), !known);
            if (s != CA_OK) return s;
        }
    }
    if (L->nunknown && !allow) {
        ca_error(CA_ERR_CONFIG, "%s: unknown key%s %s", L->path, L->nunknown > 1 ? "s" : "", L->unknown);
        ca_error_hint("fix or remove %s; if the file comes from a newer Accelerate, set CACCEL_ALLOW_UNKNOWN_KEYS=1 "
                      "or pass --allow_unknown_keys to keep them as warnings",
                      L->nunknown > 1 ? "them" : "it");
        return CA_ERR_CONFIG;
    }
    if (L->nunknown)
        CA_LOG_W("%s: unknown key%s kept and ignored (unknown keys are allowed): %s", L->path,
                 L->nunknown > 1 ? "s" : "", L->unknown);
    return CA_OK;
}

/* Accelerate requires distributed_type, and it must suit the compute environment. */
static ca_status check_distributed_type(loader *L, const ynode *dt, int dt_line, bool sagemaker, int ce_line) {
    if (!dt) {
        char allowed[768];
        ca_config_describe_allowed(ca_config_key_find("distributed_type"), allowed, sizeof allowed);
        ca_error(CA_ERR_CONFIG, "%s: a `distributed_type` must be specified in the config file (allowed: %s)",
                 L->path, allowed);
        ca_error_hint("add `distributed_type: NO` for a single process (Accelerate requires the key too)");
        return CA_ERR_CONFIG;
    }
    if (dt->type == YN_SCALAR && !scalar_is_null(dt) &&
        !ca_config_dist_allowed(sagemaker ? "AMAZON_SAGEMAKER" : "LOCAL_MACHINE", scalar_text(dt)))
        return ca_error(CA_ERR_CONFIG, "%s:%d: distributed_type '%s' needs compute_environment %s (%s:%d says %s)",
                        L->path, dt_line, scalar_text(dt), sagemaker ? "LOCAL_MACHINE" : "AMAZON_SAGEMAKER",
                        L->path, ce_line ? ce_line : dt_line,
                        sagemaker ? "AMAZON_SAGEMAKER" : "LOCAL_MACHINE (the default)");
    return CA_OK;
}

/* Accelerate's own migrations and implied values (config_args.py). */
static ca_status migrate(loader *L, const ynode *root, const ynode *dt, int dt_line) {
    int line = 0;
    bool b;
    ca_status s = CA_OK;
    const ynode *fp16 = top_value(L, root, "fp16", &line);
    if (fp16 && !top_value(L, root, "mixed_precision", NULL) && fp16->type == YN_SCALAR &&
        !scalar_is_null(fp16) && ca_config_parse_bool(scalar_text(fp16), &b) && b)
        s = add(L, "mixed_precision", "fp16", line, " (fp16: true)", false);
    const ynode *dyn = top_value(L, root, "dynamo_backend", &line);
    if (s == CA_OK && dyn && dyn->type == YN_SCALAR && !scalar_is_null(dyn)) {
        const ynode *dc = top_value(L, root, "dynamo_config", NULL);
        bool has_new = false;
        for (size_t i = 0; dc && dc->type == YN_MAPPING && i + 1 < dc->nkids; i += 2) {
            const ynode *k = node(L, dc->kids[i]);
            if (k->type == YN_SCALAR && strcmp(scalar_text(k), "dynamo_backend") == 0) has_new = true;
        }
        if (!has_new) s = add(L, "dynamo_config.dynamo_backend", scalar_text(dyn), line, " (dynamo_backend)", false);
    }
    if (s == CA_OK && !top_value(L, root, "num_processes", NULL) && dt->type == YN_SCALAR && !scalar_is_null(dt) &&
        strcmp(scalar_text(dt), "NO") == 0)
        s = add(L, "num_processes", "1", dt_line, " (distributed_type: NO)", false);
    return s;
}

static bool is_legacy(const pending *p) { return strcmp(p->key, "fp16") == 0 || strcmp(p->key, "dynamo_backend") == 0; }

/* The value `p` sets for key `d`, as stored (NULL when the check refuses it: reported later). */
static char *stored(const ca_key_def *d, const pending *p) {
    char *canon = NULL;
    bool null = false;
    if (ca_config_check_value(d, p->key, p->value, "", &canon, &null) != CA_OK) {
        ca_clear_error();
        return NULL;
    }
    return null ? strdup("null") : canon;
}

/* Both spellings of a key in one file (parallelism_config_tp_size and tp_size) must say the same. */
static ca_status check_spellings(const loader *L) {
    for (size_t i = 0; i < L->n; i++) {
        const pending *p = &L->items[i];
        const ca_key_def *d = ca_config_key_find(p->key);
        if (!d || strcmp(d->name, p->key) == 0) continue;   /* only the other spelling looks for its twin */
        for (size_t j = 0; j < L->n; j++) {
            const pending *q = &L->items[j];
            if (j == i || ca_config_key_find(q->key) != d) continue;
            char *a = stored(d, p), *b = stored(d, q);
            bool same = a && b && strcmp(a, b) == 0;
            free(a);
            free(b);
            if (same) continue;
            ca_error(CA_ERR_CONFIG, "%s:%d: '%s' = %s and line %d: '%s' = %s are the same key (%s) with different "
                     "values", L->path, p->line, p->key, p->value ? p->value : "null", q->line, q->key,
                     q->value ? q->value : "null", d->name);
            ca_error_hint("keep one of them (Accelerate reads only %s)", d->name);
            return CA_ERR_CONFIG;
        }
    }
    return CA_OK;
}

/* Validates everything, then applies: a bad file leaves the config as it was. */
static ca_status apply(ca_config *c, loader *L) {
    char origin[4200];
    ca_status cs = check_spellings(L);
    if (cs != CA_OK) return cs;
    for (size_t i = 0; i < L->n; i++) {
        pending *p = &L->items[i];
        if (p->outside_schema || is_legacy(p)) continue;
        snprintf(origin, sizeof origin, "%s:%d", L->path, p->line);
        ca_status s = ca_config_check(c, p->key, p->value, origin);
        if (s != CA_OK) return s;
    }
    /* allow_unknown_keys first: the keys outside the schema below need it. */
    ca_config_batch_begin(c);
    ca_status s = CA_OK;
    for (int pass = 0; pass < 2 && s == CA_OK; pass++) {
        for (size_t i = 0; i < L->n && s == CA_OK; i++) {
            pending *p = &L->items[i];
            /* legacy keys were migrated by Accelerate's rules */
            if ((pass == 0) != (strcmp(p->key, "allow_unknown_keys") == 0) || is_legacy(p)) continue;
            snprintf(origin, sizeof origin, "%s:%d%s", L->path, p->line, p->note);
            /* unknown top-level keys were reported already, all together */
            bool top_unknown = p->outside_schema && !ca_config_section_of(p->key);
            s = top_unknown ? ca_config_set_quiet(c, p->key, p->value, CA_SRC_FILE, origin)
                            : ca_config_set(c, p->key, p->value, CA_SRC_FILE, origin);
        }
    }
    ca_status e = ca_config_batch_end(c);
    if (s != CA_OK) return s;
    if (e != CA_OK) return e;
    return ca_config_set_file(c, L->path);
}

static ca_status process(ca_config *c, loader *L, const ynode *root) {
    if (root->type != YN_MAPPING)
        return ca_error(CA_ERR_CONFIG, "%s:%d: expected a mapping of keys (key: value) at the top level", L->path,
                        line_of(root));
    int ce_line = 0, dt_line = 0;
    const ynode *ce = top_value(L, root, "compute_environment", &ce_line);
    bool sagemaker = ce && ce->type == YN_SCALAR && strcmp(scalar_text(ce), "AMAZON_SAGEMAKER") == 0;
    ca_status s = gather_keys(L, root, sagemaker, unknown_allowed(c, L, root));
    const ynode *dt = top_value(L, root, "distributed_type", &dt_line);
    if (s == CA_OK) s = check_distributed_type(L, dt, dt_line, sagemaker, ce_line);
    if (s == CA_OK) s = migrate(L, root, dt, dt_line);
    return s == CA_OK ? apply(c, L) : s;
}

/* ------------------------------------------------------------------ building the tree */

#define WEIGHT_CAP ((size_t)1 << 40)

static ca_status new_node(loader *L, ynode_type type, const yaml_event_t *ev, size_t *out) {
    if (L->nnodes == L->capnodes) {
        size_t cap = L->capnodes ? L->capnodes * 2 : 64;
        ynode *nn = realloc(L->nodes, cap * sizeof *nn);
        if (!nn) return nomem();
        L->nodes = nn;
        L->capnodes = cap;
    }
    ynode *n = &L->nodes[L->nnodes];
    memset(n, 0, sizeof *n);
    n->type = type;
    n->line = (int)ev->start_mark.line + 1;
    n->weight = 1;
    n->height = type == YN_SCALAR ? 0 : 1;   /* collections that open below */
    const yaml_char_t *anchor = type == YN_SCALAR     ? ev->data.scalar.anchor
                                : type == YN_SEQUENCE ? ev->data.sequence_start.anchor
                                                      : ev->data.mapping_start.anchor;
    if (anchor && !(n->anchor = strdup((const char *)anchor))) return nomem();
    if (type == YN_SCALAR) {
        const char *tag = (const char *)ev->data.scalar.tag;
        n->text = strdup((const char *)ev->data.scalar.value);
        if (!n->text) { free(n->anchor); return nomem(); }
        n->null = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
                  (!tag || strcmp(tag, "!") == 0 || strcmp(tag, YAML_STR_TAG) == 0 ||
                   strcmp(tag, YAML_NULL_TAG) == 0) &&
                  ca_config_is_null_text(n->text);
    }
    *out = L->nnodes++;
    return CA_OK;
}

static ca_status add_kid(loader *L, size_t parent, size_t kid) {
    ynode *p = node(L, parent);
    if (p->nkids == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 8;
        size_t *nk = realloc(p->kids, cap * sizeof *nk);
        if (!nk) return nomem();
        p->kids = nk;
        p->cap = cap;
    }
    p->kids[p->nkids++] = kid;
    return CA_OK;
}

/* A collection is complete: its size and height with aliases expanded, so
 * that an alias to it is judged without expanding it. */
static void close_node(loader *L, size_t i) {
    ynode *n = node(L, i);
    for (size_t k = 0; k < n->nkids; k++) {
        const ynode *kid = node(L, n->kids[k]);
        n->weight = n->weight + kid->weight < WEIGHT_CAP ? n->weight + kid->weight : WEIGHT_CAP;
        if (kid->height + 1 > n->height) n->height = kid->height + 1;
    }
}

static ca_status too_deep(loader *L, int line) {
    ca_error(CA_ERR_CONFIG, "%s:%d: nesting deeper than %d levels, the limit for a config file", L->path, line,
             CA_CONFIG_MAX_DEPTH);
    ca_error_hint("Accelerate's files nest two levels (a section and its keys)");
    return CA_ERR_CONFIG;
}

/* *alias: the node an alias names, checked against the limits. */
static ca_status resolve_alias(loader *L, const yaml_event_t *ev, int depth, size_t *out) {
    int line = (int)ev->start_mark.line + 1;
    const char *name = (const char *)ev->data.alias.anchor;
    if (!ca_strmap_get(&L->anchors, name, out))
        return ca_error(CA_ERR_CONFIG, "%s:%d: alias '*%s' names no anchor defined before it", L->path, line, name);
    const ynode *t = node(L, *out);
    if (depth + t->height > CA_CONFIG_MAX_DEPTH) return too_deep(L, line);
    L->alias_values += t->weight;
    if (L->alias_values > CA_CONFIG_MAX_ALIAS_VALUES) {
        ca_error(CA_ERR_CONFIG, "%s:%d: aliases expand to more than %d values, the limit for a config file", L->path,
                 line, CA_CONFIG_MAX_ALIAS_VALUES);
        ca_error_hint("write the values out instead of repeating them through aliases (*%s)", name);
        return CA_ERR_CONFIG;
    }
    return CA_OK;
}

/* libyaml's reader (bad UTF-8, control characters) reports a byte offset and leaves the marks at the
 * start of the file: the line is counted from the offset instead. */
static ca_status syntax_error(loader *L, const yaml_parser_t *p, const char *text, size_t len, bool json) {
    const char *what = json ? "JSON" : "YAML";
    if (p->error == YAML_MEMORY_ERROR) return nomem();
    if (p->error == YAML_READER_ERROR) {
        size_t line = 1;
        for (size_t i = 0; i < p->problem_offset && i < len; i++) line += text[i] == '\n';
        return ca_error(CA_ERR_CONFIG, "%s:%zu: %s syntax error: %s (byte %zu of the file)", L->path, line, what,
                        p->problem ? p->problem : "?", p->problem_offset + 1);
    }
    if (p->context)
        return ca_error(CA_ERR_CONFIG, "%s:%zu: %s syntax error: %s %s (line %zu)", L->path, p->problem_mark.line + 1,
                        what, p->problem ? p->problem : "?", p->context, p->context_mark.line + 1);
    return ca_error(CA_ERR_CONFIG, "%s:%zu: %s syntax error: %s", L->path, p->problem_mark.line + 1, what,
                    p->problem ? p->problem : "?");
}

typedef struct builder {
    size_t stack[CA_CONFIG_MAX_DEPTH];
    int depth;
    int docs;
    bool has_root, done;
    size_t root;
} builder;

static ca_status place(loader *L, builder *B, size_t i) {
    if (B->depth > 0) return add_kid(L, B->stack[B->depth - 1], i);
    B->root = i;
    B->has_root = true;
    return CA_OK;
}

static ca_status on_event(loader *L, builder *B, const yaml_event_t *ev) {
    int line = (int)ev->start_mark.line + 1;
    size_t i;
    ca_status s = CA_OK;
    switch (ev->type) {
    case YAML_DOCUMENT_START_EVENT:
        if (B->docs > 0) {
            ca_error(CA_ERR_CONFIG, "%s:%d: a second YAML document starts here; a config file holds one", L->path,
                     line);
            ca_error_hint("remove the '---' line and what follows, or merge the documents into one mapping");
            return CA_ERR_CONFIG;
        }
        break;
    case YAML_DOCUMENT_END_EVENT: B->docs++; break;
    case YAML_STREAM_END_EVENT: B->done = true; break;
    case YAML_ALIAS_EVENT:
        s = resolve_alias(L, ev, B->depth, &i);
        if (s == CA_OK) s = place(L, B, i);
        break;
    case YAML_SCALAR_EVENT:
        s = new_node(L, YN_SCALAR, ev, &i);
        if (s == CA_OK) s = place(L, B, i);
        if (s == CA_OK && node(L, i)->anchor) s = ca_strmap_put(&L->anchors, node(L, i)->anchor, i);
        break;
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT:
        if (B->depth == CA_CONFIG_MAX_DEPTH) return too_deep(L, line);
        s = new_node(L, ev->type == YAML_SEQUENCE_START_EVENT ? YN_SEQUENCE : YN_MAPPING, ev, &i);
        if (s == CA_OK) s = place(L, B, i);
        if (s == CA_OK) B->stack[B->depth++] = i;
        break;
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        i = B->stack[--B->depth];
        close_node(L, i);
        /* registered once complete: an alias inside its own anchor is refused */
        if (node(L, i)->anchor) s = ca_strmap_put(&L->anchors, node(L, i)->anchor, i);
        break;
    default: break;
    }
    return s;
}

/* Parses the text event by event: the depth is checked as each collection
 * opens, before libyaml goes deeper, and an alias by the size of what it names. */
static ca_status build(loader *L, const char *text, size_t len, bool json, builder *B) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return nomem();
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    ca_status s = CA_OK;
    while (s == CA_OK && !B->done) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            s = syntax_error(L, &parser, text, len, json);
            break;
        }
        s = on_event(L, B, &ev);
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    return s;
}

static void loader_free(loader *L) {
    for (size_t i = 0; i < L->n; i++) {
        free(L->items[i].key);
        free(L->items[i].value);
    }
    free(L->items);
    for (size_t i = 0; i < L->nnodes; i++) {
        free(L->nodes[i].text);
        free(L->nodes[i].anchor);
        free(L->nodes[i].kids);
    }
    free(L->nodes);
    ca_strmap_free(&L->anchors);
}

ca_status ca_config_file_load(ca_config *c, const char *path) {
    char *text = NULL;
    size_t len = 0;
    ca_status s = read_all(path, &text, &len);
    if (s != CA_OK) return s;
    bool json = looks_like_json(path, text);
    if (json)
        for (size_t i = 0; i < len; i++)
            if (text[i] == '\t') text[i] = ' ';
    loader L;
    memset(&L, 0, sizeof L);
    L.path = path;
    builder B;
    memset(&B, 0, sizeof B);
    s = build(&L, text, len, json, &B);
    if (s == CA_OK && !B.has_root) {
        s = ca_error(CA_ERR_CONFIG, "%s: the file is empty; a `distributed_type` must be specified", path);
        ca_error_hint("write one with `caccel config default --config_file %s`", path);
    } else if (s == CA_OK) {
        s = process(c, &L, node(&L, B.root));
    }
    loader_free(&L);
    free(text);
    return s;
}
