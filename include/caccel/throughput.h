/* caccel/throughput.h: the training loop's throughput and model FLOPs utilisation (MFU), as llm.c's
 * step line and torchtitan's metrics report them (docs/PROFILING.md, "Throughput and MFU").
 *
 * The program calls ca_throughput_step after each step with the samples and tokens it processed
 * (what a token is, the program says: 0 when it has none). The accelerator counts the matrix FLOPs
 * (GEMM and attention, forward and backward) of the kernels its process calls meanwhile, so
 * achieved FLOP/s needs no model formula; MFU is that over the device's peak, which the `peak_flops`
 * key gives or a short GEMM probe measures once per machine and dtype and caches under
 * $XDG_CACHE_HOME/caccel (else ~/.cache/caccel). The first step starts the clock and is not counted
 * (its warm-up would skew the first interval). With `throughput_interval` N > 0 every N steps close an
 * interval: its line is printed on the main process and its values logged to the trackers
 * (throughput/samples_per_s, throughput/tokens_per_s, throughput/flops_per_s, throughput/mfu).
 * The values are this process's; with several processes ca_throughput_report also sums them over
 * the ranks (one all-reduce of five numbers: every rank must call it at the same step, as the
 * interval of throughput_interval does) into the world_ fields: samples/s, tokens/s and FLOP/s summed,
 * and MFU over the sum of the ranks' peaks.
 *
 * Threading: the three calls come from the training loop's thread; kernels on any thread count. */
#ifndef CACCEL_THROUGHPUT_H
#define CACCEL_THROUGHPUT_H

#include <caccel/accelerator.h>
#include <caccel/device.h>
#include <caccel/status.h>
#include <caccel/types.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One closed interval. */
typedef struct ca_throughput {
    int64_t step;               /* when it closed: the first prepared optimizer's steps (the tracker
                                   step), else the ca_throughput_step calls in all */
    int64_t steps;              /* ca_throughput_step calls in the interval */
    double seconds;             /* its wall time (the device synchronised at both ends) */
    double samples, tokens;     /* processed in it (this process) */
    double samples_per_s, tokens_per_s;
    double flops;               /* matrix FLOPs of this process's kernels in it */
    double flops_per_s;
    double peak_flops;          /* the device's peak FLOP/s; 0: unknown (probe failed), then mfu is 0 */
    ca_dtype peak_dtype;        /* the dtype the peak is for: mixed_precision's (f32 without) */
    const char *peak_source;    /* "peak_flops" (the key), "probe", "cache", or "raised": a probed or cached peak
                                 * below the interval's rate became that rate (static text) */
    double mfu;                 /* flops_per_s / peak_flops */
    int world;                  /* the processes summed in the world_ fields (1: this one alone) */
    double world_samples_per_s, world_tokens_per_s, world_flops_per_s;
    double world_peak_flops;    /* the ranks' peaks summed; 0 when a rank's is unknown (then world_mfu is 0) */
    double world_mfu;           /* world_flops_per_s / world_peak_flops */
} ca_throughput;

/* Counts one step of `samples` samples and `tokens` tokens (>= 0). The first call resolves the peak
 * (the key, the cache or the probe, which runs here: a fraction of a second) and starts the clock.
 * CA_ERR_INVALID for a negative count. */
CA_API ca_status ca_throughput_step(ca_accelerator *acc, int64_t samples, int64_t tokens);

/* Closes the interval now (the steps since the last close) into *out without printing: for a loop
 * that prints its own line. With several processes a collective (every rank calls it at the same
 * step; its time is not counted in the next interval): a communicator failure's status. CA_ERR_STATE
 * when no step was counted since the last close. */
CA_API ca_status ca_throughput_report(ca_accelerator *acc, ca_throughput *out);

/* Stops the clock and the FLOP count until ca_throughput_resume: evaluation, a checkpoint save or
 * generation between steps are not training throughput. Call resume before the next step's work: a
 * step counted while paused is not counted (its work was not timed) and restarts the clock. Both
 * accept a meter not yet started (no-op). */
CA_API ca_status ca_throughput_pause(ca_accelerator *acc);
CA_API ca_status ca_throughput_resume(ca_accelerator *acc);

/* Prints r's line on the main process ("throughput: step 20: 41.3 samples/s, 10573 tokens/s,
 * 9.81 GFLOP/s, MFU 12.4% of 79.1 GFLOP/s f32 peak (cache)", and with several processes "; all 2
 * processes: 82.6 samples/s, 21146 tokens/s, 19.6 GFLOP/s, MFU 12.4% of 158.2 GFLOP/s") and logs its
 * values to the trackers when ca_init_trackers started them (the world's as throughput/world_*). */
CA_API ca_status ca_throughput_log(ca_accelerator *acc, const ca_throughput *r);

/* The peak FLOP/s of device dev for dtype dt: the cache file's value when it holds one for this
 * device (its description: model, threads, GEMM path) and dtype, else a GEMM probe of about
 * `seconds` (<= 0: 0.3), written to the cache atomically. A cache file that is not a regular file,
 * is too large, or holds no valid peak for this machine is refused with a warning naming it and
 * probed again. *source is "cache" or "probe". CA_ERR_UNSUPPORTED when the device cannot multiply
 * dt. */
CA_API ca_status ca_peak_flops(ca_device *dev, ca_dtype dt, double seconds, double *peak, const char **source);

/* The cache file ca_peak_flops uses for dev and dt into buf ("" and CA_ERR_NOT_FOUND when neither
 * XDG_CACHE_HOME nor HOME is set). */
CA_API ca_status ca_peak_cache_path(const ca_device *dev, ca_dtype dt, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
