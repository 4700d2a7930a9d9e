/* The throughput meter (caccel/throughput.h): samples, tokens and the kernels' matrix FLOPs over an
 * interval of steps, and MFU against the device's peak, which the `peak_flops` key gives or a GEMM
 * probe measures once per machine and caches (docs/PROFILING.md, "Throughput and MFU"). */
#include "accelerator/accelerator_impl.h"
#include "accelerator/mesh_impl.h"
#include "base/file_impl.h"
#include "base/trace_impl.h"
#include "core/json_impl.h"

#include <caccel/throughput.h>
#include <caccel/tracking.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A cache file holds one small JSON object. */
#define CA_FILE_PEAK_CACHE CA_FILE_KIND("a peak FLOP/s cache file", 64 * 1024, CA_ERR_NOT_FOUND, CA_ERR_INVALID)

struct ca_throughput_meter {
    bool started;             /* the first step started the clock */
    bool paused;              /* ca_throughput_pause: the clock and the count stand */
    int64_t t0_ns;            /* the running stretch began (clock, count) */
    uint64_t flops0;
    int64_t run_ns;           /* the interval's earlier stretches (before a pause) */
    uint64_t run_flops;
    int64_t step, steps;
    double samples, tokens;
    double peak;
    ca_dtype peak_dt;
    const char *peak_source;
};

static double now_s(void) { return (double)ca_trace_now_ns() * 1e-9; }

/* FNV-1a of the cache key: the file name; the key itself is kept in the file and compared. */
static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static const char *cache_dir(char *buf, size_t len) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && xdg[0] == '/') snprintf(buf, len, "%s/caccel", xdg);
    else if (home && home[0]) snprintf(buf, len, "%s/.cache/caccel", home);
    else return NULL;
    return buf;
}

ca_status ca_peak_cache_path(const ca_device *dev, ca_dtype dt, char *buf, size_t len) {
    char dir[3800], key[400];
    if (!buf || !len || !dev) return ca_error(CA_ERR_INVALID, "ca_peak_cache_path: NULL device or buffer");
    buf[0] = 0;
    if (!cache_dir(dir, sizeof dir))
        return ca_error(CA_ERR_NOT_FOUND, "peak FLOP/s cache: neither XDG_CACHE_HOME nor HOME is set");
    snprintf(key, sizeof key, "%s|%s", ca_device_description(dev), ca_dtype_name(dt));
    int n = snprintf(buf, len, "%s/peak-%s-%016llx.json", dir, ca_dtype_name(dt), (unsigned long long)fnv1a(key));
    if (n < 0 || (size_t)n >= len) return ca_error(CA_ERR_INVALID, "peak FLOP/s cache: path too long under %s", dir);
    return CA_OK;
}

/* The cached peak, or 0 with a warning naming the file when it is there but unusable. */
static double cache_read(const char *path, const ca_device *dev, ca_dtype dt) {
    char why[200] = "";
    ca_status st = CA_OK;
    json_object *o = ca_json_load(path, CA_FILE_PEAK_CACHE, why, sizeof why, &st);
    if (!o && st == CA_ERR_NOT_FOUND) { ca_clear_error(); return 0; }
    if (!o && !why[0]) snprintf(why, sizeof why, "%s", ca_last_error());
    ca_clear_error();
    json_object *v = ca_json_member(o, "peak_flops");
    const char *desc = ca_json_member_str(o, "device"), *dtn = ca_json_member_str(o, "dtype");
    double peak = v && (json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int))
                      ? json_object_get_double(v) : 0;
    if (o && !why[0] && !json_object_is_type(o, json_type_object))
        snprintf(why, sizeof why, "it holds no JSON object");
    else if (o && !why[0] && !(isfinite(peak) && peak > 0))
        snprintf(why, sizeof why, "its \"peak_flops\" is not a positive number");
    else if (o && !why[0] && (!desc || strcmp(desc, ca_device_description(dev)) != 0 || !dtn || strcmp(dtn, ca_dtype_name(dt)) != 0))
        snprintf(why, sizeof why, "its \"device\" or \"dtype\" is not this device's");
    json_object_put(o);
    if (!why[0]) return peak;
    ca_log_printf(CA_LOG_WARNING, "throughput: ignoring the peak FLOP/s cache file '%s' (%s); probing again", path, why);
    return 0;
}

