/* The configuration file as `caccel config` writes it: Accelerate's keys, sorted, in YAML or JSON. */
#include "tools/cli_impl.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

void ca_cli_doc_put(ca_cli_doc *d, const char *key, const char *value, bool plain) {
    int i = 0;
    while (i < d->n && strcmp(d->items[i].key, key) != 0) i++;
    if (i == d->n) {
        if (d->n == CA_CLI_DOC_MAX) return;
        d->n++;
    }
    snprintf(d->items[i].key, sizeof d->items[i].key, "%s", key);
    snprintf(d->items[i].value, sizeof d->items[i].value, "%s", value);
    d->items[i].plain = plain;
}

void ca_cli_doc_drop(ca_cli_doc *d, const char *key) {
    for (int i = 0; i < d->n; i++)
        if (strcmp(d->items[i].key, key) == 0) {
            d->items[i] = d->items[--d->n];
            return;
        }
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

typedef struct outbuf {
    char *p;
    size_t n, len;
    bool overflow;
} outbuf;

static void out(outbuf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(outbuf *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->len < o->n ? o->n - o->len : 0;
    int w = vsnprintf(o->p + o->len, room, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= room) o->overflow = true;
    else o->len += (size_t)w;
}

static void yaml_value(outbuf *o, const ca_cli_doc_item *it) {
    if (it->plain || !yaml_needs_quotes(it->value)) {
        out(o, "%s\n", it->value);
        return;
    }
    out(o, "'");
    for (const char *c = it->value; *c; c++) out(o, *c == '\'' ? "''" : "%c", *c);
    out(o, "'\n");
}

static void json_value(outbuf *o, const ca_cli_doc_item *it) {
    if (it->plain) {
        out(o, "%s", it->value);
        return;
    }
    out(o, "\"");
    for (const unsigned char *c = (const unsigned char *)it->value; *c; c++) {
        if (*c == '"' || *c == '\\') out(o, "\\%c", *c);
        else if (*c < 0x20) out(o, "\\u%04x", *c);
        else out(o, "%c", *c);
    }
    out(o, "\"");
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

static void render_yaml(outbuf *o, const ca_cli_doc *d) {
    for (int i = 0; i < d->n; i++) {
        const ca_cli_doc_item *it = &d->items[i];
        size_t sl = section_len(it->key);
        if (sl && (i == 0 || !same_section(d->items[i - 1].key, it->key))) out(o, "%.*s:\n", (int)sl, it->key);
        out(o, "%s%s: ", sl ? "  " : "", sl ? it->key + sl + 1 : it->key);
        yaml_value(o, it);
    }
}

static void render_json(outbuf *o, const ca_cli_doc *d) {
    out(o, "{");
    for (int i = 0; i < d->n; i++) {
        const ca_cli_doc_item *it = &d->items[i];
        size_t sl = section_len(it->key);
        bool opens = sl && (i == 0 || !same_section(d->items[i - 1].key, it->key));
        out(o, "%s\n", i == 0 ? "" : ",");
        if (opens) out(o, "  \"%.*s\": {\n", (int)sl, it->key);
        out(o, "%s\"%s\": ", sl ? "    " : "  ", sl ? it->key + sl + 1 : it->key);
        json_value(o, it);
        bool closes = sl && (i + 1 == d->n || !same_section(d->items[i + 1].key, it->key));
        if (closes) out(o, "\n  }");
    }
    out(o, "\n}\n");
}

int ca_cli_doc_render(ca_cli_doc *d, bool json, const char *header, char *buf, size_t size) {
    qsort(d->items, (size_t)d->n, sizeof d->items[0], by_key);
    outbuf o = {buf, size, 0, false};
    if (size) buf[0] = '\0';
    if (json) {
        render_json(&o, d);
    } else {
        if (header) out(&o, "# %s\n", header);
        render_yaml(&o, d);
    }
    return o.overflow ? -1 : 0;
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

int ca_cli_write_atomic(const char *path, const char *text, bool replace) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmpXXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) return -1;
    if (write_all(fd, text) != 0 || fchmod(fd, 0644) != 0 || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        errno = e;
        return -1;
    }
    if (close(fd) != 0) {
        unlink(tmp);
        return -1;
    }
    /* Without `replace`, link() refuses an existing target: a file that
     * appeared meanwhile is not overwritten. */
    int rc = replace ? rename(tmp, path) : link(tmp, path);
    if (rc != 0 && !replace && errno != EEXIST) rc = rename(tmp, path);   /* no hard links here */
    else if (rc == 0 && !replace) unlink(tmp);
    int e = errno;
    if (rc != 0) unlink(tmp);
    errno = e;
    return rc;
}
