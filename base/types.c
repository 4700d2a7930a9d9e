/* Names and sizes of dtypes and operator enums; the monotonic clock. */
#include "base/base_impl.h"

#include <time.h>

/* Every table here is generated from the enum's list in caccel/types.h. */
#define NAME_ROW(e, name, ...) name,

static const struct { const char *name; uint8_t size; bool is_float; } dtypes[] = {
#define DTYPE_ROW(e, name, size, is_float) {name, size, is_float},
    CA_DTYPE_LIST(DTYPE_ROW)
#undef DTYPE_ROW
};
CA_TABLE_COVERS(dtypes, CA_DTYPE_COUNT);

size_t ca_dtype_size(ca_dtype dt) { return (unsigned)dt < CA_DTYPE_COUNT ? dtypes[dt].size : 0; }

const char *ca_dtype_name(ca_dtype dt) { return (unsigned)dt < CA_DTYPE_COUNT ? dtypes[dt].name : "?"; }

bool ca_dtype_is_float(ca_dtype dt) { return (unsigned)dt < CA_DTYPE_COUNT && dtypes[dt].is_float; }

const char *ca_reduce_op_name(ca_reduce_op op) {
    static const char *const names[] = {CA_REDUCE_OP_LIST(NAME_ROW)};
    CA_TABLE_COVERS(names, CA_REDUCE_OP_COUNT);
    return (unsigned)op < CA_REDUCE_OP_COUNT ? names[op] : "?";
}

const char *ca_unary_op_name(ca_unary_op op) {
    static const char *const names[] = {CA_UNARY_OP_LIST(NAME_ROW)};
    CA_TABLE_COVERS(names, CA_UNARY_OP_COUNT);
    return (unsigned)op < CA_UNARY_OP_COUNT ? names[op] : "?";
}

const char *ca_binary_op_name(ca_binary_op op) {
    static const char *const names[] = {CA_BINARY_OP_LIST(NAME_ROW)};
    CA_TABLE_COVERS(names, CA_BINARY_OP_COUNT);
    return (unsigned)op < CA_BINARY_OP_COUNT ? names[op] : "?";
}

int64_t ca_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