/* Writes the cache through a temporary file and a rename, so a reader sees the old file or the new. */
static void cache_write(const char *path, const ca_device *dev, ca_dtype dt, double peak) {
    char dir[4096], tmp[4200];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    char *parent = strrchr(dir, '/');   /* XDG_CACHE_HOME or ~/.cache may not exist yet */
    if (parent) { *parent = 0; (void)mkdir(dir, 0700); *parent = '/'; }
    (void)mkdir(dir, 0700);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    json_object *o = json_object_new_object();
    json_object_object_add(o, "device", json_object_new_string(ca_device_description(dev)));
    json_object_object_add(o, "dtype", json_object_new_string(ca_dtype_name(dt)));
    json_object_object_add(o, "peak_flops", json_object_new_double(peak));
    FILE *f = fopen(tmp, "w");
    bool ok = f && fprintf(f, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY)) > 0;
    if (f && fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        ca_log_printf(CA_LOG_WARNING, "throughput: cannot write the peak FLOP/s cache file '%s': %s", path, strerror(errno));
        remove(tmp);
    }
    json_object_put(o);
}

/* Seconds of one n x n x n GEMM on dev (synchronised), or -1 with the error set. */
static double time_gemm(ca_device *dev, ca_dtype dt, int64_t n) {
    double t = -1;
    CA_SCOPE {
        int64_t shape[2] = {n, n};
        ca_tensor *a = ca_full(dev, dt, 2, shape, 0.5), *b = ca_full(dev, dt, 2, shape, 0.25);
        if (a && b && ca_device_synchronize(dev) == CA_OK) {
            double t0 = now_s();
            if (ca_matmul(a, b) && ca_device_synchronize(dev) == CA_OK) t = now_s() - t0;
        }
    }
    return t;
}

/* The best rate of n x n GEMMs over about `seconds`; n doubles from 256 (to 4096) until one GEMM
 * takes an eighth of the budget, so a slow device is not held for long and a fast one is measured
 * at a size that fills it. */
static ca_status probe(ca_device *dev, ca_dtype dt, double seconds, double *peak) {
    int64_t n = 256;
    double t = time_gemm(dev, dt, n);   /* the first call also warms the GEMM path up */
    while (t >= 0 && t < seconds / 8 && n < 4096) t = time_gemm(dev, dt, n *= 2);
    double best = 0, end = now_s() + seconds;
    do {
        if (t < 0) return ca_error_context("throughput: the peak FLOP/s probe (%s GEMM %lldx%lld on %s)",
                                           ca_dtype_name(dt), (long long)n, (long long)n, ca_device_name(dev));
        if (t > 0 && 2.0 * (double)n * (double)n * (double)n / t > best) best = 2.0 * (double)n * (double)n * (double)n / t;
        t = time_gemm(dev, dt, n);
    } while (now_s() < end);
    *peak = best;
    return CA_OK;
}

ca_status ca_peak_flops(ca_device *dev, ca_dtype dt, double seconds, double *peak, const char **source) {
    if (!dev || !peak) return ca_error(CA_ERR_INVALID, "ca_peak_flops: NULL device or output");
    char path[4096];
    bool cached = ca_peak_cache_path(dev, dt, path, sizeof path) == CA_OK;
    if (!cached) ca_clear_error();
    double p = cached ? cache_read(path, dev, dt) : 0;
    if (source) *source = p > 0 ? "cache" : "probe";
    if (p > 0) { *peak = p; return CA_OK; }
    ca_status s = probe(dev, dt, seconds > 0 ? seconds : 0.3, &p);
    if (s != CA_OK) return s;
    if (cached) cache_write(path, dev, dt, p);
    *peak = p;
    return CA_OK;
}

static ca_dtype peak_dtype(const ca_accelerator *acc) {
    switch (ca_accelerator_mixed_precision(acc)) {
    case CA_MP_BF16: return CA_BF16;
    case CA_MP_FP16: return CA_F16;
    default: return CA_F32;
    }
}

