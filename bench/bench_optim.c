/* The fused optimizer kernels through the CPU kernel table: AdamW and SGD (momentum) over the
 * 784-256-128-10 MLP's six parameter tensors (235,146 f32), with the optimizer state at
 * several magnitudes down to subnormal, subnormal flushing on (the default) and off. Prints
 * microseconds per step (best of the samples), bytes moved per step and their rate against
 * memcpy and against a loop with AdamW's traffic and no arithmetic, both measured in the same run.
 * usage: bench_optim [samples (default 9)] [steps per sample (default 50)] */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/device_impl.h"
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_plugin.h"
#include "bench/bench_util.h"

#define NT 6
static const int64_t NUMEL[NT] = {784 * 256, 256, 256 * 128, 128, 128 * 10, 10};

typedef struct bufs {
    float *p[NT], *g[NT], *m[NT], *v[NT];
    int64_t total;
} bufs;

static float *alloc_f(int64_t n) {
    float *x = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    if (!x) { fprintf(stderr, "bench_optim: out of memory\n"); exit(1); }
    return x;
}

/* Weights ~0.05, zero gradients (the units a ReLU has switched off: their state decays
 * geometrically towards and through the subnormal range), state at `scale`. */
static void reset(bufs *b, float scale) {
    for (int t = 0; t < NT; t++)
        for (int64_t i = 0; i < NUMEL[t]; i++) {
            float u = (float)((i * 2654435761u) % 1000 + 1) * 1e-3f;
            b->p[t][i] = 0.05f * u;
            b->g[t][i] = 0.0f;
            b->m[t][i] = scale * u;
            b->v[t][i] = scale * u * u;
        }
}

typedef struct ctx {
    const ca_kernels *k;
    void *dev;
    ca_tensor_list list;
} ctx;

static double best_step_us(ctx *c, bufs *b, bool adam, float scale, int samples, int steps) {
    ca_adamw_args a = {.struct_size = sizeof a, .t = &c->list, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f,
                       .bias_correction1 = 0.9f, .bias_correction2 = 0.5f, .grad_scale = 1.0f};
    ca_sgd_args s = {.struct_size = sizeof s, .t = &c->list, .lr = 1e-2f, .momentum = 0.9f, .grad_scale = 1.0f};
    double best = 1e30;
    for (int r = 0; r < samples; r++) {
        reset(b, scale);
        double t0 = now_s();
        for (int i = 0; i < steps; i++) {
            ca_status st = adam ? c->k->adamw(c->dev, &a) : c->k->sgd(c->dev, &s);
            if (st != CA_OK) { fprintf(stderr, "bench_optim: %s\n", ca_last_error()); exit(1); }
        }
        double us = (now_s() - t0) / steps * 1e6;
        if (us < best) best = us;
    }
    return best;
}

