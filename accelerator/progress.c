/* The training loop's progress bar (caccel/progress.h). ca_progress_update is on every step's path:
 * it reads the clock and compares; formatting and writing happen only when a redraw is due. */
#include "accelerator/accelerator_impl.h"

#include <caccel/progress.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct ca_progress {
    ca_accelerator *acc;       /* NULL once detached (the accelerator went first) */
    bool on;                   /* writes anything */
    bool tty;                  /* '\r' redraws; otherwise whole lines */
    FILE *out;
    double (*clock)(void *ctx);
    void *clock_ctx;
    int64_t n, total, initial;
    double start, next_t;      /* next_t: the earliest time of the next redraw */
    int64_t next_n;            /* line mode: the count that makes the next line due (the next 10%) */
    double min_interval, log_interval;
    double loss;
    bool has_loss;
    int64_t drawn_n;           /* the count of the last drawing (-1: none yet) */
    size_t last_len;           /* terminal: the length of the last drawing, to blank its tail */
    char desc[128];
};

/* The coarse clock (Linux: the last tick's time, read from the vDSO in a few ns, 1-4 ms resolution)
 * is precise enough to pace redraws of 0.1 s and costs a fifth of the fine one. */
static double pg_monotonic(void *ctx) {
    (void)ctx;
    struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* [mm:ss], or h:mm:ss from an hour on. */
static void pg_clock_text(char *buf, size_t cap, double secs) {
    long s = secs > 0 && secs < 1e9 ? (long)secs : 0;
    if (s >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    else snprintf(buf, cap, "%02ld:%02ld", s / 60, s % 60);
}

/* The bar's text at `now`, without '\r' or newline. */
static size_t pg_format(const ca_progress *p, double now, char *buf, size_t cap) {
    double el = now - p->start, rate = el > 0 ? (double)(p->n - p->initial) / el : 0;
    char elapsed[32], eta[32] = "?", rtext[48] = "? it/s", loss[48] = "";
    pg_clock_text(elapsed, sizeof elapsed, el);
    if (rate > 0 && p->total > 0) pg_clock_text(eta, sizeof eta, (double)(p->total > p->n ? p->total - p->n : 0) / rate);
    if (rate >= 1) snprintf(rtext, sizeof rtext, "%.2f it/s", rate);
    else if (rate > 0) snprintf(rtext, sizeof rtext, "%.2f s/it", 1 / rate);
    if (p->has_loss) snprintf(loss, sizeof loss, ", loss=%.4g", p->loss);
    size_t k = 0;
    if (p->desc[0]) k += (size_t)snprintf(buf + k, cap - k, "%s: ", p->desc);
    if (p->total <= 0) {
        snprintf(buf + k, cap - k, "%lld [%s, %s%s]", (long long)p->n, elapsed, rtext, loss);
        return strlen(buf);
    }
    int64_t shown = p->n < p->total ? p->n : p->total;
    int pct = (int)(100 * shown / p->total), fill = (int)(10 * shown / p->total);
    k += (size_t)snprintf(buf + k, cap - k, "%3d%%", pct);
    if (p->tty) k += (size_t)snprintf(buf + k, cap - k, "|%.*s%.*s|", fill, "##########", 10 - fill, "          ");
    snprintf(buf + k, cap - k, " %lld/%lld [%s<%s, %s%s]", (long long)p->n, (long long)p->total, elapsed, eta,
             rtext, loss);
    return strlen(buf);
}

/* Line mode: the next count at which a line is due, the first multiple of 10% above n. */
static int64_t pg_next_tenth(const ca_progress *p) {
    if (p->total <= 0) return INT64_MAX;
    int64_t k = p->n * 10 / p->total + 1;
    return (k * p->total + 9) / 10;
}

static ca_status pg_draw(ca_progress *p, double now, bool last) {
    char buf[512];
    size_t len = pg_format(p, now, buf, sizeof buf);
    if (p->tty) {
        int pad = p->last_len > len ? (int)(p->last_len - len) : 0;
        fprintf(p->out, "\r%s%*s%s", buf, pad, "", last ? "\n" : "");
    } else {
        fprintf(p->out, "%s\n", buf);
    }
    fflush(p->out);
    p->last_len = len;
    p->drawn_n = p->n;
    p->next_t = now + (p->tty ? p->min_interval : p->log_interval);
    p->next_n = p->tty ? INT64_MAX : pg_next_tenth(p);
    return ferror(p->out) ? ca_error(CA_ERR_IO, "progress: writing the bar failed") : CA_OK;
}

/* Whether this process shows bars: the main one, `progress` not false, the log level at most WARNING. */
static bool pg_enabled(const ca_accelerator *acc) {
    bool want = true;
    if (ca_config_get_bool(acc->cfg, "progress", &want) != CA_OK) want = true;
    return want && ca_is_main_process(acc) && ca_log_get_level() <= CA_LOG_WARNING;
}

ca_status ca_progress_create(ca_accelerator *acc, const ca_progress_opts *opts, ca_progress **out) {
    if (out) *out = NULL;
    if (!acc || !out) return ca_error(CA_ERR_INVALID, "progress_create: NULL accelerator or output");
    static const ca_progress_opts none;
    const ca_progress_opts *o = opts ? opts : &none;
    ca_progress *p = calloc(1, sizeof *p);
    if (!p) return ca_error(CA_ERR_NOMEM, "progress_create: out of host memory");
    p->acc = acc;
    p->on = !o->disable && pg_enabled(acc);
    p->out = o->out ? o->out : stderr;
    p->tty = o->tty ? o->tty > 0 : isatty(fileno(p->out)) == 1;
    p->clock = o->clock ? o->clock : pg_monotonic;
    p->clock_ctx = o->clock_ctx;
    p->total = o->total > 0 ? o->total : 0;
    p->min_interval = o->min_interval > 0 ? o->min_interval : 0.1;
    p->log_interval = o->log_interval > 0 ? o->log_interval : 30;
    p->n = p->initial = o->initial > 0 ? o->initial : 0;
    p->drawn_n = -1;
    snprintf(p->desc, sizeof p->desc, "%s", o->desc ? o->desc : "");
    p->start = p->clock(p->clock_ctx);
    p->next_t = p->start + (p->tty ? 0 : p->log_interval);
    p->next_n = p->tty ? INT64_MAX : pg_next_tenth(p);
    acc->progress = p;
    *out = p;
    return p->on && p->tty ? pg_draw(p, p->start, false) : CA_OK;
}

ca_status ca_progress_update(ca_progress *p, int64_t n) {
    if (!p || n < 0) return ca_error(CA_ERR_INVALID, "progress_update: NULL bar or negative count %lld", (long long)n);
    p->n += n;
    if (!p->on) return CA_OK;
    double now = p->clock(p->clock_ctx);
    if (now < p->next_t && p->n < p->next_n) return CA_OK;
    return pg_draw(p, now, false);
}

ca_status ca_progress_set_loss(ca_progress *p, double loss) {
    if (!p) return ca_error(CA_ERR_INVALID, "progress_set_loss: NULL bar");
    p->loss = loss;
    p->has_loss = true;
    return CA_OK;
}

int64_t ca_progress_count(const ca_progress *p) {
    return p ? p->n : 0;
}

ca_status ca_progress_close(ca_progress *p) {
    if (!p) return CA_OK;
    ca_status s = CA_OK;
    /* line mode: no second line when the last one already shows the final count */
    if (p->on && (p->tty || p->drawn_n != p->n)) s = pg_draw(p, p->clock(p->clock_ctx), true);
    if (p->acc && p->acc->progress == p) p->acc->progress = NULL;
    free(p);
    return s;
}

/* "loss", or a name ending in "loss" ("train_loss", "train/loss"). */
static bool pg_is_loss(const char *name) {
    size_t len = strlen(name);
    return len >= 4 && strcmp(name + len - 4, "loss") == 0;
}

void ca_progress_note_metrics(ca_progress *p, const ca_metric *values, size_t n) {
    for (size_t i = 0; p && i < n; i++)
        if (pg_is_loss(values[i].name)) ca_progress_set_loss(p, values[i].value);
}

void ca_progress_detach(ca_progress *p) {
    if (p) p->acc = NULL;
}
