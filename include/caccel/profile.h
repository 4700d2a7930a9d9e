/* caccel/profile.h: the profiler. A Chrome trace-event JSON file per process (rank), which
 * Perfetto (ui.perfetto.dev) and chrome://tracing open: kernel calls with their op, shapes, dtype,
 * device and FLOPs, autograd's backward nodes, collectives with their sequence numbers and bytes,
 * dataloader waits, checkpoint saves, the allocator's live and reserved bytes, the lazy device's
 * graph compiles and runs. The configuration is Accelerate's ProfileKwargs (docs/PROFILING.md).
 *
 * Off (the default) every hook costs one load of a flag and a branch. The accelerator begins a
 * profile when the configuration's `profile` is true, counts its optimizer steps with
 * ca_profile_step and ends it (writing the file) when it is destroyed; a program without an
 * accelerator calls the three itself. Threading: begin, step and end are called from one thread
 * (the training loop's); events are recorded from any thread, each into its own buffer. */
#ifndef CACCEL_PROFILE_H
#define CACCEL_PROFILE_H

#include <caccel/status.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Accelerate's ProfileKwargs. Zeroed fields are the defaults noted. */
typedef struct ca_profile_config {
    const char *activities;       /* "cpu", "cuda" or "cpu,cuda" (NULL: all); kept in the trace's metadata:
                                     every event here is timed on the host */
    /* schedule_option: steps (ca_profile_step) wait, then warmup, then active are recorded, the
     * cycle done `repeat` times (0: for ever). All zero: every step is recorded. */
    int wait, warmup, active, repeat;
    bool record_shapes;           /* kernel slices carry their shapes and dtypes */
    bool profile_memory;          /* the allocator's counter track */
    bool with_flops;              /* kernel slices carry their FLOPs */
    const char *output_trace_dir; /* where trace_rank<rank>.json is written (NULL: the current directory) */
    int rank;                     /* the trace's pid; -1: 0 */
} ca_profile_config;

/* Starts recording per cfg. Refuses (CA_ERR_STATE) a second begin without an end, (CA_ERR_INVALID)
 * a negative schedule count or unknown activity, and (CA_ERR_IO) an output_trace_dir that cannot be
 * created or written, naming it, so a long run does not fail only at its end. */
CA_API ca_status ca_profile_begin(const ca_profile_config *cfg);

/* One step of the schedule (torch's prof.step()): the accelerator calls it after each optimizer
 * step. No-op when no profile is running. */
CA_API ca_status ca_profile_step(void);

/* Stops recording and writes <output_trace_dir>/trace_rank<rank>.json; the buffers are freed.
 * CA_ERR_STATE without a begin; CA_ERR_IO naming the file when it cannot be written. */
CA_API ca_status ca_profile_end(void);

/* Whether a profile is running (begun, not ended), and whether events are recorded now. */
CA_API bool ca_profile_running(void);
CA_API bool ca_profile_recording(void);

/* The path of the last trace written by ca_profile_end ("" before any). */
CA_API const char *ca_profile_last_path(void);

/* A user's own slice on the calling thread ("cat" user): CA_PROFILE_SCOPE("forward") { ... } */
CA_API int64_t ca_profile_range_begin(void);
CA_API void ca_profile_range_end(const char *name, int64_t begin);
#define CA_PROFILE_SCOPE(name) \
    for (int64_t ca_ps_t_ = ca_profile_range_begin(), ca_ps_once_ = 1; ca_ps_once_; \
         ca_ps_once_ = 0, ca_profile_range_end((name), ca_ps_t_))

#ifdef __cplusplus
}
#endif
#endif
