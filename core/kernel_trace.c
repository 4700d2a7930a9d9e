/* The profiler's slice of a kernel call (the op, device, dtype, shapes and FLOPs that
 * core/kernel_desc_impl.h described), written by ca_kcall_<slot> (device_impl.h) only while the
 * profiler records; and the flight recorder's ring of the last kernel calls, kept while a flight
 * recorder directory is configured (comm/flightrec.c dumps it with the collectives). */
#include "core/device_impl.h"
#include "base/trace_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One kernel call. op and detail are the slot's literal and the op name tables' entries: they live
 * as long as the process. `ticket` (the call's number + 1, 0: never written) is stored last, so a
 * reader skips a slot not yet written. */
typedef struct kfr_entry {
    _Atomic uint64_t ticket;
    const char *op, *detail;
    int dtype;
    char device[32];          /* "cpu:0": a plugin's name string may go with the plugin */
    int64_t t0, t1;
    char shapes[96];
} kfr_entry;

static kfr_entry *g_kfr;
static uint64_t g_kfr_n;
static _Atomic uint64_t g_kfr_next;
static pthread_mutex_t g_kfr_mu = PTHREAD_MUTEX_INITIALIZER;

bool ca_kernel_fr_enable(int entries) {
    pthread_mutex_lock(&g_kfr_mu);
    if (!g_kfr && entries > 0) {
        g_kfr = calloc((size_t)entries, sizeof *g_kfr);
        if (g_kfr) {
            g_kfr_n = (uint64_t)entries;
            atomic_fetch_or(&ca_trace_flags_, CA_TRACE_FR);
        }
    }
    bool ok = g_kfr != NULL;
    pthread_mutex_unlock(&g_kfr_mu);
    return ok;
}

/* The hot path with the recorder on: one atomic add and a copy of the description, no lock. */
static void kfr_record(const ca_device *dev, const char *slot, int64_t t0, int64_t t1, const ca_kdesc *d) {
    uint64_t t = atomic_fetch_add_explicit(&g_kfr_next, 1, memory_order_relaxed);
    kfr_entry *e = &g_kfr[t % g_kfr_n];
    atomic_store_explicit(&e->ticket, 0, memory_order_relaxed);
    e->op = slot;
    e->detail = d->detail;
    snprintf(e->device, sizeof e->device, "%s:%d", dev->name, dev->index);
    e->dtype = d->dtype;
    e->t0 = t0;
    e->t1 = t1;
    snprintf(e->shapes, sizeof e->shapes, "%s", d->shapes);
    atomic_store_explicit(&e->ticket, t + 1, memory_order_release);
}

/* Shapes cut to fit the ring's slot end inside a bracket pair no more: say "" then. */
static bool shapes_whole(const char *s) {
    int depth = 0;
    for (; *s; s++) depth += *s == '[' ? 1 : *s == ']' ? -1 : 0;
    return depth == 0;
}

void ca_kernel_fr_write(FILE *f) {
    fputc('[', f);
    uint64_t end = atomic_load(&g_kfr_next), n = g_kfr ? g_kfr_n : 0;
    bool first = true;
    for (uint64_t t = end > n ? end - n : 0; t < end && n; t++) {
        const kfr_entry *e = &g_kfr[t % n];
        if (atomic_load_explicit(&e->ticket, memory_order_acquire) != t + 1) continue;   /* overwritten or torn */
        fprintf(f, "%s\n    {\"n\":%llu,\"op\":\"%s%s%s\",\"device\":\"%s\",\"dtype\":\"%s\",\"shapes\":%s,"
                "\"t_start_ns\":%lld,\"t_end_ns\":%lld}", first ? "" : ",", (unsigned long long)t, e->op,
                e->detail ? "." : "", e->detail ? e->detail : "", e->device,
                e->dtype >= 0 ? ca_dtype_name((ca_dtype)e->dtype) : "none",
                e->shapes[0] && shapes_whole(e->shapes) ? e->shapes : "[]", (long long)e->t0, (long long)e->t1);
        first = false;
    }
    fputs(first ? "]" : "\n  ]", f);
}

void ca_kernel_trace(const ca_device *dev, const char *slot, int64_t t0, const ca_kdesc *d) {
    int f = ca_trace_flags();
    if ((f & CA_TRACE_FR) && g_kfr) kfr_record(dev, slot, t0, ca_trace_now_ns(), d);
    if (!(f & CA_TRACE_ON)) return;
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
