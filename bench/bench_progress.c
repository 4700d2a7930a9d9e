/* The progress bar's cost (caccel/progress.h).
 *
 * 1. Training steps of the 784-256-128-10 MLP (AdamW, batch B, synthetic data, one process) with and
 *    without a bar (ca_progress_update and ca_progress_set_loss every step; terminal mode, redraws
 *    every 0.1 s, written to /dev/null so that a terminal's speed does not enter). Samples of S steps
 *    alternate between the two; the ratio is the median over adjacent pairs of (time with / time
 *    without): 1.000 means no measurable cost.
 * 2. The bare call: ns per ca_progress_update in an otherwise empty loop, against the same loop
 *    without the call (the worst case: a step that does nothing).
 *
 * usage: bench_progress [SAMPLES [STEPS [BATCH]]]   (defaults 9 200 128) */
#include <caccel/caccel.h>

#include "bench/bench_util.h"

#include <stdio.h>
#include <stdlib.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Seconds for `steps` training steps; with a bar when `sink` is not NULL. */
static double train_steps(ca_accelerator *acc, ca_module *m, ca_optimizer *opt, ca_tensor *x, ca_tensor *y,
                          int steps, FILE *sink) {
    ca_progress *bar = NULL;
    if (sink) CA_CHECK(ca_progress_create(acc, &(ca_progress_opts){.total = steps, .desc = "bench", .out = sink,
                                                                    .tty = 1}, &bar));
    double t0 = now_s(), loss_sum = 0;
    for (int s = 0; s < steps; s++) {
        CA_SCOPE {
            ca_tensor *loss = ca_cross_entropy(ca_module_forward(m, x), y);
            CA_CHECK(ca_backward(acc, loss));
            CA_CHECK(ca_optimizer_step(opt));
            ca_optimizer_zero_grad(opt);
            loss_sum += ca_item(loss);
        }
        if (bar) {
            CA_CHECK(ca_progress_set_loss(bar, loss_sum / (s + 1)));
            CA_CHECK(ca_progress_update(bar, 1));
        }
    }
    double secs = now_s() - t0;
    CA_CHECK(ca_progress_close(bar));
    return secs;
}

/* ns per iteration of an empty loop of n iterations, with or without the update call. */
static double bare_loop_ns(ca_accelerator *acc, FILE *sink, int64_t n, bool with_bar) {
    ca_progress *bar;
    CA_CHECK(ca_progress_create(acc, &(ca_progress_opts){.total = n, .out = sink, .tty = 1}, &bar));
    volatile int64_t k = 0;
    double t0 = now_s();
    if (with_bar)
        for (int64_t i = 0; i < n; i++) CA_CHECK(ca_progress_update(bar, 1));
    else
        for (int64_t i = 0; i < n; i++) k = k + 1;
    double secs = now_s() - t0;
    CA_CHECK(ca_progress_close(bar));
    return secs / (double)n * 1e9;
}

int main(int argc, char **argv) {
    int samples = argc > 1 ? atoi(argv[1]) : 9, steps = argc > 2 ? atoi(argv[2]) : 200;
    int64_t B = argc > 3 ? atoll(argv[3]) : 128;
    if (samples < 1 || steps < 1 || B < 1) {
        fprintf(stderr, "usage: bench_progress [SAMPLES [STEPS [BATCH]]]\n");
        return 2;
    }
    FILE *sink = fopen("/dev/null", "w");
    if (!sink) { perror("/dev/null"); return 1; }
    char *cpu_argv[] = {"bench_progress", "--cpu", NULL};
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

    train_steps(acc, m, opt, x, y, steps / 4 + 1, NULL);   /* warm-up: allocator caches, page faults */
    double *off = malloc(sizeof(double) * (size_t)samples), *on = malloc(sizeof(double) * (size_t)samples);
    double *ratio = malloc(sizeof(double) * (size_t)samples);
    for (int i = 0; i < samples; i++) {   /* the order alternates so that drift favours neither */
        bool bar_first = i % 2;
        if (bar_first) on[i] = train_steps(acc, m, opt, x, y, steps, sink);
        off[i] = train_steps(acc, m, opt, x, y, steps, NULL);
        if (!bar_first) on[i] = train_steps(acc, m, opt, x, y, steps, sink);
        ratio[i] = on[i] / off[i];
    }
    double r = median(ratio, samples), t_off = median(off, samples), t_on = median(on, samples);
    printf("training steps: batch=%lld steps_per_sample=%d samples=%d step_us_without=%.1f step_us_with=%.1f "
           "ratio_with_over_without=%.4f ratio_min=%.4f ratio_max=%.4f\n",
           (long long)B, steps, samples, t_off / steps * 1e6, t_on / steps * 1e6, r, ratio[0], ratio[samples - 1]);

    const int64_t n = 20000000;
    double ns_off[5], ns_on[5];
    for (int i = 0; i < 5; i++) {
        ns_off[i] = bare_loop_ns(acc, sink, n, false);
        ns_on[i] = bare_loop_ns(acc, sink, n, true);
    }
    printf("bare update: iterations=%lld ns_per_update=%.2f ns_per_empty_iteration=%.2f kernels=%s\n", (long long)n,
           median(ns_on, 5), median(ns_off, 5), bench_kernel_set());
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_tensor_free(x);
    ca_tensor_free(y);
    ca_accelerator_destroy(acc);
    fclose(sink);
    ca_shutdown();
    free(off), free(on), free(ratio);
    return 0;
}
