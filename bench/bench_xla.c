/* The lazy xla device against the eager CPU backend in the same run: training steps/s of the
 * 784-256-128-10 MLP (AdamW) at several batch sizes, with the xla device's compile count, compile
 * time, graph size, the device memory held over the timed steps (each allocator's peak of
 * `reserved`: the cpu's caching pool; the xla device's blocks, cache and graph arena) and the
 * planned peak and arena of the graph's intermediates; then an
 * elementwise chain that the compiler fuses. Ratios by wall clock and by the process's CPU time
 * (steadier on a shared machine). Synthetic inputs (the throughput does not depend on the values). */
#include <caccel/caccel.h>

#include "bench/bench_util.h"

#include <stdio.h>
#include <string.h>

/* cpu_s (bench_util.h): CPU time of the process; one BLAS thread, the process's only busy one. */

typedef struct run {
    double samples_per_s;
    double cpu_samples_per_s;  /* per second of the process's CPU time: steadier on a shared machine */
    double peak_mib;           /* device memory held over the timed steps (peak reserved) */
    ca_xla_metrics m;
} run;

/* `steps` timed steps after `warm` untimed ones; each step ends with a mark_step, as the prepared
 * dataloader does, and nothing is read back inside the loop. */
static run train(ca_device *dev, int B, int warm, int steps) {
    CA_CHECK(ca_device_empty_cache(dev));   /* the pool of this run only */
    ca_manual_seed(1);
    ca_module *m = mlp();
    CA_CHECK(ca_module_to(m, dev));
    ca_optimizer *opt;
    CA_CHECK(ca_adamw_create(m, &(ca_adamw_opts){.lr = 1e-3}, &opt));
    ca_tensor *x = ca_tensor_keep(ca_rand_uniform(dev, CA_F32, CA_SHAPE(B, 784), 0, 1));
    int64_t *lab = malloc(sizeof *lab * (size_t)B);
    for (int i = 0; i < B; i++) lab[i] = i % 10;
    ca_tensor *y = ca_tensor_keep(ca_from_host(dev, CA_I64, CA_SHAPE(B), lab));
    free(lab);
    bool lazy = ca_device_is_lazy(dev);
    run r = {0};
    double t0 = 0, c0 = 0;
    for (int s = -warm; s < steps; s++) {
        if (s == 0) {
            CA_CHECK(ca_device_synchronize(dev));
            if (lazy) CA_CHECK(ca_xla_metrics_reset(dev));
            CA_CHECK(ca_device_reset_peak_stats(dev));
            t0 = now_s();
            c0 = cpu_s();
        }
        CA_SCOPE {
            CA_CHECK(ca_autograd_backward(ca_cross_entropy(ca_module_forward(m, x), y)));
            CA_CHECK(ca_optimizer_step(opt));
            ca_optimizer_zero_grad(opt);
        }
        CA_CHECK(ca_device_mark_step(dev));
    }
    CA_CHECK(ca_device_synchronize(dev));
    if (lazy) bench_window("xla-mlp", B, t0, now_s());
    r.samples_per_s = (double)steps * B / (now_s() - t0);
    r.cpu_samples_per_s = (double)steps * B / (cpu_s() - c0);
    ca_allocator_stats st;
    CA_CHECK(ca_device_memory_stats(dev, &st));
    r.peak_mib = (double)st.peak_reserved / (1 << 20);
    if (lazy) CA_CHECK(ca_xla_metrics_get(dev, &r.m));
    ca_tensor_free(x);
    ca_tensor_free(y);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    return r;
}

/* The fusion case: `steps` evaluations of y = relu((x * w + b) * 2 - x) on [B, 4096] (b broadcast
 * over rows), a step boundary after each; the intermediates die with the scope, y with the next
 * step (so the chain is not dead code). */
static run chain(ca_device *dev, int B, int warm, int steps) {
    CA_CHECK(ca_device_empty_cache(dev));
    ca_manual_seed(2);
    ca_tensor *x = ca_tensor_keep(ca_rand_uniform(dev, CA_F32, CA_SHAPE(B, 4096), -1, 1));
    ca_tensor *w = ca_tensor_keep(ca_rand_uniform(dev, CA_F32, CA_SHAPE(B, 4096), -1, 1));
    ca_tensor *b = ca_tensor_keep(ca_rand_uniform(dev, CA_F32, CA_SHAPE(1, 4096), -1, 1));
    bool lazy = ca_device_is_lazy(dev);
    run r = {0};
    double t0 = 0, c0 = 0;
    ca_tensor *y = NULL;
    for (int s = -warm; s < steps; s++) {
        if (s == 0) {
            CA_CHECK(ca_device_synchronize(dev));
            if (lazy) CA_CHECK(ca_xla_metrics_reset(dev));
            CA_CHECK(ca_device_reset_peak_stats(dev));
            t0 = now_s();
            c0 = cpu_s();
        }
        ca_tensor *ny = NULL;
        CA_SCOPE { ny = ca_tensor_keep(ca_relu(ca_sub(ca_mul_scalar(ca_add(ca_mul(x, w), b), 2.0), x))); }
        CA_CHECK(ca_last_status());
        ca_tensor_free(y);
        y = ny;
        CA_CHECK(ca_device_mark_step(dev));
    }
    ca_tensor_free(y);
    CA_CHECK(ca_device_synchronize(dev));
    r.samples_per_s = (double)steps * B / (now_s() - t0);
    r.cpu_samples_per_s = (double)steps * B / (cpu_s() - c0);
    ca_allocator_stats st;
    CA_CHECK(ca_device_memory_stats(dev, &st));
    r.peak_mib = (double)st.peak_reserved / (1 << 20);
    if (lazy) CA_CHECK(ca_xla_metrics_get(dev, &r.m));
    ca_tensor_free(x);
    ca_tensor_free(w);
    ca_tensor_free(b);
    return r;
}

