/* device_impl.h: an opened device as the rooms above the registry see it, and the kernel-call
 * wrapper every op uses. */
#ifndef CACCEL_DEVICE_IMPL_H
#define CACCEL_DEVICE_IMPL_H

#include "base/base_impl.h"
#include "base/kernel_check_impl.h"
#include "base/trace_impl.h"
#include "core/kernel_desc_impl.h"
#include <caccel/device.h>

/* An opened device. The registry owns it; it lives until ca_shutdown(). The
 * vtables are copies normalised to this library's struct sizes, so slots a
 * plugin's older ABI lacks read as NULL. */
struct ca_device {
    const char *name;               /* backend name */
    int index;
    ca_device_ops ops;              /* normalised copy */
    ca_kernels k;                   /* normalised copy */
    void *ctx;                      /* backend context (the `dev` of kernels) */
    const ca_allocator_ops *aops;   /* the allocator tensors use */
    void *actx;
    size_t memory_limit;            /* ca_device_set_memory_limit; 0: none (read atomically) */
    struct ca_eager_model *eager;   /* lazy device under CACCEL_MEMORY_REPORT, else NULL */
    struct ca_peak_mark *pmark;     /* under CACCEL_MEMORY_REPORT (any device), else NULL */
    char description[256];
    struct ca_device *next;
};

/* The peak bytes the allocations of lazy device d would have held on an eager device's caching
 * allocator (replayed through it: its size classes and its reuse of larger free blocks):
 * estimate-memory --run compares it with an eager step's
 * peak_allocated. Counted only while CACCEL_MEMORY_REPORT was set when d was opened; 0 otherwise. */
size_t ca_device_eager_peak(const ca_device *d);

/* Whether lazy device d stands in for an eager device (opened under CACCEL_MEMORY_REPORT, like
 * ca_device_eager_peak's count): then mixed precision bf16 on it must run as the eager device's
 * autocast, not as xla's bf16 storage, for its memory to be the eager step's. */
bool ca_device_models_eager(const ca_device *d);

/* A figure of the layer above (stage 3's unsharded bytes) that the memory report needs at the
 * moment of the step's peak, not at its own: each allocation that raises the peak the report reads
 * (ca_device_eager_peak's on a lazy device, else the allocator's) remembers the mark set last. Set
 * the mark before an allocation it counts, so the allocation that makes the peak sees it. Kept only
 * under CACCEL_MEMORY_REPORT (as ca_device_eager_peak): otherwise the set does nothing and the read
 * is 0. Any thread; the mark is one value per device. */
void ca_device_set_peak_mark(ca_device *d, size_t mark);
size_t ca_device_mark_at_peak(const ca_device *d);

/* Error for a NULL kernel slot: "device backend '<backend>' has no kernel '<slot>' (device
 * <backend>:<index>; the op needs it)". */
static inline ca_status ca_kernel_missing(const ca_device *d, const char *slot) {
    return ca_error(CA_ERR_UNSUPPORTED, "device backend '%s' has no kernel '%s': op %s cannot run on device %s:%d",
                    d->name, slot, slot, d->name, d->index);
}

/* Records the slice of kernel `slot` on dev from t0 (ns) to now (profiler), and the call in the flight
 * recorder's ring when that is on. */
CA_API void ca_kernel_trace(const ca_device *dev, const char *slot, int64_t t0, const ca_kdesc *d);
/* The flight recorder's ring of the last `entries` kernel calls (docs/PROFILING.md, "Flight recorder"):
 * allocated by the first call (later calls change nothing), kept to the end of the process; false when
 * out of memory. Any thread may call. */
bool ca_kernel_fr_enable(int entries);
/* Writes the ring, oldest first, as a JSON array to o. Async-signal-safe (no lock, no malloc, no
 * stdio: a fatal signal's handler calls it); a record being rewritten meanwhile is skipped, or shows
 * its fields bounded and quoted. */
struct ca_sigout;
void ca_kernel_fr_write(struct ca_sigout *o);

/* ca_kcall_<slot>(d, args): the checked call of kernel `slot` on device d, one per slot of
 * CA_KERNEL_LIST. The contract's checks (base/kernel_check_impl.h) run here, above the backends,
 * so a bad call fails at the op on every device, a lazy one included. */
/* The one hook of the profiler, the throughput meter and the flight recorder on the kernel path: all
 * off, a load and a branch per call; on, the call is counted (its matrix FLOPs) and, profiling or
 * recording, timed and described out of line (cold, so the plain path stays as it was). */
#define CA_KCALL_FN_(slot)                                                                     \
    static __attribute__((cold, noinline, unused)) ca_status ca_kcall_traced_##slot(           \
        const ca_device *d, const ca_##slot##_args *args) {                                    \
        int f_ = ca_trace_flags();                                                             \
        bool timed_ = (f_ & (CA_TRACE_ON | CA_TRACE_FR)) != 0;                                 \
        int64_t t0_ = timed_ ? ca_trace_now_ns() : 0;                                          \
        ca_status s_ = ca_kernel_checked_##slot(d->name, &d->k, d->ctx, args);                 \
        if ((f_ & CA_TRACE_COUNT) && s_ == CA_OK && args) ca_flops_add(CA_KFLOPS_(args));      \
        if (!timed_) return s_;                                                                \
        ca_kdesc kd_ = {.dtype = -1};                                                          \
        if (args) CA_KDESC_(args, &kd_);                                                       \
        ca_kernel_trace(d, #slot, t0_, &kd_);                                                  \
        return s_;                                                                             \
    }                                                                                          \
    static inline ca_status ca_kcall_##slot(const ca_device *d, const ca_##slot##_args *args) { \
        if (!d->k.slot) return ca_kernel_missing(d, #slot);                                    \
        if (ca_trace_any()) return ca_kcall_traced_##slot(d, args);                            \
        return ca_kernel_checked_##slot(d->name, &d->k, d->ctx, args);                         \
    }
CA_KERNEL_LIST(CA_KCALL_FN_)
#undef CA_KCALL_FN_

/* Calls kernel `slot` of device d with its arguments as designated initialisers of
 * ca_<slot>_args: CA_KCALL(d, fill, .dt = dt, .n = n, .value = v, .y = y). Fields not named are
 * zero; struct_size is set by the call. */
#define CA_KCALL(d, slot, ...) ca_kcall_##slot((d), &(const ca_##slot##_args){.struct_size = 0, __VA_ARGS__})
/* The same with an args struct built beforehand (its struct_size need not be set). */
#define CA_KCALL_ARGS(d, slot, args) ca_kcall_##slot((d), (args))

#endif