/* The peak from the key, else the cache or the probe; a failed probe leaves MFU unreported. */
static void resolve_peak(ca_accelerator *acc, struct ca_throughput_meter *m) {
    double given = 0;
    if (ca_config_get_double(acc->cfg, "peak_flops", &given) != CA_OK) { ca_clear_error(); given = 0; }
    m->peak_dt = peak_dtype(acc);
    if (given > 0) { m->peak = given; m->peak_source = "peak_flops"; return; }
    if (ca_peak_flops(acc->device, m->peak_dt, 0, &m->peak, &m->peak_source) != CA_OK) {
        ca_log_printf(CA_LOG_WARNING, "%s; MFU is not reported (give the peak with the peak_flops key)", ca_last_error());
        ca_clear_error();
        m->peak = 0;
        m->peak_source = "probe";
    }
}

static void mark(ca_accelerator *acc, struct ca_throughput_meter *m) {
    if (ca_device_synchronize(acc->device) != CA_OK) ca_clear_error();   /* the program's to see at its next op */
    m->t0_ns = ca_trace_now_ns();
    m->flops0 = ca_flops_counted();
    m->run_ns = 0;
    m->run_flops = 0;
    m->paused = false;
    m->steps = 0;
    m->samples = m->tokens = 0;
}

/* Adds the running stretch to the interval's totals. */
static void stop_stretch(ca_accelerator *acc, struct ca_throughput_meter *m) {
    if (m->paused) return;
    if (ca_device_synchronize(acc->device) != CA_OK) ca_clear_error();
    m->run_ns += ca_trace_now_ns() - m->t0_ns;
    m->run_flops += ca_flops_counted() - m->flops0;
    m->paused = true;
}

ca_status ca_throughput_pause(ca_accelerator *acc) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_throughput_pause: accelerator is NULL");
    if (acc->meter && acc->meter->started) stop_stretch(acc, acc->meter);
    return CA_OK;
}

ca_status ca_throughput_resume(ca_accelerator *acc) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_throughput_resume: accelerator is NULL");
    struct ca_throughput_meter *m = acc->meter;
    if (!m || !m->paused) return CA_OK;
    /* the work queued while paused (an evaluation's graph on a lazy device, its kernels on a GPU) runs
     * now, before the clock restarts, not inside the next interval */
    if (ca_device_synchronize(acc->device) != CA_OK) ca_clear_error();   /* the program's to see at its next op */
    m->t0_ns = ca_trace_now_ns();
    m->flops0 = ca_flops_counted();
    m->paused = false;
    return CA_OK;
}

ca_status ca_throughput_step(ca_accelerator *acc, int64_t samples, int64_t tokens) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_throughput_step: accelerator is NULL");
    if (samples < 0 || tokens < 0)
        return ca_error(CA_ERR_INVALID, "ca_throughput_step: negative count (samples %lld, tokens %lld)",
                        (long long)samples, (long long)tokens);
    struct ca_throughput_meter *m = acc->meter;
    if (!m) {
        if (!(m = calloc(1, sizeof *m))) return ca_error(CA_ERR_NOMEM, "ca_throughput_step: out of memory");
        acc->meter = m;
        resolve_peak(acc, m);
        ca_flop_count_enable(true);
    }
    m->step++;
    if (!m->started) { m->started = true; mark(acc, m); return CA_OK; }   /* the warm-up step is not counted */
    if (m->paused) return ca_throughput_resume(acc);   /* its work was not timed: the clock restarts here */
    m->steps++;
    m->samples += (double)samples;
    m->tokens += (double)tokens;
    int64_t every = 0;
    if (ca_config_get_int(acc->cfg, "throughput_interval", &every) != CA_OK) { ca_clear_error(); every = 0; }
    if (every <= 0 || m->steps < every) return CA_OK;
    ca_throughput r;
    ca_status s = ca_throughput_report(acc, &r);
    return s == CA_OK ? ca_throughput_log(acc, &r) : s;
}

/* v[0..n) summed over the ranks in place. A lazy device's collectives take its own memory only (they are
 * nodes of its graph): the numbers go through a device buffer there, read back at once. */
