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

json_object *ca_json_load(const char *path, ca_file_kind kind, char *why, size_t len, ca_status *st) {
    why[0] = '\0';
    char *text = NULL;
    size_t n = 0;
    *st = ca_file_read(path, kind, &text, &n);
    if (*st != CA_OK) return NULL;
    const char *reason;
    size_t where;
    json_object *root = ca_json_parse(text, n, &reason, &where);
    free(text);
    if (!root) {
        snprintf(why, len, "%s at byte %zu", reason, where);
        *st = CA_ERR_INVALID;
    }
    return root;
}

bool ca_json_get_u64(json_object *o, uint64_t *out) {
    if (!json_object_is_type(o, json_type_int) || json_object_get_int64(o) < 0) return false;
    *out = json_object_get_uint64(o);
    return true;
}

json_object *ca_json_member(json_object *o, const char *key) {
    json_object *v = NULL;
    return o && json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, key, &v) ? v : NULL;
}

const char *ca_json_member_str(json_object *o, const char *key) {
    json_object *v = ca_json_member(o, key);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

bool ca_json_member_bool(json_object *o, const char *key, bool dflt) {
    json_object *v = ca_json_member(o, key);
    return v && json_object_is_type(v, json_type_boolean) ? json_object_get_boolean(v) : dflt;
}

const char *ca_json_u64_text(uint64_t v, char *buf, size_t len) {
    if (v == UINT64_MAX) snprintf(buf, len, "%" PRIu64 " (2^64 - 1) or more", v);
    else snprintf(buf, len, "%" PRIu64, v);
    return buf;
}