static void chain_rows(ca_device *cpu, ca_device *xla, const int *batches, int nb, int steps, int reps) {
    printf("\n# elementwise chain relu((x * w + b) * 2 - x) on [batch, 4096], %d steps per run\n", steps);
    printf("%6s %14s %14s %7s %9s %12s %16s %9s %9s %12s %10s\n", "batch", "cpu rows/s", "xla rows/s", "ratio",
           "cpu-time", "nodes/step", "kernels/step", "cpu MiB", "xla MiB", "planned MiB", "arena MiB");
    for (int i = 0; i < nb; i++) {
        run best_c = {0}, best_x = {0};
        double best_cc = 0, best_xc = 0;   /* best per CPU second */
        for (int r = 0; r < reps; r++) {
            run c = chain(cpu, batches[i], 20, steps), x = chain(xla, batches[i], 20, steps);
            if (c.samples_per_s > best_c.samples_per_s) best_c = c;
            if (x.samples_per_s > best_x.samples_per_s) best_x = x;
            if (c.cpu_samples_per_s > best_cc) best_cc = c.cpu_samples_per_s;
            if (x.cpu_samples_per_s > best_xc) best_xc = x.cpu_samples_per_s;
        }
        double g = best_x.m.graphs ? (double)best_x.m.graphs : 1.0;
        printf("%6d %14.0f %14.0f %7.3f %9.3f %12.1f %9.1f (%llu f) %9.2f %9.2f %12.2f %10.2f\n", batches[i],
               best_c.samples_per_s, best_x.samples_per_s, best_x.samples_per_s / best_c.samples_per_s,
               best_xc / best_cc,
               (double)best_x.m.nodes_executed / g, (double)best_x.m.kernels_launched / g,
               (unsigned long long)(best_x.m.fused_kernels / (uint64_t)g), best_c.peak_mib, best_x.peak_mib,
               (double)best_x.m.planned_peak_bytes / (1 << 20), (double)best_x.m.arena_bytes / (1 << 20));
    }
}

int main(int argc, char **argv) {
    int batches[8] = {16, 32, 128}, nb = 3, steps = 300, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch-sizes") && i + 1 < argc) {
            nb = 0;
            for (char *s = strtok(argv[++i], ","); s && nb < 8; s = strtok(NULL, ",")) batches[nb++] = atoi(s);
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            steps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        }
    }
    ca_device *cpu = ca_cpu_device(), *xla;
    CA_CHECK(ca_device_open("xla", 0, NULL, &xla));
    printf("# %s\n# steps %d per run, best of %d runs alternating cpu and xla\n", ca_device_description(cpu), steps,
           reps);
    printf("%6s %14s %14s %7s %9s %9s %11s %12s %14s %9s %9s %12s %10s\n", "batch", "cpu samples/s",
           "xla samples/s", "ratio", "cpu-time", "compiles", "compile ms", "graph nodes", "executed/step", "cpu MiB",
           "xla MiB", "planned MiB", "arena MiB");
    for (int b = 0; b < nb; b++) {
        run best_c = {0}, best_x = {0};
        double best_cc = 0, best_xc = 0;   /* best per CPU second */
        for (int r = 0; r < reps; r++) {
            run c = train(cpu, batches[b], 20, steps), x = train(xla, batches[b], 20, steps);
            if (c.samples_per_s > best_c.samples_per_s) best_c = c;
            if (x.samples_per_s > best_x.samples_per_s) best_x = x;
            if (c.cpu_samples_per_s > best_cc) best_cc = c.cpu_samples_per_s;
            if (x.cpu_samples_per_s > best_xc) best_xc = x.cpu_samples_per_s;
        }
        /* compiles of a fresh model: the timed part must compile nothing (the warm-up did) */
        ca_xla_metrics_reset(xla);
        run cold = train(xla, batches[b], 0, 3);
        printf("%6d %14.0f %14.0f %7.3f %9.3f %4llu+%-4llu %11.3f %12llu %14.1f %9.2f %9.2f %12.2f %10.2f\n",
               batches[b],
               best_c.samples_per_s,
               best_x.samples_per_s, best_x.samples_per_s / best_c.samples_per_s, best_xc / best_cc,
               (unsigned long long)cold.m.compiles, (unsigned long long)best_x.m.compiles, cold.m.compile_ms,
               (unsigned long long)best_x.m.max_graph_nodes,
               best_x.m.graphs ? (double)best_x.m.nodes_executed / (double)best_x.m.graphs : 0.0, best_c.peak_mib,
               best_x.peak_mib, (double)best_x.m.planned_peak_bytes / (1 << 20),
               (double)best_x.m.arena_bytes / (1 << 20));
    }
    chain_rows(cpu, xla, batches, nb, steps, reps);
    ca_shutdown();
    return 0;
}
