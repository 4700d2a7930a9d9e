/* trace_impl.h: the profiler's recorder as the library's hooks see it (caccel/profile.h is the
 * user's face). Every hook is `if (ca_trace_on()) ...`: off, one relaxed load and a branch. Events
 * are formatted as Chrome trace-event JSON into the calling thread's buffer; ca_profile_end joins
 * the buffers into one file. */
#ifndef CACCEL_TRACE_IMPL_H
#define CACCEL_TRACE_IMPL_H

#include <caccel/profile.h>
#include <stdatomic.h>
#include <stdint.h>

/* Bits of ca_trace_flags_: ON, SHAPES, MEMORY, FLOPS set only while a schedule's active step records;
 * FR (the flight recorder keeps the last kernel calls, core/kernel_trace.c) from the first communicator
 * made with a flight recorder directory to the end of the process. The profiler's changes keep FR. */
enum { CA_TRACE_ON = 1, CA_TRACE_SHAPES = 2, CA_TRACE_MEMORY = 4, CA_TRACE_FLOPS = 8, CA_TRACE_FR = 16 };
extern CA_API _Atomic int ca_trace_flags_;

static inline int ca_trace_flags(void) { return atomic_load_explicit(&ca_trace_flags_, memory_order_relaxed); }
static inline bool ca_trace_on(void) { return __builtin_expect(ca_trace_flags() & CA_TRACE_ON, 0); }
/* The kernel call's hook: the profiler records, or the flight recorder keeps kernel calls. */
static inline bool ca_trace_kernels(void) {
    return __builtin_expect(ca_trace_flags() & (CA_TRACE_ON | CA_TRACE_FR), 0);
}

/* Monotonic nanoseconds (CLOCK_MONOTONIC): the same clock on every process of a machine. */
CA_API int64_t ca_trace_now_ns(void);

/* A complete slice ("ph":"X") on the calling thread from t0_ns to now. args_json is the inside of
 * the args object ("\"seq\":3,\"bytes\":64") or NULL; name and cat are escaped. */
CA_API void ca_trace_slice(const char *cat, const char *name, int64_t t0_ns, const char *args_json);
/* The same with an explicit end. */
CA_API void ca_trace_slice_at(const char *cat, const char *name, int64_t t0_ns, int64_t t1_ns, const char *args_json);
/* A counter sample ("ph":"C") now: args_json holds its series ("\"allocated\":1024,\"reserved\":2048"). */
CA_API void ca_trace_counter(const char *name, const char *args_json);

#endif
