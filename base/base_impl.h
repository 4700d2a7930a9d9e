/* base_impl.h: what every room of the library may use: the public status, log and type
 * declarations and two small macros. Plugins call nothing of the library but these. */
#ifndef CACCEL_BASE_IMPL_H
#define CACCEL_BASE_IMPL_H

#include <caccel/status.h>
#include <caccel/log.h>
#include <caccel/types.h>
#include <caccel/backend.h>

#define CA_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define CA_UNUSED(x) ((void)(x))

/* Fails to compile unless the array tbl has exactly count rows: put after each table indexed by an
 * enum (CA_TABLE_COVERS(unary_vt, CA_UNARY_OP_COUNT)) so that an entry added to the enum's list
 * without a row here is a build error instead of a zero row read at run time. A table sized
 * [count] with designated initialisers is not enough on its own: missing rows are zeroes. */
#ifdef __cplusplus
#define CA_TABLE_COVERS(tbl, count) \
    static_assert(CA_ARRAY_LEN(tbl) == (size_t)(count), #tbl " needs one row per entry of " #count)
#else
#define CA_TABLE_COVERS(tbl, count) \
    _Static_assert(CA_ARRAY_LEN(tbl) == (size_t)(count), #tbl " needs one row per entry of " #count)
#endif

#endif
