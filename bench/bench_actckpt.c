/* Activation checkpointing: saved-activation memory, peak memory and step time of a deep residual
 * MLP (pre-LayerNorm blocks x + fc2(dropout(gelu(fc1(ln(x))))), a transformer's MLP half) with and
 * without ca_module_set_checkpointing on every block. Memory from the CPU allocator's statistics;
 * modes alternate each repetition so machine load hits both alike. One key=value line per mode. */
#include <caccel/caccel.h>

#include "bench/bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct block {
    ca_module *ln, *fc1, *fc2;
    double dropout;
} block;

static ca_tensor *block_forward(ca_module *self, ca_tensor *x, void *ctx) {
    (void)self;
    block *b = ctx;
    ca_tensor *h = ca_gelu(ca_module_forward(b->fc1, ca_module_forward(b->ln, x)));
    return ca_add(x, ca_module_forward(b->fc2, ca_dropout(h, b->dropout, true)));
}

static ca_module *deep_mlp(int depth, int64_t w, double dropout) {
    ca_module *root, *m, *l;
    CA_CHECK(ca_sequential_create(&root));
    for (int i = 0; i < depth; i++) {
        block *b = calloc(1, sizeof *b);
        if (!b) exit(1);
        b->dropout = dropout;
        CA_CHECK(ca_module_create("Block", block_forward, b, free, &m));
        CA_CHECK(ca_layer_norm_create(w, 0, &l));        CA_CHECK(ca_module_add(m, "ln", l));        b->ln = l;
        CA_CHECK(ca_linear_create(w, 4 * w, true, &l));  CA_CHECK(ca_module_add(m, "fc1", l));       b->fc1 = l;
        CA_CHECK(ca_linear_create(4 * w, w, true, &l));  CA_CHECK(ca_module_add(m, "fc2", l));       b->fc2 = l;
        CA_CHECK(ca_module_add(root, NULL, m));
    }
    return root;
}

typedef struct result {
    double seconds;
    size_t saved, peak;
} result;

/* One step: forward, loss, backward. saved: bytes allocated after forward beyond those before it
 * (what backward keeps); peak: the highest allocation during the step beyond the same base. */
static result step(ca_module *m, ca_tensor *x) {
    ca_device *dev = ca_tensor_device(x);
    ca_allocator_stats st;
    result r = {0};
    ca_module_zero_grad(m);
    CA_SCOPE {
        CA_CHECK(ca_device_memory_stats(dev, &st));
        size_t base = st.allocated;
        CA_CHECK(ca_device_reset_peak_stats(dev));
        double t0 = now_s();
        ca_tensor *y = ca_module_forward(m, x);
        ca_tensor *loss = ca_mean(ca_mul(y, y));
        CA_CHECK(ca_device_memory_stats(dev, &st));
        r.saved = st.allocated - base;
        CA_CHECK(ca_autograd_backward(loss));
        r.seconds = now_s() - t0;
        CA_CHECK(ca_device_memory_stats(dev, &st));
        r.peak = st.peak_allocated - base;
    }
    return r;
}

static void set_all(ca_module *m, bool on) {
    for (int i = 0;; i++) {
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        ca_module *c = ca_module_child(m, name);
        if (!c) break;
        CA_CHECK(ca_module_set_checkpointing(c, on));
    }
}

int main(int argc, char **argv) {
    int depth = 16, reps = 5;
    int64_t width = 256, batch = 256;
    double dropout = 0.1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--depth")) depth = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--width")) width = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dropout")) dropout = atof(argv[i + 1]);
        else { fprintf(stderr, "usage: bench_actckpt [--depth N] [--width W] [--batch B] [--reps R] [--dropout P]\n"); return 2; }
    }
    ca_manual_seed(1);
    ca_module *m = deep_mlp(depth, width, dropout);
    ca_tensor *x = ca_tensor_keep(ca_rand_normal(ca_cpu_device(), CA_F32, CA_SHAPE(batch, width), 0, 1));
    result sum[2] = {{0}}, best[2] = {{1e30, 0, 0}, {1e30, 0, 0}};
    for (int r = -1; r < reps; r++) {            /* one warm-up step per mode, then alternate */
        for (int mode = 0; mode < 2; mode++) {
            set_all(m, mode == 1);
            result s = step(m, x);
            if (r < 0) continue;
            sum[mode].seconds += s.seconds;
            sum[mode].saved = s.saved;
            sum[mode].peak = s.peak;
            if (s.seconds < best[mode].seconds) best[mode].seconds = s.seconds;
        }
    }
    for (int mode = 0; mode < 2; mode++)
        printf("mode=%s depth=%d width=%lld batch=%lld params=%lld saved_mib=%.2f peak_mib=%.2f "
               "step_ms_mean=%.1f step_ms_best=%.1f\n",
               mode ? "checkpointed" : "plain", depth, (long long)width, (long long)batch,
               (long long)ca_module_param_count(m), sum[mode].saved / 1048576.0, sum[mode].peak / 1048576.0,
               1e3 * sum[mode].seconds / reps, 1e3 * best[mode].seconds);
    printf("saved_ratio=%.3f peak_ratio=%.3f time_ratio_mean=%.3f\n", (double)sum[1].saved / (double)sum[0].saved,
           (double)sum[1].peak / (double)sum[0].peak, sum[1].seconds / sum[0].seconds);
    ca_tensor_free(x);
    ca_module_destroy(m);
    ca_scope_release_all();
    return 0;
}
