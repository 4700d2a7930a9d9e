/* JSON through json-c with failures in words (json_impl.h): one place that turns the tokener's
 * states into reasons a message can quote, for every reader of JSON in the library and the tools. */
#include "core/json_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_object *ca_json_parse(const char *text, size_t len, const char **why, size_t *where) {
    *why = NULL;
    *where = 0;
    if (len > INT_MAX) {   /* json_tokener_parse_ex takes an int */
        *why = "the text is larger than 2 GiB";
        return NULL;
    }
    json_tokener *tk = json_tokener_new();
    if (!tk) {
        *why = "out of memory";
        return NULL;
    }
    json_object *root = json_tokener_parse_ex(tk, text, (int)len);
    enum json_tokener_error err = json_tokener_get_error(tk);
    size_t end = json_tokener_get_parse_end(tk);
    json_tokener_free(tk);
    *where = end;
    if (err == json_tokener_continue || (!root && err == json_tokener_success)) *why = "unexpected end of input";
    else if (err != json_tokener_success) *why = json_tokener_error_desc(err);
    else {
        while (end < len && (text[end] == ' ' || text[end] == '\t' || text[end] == '\n' || text[end] == '\r')) end++;
        if (end < len) {
            *why = "bytes after the value";
            *where = end;
        }
    }
    if (!*why) return root;
    json_object_put(root);
    return NULL;
}

/* The whole file in a malloc'd buffer, or NULL with *err (errno: a directory gives EISDIR). */
static char *read_all(const char *path, size_t *len, int *err) {
    *err = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        *err = errno;
        return NULL;
    }
    size_t cap = 0, n = 0;
    char *buf = NULL;
    for (;;) {
        if (n == cap) {
            char *nb = cap <= SIZE_MAX / 2 - 4096 ? realloc(buf, cap = cap * 2 + 4096) : NULL;
            if (!nb) {
                *err = ENOMEM;
                break;
            }
            buf = nb;
        }
        errno = 0;
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) *err = errno ? errno : EIO;
            break;
        }
    }
    fclose(f);
    if (*err) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

json_object *ca_json_load(const char *path, char *why, size_t len, int *sys_errno) {
    size_t n = 0;
    int e;
    char *text = read_all(path, &n, &e);
    if (sys_errno) *sys_errno = e;
    if (!text) {
        snprintf(why, len, "%s", strerror(e));
        return NULL;
    }
    const char *reason;
    size_t where;
    json_object *root = ca_json_parse(text, n, &reason, &where);
    free(text);
    if (!root) snprintf(why, len, "%s at byte %zu", reason, where);
    return root;
}

bool ca_json_get_u64(json_object *o, uint64_t *out) {
    if (!json_object_is_type(o, json_type_int) || json_object_get_int64(o) < 0) return false;
    *out = json_object_get_uint64(o);
    return true;
}

const char *ca_json_u64_text(uint64_t v, char *buf, size_t len) {
    if (v == UINT64_MAX) snprintf(buf, len, "%" PRIu64 " (2^64 - 1) or more", v);
    else snprintf(buf, len, "%" PRIu64, v);
    return buf;
}
