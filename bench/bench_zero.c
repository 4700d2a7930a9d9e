/* bench_zero: per-rank memory of parameters, gradients and optimizer state, from the allocator's
 * statistics, and the step time, for DDP and the sharded stages (the stage comes from the
 * configuration: --use_deepspeed --zero_stage N). A deep MLP trained with AdamW on random data.
 * Each rank prints one line:
 *   rank=R world=W stage=S params_mb=.. grads_mb=.. optim_mb=.. total_mb=.. peak_mb=.. step_ms=.. sent_mb=..
 * params: allocated after the model is built; grads: what prepare allocates for gradients plus what
 * stays allocated across a step; optim: what preparing the optimizer allocates; peak: the highest
 * allocation during the timed steps, all relative to the start. step_ms: median over the steps.
 * sent_mb: the bytes this rank sent per timed step (ca_comm_bytes: ring bus bytes).
 * Under stage 3 preparing the model frees the full parameters and allocates the parameter and
 * gradient shards, so params and grads are not told apart: params_mb and grads_mb print "-". */
#include <caccel/caccel.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The stage the configuration asks for: DeepSpeed's zero_stage, or FSDP's strategy (by name or index). */
static const char *stage_of(ca_accelerator *acc) {
    const ca_config *c = ca_accelerator_config(acc);
    if (ca_accelerator_settings(acc)->distributed_type != CA_DIST_FSDP)
        return ca_config_get(c, "deepspeed_config.zero_stage");
    const char *v = ca_config_get(c, "fsdp_config.fsdp_sharding_strategy");
    static const char *const three[] = {"FULL_SHARD", "1", "HYBRID_SHARD", "4"};
    for (size_t i = 0; v && i < sizeof three / sizeof three[0]; i++)
        if (!strcmp(v, three[i])) return "3";
    return "2";
}

static size_t allocated(ca_device *d) {
    ca_allocator_stats st;
    CA_CHECK(ca_device_memory_stats(d, &st));
    return st.allocated;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int layers = 8, width = 512, batch = 32, steps = 10;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--width") && i + 1 < argc) width = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (ca_config_flag_arity(argv[i]) >= 0) i += ca_config_flag_arity(argv[i]);
        else { fprintf(stderr, "bench_zero: unknown argument %s\n", argv[i]); return 2; }
    }
    ca_accelerator *acc;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv}, &acc));
    CA_CHECK(ca_set_seed(acc, 3));
    ca_device *dev = ca_accelerator_device(acc);
    size_t a0 = allocated(dev);
    ca_module *m, *l;
    CA_CHECK(ca_sequential_create(&m));
    for (int i = 0; i < layers; i++) {
        char name[32];
        snprintf(name, sizeof name, "fc%d", i);
        CA_CHECK(ca_linear_create(width, width, true, &l));
        CA_CHECK(ca_module_add(m, name, l));
        snprintf(name, sizeof name, "act%d", i);
        CA_CHECK(ca_tanh_create(&l));
        CA_CHECK(ca_module_add(m, name, l));
    }
    ca_optimizer *opt;
    CA_CHECK(ca_adamw_create(m, &(ca_adamw_opts){.lr = 1e-4}, &opt));
    size_t a1 = allocated(dev);
    CA_CHECK(ca_prepare(acc, m, NULL, NULL));
    size_t a2 = allocated(dev);
    CA_CHECK(ca_prepare(acc, NULL, opt, NULL));
    size_t a3 = allocated(dev);
    int64_t xs[2] = {batch, width};
    double *t = calloc((size_t)steps, sizeof *t);
    size_t a4 = 0;
    uint64_t b0 = 0;
    for (int s = 0; s <= steps; s++) {
        if (s == 1) {
            a4 = allocated(dev);   /* after one whole step: what stays allocated across steps */
            b0 = ca_comm_bytes(ca_accelerator_comm(acc));
            CA_CHECK(ca_device_reset_peak_stats(dev));
        }
        double t0 = now_ms();
        CA_SCOPE {
            ca_tensor *x = ca_rand_normal(dev, CA_F32, 2, xs, 0.0, 1.0);
            ca_tensor *y = ca_module_forward(m, x);
            ca_tensor *loss = ca_mean(ca_mul(y, y));
            CA_CHECK(ca_backward(acc, loss));
            CA_CHECK(ca_optimizer_step(opt));
            ca_optimizer_zero_grad(opt);
        }
        if (s) t[s - 1] = now_ms() - t0;
    }
    ca_allocator_stats st;
    CA_CHECK(ca_device_memory_stats(dev, &st));
    qsort(t, (size_t)steps, sizeof *t, cmp_double);
    const ca_settings *set = ca_accelerator_settings(acc);
    const char *stage = stage_of(acc);
    bool sharded = set->distributed_type == CA_DIST_DEEPSPEED || set->distributed_type == CA_DIST_FSDP;
    const double MB = 1024.0 * 1024.0;
    char pm[32] = "-", gm[32] = "-";
    if (!sharded || strcmp(stage, "3") != 0) {
        snprintf(pm, sizeof pm, "%.2f", (double)(a1 - a0) / MB);
        snprintf(gm, sizeof gm, "%.2f", ((double)a2 - (double)a1 + (double)a4 - (double)a3) / MB);
    }
    printf("rank=%d world=%d stage=%s params_mb=%s grads_mb=%s optim_mb=%.2f total_mb=%.2f peak_mb=%.2f "
           "step_ms=%.2f sent_mb=%.3f\n", ca_process_index(acc), ca_num_processes(acc), sharded ? stage : "ddp", pm,
           gm, (double)(a3 - a2) / MB, (double)(a4 - a0) / MB, (double)(st.peak_allocated - a0) / MB, t[steps / 2],
           (double)(ca_comm_bytes(ca_accelerator_comm(acc)) - b0) / steps / MB);
    fflush(stdout);
    free(t);
    CA_CHECK(ca_wait_for_everyone(acc));
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
    ca_shutdown();
    return 0;
}
