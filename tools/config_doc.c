/* The configuration file as `caccel config` writes it: Accelerate's keys, sorted, in YAML or JSON, replacing
 * the file only once it reads back as written. */
#include "tools/cli_impl.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

static char *dupstr(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static ca_cli_doc_item *find(const ca_cli_doc *d, const char *key) {
    for (size_t i = 0; i < d->n; i++)
        if (strcmp(d->items[i].key, key) == 0) return &d->items[i];
    return NULL;
}

const ca_cli_doc_item *ca_cli_doc_find(const ca_cli_doc *d, const char *key) { return find(d, key); }

int ca_cli_doc_put(ca_cli_doc *d, const char *key, const char *value, bool plain) {
    ca_cli_doc_item *it = find(d, key);
    char *v = dupstr(value);
    if (!v) {
        d->nomem = true;
        return -1;
    }
    if (!it) {
        if (d->n == d->cap) {
            size_t cap = d->cap ? d->cap * 2 : 32;
            ca_cli_doc_item *ni = realloc(d->items, cap * sizeof *ni);
            if (!ni) {
                free(v);
                d->nomem = true;
                return -1;
            }
            d->items = ni;
            d->cap = cap;
        }
        it = &d->items[d->n];
        if (!(it->key = dupstr(key))) {
            free(v);
            d->nomem = true;
            return -1;
        }
        it->value = NULL;
        d->n++;
    }
    free(it->value);
    it->value = v;
    it->plain = plain;
    return 0;
}

void ca_cli_doc_drop(ca_cli_doc *d, const char *key) {
    ca_cli_doc_item *it = find(d, key);
    if (!it) return;
    free(it->key);
    free(it->value);
    *it = d->items[--d->n];
}

void ca_cli_doc_free(ca_cli_doc *d) {
    for (size_t i = 0; i < d->n; i++) {
        free(d->items[i].key);
        free(d->items[i].value);
    }
    free(d->items);
    memset(d, 0, sizeof *d);
}

static int by_key(const void *a, const void *b) {
    return strcmp(((const ca_cli_doc_item *)a)->key, ((const ca_cli_doc_item *)b)->key);
}

/* A string a YAML 1.1 reader (PyYAML) would take for something else:
 * booleans, nulls, numbers, or text with YAML's indicators. */
static bool yaml_needs_quotes(const char *s) {
    static const char *const words[] = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "~", NULL};
    if (!*s || isspace((unsigned char)*s) || isspace((unsigned char)s[strlen(s) - 1])) return true;
    for (int i = 0; words[i]; i++)
        if (strcasecmp(s, words[i]) == 0) return true;
    char *end;
    (void)strtod(s, &end);
    if (*end == '\0') return true;
    /* YAML 1.1 also has 1_000 and sexagesimal 1:30 */
    if (strspn(s, "0123456789_:.+-eE") == strlen(s)) return true;
    if (strchr("-?:,[]{}#&*!|>'\"%@`", *s)) return true;
    return strstr(s, ": ") || strstr(s, " #") || s[strlen(s) - 1] == ':';
}

/* Control characters (a line break, a tab): only a double-quoted scalar keeps
 * them; a single-quoted one folds a line break into a space. */
static bool has_control(const char *s) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        if (*c < 0x20 || *c == 0x7f) return true;
    return false;
}

/* The text being rendered: grows as needed; `nomem` once it cannot. */
typedef struct outbuf {
    char *p;
    size_t len, cap;
    bool nomem;
} outbuf;

