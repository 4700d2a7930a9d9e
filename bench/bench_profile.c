/* The profiler's cost (caccel/profile.h, docs/PROFILING.md).
 *
 * Training steps of the 784-256-128-10 MLP (AdamW, batch B, synthetic data, one process): samples of
 * S steps alternate between the profiler off (the build's hooks present, the flag clear) and on with
 * every option (record_shapes, profile_memory, with_flops; every step recorded, ca_profile_step after
 * each). The ratio is the median over adjacent pairs of (time on / time off). The trace of an on
 * sample is written by ca_profile_end after the sample's clock stopped: its time and size are
 * reported on their own.
 *
 * usage: bench_profile [SAMPLES [STEPS [BATCH [DIR]]]]   (defaults 9 200 128 /tmp) */
#include <caccel/caccel.h>

#include "bench/bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Seconds for `steps` training steps, profiled when dir is not NULL (*end_s: ca_profile_end's time). */
static double train_steps(ca_accelerator *acc, ca_module *m, ca_optimizer *opt, ca_tensor *x, ca_tensor *y,
                          int steps, const char *dir, double *end_s) {
    if (dir)
        CA_CHECK(ca_profile_begin(&(ca_profile_config){.output_trace_dir = dir, .record_shapes = true,
                                                       .profile_memory = true, .with_flops = true}));
    double t0 = now_s();
    for (int s = 0; s < steps; s++) {
        CA_SCOPE {
            ca_tensor *loss = ca_cross_entropy(ca_module_forward(m, x), y);
            CA_CHECK(ca_backward(acc, loss));
            CA_CHECK(ca_optimizer_step(opt));
            ca_optimizer_zero_grad(opt);
            (void)ca_item(loss);
        }
        if (dir) CA_CHECK(ca_profile_step());
    }
    double secs = now_s() - t0;
    if (dir) {
        double t1 = now_s();
        CA_CHECK(ca_profile_end());
        *end_s = now_s() - t1;
    }
    return secs;
}

int main(int argc, char **argv) {
    int samples = argc > 1 ? atoi(argv[1]) : 9, steps = argc > 2 ? atoi(argv[2]) : 200;
    int64_t B = argc > 3 ? atoll(argv[3]) : 128;
    const char *dir = argc > 4 ? argv[4] : "/tmp";
    if (samples < 1 || steps < 1 || B < 1) {
        fprintf(stderr, "usage: bench_profile [SAMPLES [STEPS [BATCH [DIR]]]]\n");
        return 2;
    }
    char *cpu_argv[] = {"bench_profile", "--cpu", NULL};
    ca_accelerator *acc;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = cpu_argv}, &acc));
    CA_CHECK(ca_set_seed(acc, 42));
    ca_device *dev = ca_accelerator_device(acc);
    ca_tensor *x = ca_tensor_keep(ca_rand_uniform(dev, CA_F32, CA_SHAPE(B, 784), 0, 1));
    int64_t *labels = malloc(sizeof(int64_t) * (size_t)B);
    for (int64_t i = 0; i < B; i++) labels[i] = (i * 7) % 10;
    ca_tensor *y = ca_tensor_keep(ca_from_host(dev, CA_I64, CA_SHAPE(B), labels));
    free(labels);
    ca_module *m = mlp();
    ca_optimizer *opt;
    CA_CHECK(ca_adamw_create(m, NULL, &opt));
    CA_CHECK(ca_prepare(acc, m, opt, NULL));

    double end_s = 0;
    train_steps(acc, m, opt, x, y, steps / 4 + 1, NULL, NULL);   /* warm-up: allocator caches, page faults */
    double *off = malloc(sizeof(double) * (size_t)samples), *on = malloc(sizeof(double) * (size_t)samples);
    double *ratio = malloc(sizeof(double) * (size_t)samples), *ends = malloc(sizeof(double) * (size_t)samples);
    for (int i = 0; i < samples; i++) {   /* the order alternates so that drift favours neither */
        bool on_first = i % 2;
        if (on_first) on[i] = train_steps(acc, m, opt, x, y, steps, dir, &end_s);
        off[i] = train_steps(acc, m, opt, x, y, steps, NULL, NULL);
        if (!on_first) on[i] = train_steps(acc, m, opt, x, y, steps, dir, &end_s);
        ends[i] = end_s;
        ratio[i] = on[i] / off[i];
    }
    struct stat st;
    long long bytes = stat(ca_profile_last_path(), &st) == 0 ? (long long)st.st_size : -1;
    double r = median(ratio, samples), t_off = median(off, samples), t_on = median(on, samples);
    printf("profiler: batch=%lld steps_per_sample=%d samples=%d step_us_off=%.1f step_us_on=%.1f "
           "ratio_on_over_off=%.4f ratio_min=%.4f ratio_max=%.4f trace_write_ms=%.1f trace_bytes=%lld kernels=%s\n",
           (long long)B, steps, samples, t_off / steps * 1e6, t_on / steps * 1e6, r, ratio[0], ratio[samples - 1],
           median(ends, samples) * 1e3, bytes, bench_kernel_set());
    remove(ca_profile_last_path());
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_tensor_free(x);
    ca_tensor_free(y);
    ca_accelerator_destroy(acc);
    ca_shutdown();
    free(off), free(on), free(ratio), free(ends);
    return 0;
}
