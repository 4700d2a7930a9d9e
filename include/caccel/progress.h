/* caccel/progress.h: a progress bar for the training loop, as Accelerate's scripts use tqdm with
 * `disable=not accelerator.is_local_main_process`.
 *
 *   ca_progress *bar;
 *   CA_CHECK(ca_progress_create(acc, &(ca_progress_opts){.total = ca_dataloader_num_batches(dl),
 *                                                          .desc = "epoch 1/5"}, &bar));
 *   while (ca_dataloader_next(dl, &b)) { ...; CA_CHECK(ca_progress_update(bar, 1)); }
 *   CA_CHECK(ca_progress_close(bar));
 *
 * The bar goes to stderr on the main process only; on every other process the calls do nothing. It
 * is off when the configuration key `progress` is false (CACCEL_PROGRESS=false, --progress false) or
 * the log level is above WARNING (CACCEL_LOG_LEVEL=ERROR, CRITICAL or OFF). On a terminal it redraws
 * one line with '\r' at most every `min_interval` seconds (default 0.1):
 *
 *   epoch 1/5:  42%|####      | 197/469 [00:01<00:02, 131.50 it/s, loss=0.5123]
 *
 * When stderr is not a terminal (a log file, a pipe, CI) it writes the same text without the bar as
 * whole lines, one when the count passes each 10% of `total` or `log_interval` seconds (default 30)
 * have gone by, whichever comes first, and one at ca_progress_close:
 *
 *   epoch 1/5:  42% 197/469 [00:01<00:02, 131.50 it/s, loss=0.5123]
 *
 * Elapsed time and ETA are [mm:ss] (h:mm:ss from an hour); the ETA is (total - n) / rate with the
 * rate averaged since the bar started (steps given as `initial` excluded); below 1 it/s the rate reads "s/it" as tqdm's. With no total,
 * there is no percentage and no ETA, and non-terminal lines come every log_interval seconds only.
 * The loss shown is the last value given to ca_progress_set_loss, or else the last metric named
 * "loss" or ending in "loss" ("train_loss", "train/loss") passed to ca_log_metrics while the bar is
 * open (caccel/tracking.h).
 *
 * Cost per ca_progress_update: one clock read (CLOCK_MONOTONIC_COARSE where the system has it: on
 * Linux a vDSO read, no system call, 1-4 ms resolution) and a comparison; text is formatted and written only when a redraw is due. bench/bench_progress
 * measures it. A bar is used from one thread. */
#ifndef CACCEL_PROGRESS_H
#define CACCEL_PROGRESS_H

#include <caccel/accelerator.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ca_progress ca_progress;

typedef struct ca_progress_opts {
    int64_t total;             /* steps expected (ca_dataloader_num_batches); <= 0: unknown */
    int64_t initial;           /* steps already done (a resumed epoch): counted, not in the rate */
    const char *desc;          /* text before the count, copied (NULL: none) */
    double min_interval;       /* terminal: seconds between redraws (0: 0.1) */
    double log_interval;       /* not a terminal: seconds between lines at most (0: 30) */
    bool disable;              /* tqdm's disable=: no output on this process either */
    /* For tests and replays; leave zero otherwise. */
    FILE *out;                 /* where to write (NULL: stderr) */
    int tty;                   /* 1: terminal mode, -1: line mode, 0: isatty(fileno(out)) */
    double (*clock)(void *ctx);/* seconds on a monotonic clock (NULL: CLOCK_MONOTONIC_COARSE) */
    void *clock_ctx;
} ca_progress_opts;

/* Starts a bar at 0 steps; *out is the caller's, released by ca_progress_close. `opts` may be NULL
 * (no total, no description). On processes other than the main one, with `progress` false, under a
 * log level above WARNING or with opts->disable, the bar is silent and every call on it returns CA_OK.
 * While open, it is the accelerator's current bar (the one ca_log_metrics gives its loss): close it
 * before ca_accelerator_destroy. CA_ERR_INVALID for a NULL acc or out; CA_ERR_NOMEM. */
CA_API ca_status ca_progress_create(ca_accelerator *acc, const ca_progress_opts *opts, ca_progress **out);

/* Adds n steps (n >= 0) and redraws when due. CA_ERR_INVALID for a NULL bar or a negative n. */
CA_API ca_status ca_progress_update(ca_progress *bar, int64_t n);

/* The loss shown from the next redraw on. CA_ERR_INVALID for a NULL bar. */
CA_API ca_status ca_progress_set_loss(ca_progress *bar, double loss);

/* Steps counted so far (0 for NULL): for a program's own figures. */
CA_API int64_t ca_progress_count(const ca_progress *bar);

/* Draws the final state (ends the terminal line), releases the bar. NULL is accepted.
 * CA_ERR_IO when writing to the stream failed. */
CA_API ca_status ca_progress_close(ca_progress *bar);

#ifdef __cplusplus
}
#endif

#endif