static void out_bytes(outbuf *o, const char *s, size_t n) {
    if (o->nomem) return;
    if (o->len + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (o->len + n + 1 > cap) cap *= 2;
        char *np = realloc(o->p, cap);
        if (!np) {
            o->nomem = true;
            return;
        }
        o->p = np;
        o->cap = cap;
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
    o->p[o->len] = '\0';
}

static void out(outbuf *o, const char *s) { out_bytes(o, s, strlen(s)); }

/* `s` with JSON's (and YAML's double-quoted) escapes, quotes included. */
static void out_escaped(outbuf *o, const char *s) {
    out(o, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        if (*c == '"' || *c == '\\') {
            esc[0] = '\\', esc[1] = (char)*c, esc[2] = '\0';
            out(o, esc);
        } else if (*c < 0x20 || *c == 0x7f) {
            snprintf(esc, sizeof esc, "\\u%04x", *c);
            out(o, esc);
        } else {
            out_bytes(o, (const char *)c, 1);
        }
    }
    out(o, "\"");
}

/* A key or a string value as YAML: plain when a YAML 1.1 reader takes it for
 * the same text, else single-quoted, or double-quoted with escapes when it
 * holds control characters. */
static void yaml_scalar(outbuf *o, const char *s) {
    if (has_control(s)) {
        out_escaped(o, s);
    } else if (!yaml_needs_quotes(s)) {
        out(o, s);
    } else {
        out(o, "'");
        for (const char *c = s; *c; c++) {
            if (*c == '\'') out(o, "''");
            else out_bytes(o, c, 1);
        }
        out(o, "'");
    }
}

/* Length of the section part of "section.key", 0 for a top-level key. */
static size_t section_len(const char *key) {
    const char *dot = strchr(key, '.');
    return dot ? (size_t)(dot - key) : 0;
}

static bool same_section(const char *a, const char *b) {
    size_t la = section_len(a);
    return la && la == section_len(b) && strncmp(a, b, la) == 0;
}

/* The section part of `key` (sl bytes) as its own string, for quoting. */
static void out_section(outbuf *o, const char *key, size_t sl, bool json) {
    char *name = malloc(sl + 1);
    if (!name) {
        o->nomem = true;
        return;
    }
    memcpy(name, key, sl);
    name[sl] = '\0';
    if (json) out_escaped(o, name);
    else yaml_scalar(o, name);
    free(name);
}

static void render_yaml(outbuf *o, const ca_cli_doc *d) {
    for (size_t i = 0; i < d->n; i++) {
        const ca_cli_doc_item *it = &d->items[i];
        size_t sl = section_len(it->key);
        if (sl && (i == 0 || !same_section(d->items[i - 1].key, it->key))) {
            out_section(o, it->key, sl, false);
            out(o, ":\n");
        }
        if (sl) out(o, "  ");
        yaml_scalar(o, sl ? it->key + sl + 1 : it->key);
        out(o, ": ");
        if (it->plain) out(o, it->value);
        else yaml_scalar(o, it->value);
        out(o, "\n");
    }
}

static void render_json(outbuf *o, const ca_cli_doc *d) {
    out(o, "{");
    for (size_t i = 0; i < d->n; i++) {
        const ca_cli_doc_item *it = &d->items[i];
        size_t sl = section_len(it->key);
        bool opens = sl && (i == 0 || !same_section(d->items[i - 1].key, it->key));
        out(o, i == 0 ? "\n" : ",\n");
        if (opens) {
            out(o, "  ");
            out_section(o, it->key, sl, true);
            out(o, ": {\n");
        }
        out(o, sl ? "    " : "  ");
        out_escaped(o, sl ? it->key + sl + 1 : it->key);
        out(o, ": ");
        if (it->plain) out(o, it->value);
        else out_escaped(o, it->value);
        bool closes = sl && (i + 1 == d->n || !same_section(d->items[i + 1].key, it->key));
        if (closes) out(o, "\n  }");
    }
    out(o, "\n}\n");
}

char *ca_cli_doc_render(ca_cli_doc *d, bool json, const char *header) {
    if (d->n) qsort(d->items, d->n, sizeof d->items[0], by_key);
    outbuf o = {0};
    out(&o, "");
    if (json) {
        render_json(&o, d);
    } else {
        if (header) {
            out(&o, "# ");
            out(&o, header);
            out(&o, "\n");
        }
        render_yaml(&o, d);
    }
    if (o.nomem) {
        free(o.p);
        return NULL;
    }
    return o.p;
}

bool ca_cli_path_is_json(const char *path) {
    size_t n = strlen(path);
    return n >= 5 && strcasecmp(path + n - 5, ".json") == 0;
}

int ca_cli_make_parents(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    char *slash = strrchr(buf, '/');
    if (!slash || slash == buf) return 0;
    *slash = '\0';
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

static int write_all(int fd, const char *text) {
    size_t len = strlen(text), off = 0;
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        off += (size_t)w;
    }
    return 0;
}

/* `text` in a new file next to `path` (path.tmpXXXXXX), with permissions `mode`, synced to disk; its
 * name in *tmp (malloc'd). -1 with errno, nothing left behind, when it cannot. */
static int write_temp(const char *path, const char *text, unsigned mode, char **tmp) {
    size_t n = strlen(path) + sizeof ".tmpXXXXXX";
    char *name = malloc(n);
    if (!name) return -1;
    snprintf(name, n, "%s.tmpXXXXXX", path);
    int fd = mkstemp(name);
    if (fd < 0) {
        int e = errno;
        free(name);
        errno = e;
        return -1;
    }
    bool ok = write_all(fd, text) == 0 && fchmod(fd, (mode_t)mode) == 0 && fsync(fd) == 0;
    int e = errno;
    if (close(fd) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        unlink(name);
        free(name);
        errno = e;
        return -1;
    }
    *tmp = name;
    return 0;
}

/* The rename itself reaches the disk: the directory is synced too. */
static void sync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

/* Puts the temporary file in place of `path`. Without `replace`, link() refuses an existing target:
 * a file that appeared meanwhile is not overwritten. The temporary file is gone afterwards. */
static int commit_temp(const char *tmp, const char *path, bool replace) {
    int rc = replace ? rename(tmp, path) : link(tmp, path);
    if (rc != 0 && !replace && errno != EEXIST) rc = rename(tmp, path);   /* no hard links here */
    else if (rc == 0 && !replace) unlink(tmp);
    int e = errno;
    if (rc != 0) unlink(tmp);
    else sync_dir(path);
    errno = e;
    return rc;
}

int ca_cli_write_atomic(const char *path, const char *text, bool replace) {
    char *tmp = NULL;
    if (write_temp(path, text, 0644, &tmp) != 0) return -1;
    int rc = commit_temp(tmp, path, replace);
    free(tmp);
    return rc;
}

/* ------------------------------------------------------------------ reading back */

/* A value for a message: at most 60 bytes of it. */
static void clip(char *buf, size_t size, const char *v) {
    snprintf(buf, size, "%.60s%s", v, strlen(v) > 60 ? "..." : "");
}

/* The value the loader keeps for `value` of `key` (enumerations in their listed spelling, booleans and
 * numbers in their stored form), from a scratch configuration; a key outside the schema keeps its text. */
static char *canonical(ca_config *scratch, const char *key, const char *value) {
    if (ca_config_get(scratch, key) && ca_config_set(scratch, key, value, CA_SRC_PROGRAM, "written") == CA_OK)
        return dupstr(ca_config_get(scratch, key));
    ca_clear_error();
    return dupstr(value);
}

/* A value the loader adds by itself (num_processes of a NO file) has a note after the line:
 * "file:3 (distributed_type: NO)". */
static bool from_the_text(const char *origin, const char *file) {
    size_t n = strlen(file);
    return strncmp(origin, file, n) == 0 && origin[n] == ':' && origin[n + 1] &&
           strspn(origin + n + 1, "0123456789") == strlen(origin + n + 1);
}

/* Compares what `tmp` holds, as the loader reads it, with the document: every key with its value, and
 * no key that the document lacks (sections apart: they hold the keys). 0 when they agree, else -1
 * with the first difference described in `why`. */
static int compare(const ca_cli_doc *d, const ca_config *c, ca_config *scratch, const char *tmp, char *why,
                   size_t size) {
    char a[80], b[80];
    for (size_t i = 0; i < d->n; i++) {
        const ca_cli_doc_item *it = &d->items[i];
        const char *got = ca_config_get(c, it->key);
        char *want = canonical(scratch, it->key, it->value);
        if (!want) {
            snprintf(why, size, "out of memory");
            return -1;
        }
        bool same = got && ca_config_source_of(c, it->key) == CA_SRC_FILE && strcmp(got, want) == 0;
        clip(a, sizeof a, want);
        free(want);
        if (same) continue;
        clip(b, sizeof b, got ? got : "nothing");
        snprintf(why, size, "key '%.200s' reads back as '%s', not '%s' as written", it->key, b, a);
        return -1;
    }
    /* A section is listed only when it was written empty, which the document never does. */
    for (int i = 0; i < ca_config_count(c); i++) {
        ca_config_entry e;
        if (ca_config_entry_at(c, i, &e) != CA_OK || e.source != CA_SRC_FILE || !strcmp(e.value, "null")) continue;
        if (find(d, e.key) || !from_the_text(e.origin, tmp)) continue;
        snprintf(why, size, "key '%.200s' appears, which was not written", e.key);
        return -1;
    }
    return 0;
}

/* Test hook: CACCEL_TEST_CONFIG_STALL=1 stops the command (SIGSTOP) once the new text is in its
 * temporary file and before it is read back, so that a test can change the file there and see the
 * difference caught and `path` kept. */
static void test_stall(const char *cmd, const char *tmp) {
    const char *v = getenv("CACCEL_TEST_CONFIG_STALL");
    if (!v || strcmp(v, "1") != 0) return;
    fprintf(stderr, "caccel %s: stalled before reading back %s (CACCEL_TEST_CONFIG_STALL)\n", cmd, tmp);
    fflush(stderr);
    raise(SIGSTOP);
}

/* Reads `tmp` back with the loader every program uses; 0 when it holds the document. */
static int read_back(const ca_cli_doc *d, const char *tmp, char *why, size_t size) {
    ca_config *c = NULL, *scratch = NULL;
    int rc = 0;
    if (ca_config_create(&c) != CA_OK || ca_config_create(&scratch) != CA_OK) {
        snprintf(why, size, "%s", ca_last_error());
        rc = -1;
    } else if (ca_config_load_file(c, tmp) != CA_OK) {
        snprintf(why, size, "it does not load: %s", ca_last_error());
        rc = -1;
    } else {
        rc = compare(d, c, scratch, tmp, why, size);
    }
    ca_config_destroy(c);
    ca_config_destroy(scratch);
    ca_clear_error();
    return rc;
}

int ca_cli_doc_save(ca_cli_doc *d, const char *path, const char *header, unsigned mode, bool replace,
                    const char *cmd) {
    char *text = d->nomem ? NULL : ca_cli_doc_render(d, ca_cli_path_is_json(path), header);
    if (!text) {
        fprintf(stderr, "caccel %s: error: out of memory rendering the configuration for %s\n", cmd, path);
        return 1;
    }
    char *tmp = NULL;
    int rc = write_temp(path, text, mode, &tmp);
    free(text);
    if (rc != 0) {
        fprintf(stderr, "caccel %s: error: cannot write %s: %s\n", cmd, path, strerror(errno));
        return 1;
    }
    test_stall(cmd, tmp);
    char why[1024];
    if (read_back(d, tmp, why, sizeof why) != 0) {
        unlink(tmp);
        fprintf(stderr, "caccel %s: error: the text written for %s does not read back as written (%s): %s; "
                        "%s was not changed\n", cmd, path, tmp, why, path);
        free(tmp);
        return 1;
    }
    rc = commit_temp(tmp, path, replace);
    int e = errno;
    free(tmp);
    if (rc != 0) {
        fprintf(stderr, "caccel %s: error: cannot write %s: %s\n", cmd, path, strerror(e));
        return 1;
    }
    return 0;
}
