/* The configuration store: values with provenance, the merge rule, env and flag mapping, file search, the typed view. */
#include "config/config_impl.h"
#include "base/base_impl.h"
#include "base/text_impl.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

typedef struct ca_cfg_entry {
    const ca_key_def *def;     /* NULL: a key outside the schema, kept and reported */
    char *name;                /* keys outside the schema only */
    char *value;               /* NULL: null */
    char *origin;
    ca_config_source source;
} ca_cfg_entry;

struct ca_config {
    ca_cfg_entry *known;       /* one per ca_config_keys[] entry */
    ca_cfg_entry *extra;       /* keys outside the schema */
    size_t nextra, cap_extra;
    ca_strmap extra_index;     /* name -> index in extra */
    bool batch;                /* sections and order are rebuilt at the batch's end */
    ca_cfg_entry **order;      /* iteration order, rebuilt after every change */
    size_t norder;
    char *file;
};

static const char *source_word(ca_config_source s) {
    switch (s) {
    case CA_SRC_DEFAULT: return "default";
    case CA_SRC_PROGRAM: return "program";
    case CA_SRC_FILE: return "file";
    case CA_SRC_ENV: return "env";
    case CA_SRC_CLI: return "command line";
    }
    return "?";
}

static char *dupstr(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static const char *entry_name(const ca_cfg_entry *e) { return e->def ? e->def->name : e->name; }

static ca_status nomem(void) { return ca_error(CA_ERR_NOMEM, "out of memory in the configuration"); }

/* ------------------------------------------------------------------ lifecycle */

ca_status ca_config_create(ca_config **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_config_create: out is NULL");
    *out = NULL;
    ca_config *c = calloc(1, sizeof *c);
    if (!c) return nomem();
    c->known = calloc(ca_config_nkeys, sizeof *c->known);
    c->order = calloc(ca_config_nkeys, sizeof *c->order);
    if (!c->known || !c->order) {
        ca_config_destroy(c);
        return nomem();
    }
    for (size_t i = 0; i < ca_config_nkeys; i++) {
        ca_cfg_entry *e = &c->known[i];
        e->def = &ca_config_keys[i];
        e->source = CA_SRC_DEFAULT;
        e->origin = dupstr("default");
        e->value = ca_config_keys[i].def ? dupstr(ca_config_keys[i].def) : NULL;
        if (!e->origin || (ca_config_keys[i].def && !e->value)) {
            ca_config_destroy(c);
            return nomem();
        }
    }
    *out = c;
    ca_status s = ca_config_reorder(c);
    if (s != CA_OK) {
        ca_config_destroy(c);
        *out = NULL;
    }
    return s;
}

void ca_config_destroy(ca_config *c) {
    if (!c) return;
    if (c->known) {
        for (size_t i = 0; i < ca_config_nkeys; i++) {
            free(c->known[i].value);
            free(c->known[i].origin);
        }
    }
    for (size_t i = 0; i < c->nextra; i++) {
        free(c->extra[i].name);
        free(c->extra[i].value);
        free(c->extra[i].origin);
    }
    ca_strmap_free(&c->extra_index);
    free(c->known);
    free(c->extra);
    free(c->order);
    free(c->file);
    free(c);
}

/* ------------------------------------------------------------------ lookup */

static ca_cfg_entry *find_entry(const ca_config *c, const char *key) {
    const ca_key_def *d = ca_config_key_find(key);
    if (d) return &c->known[ca_config_key_index(d)];
    size_t i;
    return ca_strmap_get(&c->extra_index, key, &i) ? &c->extra[i] : NULL;
}

static bool is_sub_of(const char *name, const char *section) {
    size_t n = strlen(section);
    return strncmp(name, section, n) == 0 && name[n] == '.';
}

/* Entries in `caccel env` order: schema order, keys outside the schema that
 * belong to a section right after that section's known keys, the rest last.
 * Legacy keys never hold a value; sub-keys and sections appear once set. */
static bool listed(const ca_cfg_entry *e, bool sagemaker) {
    if (e->def && (e->def->flags & CA_KF_LEGACY)) return false;
    if (e->def && e->def->type == CA_KT_MAP) return false;
    if (e->source != CA_SRC_DEFAULT || !e->def) return true;
    if (strchr(e->def->name, '.')) return false;
    /* SageMaker's keys at their defaults are noise in a LOCAL_MACHINE
     * configuration, and the cluster's in a SageMaker one. */
    return (e->def->flags & (sagemaker ? CA_KF_SAGEMAKER : CA_KF_CLUSTER)) != 0;
}

ca_status ca_config_reorder(ca_config *c) {
    ca_cfg_entry **order = realloc(c->order, (ca_config_nkeys + c->nextra + 1) * sizeof *order);
    if (!order) return nomem();
    c->order = order;
    bool *placed = c->nextra ? calloc(c->nextra, sizeof *placed) : NULL;
    if (c->nextra && !placed) return nomem();
    const ca_cfg_entry *ce = &c->known[ca_config_key_index(ca_config_key_find("compute_environment"))];
    bool sagemaker = ce->value && strcmp(ce->value, "AMAZON_SAGEMAKER") == 0;
    size_t n = 0;
    for (size_t i = 0; i < ca_config_nkeys; i++) {
        ca_cfg_entry *e = &c->known[i];
        if (listed(e, sagemaker)) order[n++] = e;
        const ca_key_def *sd = e->def->type == CA_KT_MAP ? e->def : ca_config_section_of(e->def->name);
        if (!sd || (i + 1 < ca_config_nkeys && is_sub_of(ca_config_keys[i + 1].name, sd->name))) continue;
        /* After the last known key of a section: its keys outside the schema,
         * then the section itself when it was written but holds no set key. */
        bool any = false;
        for (size_t j = 0; j < c->nextra; j++) {
            if (!placed[j] && is_sub_of(c->extra[j].name, sd->name)) {
                order[n++] = &c->extra[j];
                placed[j] = true;
                any = true;
            }
        }
        size_t si = ca_config_key_index(sd);
        for (size_t k = si + 1; k <= i && !any; k++) any = c->known[k].source != CA_SRC_DEFAULT;
        if (!any && c->known[si].source != CA_SRC_DEFAULT) order[n++] = &c->known[si];
    }
    for (size_t j = 0; j < c->nextra; j++)
        if (!placed[j]) order[n++] = &c->extra[j];
    free(placed);
    c->norder = n;
    return CA_OK;
}

/* Rebuilds "{k: v, ...}" of a section from its set sub-keys. */
static ca_status rebuild_section(ca_config *c, const ca_key_def *sd) {
    ca_cfg_entry *se = &c->known[ca_config_key_index(sd)];
    size_t cap = 64, len = 0;
    char *buf = malloc(cap);
    if (!buf) return nomem();
    buf[len++] = '{';
    bool first = true;
    size_t plen = strlen(sd->name);
    for (int pass = 0; pass < 2; pass++) {
        size_t count = pass == 0 ? ca_config_nkeys : c->nextra;
        for (size_t i = 0; i < count; i++) {
            ca_cfg_entry *e = pass == 0 ? &c->known[i] : &c->extra[i];
            const char *nm = entry_name(e);
            if (!is_sub_of(nm, sd->name) || e->source == CA_SRC_DEFAULT) continue;
            const char *v = e->value ? e->value : "null";
            size_t need = len + strlen(nm) + strlen(v) + 8;
            if (need > cap) {
                while (need > cap) cap *= 2;
                char *nb = realloc(buf, cap);
                if (!nb) { free(buf); return nomem(); }
                buf = nb;
            }
            len += (size_t)sprintf(buf + len, "%s%s: %s", first ? "" : ", ", nm + plen + 1, v);
            first = false;
        }
    }
    buf[len++] = '}';
    buf[len] = '\0';
    free(se->value);
    se->value = buf;
    return CA_OK;
}

/* ------------------------------------------------------------------ checking */

static ca_status bad_value(const ca_key_def *d, const char *name, const char *value, const char *origin) {
    char allowed[768], q[256];
    ca_config_describe_allowed(d, allowed, sizeof allowed);
    return ca_error(CA_ERR_CONFIG, "%s: invalid value '%s' for key '%s' (allowed: %s)", origin,
                    ca_escape(value, q, sizeof q), name, allowed);
}

/* "MIN:MAX" of a CA_KF_RANGE key (torchrun's --nnodes form): false for any other text. */
static bool parse_range(const char *v, int64_t *lo, int64_t *hi) {
    const char *colon = v ? strchr(v, ':') : NULL;
    char head[32];
    if (!colon || (size_t)(colon - v) >= sizeof head) return false;
    memcpy(head, v, (size_t)(colon - v));
    head[colon - v] = '\0';
    return ca_config_parse_int(head, lo) && ca_config_parse_int(colon + 1, hi);
}

/* An integer key's value; a CA_KF_RANGE key given as MIN:MAX reads as MAX (the most it may be). */
static bool int_of(const ca_key_def *d, const char *text, int64_t *out) {
    int64_t lo;
    if (d && (d->flags & CA_KF_RANGE) && parse_range(text, &lo, out)) return true;
    return ca_config_parse_int(text, out);
}

/* A CA_KF_RANGE value given as MIN:MAX: both ends in the key's range and MIN <= MAX; stored as "MIN:MAX". */
static ca_status check_range(const ca_key_def *d, const char *name, const char *value, const char *origin,
                             char *buf, size_t size) {
    int64_t lo, hi;
    char q[256];
    if (!parse_range(value, &lo, &hi) || (double)lo < d->min || (double)hi < d->min || (double)lo > d->max ||
        (double)hi > d->max)
        return bad_value(d, name, value, origin);
    if (lo > hi)
        return ca_error(CA_ERR_CONFIG, "%s: invalid value '%s' for key '%s': the minimum %lld is larger than the "
                        "maximum %lld", origin, ca_escape(value, q, sizeof q), name, (long long)lo, (long long)hi);
    snprintf(buf, size, "%lld:%lld", (long long)lo, (long long)hi);
    return CA_OK;
}

ca_status ca_config_check_value(const ca_key_def *d, const char *name, const char *value, const char *origin,
                                char **out, bool *is_null) {
    *out = NULL;
    *is_null = false;
    if (ca_config_is_null_text(value)) {
        *is_null = true;
        return CA_OK;
    }
    char buf[64];
    const char *store = value;
    switch (d->type) {
    case CA_KT_BOOL: {
        bool b;
        if (!ca_config_parse_bool(value, &b)) return bad_value(d, name, value, origin);
        store = b ? "true" : "false";
        break;
    }
    case CA_KT_INT: {
        int64_t v;
        if ((d->flags & CA_KF_RANGE) && strchr(value, ':')) {
            ca_status s = check_range(d, name, value, origin, buf, sizeof buf);
            if (s != CA_OK) return s;
            store = buf;
            break;
        }
        if (!ca_config_parse_int(value, &v)) return bad_value(d, name, value, origin);
        if (d->min <= d->max && ((double)v < d->min || (double)v > d->max))
            return bad_value(d, name, value, origin);
        if (v == 0 && strcmp(d->name, "num_processes") == 0) return bad_value(d, name, value, origin);
        snprintf(buf, sizeof buf, "%lld", (long long)v);
        store = buf;
        break;
    }
    case CA_KT_FLOAT: {
        double v;
        if (!ca_config_parse_double(value, &v)) return bad_value(d, name, value, origin);
        if (d->min <= d->max && (v < d->min || v > d->max)) return bad_value(d, name, value, origin);
        while (isspace((unsigned char)*store)) store++;
        break;
    }
    case CA_KT_ENUM: {
        const char *hit = NULL;
        for (size_t i = 0; d->allowed[i] && !hit; i++) {
            bool eq = (d->flags & CA_KF_CASEFOLD) ? strcasecmp(d->allowed[i], value) == 0
                                                  : strcmp(d->allowed[i], value) == 0;
            if (eq) hit = d->allowed[i];
        }
        if (!hit) return bad_value(d, name, value, origin);
        store = hit;
        break;
    }
    case CA_KT_MAP:
        if (strcmp(value, "{}") != 0) {
            ca_error(CA_ERR_CONFIG, "%s: key '%s' is a section; set its keys as '%s.<key>'", origin, name, name);
            return CA_ERR_CONFIG;
        }
        break;
    case CA_KT_STRING:
    case CA_KT_LIST:
        break;
    }
    *out = dupstr(store);
    return *out ? CA_OK : nomem();
}

/* ------------------------------------------------------------------ setting */

static ca_status store(ca_cfg_entry *e, char *value, bool is_null, ca_config_source source, const char *origin) {
    char *o = dupstr(origin);
    if (!o) { free(value); return nomem(); }
    free(e->value);
    free(e->origin);
    e->value = is_null ? NULL : value;
    if (is_null) free(value);
    e->origin = o;
    e->source = source;
    return CA_OK;
}

static ca_status add_extra(ca_config *c, const char *key, ca_cfg_entry **out) {
    if (c->nextra == c->cap_extra) {
        size_t cap = c->cap_extra ? c->cap_extra * 2 : 8;
        ca_cfg_entry *ne = realloc(c->extra, cap * sizeof *ne);
        if (!ne) return nomem();
        /* entries moved: the order array is rebuilt by the caller */
        c->extra = ne;
        c->cap_extra = cap;
    }
    ca_cfg_entry *e = &c->extra[c->nextra];
    memset(e, 0, sizeof *e);
    e->name = dupstr(key);
    if (!e->name) return nomem();
    ca_status s = ca_strmap_put(&c->extra_index, e->name, c->nextra);
    if (s != CA_OK) {
        free(e->name);
        return s;
    }
    e->source = CA_SRC_DEFAULT;
    c->nextra++;
    *out = e;
    return CA_OK;
}

/* After a sub-key changed: the section shows the highest source that wrote
 * into it, and its text is rebuilt. */
static ca_status touch_section(ca_config *c, const ca_key_def *sd, ca_config_source source, const char *origin) {
    ca_cfg_entry *se = &c->known[ca_config_key_index(sd)];
    if (source > se->source) {
        char *o = dupstr(origin);
        if (!o) return nomem();
        free(se->origin);
        se->origin = o;
        se->source = source;
    }
    return c->batch ? CA_OK : rebuild_section(c, sd);
}

/* The end of a change: the order (and, after a batch, every section). */
static ca_status changed(ca_config *c) { return c->batch ? CA_OK : ca_config_reorder(c); }

void ca_config_batch_begin(ca_config *c) { c->batch = true; }

ca_status ca_config_batch_end(ca_config *c) {
    c->batch = false;
    for (size_t i = 0; i < ca_config_nkeys; i++) {
        if (ca_config_keys[i].type != CA_KT_MAP) continue;
        ca_status s = rebuild_section(c, &ca_config_keys[i]);
        if (s != CA_OK) return s;
    }
    return ca_config_reorder(c);
}

static const char *default_origin(ca_config_source s, const char *origin) {
    return origin ? origin : source_word(s);
}

static ca_status unknown_key_error(const char *key, const char *origin) {
    const ca_key_def *sect = ca_config_section_of(key);
    const char *dot = strchr(key, '.');
    char head[128];
    if (dot && !sect) {
        size_t n = (size_t)(dot - key) < sizeof head ? (size_t)(dot - key) : sizeof head - 1;
        memcpy(head, key, n);
        head[n] = '\0';
    } else {
        snprintf(head, sizeof head, "%s", key);
    }
    const char *near = ca_config_closest_key(head, NULL);
    if (near)
        ca_error(CA_ERR_CONFIG, "%s: unknown key '%s' (did you mean '%s'?)", origin, key, near);
    else
        ca_error(CA_ERR_CONFIG, "%s: unknown key '%s'", origin, key);
    ca_error_hint("fix the key; for files from a newer Accelerate set CACCEL_ALLOW_UNKNOWN_KEYS=1, "
                  "pass --allow_unknown_keys, or set allow_unknown_keys=true in the program");
    return CA_ERR_CONFIG;
}

bool ca_config_unknown_allowed(const ca_config *c) {
    const ca_cfg_entry *e = &c->known[ca_config_key_index(ca_config_key_find("allow_unknown_keys"))];
    return e->value && strcmp(e->value, "true") == 0;
}

/* Keys outside the schema: inside a known section they are kept and
 * reported (Accelerate passes them on); at the top level they are an error
 * unless unknown keys are allowed. `quiet`: the caller already reported. */
static ca_status set_extra(ca_config *c, const char *key, const char *value, ca_config_source source,
                           const char *origin, bool quiet) {
    const ca_key_def *sect = ca_config_section_of(key);
    if (!sect) {
        if (!ca_config_unknown_allowed(c)) return unknown_key_error(key, origin);
        if (!quiet) {
            const char *near = ca_config_closest_key(key, NULL);
            CA_LOG_W("%s: unknown key '%s' kept and ignored (%s%s%sunknown keys are allowed)", origin, key,
                     near ? "did you mean '" : "", near ? near : "", near ? "'?; " : "");
        }
    } else if (!quiet && !(sect->flags & CA_KF_FREEFORM)) {
        const char *sub = key + strlen(sect->name) + 1;
        const char *near = ca_config_closest_key(sub, sect);
        CA_LOG_W("%s: '%s' is not a key caccel knows in %s; kept as written and not validated%s%s%s", origin, key,
                 sect->name, near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
    }
    ca_cfg_entry *e = find_entry(c, key);
    if (e && source < e->source) return CA_OK;
    if (!e) {
        ca_status s = add_extra(c, key, &e);
        if (s != CA_OK) return s;
    }
    char *v = ca_config_is_null_text(value) ? NULL : dupstr(value);
    if (!ca_config_is_null_text(value) && !v) return nomem();
    ca_status s = store(e, v, v == NULL, source, origin);
    if (s == CA_OK && sect) s = touch_section(c, sect, source, origin);
    if (s == CA_OK) s = changed(c);
    return s;
}

static ca_status set_key(ca_config *c, const char *key, const char *value, ca_config_source source,
                         const char *origin, bool quiet);

/* fp16: true -> mixed_precision: fp16; dynamo_backend -> dynamo_config.dynamo_backend. */
static ca_status set_legacy(ca_config *c, const ca_key_def *d, const char *value, ca_config_source source,
                            const char *origin) {
    char o[512];
    if (strcmp(d->name, "fp16") == 0) {
        char *canon = NULL;
        bool is_null;
        ca_status s = ca_config_check_value(d, d->name, value, origin, &canon, &is_null);
        if (s != CA_OK) return s;
        bool on = !is_null && strcmp(canon, "true") == 0;
        free(canon);
        if (!on) return CA_OK;
        snprintf(o, sizeof o, "%s (fp16: true)", origin);
        return set_key(c, "mixed_precision", "fp16", source, o, true);
    }
    snprintf(o, sizeof o, "%s (dynamo_backend)", origin);
    return set_key(c, "dynamo_config.dynamo_backend", value, source, o, true);
}

static ca_status set_key(ca_config *c, const char *key, const char *value, ca_config_source source,
                         const char *origin, bool quiet) {
    const ca_key_def *d = ca_config_key_find(key);
    if (!d) return set_extra(c, key, value, source, origin, quiet);
    if (d->flags & CA_KF_LEGACY) return set_legacy(c, d, value, source, origin);
    if (strcmp(d->name, key) != 0) {   /* another spelling: the key itself, the origin names the spelling */
        size_t n = strlen(origin) + strlen(key) + 4;
        char *o = malloc(n);
        if (!o) return nomem();
        snprintf(o, n, "%s (%s)", origin, key);
        ca_status s = set_key(c, d->name, value, source, o, quiet);
        free(o);
        return s;
    }
    char *canon = NULL;
    bool is_null;
    ca_status s = ca_config_check_value(d, key, value, origin, &canon, &is_null);
    if (s != CA_OK) return s;
    ca_cfg_entry *e = &c->known[ca_config_key_index(d)];
    if (source < e->source) {
        free(canon);
        return CA_OK;
    }
    if (d->type == CA_KT_MAP) {
        /* "{}" or null: the section is present and empty. */
        free(canon);
        char *o = dupstr(origin);
        if (!o) return nomem();
        free(e->origin);
        e->origin = o;
        e->source = source;
        s = c->batch ? CA_OK : rebuild_section(c, d);
        return s == CA_OK ? changed(c) : s;
    }
    s = store(e, canon, is_null, source, origin);
    const ca_key_def *sect = ca_config_section_of(key);
    if (s == CA_OK && sect) s = touch_section(c, sect, source, origin);
    if (s == CA_OK) s = changed(c);
    return s;
}

ca_status ca_config_set(ca_config *c, const char *key, const char *value, ca_config_source source,
                        const char *origin) {
    if (!c || !key) return ca_error(CA_ERR_INVALID, "ca_config_set: config and key must not be NULL");
    if (source < CA_SRC_DEFAULT || source > CA_SRC_CLI)
        return ca_error(CA_ERR_INVALID, "ca_config_set: source %d is not a ca_config_source", (int)source);
    return set_key(c, key, value, source, default_origin(source, origin), false);
}

ca_status ca_config_set_quiet(ca_config *c, const char *key, const char *value, ca_config_source source,
                              const char *origin) {
    return set_key(c, key, value, source, default_origin(source, origin), true);
}

ca_status ca_config_check(const ca_config *c, const char *key, const char *value, const char *origin) {
    const ca_key_def *d = ca_config_key_find(key);
    if (!d) {
        if (ca_config_section_of(key) || ca_config_unknown_allowed(c)) return CA_OK;
        return unknown_key_error(key, origin);
    }
    char *canon = NULL;
    bool is_null;
    ca_status s = ca_config_check_value(d, key, value, origin, &canon, &is_null);
    free(canon);
    return s;
}

ca_status ca_config_set_file(ca_config *c, const char *path) {
    char *p = dupstr(path);
    if (!p) return nomem();
    free(c->file);
    c->file = p;
    return CA_OK;
}

const char *ca_config_file(const ca_config *c) { return c ? c->file : NULL; }

/* ------------------------------------------------------------------ getters */

const char *ca_config_get(const ca_config *c, const char *key) {
    if (!c || !key) return NULL;
    const ca_cfg_entry *e = find_entry(c, key);
    if (!e) return NULL;
    if (e->def && (e->def->flags & CA_KF_LEGACY)) return NULL;
    return e->value ? e->value : "null";
}

static ca_status get_text(const ca_config *c, const char *key, const char **out) {
    if (!c || !key) return ca_error(CA_ERR_INVALID, "ca_config_get: config and key must not be NULL");
    const ca_cfg_entry *e = find_entry(c, key);
    if (!e || (e->def && (e->def->flags & CA_KF_LEGACY))) {
        const char *near = ca_config_closest_key(key, NULL);
        return near ? ca_error(CA_ERR_NOT_FOUND, "unknown configuration key '%s' (did you mean '%s'?)", key, near)
                    : ca_error(CA_ERR_NOT_FOUND, "unknown configuration key '%s'", key);
    }
    if (!e->value)
        return ca_error(CA_ERR_NOT_FOUND, "configuration key '%s' is null (not given; %s)", key, e->origin);
    *out = e->value;
    return CA_OK;
}

ca_status ca_config_get_bool(const ca_config *c, const char *key, bool *out) {
    const char *v;
    ca_status s = get_text(c, key, &v);
    if (s != CA_OK) return s;
    char q[256];
    if (!out || !ca_config_parse_bool(v, out))
        return ca_error(CA_ERR_CONFIG, "configuration key '%s' = '%s' is not a boolean", key,
                        ca_escape(v, q, sizeof q));
    return CA_OK;
}

ca_status ca_config_get_int(const ca_config *c, const char *key, int64_t *out) {
    const char *v;
    ca_status s = get_text(c, key, &v);
    if (s != CA_OK) return s;
    char q[256];
    if (!out || !int_of(ca_config_key_find(key), v, out))
        return ca_error(CA_ERR_CONFIG, "configuration key '%s' = '%s' is not an integer", key,
                        ca_escape(v, q, sizeof q));
    return CA_OK;
}

ca_status ca_config_get_double(const ca_config *c, const char *key, double *out) {
    const char *v;
    ca_status s = get_text(c, key, &v);
    if (s != CA_OK) return s;
    char q[256];
    if (!out || !ca_config_parse_double(v, out))
        return ca_error(CA_ERR_CONFIG, "configuration key '%s' = '%s' is not a number", key,
                        ca_escape(v, q, sizeof q));
    return CA_OK;
}

const char *ca_config_origin(const ca_config *c, const char *key) {
    if (!c || !key) return NULL;
    const ca_cfg_entry *e = find_entry(c, key);
    if (!e || (e->def && (e->def->flags & CA_KF_LEGACY))) return NULL;
    return e->origin;
}

ca_config_source ca_config_source_of(const ca_config *c, const char *key) {
    if (!c || !key) return CA_SRC_DEFAULT;
    const ca_cfg_entry *e = find_entry(c, key);
    return e ? e->source : CA_SRC_DEFAULT;
}

int ca_config_count(const ca_config *c) { return c ? (int)c->norder : 0; }

ca_status ca_config_entry_at(const ca_config *c, int i, ca_config_entry *out) {
    if (!c || !out) return ca_error(CA_ERR_INVALID, "ca_config_entry_at: config and out must not be NULL");
    if (i < 0 || (size_t)i >= c->norder)
        return ca_error(CA_ERR_INVALID, "ca_config_entry_at: index %d out of range (0..%zu)", i, c->norder);
    const ca_cfg_entry *e = c->order[i];
    out->key = entry_name(e);
    out->value = e->value ? e->value : "null";
    out->origin = e->origin;
    out->source = e->source;
    out->supported = e->def && (e->def->flags & CA_KF_SUPPORTED);
    return CA_OK;
}

/* ------------------------------------------------------------------ rendezvous endpoint */

/* `key` already set at `source` by another origin to another value: a job given two rendezvous addresses
 * (MASTER_ADDR and PET_RDZV_ENDPOINT, --main_process_ip and --rdzv_endpoint) is refused, naming both. */
static ca_status endpoint_agrees(const ca_config *c, const char *key, const char *v, ca_config_source source,
                                 const char *origin) {
    const ca_cfg_entry *e = find_entry(c, key);
    if (!e || e->source != source || !e->value || strcmp(e->value, v) == 0) return CA_OK;
    char q[256];
    ca_error(CA_ERR_CONFIG, "%s sets %s to '%s', but %s set it to '%s': give the rendezvous address once", origin, key,
             ca_escape(v, q, sizeof q), e->origin ? e->origin : "?", e->value);
    return CA_ERR_CONFIG;
}

/* torchrun's --rdzv_endpoint / PET_RDZV_ENDPOINT, HOST[:PORT] ([ADDR]:PORT for IPv6): machine 0's
 * rendezvous, which is main_process_ip and main_process_port here. A port left out keeps the port the
 * other keys give (default 29500). */
static ca_status set_endpoint(ca_config *c, const char *v, ca_config_source source, const char *origin) {
    char host[256], q[256];
    const char *h = v, *hend, *port = NULL;
    bool bad = false;
    if (*v == '[') {
        h = v + 1;
        hend = strchr(h, ']');
        if (!hend) bad = true;
        else if (hend[1] == ':') port = hend + 2;
        else if (hend[1]) bad = true;
    } else {
        hend = strchr(v, ':');
        if (!hend) hend = v + strlen(v);
        else if (strchr(port = hend + 1, ':')) bad = true;   /* an IPv6 address goes in brackets */
    }
    if (bad || hend == h || (size_t)(hend - h) >= sizeof host || (port && !*port))
        return ca_error(CA_ERR_CONFIG, "%s: invalid value '%s' (allowed: HOST or HOST:PORT, an IPv6 address in "
                        "brackets as [ADDR]:PORT: machine 0's rendezvous, as main_process_ip and main_process_port)",
                        origin, ca_escape(v, q, sizeof q));
    memcpy(host, h, (size_t)(hend - h));
    host[hend - h] = '\0';
    char *canon = NULL;
    bool is_null;
    ca_status s = CA_OK;
    /* the key's own check names `origin` for a port that is no number 0..65535 */
    if (port) s = ca_config_check_value(ca_config_key_find("main_process_port"), "main_process_port", port, origin,
                                        &canon, &is_null);
    if (s == CA_OK) s = endpoint_agrees(c, "main_process_ip", host, source, origin);
    if (s == CA_OK && canon) s = endpoint_agrees(c, "main_process_port", canon, source, origin);
    if (s == CA_OK) s = set_key(c, "main_process_ip", host, source, origin, false);
    if (s == CA_OK && canon) s = set_key(c, "main_process_port", canon, source, origin, false);
    free(canon);
    return s;
}

/* ------------------------------------------------------------------ environment */

static const char *env_lookup(char *const *envp, const char *name) {
    size_t n = strlen(name);
    for (char *const *p = envp; p && *p; p++)
        if (strncmp(*p, name, n) == 0 && (*p)[n] == '=') return *p + n + 1;
    return NULL;
}

ca_status ca_config_apply_env(ca_config *c, char *const *envp) {
    if (!c) return ca_error(CA_ERR_INVALID, "ca_config_apply_env: config is NULL");
    if (!envp) envp = environ;
    const ca_env_def *dist_var = NULL;
    for (size_t i = 0; i < ca_config_nenvs; i++) {
        const ca_env_def *ev = &ca_config_envs[i];
        const char *v = env_lookup(envp, ev->var);
        /* An empty variable counts as unset (shells leave them behind). */
        if (!v || !*v || ev->kind == CA_ENV_CONFIG_FILE) continue;
        char origin[160];
        snprintf(origin, sizeof origin, "env %s", ev->var);
        if (ev->kind == CA_ENV_ENDPOINT) {
            ca_status s = set_endpoint(c, v, CA_SRC_ENV, origin);
            if (s != CA_OK) return s;
            continue;
        }
        if (ev->kind == CA_ENV_DIST_TYPE) {
            bool on;
            char q[256];
            if (!ca_config_parse_bool(v, &on))
                return ca_error(CA_ERR_CONFIG, "%s: invalid value '%s' (allowed: true, false, yes, no, on, off, 1, 0)",
                                origin, ca_escape(v, q, sizeof q));
            if (!on) continue;
            if (dist_var) {
                ca_error(CA_ERR_CONFIG, "env %s and env %s both choose distributed_type (%s, %s): set only one",
                         dist_var->var, ev->var, dist_var->key, ev->key);
                return CA_ERR_CONFIG;
            }
            dist_var = ev;
            ca_status s = set_key(c, "distributed_type", ev->key, CA_SRC_ENV, origin, false);
            if (s != CA_OK) return s;
            continue;
        }
        ca_status s = set_key(c, ev->key, v, CA_SRC_ENV, origin, false);
        if (s != CA_OK) return s;
    }
    return CA_OK;
}

/* ------------------------------------------------------------------ command line */

/* --flag VALUE (or --flag=VALUE), rather than a switch */
static bool takes_value(const ca_flag_def *f) {
    return f->kind == CA_FLAG_VALUE || f->kind == CA_FLAG_CONFIG_FILE || f->kind == CA_FLAG_ENDPOINT;
}

int ca_config_flag_arity(const char *arg) {
    const char *value;
    const ca_flag_def *f = ca_config_flag_find(arg, &value);
    if (!f) return -1;
    if (value) return 0;
    return takes_value(f) ? 1 : 0;
}

ca_status ca_config_apply_args(ca_config *c, int argc, char *const *argv) {
    if (!c) return ca_error(CA_ERR_INVALID, "ca_config_apply_args: config is NULL");
    if (argc > 0 && !argv) return ca_error(CA_ERR_INVALID, "ca_config_apply_args: argv is NULL");
    char hw_seen[128];
    const char *hw_flag = NULL;   /* Accelerate allows one of --cpu/--multi_gpu/--tpu/--use_deepspeed/--use_fsdp */
    const char *hw_sets = NULL;   /* what hw_flag set: its distributed type, or use_cpu (--cpu and --use_cpu) */
    const char *endpoint = NULL;  /* --rdzv_endpoint, set after the loop: it must agree with --main_process_ip */
    for (int i = 1; i < argc; i++) {
        if (!argv[i]) break;
        if (strcmp(argv[i], "--") == 0) break;   /* the rest belongs to the program */
        const char *value;
        const ca_flag_def *f = ca_config_flag_find(argv[i], &value);
        if (!f) continue;
        char origin[128];
        snprintf(origin, sizeof origin, "--%s", f->flag);
        if (takes_value(f)) {
            if (!value) {
                if (i + 1 >= argc || !argv[i + 1] || strncmp(argv[i + 1], "--", 2) == 0) {
                    ca_error(CA_ERR_CONFIG, "%s needs a value", origin);
                    if (f->kind == CA_FLAG_VALUE) {
                        char allowed[512];
                        ca_config_describe_allowed(ca_config_key_find(f->key), allowed, sizeof allowed);
                        ca_error_hint("pass %s VALUE or %s=VALUE (allowed: %s)", origin, origin, allowed);
                    }
                    return CA_ERR_CONFIG;
                }
                value = argv[++i];
            }
            if (f->kind == CA_FLAG_CONFIG_FILE) continue;
            if (f->kind == CA_FLAG_ENDPOINT) {
                endpoint = value;
                continue;
            }
            ca_status s = set_key(c, f->key, value, CA_SRC_CLI, origin, false);
            if (s != CA_OK) return s;
            continue;
        }
        bool on = true;
        char q[256];
        if (value && !ca_config_parse_bool(value, &on))
            return ca_error(CA_ERR_CONFIG, "%s: invalid value '%s' (allowed: true, false, yes, no, on, off, 1, 0)",
                            origin, ca_escape(value, q, sizeof q));
        if (f->kind == CA_FLAG_IMPLIED) continue;
        bool exclusive = f->kind == CA_FLAG_DIST_TYPE || strcmp(f->key, "use_cpu") == 0;
        if (exclusive && on) {
            if (hw_flag && strcmp(hw_sets, f->key) != 0) {
                ca_error(CA_ERR_CONFIG, "%s and %s cannot be used together", hw_flag, origin);
                ca_error_hint("use only one of --cpu, --multi_gpu, --tpu, --use_deepspeed, --use_fsdp, "
                              "--use_megatron_lm (as accelerate launch does)");
                return CA_ERR_CONFIG;
            }
            snprintf(hw_seen, sizeof hw_seen, "%s", origin);
            hw_flag = hw_seen;
            hw_sets = f->key;
        }
        ca_status s;
        if (f->kind == CA_FLAG_DIST_TYPE) {
            if (!on) continue;
            s = set_key(c, "distributed_type", f->key, CA_SRC_CLI, origin, false);
        } else {
            s = set_key(c, f->key, on ? "true" : "false", CA_SRC_CLI, origin, false);
        }
        if (s != CA_OK) return s;
    }
    return endpoint ? set_endpoint(c, endpoint, CA_SRC_CLI, "--rdzv_endpoint") : CA_OK;
}

/* ------------------------------------------------------------------ combinations */

/* Kinds that run on CPUs: sharded data parallelism (FSDP, DEEPSPEED) runs on either. */
static bool dist_is_cpu_kind(const char *d) {
    return !d || strcmp(d, "NO") == 0 || strcmp(d, "MULTI_CPU") == 0 || strcmp(d, "FSDP") == 0 ||
           strcmp(d, "DEEPSPEED") == 0;
}
static bool dist_is_sagemaker(const char *d) {
    return d && (strcmp(d, "DATA_PARALLEL") == 0 || strcmp(d, "MODEL_PARALLEL") == 0);
}

bool ca_config_dist_allowed(const char *compute_env, const char *dist) {
    bool sm = compute_env && strcmp(compute_env, "AMAZON_SAGEMAKER") == 0;
    if (!dist || strcmp(dist, "NO") == 0) return true;
    return sm ? dist_is_sagemaker(dist) : !dist_is_sagemaker(dist);
}

static const ca_cfg_entry *K(const ca_config *c, const char *key) {
    return &c->known[ca_config_key_index(ca_config_key_find(key))];
}

static int64_t int_or(const ca_cfg_entry *e, int64_t def) {
    int64_t v;
    return e->value && int_of(e->def, e->value, &v) ? v : def;
}

static bool bool_or(const ca_cfg_entry *e, bool def) {
    bool v;
    return e->value && ca_config_parse_bool(e->value, &v) ? v : def;
}

/* Checks what no single key can: contradictions between keys. A
 * contradiction between layers is settled by the higher layer (with a
 * warning); inside one layer it is an error naming both origins. */
static ca_status validate(const ca_config *c) {
    const ca_cfg_entry *ce = K(c, "compute_environment"), *de = K(c, "distributed_type");
    const ca_cfg_entry *ue = K(c, "use_cpu"), *npe = K(c, "num_processes");
    const ca_cfg_entry *nme = K(c, "num_machines"), *mre = K(c, "machine_rank");
    if (!ca_config_dist_allowed(ce->value, de->value)) {
        ca_error(CA_ERR_CONFIG, "%s: distributed_type '%s' does not go with compute_environment '%s' (%s)",
                 de->origin, de->value, ce->value ? ce->value : "LOCAL_MACHINE", ce->origin);
        ca_error_hint("AMAZON_SAGEMAKER takes NO, DATA_PARALLEL or MODEL_PARALLEL; LOCAL_MACHINE takes the others");
        return CA_ERR_CONFIG;
    }
    bool use_cpu = bool_or(ue, false);
    if (use_cpu && !dist_is_cpu_kind(de->value)) {
        if (ue->source == de->source && ue->source != CA_SRC_DEFAULT) {
            ca_error(CA_ERR_CONFIG, "use_cpu: true (%s) contradicts distributed_type: %s (%s)", ue->origin,
                     de->value, de->origin);
            ca_error_hint("remove one of them, or override on the command line with --cpu or --multi_gpu");
            return CA_ERR_CONFIG;
        }
        if (ue->source > de->source)
            CA_LOG_W("use_cpu: true (%s) overrides distributed_type: %s (%s): running on CPUs", ue->origin,
                     de->value, de->origin);
        else
            CA_LOG_W("distributed_type: %s (%s) overrides use_cpu: true (%s)", de->value, de->origin, ue->origin);
    }
    int64_t nm = int_or(nme, 1), mr = int_or(mre, 0), np = int_or(npe, -1);
    if (mr >= nm) {
        ca_error(CA_ERR_CONFIG, "machine_rank %lld (%s) must be less than num_machines %lld (%s)", (long long)mr,
                 mre->origin, (long long)nm, nme->origin);
        return CA_ERR_CONFIG;
    }
    /* MIN:MAX (elastic): the job runs on MIN..MAX machines, and its processes see the current count of
     * processes (ACCELERATE_NUM_PROCESSES), which only MIN bounds; the launcher checks the split at MAX */
    int64_t lo, hi;
    bool range = parse_range(nme->value, &lo, &hi);
    if (np > 0 && np < (range ? lo : nm)) {
        ca_error(CA_ERR_CONFIG, "num_processes %lld (%s) is the total over all machines and cannot be less than "
                 "num_machines %s (%s)", (long long)np, npe->origin, nme->value, nme->origin);
        return CA_ERR_CONFIG;
    }
    if (np > 0 && np % nm != 0 && !range)
        CA_LOG_W("num_processes %lld (%s) is not a multiple of num_machines %lld (%s): machines get %lld each",
                 (long long)np, npe->origin, (long long)nm, nme->origin, (long long)(np / nm));
    if (de->value && strcmp(de->value, "MULTI_GPU") == 0 && np == 1 && nm == 1)
        CA_LOG_W("distributed_type MULTI_GPU (%s) with num_processes 1 (%s) runs a single process",
                 de->origin, npe->origin);
    return CA_OK;
}

/* Accelerate's ParallelismConfig beyond data, tensor and context parallelism (the device mesh,
 * accelerator/mesh.c, runs those): each dimension above 1 named with its key, value and origin, all in one error. */
ca_status ca_config_check_parallelism(const ca_config *c) {
    static const struct { const char *key, *what; } dims[] = {
        {"parallelism_config.parallelism_config_sp_size", "sequence parallelism"},
    };
    char msg[1024];
    size_t len = 0;
    int n = 0;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        const ca_cfg_entry *e = K(c, dims[i].key);
        int64_t v = int_or(e, 1);
        if (v <= 1 || len >= sizeof msg) continue;
        int w = snprintf(msg + len, sizeof msg - len, "%s%s: %s = %lld asks for %s", n++ ? "; " : "", e->origin,
                         dims[i].key, (long long)v, dims[i].what);
        if (w > 0) len += (size_t)w;
    }
    if (!n) return CA_OK;
    ca_error(CA_ERR_UNSUPPORTED, "%s: not supported yet (caccel runs data parallelism, plain or sharded under "
             "distributed_type FSDP / DEEPSPEED, tensor parallelism, parallelism_config_tp_size, and context "
             "parallelism, parallelism_config_cp_size)", msg);
    ca_error_hint("set %s to 1 or remove %s; parallelism_config_dp_shard_size and dp_replicate_size (HSDP) "
                  "are honoured under FSDP", n > 1 ? "them" : "it", n > 1 ? "them" : "it");
    return CA_ERR_UNSUPPORTED;
}

static const char *const mesh_keys[CA_MESH_NDIMS] = {
    "parallelism_config.parallelism_config_dp_replicate_size", "parallelism_config.parallelism_config_dp_shard_size",
    "parallelism_config.parallelism_config_cp_size", "parallelism_config.parallelism_config_tp_size",
};

const char *ca_mesh_dim_name(int dim) {
    static const char *const names[] = {"dp_replicate", "dp_shard", "cp", "tp", "dp"};
    return dim >= 0 && dim <= CA_MESH_NDIMS ? names[dim] : NULL;
}

void ca_mesh_coords(const ca_mesh_shape *m, int rank, int coord[CA_MESH_NDIMS]) {
    for (int d = CA_MESH_NDIMS - 1; d >= 0; d--) {
        int n = m->size[d] > 0 ? m->size[d] : 1;
        coord[d] = rank % n;
        rank /= n;
    }
}

/* The product differs from the process count: every size with its origin, and the count's. */
static ca_status mesh_mismatch(const ca_config *c, const ca_mesh_shape *m, int64_t product, int world) {
    char msg[1024];
    size_t len = 0;
    for (int d = 0; d < CA_MESH_NDIMS && len < sizeof msg; d++) {
        int w = snprintf(msg + len, sizeof msg - len, "%s%s %d (%s)", d ? " x " : "", mesh_keys[d] + 19, m->size[d],
                         K(c, mesh_keys[d])->origin);
        if (w > 0) len += (size_t)w;
    }
    ca_error(CA_ERR_CONFIG, "parallelism_config: %s = %lld processes, but the job has %d (num_processes, from %s): "
             "the device mesh needs their product to equal the process count", msg, (long long)product, world,
             K(c, "num_processes")->origin);
    int inner = m->size[CA_MESH_TP] * m->size[CA_MESH_CP];
    ca_error_hint("with parallelism_config_tp_size %d and cp_size %d, set parallelism_config_dp_replicate_size to %d "
                  "(data parallel over the tensor- and context-parallel groups)", m->size[CA_MESH_TP],
                  m->size[CA_MESH_CP], world % inner ? 1 : world / inner);
    return CA_ERR_CONFIG;
}

ca_status ca_config_mesh(const ca_config *c, int world, ca_mesh_shape *out) {
    if (!c || !out || world < 1) return ca_error(CA_ERR_INVALID, "ca_config_mesh: config, out and a world >= 1 are required");
    int64_t product = 1;
    for (int d = 0; d < CA_MESH_NDIMS; d++) {
        int64_t v = int_or(K(c, mesh_keys[d]), 1);
        out->size[d] = v > 0 && v <= 1 << 20 ? (int)v : 1;
        product *= out->size[d];
    }
    if (out->size[CA_MESH_TP] > 1 || out->size[CA_MESH_CP] > 1)
        return product == world ? CA_OK : mesh_mismatch(c, out, product, world);
    if (product != world) *out = (ca_mesh_shape){.size = {world, 1, 1, 1}};   /* plain data parallelism */
    return CA_OK;
}

/* ------------------------------------------------------------------ loading */

ca_status ca_config_load_file(ca_config *c, const char *path) {
    if (!c || !path) return ca_error(CA_ERR_INVALID, "ca_config_load_file: config and path must not be NULL");
    return ca_config_file_load(c, path);
}

static bool is_file(const char *p) {
    struct stat st;
    return p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The last --config_file in argv (before "--"), or NULL. */
static const char *argv_config_file(int argc, char *const *argv) {
    const char *found = NULL;
    for (int i = 1; i < argc && argv && argv[i]; i++) {
        if (strcmp(argv[i], "--") == 0) break;
        const char *v;
        const ca_flag_def *f = ca_config_flag_find(argv[i], &v);
        if (!f) continue;
        if (f->kind == CA_FLAG_CONFIG_FILE) {
            if (!v && i + 1 < argc) v = argv[i + 1];
            if (v) found = v;
        }
        if (!v && takes_value(f)) i++;
    }
    return found;
}

void ca_config_default_paths(char *caccel_path, size_t n1, char *hf_path, size_t n2) {
    const char *home = getenv("HOME");
    const char *xdg = getenv("XDG_CONFIG_HOME");
    caccel_path[0] = hf_path[0] = '\0';
    if (xdg && *xdg)
        snprintf(caccel_path, n1, "%s/caccel/default_config.yaml", xdg);
    else if (home && *home)
        snprintf(caccel_path, n1, "%s/.config/caccel/default_config.yaml", home);
    const char *hf = getenv("HF_HOME");
    const char *cache = getenv("XDG_CACHE_HOME");
    if (hf && *hf)
        snprintf(hf_path, n2, "%s/accelerate/default_config.yaml", hf);
    else if (cache && *cache)
        snprintf(hf_path, n2, "%s/huggingface/accelerate/default_config.yaml", cache);
    else if (home && *home)
        snprintf(hf_path, n2, "%s/.cache/huggingface/accelerate/default_config.yaml", home);
}

static void log_defaults(const ca_config *c) {
    if (ca_log_get_level() > CA_LOG_INFO) return;
    char line[2048];
    size_t len = 0;
    for (size_t i = 0; i < ca_config_nkeys; i++) {
        const ca_cfg_entry *e = &c->known[i];
        if (e->source != CA_SRC_DEFAULT || !(e->def->flags & CA_KF_SUPPORTED) || strchr(e->def->name, '.'))
            continue;
        int n = snprintf(line + len, sizeof line - len, "%s%s=%s", len ? ", " : "", e->def->name,
                         e->value ? e->value : "null");
        if (n < 0 || (size_t)n >= sizeof line - len) break;
        len += (size_t)n;
    }
    if (len)
        CA_LOG_I("not set in a file, the environment, the command line or the program, so using defaults: %s",
                 line);
}

ca_status ca_config_load(ca_config *c, const char *const *settings, int argc, char *const *argv) {
    if (!c) return ca_error(CA_ERR_INVALID, "ca_config_load: config is NULL");
    if (argc > 0 && !argv) return ca_error(CA_ERR_INVALID, "ca_config_load: argv is NULL");
    ca_status s;
    const char *program_file = NULL;
    for (size_t i = 0; settings && settings[i]; i++) {
        const char *eq = strchr(settings[i], '=');
        if (!eq || eq == settings[i])
            return ca_error(CA_ERR_CONFIG, "program setting '%s' is not of the form key=value", settings[i]);
        char key[256];
        size_t kl = (size_t)(eq - settings[i]);
        if (kl >= sizeof key) return ca_error(CA_ERR_CONFIG, "program setting '%s': key too long", settings[i]);
        memcpy(key, settings[i], kl);
        key[kl] = '\0';
        /* Not a key: the program's choice of file, below --config_file and
         * ACCELERATE_CONFIG_FILE, above the default locations. */
        if (strcmp(key, "config_file") == 0) {
            program_file = *(eq + 1) ? eq + 1 : NULL;
            continue;
        }
        s = set_key(c, key, eq + 1, CA_SRC_PROGRAM, "program", false);
        if (s != CA_OK) return s;
    }
    /* The unknown-key switch must hold before the file is read. */
    const char *allow = getenv("CACCEL_ALLOW_UNKNOWN_KEYS");
    if (allow && *allow) {
        s = set_key(c, "allow_unknown_keys", allow, CA_SRC_ENV, "env CACCEL_ALLOW_UNKNOWN_KEYS", false);
        if (s != CA_OK) return s;
    }
    for (int i = 1; i < argc && argv[i]; i++) {
        if (strcmp(argv[i], "--") == 0) break;
        const char *v;
        const ca_flag_def *f = ca_config_flag_find(argv[i], &v);
        if (f && f->kind == CA_FLAG_TRUE && strcmp(f->key, "allow_unknown_keys") == 0) {
            s = set_key(c, "allow_unknown_keys", v ? v : "true", CA_SRC_CLI, "--allow_unknown_keys", false);
            if (s != CA_OK) return s;
        }
    }

    const char *path = argv_config_file(argc, argv);
    const char *named_by = "--config_file";
    if (!path) {
        const char *ev = getenv("ACCELERATE_CONFIG_FILE");
        if (ev && *ev) {
            path = ev;
            named_by = "env ACCELERATE_CONFIG_FILE";
        } else if (program_file) {
            path = program_file;
            named_by = "the program's config_file setting";
        }
    }
    if (path) {
        if (!is_file(path)) {
            ca_error(CA_ERR_IO, "config file '%s' (from %s) does not exist or is not a file", path, named_by);
            ca_error_hint("pass an existing file, or create one with `caccel config default --config_file %s`",
                          path);
            return CA_ERR_IO;
        }
        s = ca_config_file_load(c, path);
        if (s != CA_OK) return s;
    } else {
        char p1[4096], p2[4096];
        ca_config_default_paths(p1, sizeof p1, p2, sizeof p2);
        const char *found = is_file(p1) ? p1 : is_file(p2) ? p2 : NULL;
        if (found) {
            s = ca_config_file_load(c, found);
            if (s != CA_OK) return s;
        }
    }
    s = ca_config_apply_env(c, NULL);
    if (s != CA_OK) return s;
    s = ca_config_apply_args(c, argc, argv);
    if (s != CA_OK) return s;
    s = validate(c);
    if (s != CA_OK) return s;
    log_defaults(c);
    return CA_OK;
}

/* ------------------------------------------------------------------ typed view */

static ca_distributed_type dist_from_name(const char *n) {
    if (!n || strcmp(n, "NO") == 0) return CA_DIST_NO;
    if (strcmp(n, "MULTI_CPU") == 0) return CA_DIST_MULTI_CPU;
    if (strcmp(n, "MULTI_GPU") == 0) return CA_DIST_MULTI_GPU;
    if (strcmp(n, "XLA") == 0 || strcmp(n, "TPU") == 0) return CA_DIST_XLA;
    if (strcmp(n, "FSDP") == 0) return CA_DIST_FSDP;
    if (strcmp(n, "DEEPSPEED") == 0) return CA_DIST_DEEPSPEED;
    if (strcmp(n, "MEGATRON_LM") == 0) return CA_DIST_MEGATRON_LM;
    return CA_DIST_OTHER;
}

static ca_mixed_precision mp_from_name(const char *n) {
    if (!n || strcasecmp(n, "no") == 0) return CA_MP_NO;
    if (strcasecmp(n, "fp16") == 0) return CA_MP_FP16;
    if (strcasecmp(n, "bf16") == 0) return CA_MP_BF16;
    return CA_MP_FP8;
}

static ca_comm_hook comm_hook_from_name(const char *n) {
    if (!n || strcasecmp(n, "no") == 0) return CA_COMM_HOOK_NO;
    if (strcasecmp(n, "fp16") == 0) return CA_COMM_HOOK_FP16;
    if (strcasecmp(n, "bf16") == 0) return CA_COMM_HOOK_BF16;
    if (strcasecmp(n, "power_sgd") == 0) return CA_COMM_HOOK_POWER_SGD;
    return CA_COMM_HOOK_BATCHED_POWER_SGD;
}

static double double_or(const ca_cfg_entry *e, double def) {
    double v;
    return e->value && ca_config_parse_double(e->value, &v) ? v : def;
}

ca_status ca_config_settings(const ca_config *c, ca_settings *out) {
    if (!c || !out) return ca_error(CA_ERR_INVALID, "ca_config_settings: config and out must not be NULL");
    memset(out, 0, sizeof *out);
    const ca_cfg_entry *de = K(c, "distributed_type"), *ue = K(c, "use_cpu");
    out->num_processes = (int)int_or(K(c, "num_processes"), -1);
    out->num_machines = (int)int_or(K(c, "num_machines"), 1);
    int64_t lo, hi;
    out->min_machines = parse_range(K(c, "num_machines")->value, &lo, &hi) ? (int)lo : 0;
    out->machine_rank = (int)int_or(K(c, "machine_rank"), 0);
    out->distributed_type_name = de->value ? de->value : "NO";
    out->distributed_type = dist_from_name(de->value);
    if (out->distributed_type == CA_DIST_XLA) out->distributed_type_name = "XLA";
    out->use_cpu = bool_or(ue, false);
    /* The same rule as validate(): the higher layer settles a contradiction;
     * inside one layer (rejected by ca_config_load) the CPU wins, as
     * ACCELERATE_USE_CPU does in Accelerate's workers. */
    if (out->use_cpu && !dist_is_cpu_kind(de->value)) {
        if (ue->source >= de->source) {
            bool multi = out->num_processes > 1 || out->num_machines > 1;
            out->distributed_type = multi ? CA_DIST_MULTI_CPU : CA_DIST_NO;
            out->distributed_type_name = multi ? "MULTI_CPU" : "NO";
        } else {
            out->use_cpu = false;
        }
    }
    out->mixed_precision = mp_from_name(K(c, "mixed_precision")->value);
    out->main_process_ip = K(c, "main_process_ip")->value;
    out->main_process_port = (int)int_or(K(c, "main_process_port"), 0);
    out->gpu_ids = K(c, "gpu_ids")->value;
    out->allow_tf32 = bool_or(K(c, "allow_tf32"), false);
    const ca_cfg_entry *ga = K(c, "gradient_accumulation_steps"), *gc = K(c, "gradient_clipping");
    out->gradient_accumulation_steps = (int)int_or(ga, 1);
    out->gradient_clipping = double_or(gc, 0.0);
    /* Under DeepSpeed, Accelerate's launcher passes deepspeed_config's values as
     * ACCELERATE_GRADIENT_*; they apply where nothing else set the keys. */
    if (out->distributed_type == CA_DIST_DEEPSPEED) {
        const ca_cfg_entry *dga = K(c, "deepspeed_config.gradient_accumulation_steps");
        const ca_cfg_entry *dgc = K(c, "deepspeed_config.gradient_clipping");
        if (ga->source == CA_SRC_DEFAULT && dga->source != CA_SRC_DEFAULT)
            out->gradient_accumulation_steps = (int)int_or(dga, 1);
        if (gc->source == CA_SRC_DEFAULT && dgc->source != CA_SRC_DEFAULT) out->gradient_clipping = double_or(dgc, 0);
    }
    out->debug = bool_or(K(c, "debug"), false);
    out->downcast_bf16 = bool_or(K(c, "downcast_bf16"), false);
    out->rdzv_backend = K(c, "rdzv_backend")->value ? K(c, "rdzv_backend")->value : "static";
    out->same_network = bool_or(K(c, "same_network"), false);
    out->enable_cpu_affinity = bool_or(K(c, "enable_cpu_affinity"), false);
    out->num_cpu_threads_per_process = (int)int_or(K(c, "num_cpu_threads_per_process"), 0);
    out->backend = K(c, "backend")->value;
    out->timeout_ms = (int64_t)llround(double_or(K(c, "timeout"), 1800.0) * 1000.0);
    out->bucket_cap_mb = double_or(K(c, "bucket_cap_mb"), 25.0);
    out->comm_hook = comm_hook_from_name(K(c, "comm_hook")->value);
    out->even_batches = bool_or(K(c, "even_batches"), true);
    out->split_batches = bool_or(K(c, "split_batches"), false);
    out->dispatch_batches = bool_or(K(c, "dispatch_batches"), false);
    out->use_seedable_sampler = bool_or(K(c, "use_seedable_sampler"), false);
    out->data_seed = K(c, "data_seed")->value ? int_or(K(c, "data_seed"), -1) : -1;
    out->non_blocking = bool_or(K(c, "non_blocking"), false);
    out->deterministic = bool_or(K(c, "deterministic"), false);
    out->deterministic_shards = (int)int_or(K(c, "deterministic_shards"), 4);
    return CA_OK;
}

const char *ca_distributed_type_name(ca_distributed_type t) {
    switch (t) {
    case CA_DIST_NO: return "NO";
    case CA_DIST_MULTI_CPU: return "MULTI_CPU";
    case CA_DIST_MULTI_GPU: return "MULTI_GPU";
    case CA_DIST_XLA: return "XLA";
    case CA_DIST_FSDP: return "FSDP";
    case CA_DIST_DEEPSPEED: return "DEEPSPEED";
    case CA_DIST_MEGATRON_LM: return "MEGATRON_LM";
    case CA_DIST_OTHER: return "OTHER";
    }
    return "?";
}

const char *ca_mixed_precision_name(ca_mixed_precision m) {
    switch (m) {
    case CA_MP_NO: return "no";
    case CA_MP_FP16: return "fp16";
    case CA_MP_BF16: return "bf16";
    case CA_MP_FP8: return "fp8";
    }
    return "?";
}
