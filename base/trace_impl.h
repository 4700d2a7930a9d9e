/* trace_impl.h: the profiler's recorder as the library's hooks see it (caccel/profile.h is the
 * user's face). Every hook is `if (ca_trace_on()) ...`: off, one relaxed load and a branch. Events
 * are formatted as Chrome trace-event JSON into the calling thread's buffer; ca_profile_end joins
 * the buffers into one file. */
#ifndef CACCEL_TRACE_IMPL_H
#define CACCEL_TRACE_IMPL_H

#include <caccel/profile.h>
#include <stdatomic.h>
#include <stdint.h>

/* Bits of ca_trace_flags_: ON..FLOPS set only while a schedule's active step records; COUNT while a
 * throughput meter counts the kernels' FLOPs (ca_flop_count_enable), profile or not; FR (the flight
 * recorder keeps the last kernel calls, core/kernel_trace.c) from the first communicator made with a
 * flight recorder directory to the end of the process. The profiler's changes keep COUNT and FR. */
enum { CA_TRACE_ON = 1, CA_TRACE_SHAPES = 2, CA_TRACE_MEMORY = 4, CA_TRACE_FLOPS = 8, CA_TRACE_COUNT = 16,
       CA_TRACE_FR = 32 };
extern CA_API _Atomic int ca_trace_flags_;

static inline int ca_trace_flags(void) { return atomic_load_explicit(&ca_trace_flags_, memory_order_relaxed); }
static inline bool ca_trace_on(void) { return __builtin_expect(ca_trace_flags() & CA_TRACE_ON, 0); }
/* Whether the kernel call must take its out-of-line path (tracing, counting or the flight recorder):
 * one load, a branch. */
static inline bool ca_trace_any(void) { return __builtin_expect(ca_trace_flags() != 0, 0); }

/* The matrix FLOPs of the kernels called (through CA_KCALL, any thread) while counting is on: the
 * throughput meter's numerator (caccel/throughput.h). Whole FLOPs in 64 bits: 2^64 is 5 hours at
 * 1 EFLOP/s, and the meter reads differences. */
extern CA_API _Atomic uint64_t ca_flops_counted_;
static inline void ca_flops_add(double flops) {
    if (flops > 0) atomic_fetch_add_explicit(&ca_flops_counted_, (uint64_t)flops, memory_order_relaxed);
}
static inline uint64_t ca_flops_counted(void) { return atomic_load_explicit(&ca_flops_counted_, memory_order_relaxed); }
/* Counting is on while at least one user has it on (reference-counted: a meter per accelerator). */
CA_API void ca_flop_count_enable(bool on);

/* Monotonic nanoseconds (CLOCK_MONOTONIC): the same clock on every process of a machine. */
CA_API int64_t ca_trace_now_ns(void);

/* A complete slice ("ph":"X") on the calling thread from t0_ns to now. args_json is the inside of
 * the args object ("\"seq\":3,\"bytes\":64") or NULL; name and cat are escaped. */
CA_API void ca_trace_slice(const char *cat, const char *name, int64_t t0_ns, const char *args_json);
/* The same with an explicit end. */
CA_API void ca_trace_slice_at(const char *cat, const char *name, int64_t t0_ns, int64_t t1_ns, const char *args_json);
/* A counter sample ("ph":"C") now: args_json holds its series ("\"allocated\":1024,\"reserved\":2048"). */
CA_API void ca_trace_counter(const char *name, const char *args_json);

/* A collective's slice, kept aside (not in the thread's buffer) until ca_profile_end writes it, so
 * that the split of its time can be added once the ranks have exchanged their issue times
 * (accelerator/trace_split.c): comm and seq name it on every rank, rank and world are the
 * communicator's. The calling thread's tid, as for a slice. */
CA_API void ca_trace_collective(const char *name, int64_t t0_ns, int64_t t1_ns, const char *args_json,
                                const char *comm, uint64_t seq, int rank, int world);

/* What the exchange needs of each kept collective, in the order they were recorded. */
typedef struct ca_trace_coll_key {
    char comm[96];
    uint64_t seq;
    int32_t rank, world;
    int64_t issue_ns, dur_ns;
} ca_trace_coll_key;

/* Stops recording for good (what ca_profile_end does first) so that the exchange's own collectives
 * are not recorded; the profile stays open for ca_profile_end. No-op when none runs. */
CA_API void ca_profile_stop(void);
/* After ca_profile_stop: a malloc'd copy of the kept collectives' keys (*n of them; NULL, 0 when none
 * or out of memory: then none is split). The caller frees it. */
CA_API ca_trace_coll_key *ca_trace_coll_keys(size_t *n);
/* Kept collective i waited for peers for wait_ns of its slice (the rest moved data); last_rank
 * arrived last. Written into its args as peers_wait_us, transfer_us and last_arrival. */
CA_API void ca_trace_coll_split(size_t i, int64_t wait_ns, int last_rank);
/* The trace metadata's otherData.collective_split: how the exchange went ("exchanged in 0.41 ms: 24
 * of 24 collectives split", "... 0 of 24 ... (... different machines' clocks)"); without one,
 * ca_profile_end says that no exchange ran (a program that ends its profile itself). */
CA_API void ca_trace_split_note(const char *note);
/* The kernel's boot id ("" where it cannot be read): ranks with the same one read one CLOCK_MONOTONIC. */
CA_API void ca_trace_boot_id(char *out, size_t n);

#endif