/* Best memcpy rate over `bytes` (read + write counted), in GB/s. */
static double copy_gbs(int64_t bytes, int samples) {
    size_t cap = ((size_t)bytes + 63) / 64 * 64;  /* aligned_alloc wants a multiple of 64 */
    char *a = aligned_alloc(64, cap), *b = aligned_alloc(64, cap);
    if (!a || !b) { fprintf(stderr, "bench_optim: out of memory\n"); exit(1); }
    memset(a, 1, (size_t)bytes);
    memset(b, 2, (size_t)bytes);
    double best = 1e30;
    for (int r = 0; r < samples * 10; r++) {
        double t0 = now_s();
        memcpy(b, a, (size_t)bytes);
        a[r % bytes] ^= b[(r * 7) % bytes];
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    free(a);
    free(b);
    return 2.0 * (double)bytes / best * 1e-9;
}

/* One pass of the optimizer's traffic without its arithmetic, vectorised like the kernels (-O3 and
 * the same clones; this file is otherwise built with the project's default flags). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
CPU_CLONES static void traffic_pass(int64_t n, float *restrict p, const float *restrict g,
                                    float *restrict m, float *restrict v) {
    for (int64_t i = 0; i < n; i++) {
        p[i] += g[i];
        m[i] += g[i];
        v[i] += g[i];
    }
}

/* Per parameter read p, g, m, v and write p, m, v (28 B, as AdamW): best microseconds per pass
 * over all tensors. */
static double same_traffic_us(bufs *b, int samples, int steps) {
    reset(b, 1.0f);
    double best = 1e30;
    for (int r = 0; r < samples; r++) {
        double t0 = now_s();
        for (int s = 0; s < steps; s++)
            for (int t = 0; t < NT; t++) traffic_pass(NUMEL[t], b->p[t], b->g[t], b->m[t], b->v[t]);
        double us = (now_s() - t0) / steps * 1e6;
        if (us < best) best = us;
    }
    return best;
}

int main(int argc, char **argv) {
    int samples = argc > 1 ? atoi(argv[1]) : 9, steps = argc > 2 ? atoi(argv[2]) : 50;
    if (samples < 1 || steps < 1) { fprintf(stderr, "usage: bench_optim [samples] [steps]\n"); return 2; }
    const ca_plugin *pl = ca_cpu_plugin();
    const ca_device_ops *ops = pl->devices[0];
    ca_device_open_args oa = {.struct_size = sizeof oa, .local_rank = -1};
    ctx c = {.k = ops->kernels};
    if (ops->open(0, &oa, &c.dev) != CA_OK) { fprintf(stderr, "bench_optim: %s\n", ca_last_error()); return 1; }
    char desc[1024];
    ops->describe(c.dev, desc, sizeof desc);
    printf("# %s\n# kernels: %s clones; OpenBLAS core %s\n", desc, bench_kernel_set(), openblas_get_corename());
    bufs b = {0};
    void *pp[NT], *mp[NT], *vp[NT];
    const void *gp[NT];
    for (int t = 0; t < NT; t++) {
        pp[t] = b.p[t] = alloc_f(NUMEL[t]);
        gp[t] = b.g[t] = alloc_f(NUMEL[t]);
        mp[t] = b.m[t] = alloc_f(NUMEL[t]);
        vp[t] = b.v[t] = alloc_f(NUMEL[t]);
        b.total += NUMEL[t];
    }
    c.list = (ca_tensor_list){.count = NT, .param = pp, .grad = gp, .state1 = mp, .state2 = vp,
                              .numel = NUMEL, .grad_dtype = CA_F32};
    /* AdamW reads p, g, m, v and writes p, m, v; SGD reads p, g, buf and writes p, buf */
    double adam_bytes = 28.0 * (double)b.total, sgd_bytes = 20.0 * (double)b.total;
    double cp = copy_gbs(b.total * 16 / 2, samples);
    double tr = adam_bytes / same_traffic_us(&b, samples, steps) * 1e-3;
    printf("# %lld parameters; memcpy of half the AdamW footprint: %.1f GB/s (read + write); a loop with\n"
           "# AdamW's traffic and no arithmetic (read p g m v, write p m v): %.1f GB/s\n",
           (long long)b.total, cp, tr);
    printf("%-6s %-5s %10s %10s %9s %8s %10s %10s\n", "optim", "flush", "state", "step_us", "MB/step",
           "GB/s", "of memcpy", "of traffic");
    static const float scales[] = {1.0f, 1e-20f, 1e-36f, 1e-39f, 1e-42f};
    for (int o = 0; o < 2; o++)
        for (int f = 1; f >= 0; f--) {
            ca_cpu_set_flush_denormal(f == 1);
            for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
                double us = best_step_us(&c, &b, o == 0, scales[s], samples, steps);
                double bytes = o == 0 ? adam_bytes : sgd_bytes, gbs = bytes / us * 1e-3;
                printf("%-6s %-5s %10.0e %10.1f %9.2f %8.1f %9.0f%% %9.0f%%\n", o == 0 ? "adamw" : "sgd",
                       f ? "on" : "off", (double)scales[s], us, bytes * 1e-6, gbs, 100.0 * gbs / cp,
                       100.0 * gbs / tr);
                fflush(stdout);
            }
        }
    ca_cpu_set_flush_denormal(true);
    for (int t = 0; t < NT; t++) {
        free(b.p[t]); free(b.g[t]); free(b.m[t]); free(b.v[t]);
    }
    ops->close(c.dev);
    return 0;
}
