/* json_impl.h: JSON text and files read through json-c, with its failures said in words (private).
 * json-c's own reports are unfit for a message: a truncated text is the tokener state "continue",
 * json_util_get_last_err() is NULL after a parse that succeeded (a file that holds JSON of the
 * wrong kind) and ends in a newline otherwise, and numbers beyond the 64-bit range saturate. */
#ifndef CACCEL_JSON_IMPL_H
#define CACCEL_JSON_IMPL_H

#include "base/file_impl.h"

#include <json-c/json.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The parsed value of len bytes holding one JSON value (whitespace may follow), or NULL with
 * *why (static text: "unexpected end of input" for a text that stops inside the value, json-c's
 * description of any other error, "bytes after the value") and *where (the byte it stopped at). */
json_object *ca_json_parse(const char *text, size_t len, const char **why, size_t *where);

/* The parsed value of the file at path, read as a file of `kind` (base/file_impl.h: opened without
 * blocking, a regular file only, within the kind's size bound), or NULL. When the file cannot be
 * read, why[0] is NUL, *st the reader's status and ca_last_error() its message, which names the file
 * (kind.missing for a missing file); when it holds no JSON value, why[len] says so with
 * ca_json_parse's reason and the byte ("unexpected end of input at byte 12") and *st is
 * CA_ERR_INVALID: the caller words the error for its file. */
json_object *ca_json_load(const char *path, ca_file_kind kind, char *why, size_t len, ca_status *st);

/* An integer value as uint64: false for a non-integer or a negative one. json-c keeps integers up
 * to 2^64 - 1 (json_object_get_int64 saturates at 2^63 - 1) and saturates larger ones at 2^64 - 1:
 * that value means "2^64 - 1 or more" (ca_json_u64_text says so). */
bool ca_json_get_u64(json_object *o, uint64_t *out);
/* Member `key` of object o: NULL when o is not an object or has no such member (o may be NULL). */
json_object *ca_json_member(json_object *o, const char *key);
/* Member `key` as a string: NULL when absent or not a string. */
const char *ca_json_member_str(json_object *o, const char *key);
/* Member `key` as a boolean: dflt when absent or not a boolean. */
bool ca_json_member_bool(json_object *o, const char *key, bool dflt);
/* v in decimal into buf (48 bytes), "18446744073709551615 (2^64 - 1) or more" for UINT64_MAX. */
const char *ca_json_u64_text(uint64_t v, char *buf, size_t len);

#endif
