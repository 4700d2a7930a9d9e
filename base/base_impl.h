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

#endif
