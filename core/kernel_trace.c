/* The profiler's slice of a kernel call (the op, device, dtype, shapes and FLOPs that
 * core/kernel_desc_impl.h described), written by ca_kcall_<slot> (device_impl.h) only while the
 * profiler records. */
#include "core/device_impl.h"
#include "base/trace_impl.h"

#include <stdio.h>

void ca_kernel_trace(const ca_device *dev, const char *slot, int64_t t0, const ca_kdesc *d) {
    int f = ca_trace_flags();
    char args[600], name[96];
    size_t at = (size_t)snprintf(args, sizeof args, "\"op\":\"%s\",\"device\":\"%s:%d\"", slot, dev->name, dev->index);
    if (d->dtype >= 0 && at < sizeof args)
        at += (size_t)snprintf(args + at, sizeof args - at, ",\"dtype\":\"%s\"", ca_dtype_name(d->dtype));
    if ((f & CA_TRACE_SHAPES) && d->shapes[0] && at < sizeof args)
        at += (size_t)snprintf(args + at, sizeof args - at, ",\"shapes\":%s", d->shapes);
    if ((f & CA_TRACE_FLOPS) && d->flops > 0 && at < sizeof args)
        snprintf(args + at, sizeof args - at, ",\"flops\":%.0f", d->flops);
    if (d->detail) snprintf(name, sizeof name, "%s.%s", slot, d->detail);
    else snprintf(name, sizeof name, "%s", slot);
    ca_trace_slice("kernel", name, t0, args);
}