static ca_status sum_ranks(ca_accelerator *acc, float *v, int n) {
    if (!ca_device_is_lazy(acc->device)) return ca_comm_all_reduce(acc->comm, v, v, (size_t)n, CA_F32, CA_OP_SUM, NULL);
    ca_tensor *t = ca_tensor_keep(ca_from_host(acc->device, CA_F32, 1, (int64_t[]){n}, v));   /* freed below */
    ca_status s = t ? ca_comm_all_reduce(acc->comm, ca_tptr(t), ca_tptr(t), (size_t)n, CA_F32, CA_OP_SUM, NULL)
                    : ca_last_status();
    if (s == CA_OK) s = ca_tensor_to_host(t, v, sizeof *v * (size_t)n);
    ca_tensor_free(t);
    return s;
}

/* The world_ fields: r's rates summed over the ranks by one all-reduce of five numbers (f32 holds a
 * rate to 7 digits; the line prints 4), MFU over the ranks' peaks when every rank knows its own. */
static ca_status world_totals(ca_accelerator *acc, ca_throughput *r) {
    float v[5] = {(float)r->samples_per_s, (float)r->tokens_per_s, (float)r->flops_per_s, (float)r->peak_flops,
                  r->peak_flops > 0 ? 1.0f : 0.0f};
    r->world = acc->comm ? ca_comm_size(acc->comm) : 1;
    if (r->world > 1) {
        ca_status s = sum_ranks(acc, v, 5);
        if (s != CA_OK) return ca_error_context("throughput: summing the interval over %d processes", r->world);
    }
    /* the ranks of a tensor- or context-parallel group work on the same samples: counted once (FLOPs add
     * up) */
    double tp = acc->mesh ? acc->mesh->shape.size[CA_MESH_TP] * acc->mesh->shape.size[CA_MESH_CP] : 1;
    r->world_samples_per_s = r->world > 1 ? v[0] / tp : r->samples_per_s;
    r->world_tokens_per_s = r->world > 1 ? v[1] / tp : r->tokens_per_s;
    r->world_flops_per_s = r->world > 1 ? v[2] : r->flops_per_s;
    r->world_peak_flops = r->world == 1 ? r->peak_flops : (int)v[4] == r->world ? v[3] : 0;
    r->world_mfu = r->world_peak_flops > 0 ? r->world_flops_per_s / r->world_peak_flops : 0;
    return CA_OK;
}

/* A probed or cached peak below what the program just ran at was measured while the machine was busy
 * (the probe takes the best of a fraction of a second): the device can do at least the interval's
 * rate, so that becomes the peak, here and in the cache, and MFU stays a fraction. A peak the
 * configuration gives (peak_flops) is the user's to set and stays. */
static void raise_peak(ca_accelerator *acc, struct ca_throughput_meter *m, double rate) {
    char path[4096];
    bool cached = ca_peak_cache_path(acc->device, m->peak_dt, path, sizeof path) == CA_OK;
    if (!cached) ca_clear_error();
    ca_log_printf(CA_LOG_WARNING, "throughput: %.4g GFLOP/s achieved, above the %s peak of %.4g GFLOP/s (measured on a "
                  "busy machine?): the peak is now %.4g GFLOP/s%s%s", rate * 1e-9, m->peak_source, m->peak * 1e-9,
                  rate * 1e-9, cached ? ", written to " : "", cached ? path : "");
    m->peak = rate;
    m->peak_source = "raised";
    if (cached) cache_write(path, acc->device, m->peak_dt, rate);
}

