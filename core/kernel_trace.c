/* The profiler's slice of a kernel call (the op, device, dtype, shapes and FLOPs that
 * core/kernel_desc_impl.h described), written by ca_kcall_<slot> (device_impl.h) only while the
 * profiler records; and the flight recorder's ring of the last kernel calls, kept while a flight
 * recorder directory is configured (comm/flightrec.c dumps it with the collectives). */
#include "core/device_impl.h"
#include "base/trace_impl.h"
#include "base/sigout_impl.h"

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

/* The slot's shapes when they are a whole JSON array of numbers ("[[2,3],[3,4]]"); else "[]". Cut to
 * fit the slot, or caught while another thread rewrites it, they may be neither: read within the slot. */
static const char *shapes_json(const char *s, size_t max) {
    int depth = 0;
    size_t i = 0;
    for (; i < max && s[i]; i++) {
        char ch = s[i];
        if (ch != '[' && ch != ']' && ch != ',' && (ch < '0' || ch > '9')) return "[]";
        depth += ch == '[' ? 1 : ch == ']' ? -1 : 0;
        if (depth < 0) return "[]";
    }
    return i > 0 && i < max && depth == 0 ? s : "[]";
}

static void write_kernel(ca_sigout *o, uint64_t t, const kfr_entry *e, bool first) {
    ca_sigout_str(o, first ? "\n    {\"n\":" : ",\n    {\"n\":");
    ca_sigout_u64(o, t);
    ca_sigout_str(o, ",\"op\":\"");
    ca_sigout_str(o, e->op);
    if (e->detail) {
        ca_sigout_str(o, ".");
        ca_sigout_str(o, e->detail);
    }
    ca_sigout_str(o, "\",\"device\":");
    ca_sigout_json(o, e->device, sizeof e->device - 1);
    ca_sigout_str(o, ",\"dtype\":\"");
    ca_sigout_str(o, e->dtype >= 0 ? ca_dtype_name((ca_dtype)e->dtype) : "none");
    ca_sigout_str(o, "\",\"shapes\":");
    ca_sigout_str(o, shapes_json(e->shapes, sizeof e->shapes));
    ca_sigout_str(o, ",\"t_start_ns\":");
    ca_sigout_i64(o, e->t0);
    ca_sigout_str(o, ",\"t_end_ns\":");
    ca_sigout_i64(o, e->t1);
    ca_sigout_str(o, "}");
}

void ca_kernel_fr_write(ca_sigout *o) {
    ca_sigout_str(o, "[");
    uint64_t end = atomic_load(&g_kfr_next), n = g_kfr ? g_kfr_n : 0;
    bool first = true;
    for (uint64_t t = end > n ? end - n : 0; t < end && n; t++) {
        const kfr_entry *e = &g_kfr[t % n];
        if (atomic_load_explicit(&e->ticket, memory_order_acquire) != t + 1) continue;   /* overwritten or torn */
        write_kernel(o, t, e, first);
        first = false;
    }
    ca_sigout_str(o, first ? "]" : "\n  ]");
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