ca_status ca_throughput_report(ca_accelerator *acc, ca_throughput *out) {
    if (!acc || !out) return ca_error(CA_ERR_INVALID, "ca_throughput_report: NULL accelerator or output");
    struct ca_throughput_meter *m = acc->meter;
    if (!m || m->steps == 0)
        return ca_error(CA_ERR_STATE, "ca_throughput_report: no step counted since the last report (call "
                                      "ca_throughput_step after each step; the first one starts the clock)");
    stop_stretch(acc, m);
    double secs = (double)m->run_ns * 1e-9;
    if (secs <= 0) secs = 1e-9;
    /* the program's step numbers: the first prepared optimizer's steps (micro-steps accumulate) */
    int64_t step = acc->nopts > 0 ? ca_optimizer_steps(acc->opts[0]) : m->step;
    *out = (ca_throughput){.step = step, .steps = m->steps, .seconds = secs, .samples = m->samples,
                           .tokens = m->tokens, .samples_per_s = m->samples / secs, .tokens_per_s = m->tokens / secs,
                           .flops = (double)m->run_flops, .peak_flops = m->peak,
                           .peak_dtype = m->peak_dt, .peak_source = m->peak_source};
    out->flops_per_s = out->flops / secs;
    if (m->peak > 0 && out->flops_per_s > m->peak && strcmp(m->peak_source, "peak_flops") != 0)
        raise_peak(acc, m, out->flops_per_s);
    out->peak_flops = m->peak;
    out->peak_source = m->peak_source;
    out->mfu = m->peak > 0 ? out->flops_per_s / m->peak : 0;
    ca_status s = world_totals(acc, out);   /* before the clock restarts: its wait is no step's */
    mark(acc, m);
    return s;
}

/* "; all 2 processes: 82.6 samples/s, 21146 tokens/s, 19.6 GFLOP/s, MFU 12.4% of 158.2 GFLOP/s" */
static void world_text(const ca_throughput *r, char *buf, size_t len) {
    char tok[64] = "", mfu[100] = "";
    if (r->tokens > 0) snprintf(tok, sizeof tok, ", %.0f tokens/s", r->world_tokens_per_s);
    if (r->world_peak_flops > 0)
        snprintf(mfu, sizeof mfu, ", MFU %.1f%% of %.4g GFLOP/s", 100 * r->world_mfu, r->world_peak_flops * 1e-9);
    snprintf(buf, len, "; all %d processes: %.1f samples/s%s, %.4g GFLOP/s%s", r->world, r->world_samples_per_s, tok,
             r->world_flops_per_s * 1e-9, mfu);
}

ca_status ca_throughput_log(ca_accelerator *acc, const ca_throughput *r) {
    if (!acc || !r) return ca_error(CA_ERR_INVALID, "ca_throughput_log: NULL accelerator or report");
    char tok[64] = "", mfu[160] = "";
    if (r->tokens > 0) snprintf(tok, sizeof tok, ", %.0f tokens/s", r->tokens_per_s);
    if (r->peak_flops > 0)
        snprintf(mfu, sizeof mfu, ", MFU %.1f%% of %.4g GFLOP/s %s peak (%s)", 100 * r->mfu, r->peak_flops * 1e-9,
                 ca_dtype_name(r->peak_dtype), r->peak_source);
    char world[300] = "";
    if (r->world > 1) world_text(r, world, sizeof world);
    ca_print(acc, "throughput: step %lld: %.1f samples/s%s, %.4g GFLOP/s%s%s\n", (long long)r->step, r->samples_per_s,
             tok, r->flops_per_s * 1e-9, mfu, world);
    if (!acc->trackers) return CA_OK;
    ca_metric v[8] = {{"throughput/samples_per_s", r->samples_per_s}, {"throughput/flops_per_s", r->flops_per_s}};
    size_t n = 2;
    if (r->tokens > 0) v[n++] = (ca_metric){"throughput/tokens_per_s", r->tokens_per_s};
    if (r->peak_flops > 0) v[n++] = (ca_metric){"throughput/mfu", r->mfu};
    if (r->world > 1) {
        v[n++] = (ca_metric){"throughput/world_samples_per_s", r->world_samples_per_s};
        v[n++] = (ca_metric){"throughput/world_flops_per_s", r->world_flops_per_s};
        if (r->tokens > 0) v[n++] = (ca_metric){"throughput/world_tokens_per_s", r->world_tokens_per_s};
        if (r->world_peak_flops > 0) v[n++] = (ca_metric){"throughput/world_mfu", r->world_mfu};
    }
    return ca_log_metrics(acc, v, n, r->step);
}

void ca_throughput_free(ca_accelerator *acc) {
    if (!acc->meter) return;
    ca_flop_count_enable(false);
    free(acc->meter);
    acc->meter = NULL;
}
