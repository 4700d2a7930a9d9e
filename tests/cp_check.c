/* cp_check: context parallelism's attention and loss run as real processes (caccel launch or mpirun),
 * driven by tests/test_cp.sh. Every rank makes the same q [B, H, T, D], k, v [B, Hkv, T, D] (Hkv < H:
 * grouped-query attention) and weights w; the reference is one process's causal attention on the whole
 * sequence and loss = sum(w * out), its gradients of q, k, v. Then ca_maybe_context_parallel splits q,
 * k, v and w along T (this cp rank's two chunks), the same loss of the local attention is run backward,
 * and the local output and gradients are checked against this rank's chunks of the reference's (keys'
 * and values' gradients come back to their owners by reduce-scatter). Prints "rank=R cp attention ok N"
 * (N: elements compared) or the first mismatch.
 *   --central: also checks a few elements of the local q, k and v gradients against central differences
 *     of the whole loss (summed over the cp ranks), at any cp size (cp 1: the ordinary op).
 *   --loss: cross-entropy of the same logits split over cp against one process's mean, some labels -100
 *     (fewer on one rank than another): prints "rank=R cp loss ok L".
 *   --ring: the job runs parallelism_config_cp_comm_strategy alltoall (ring attention): the bytes the cp
 *     communicator sent during the attention's forward and backward must be the ring's, 6 (cp - 1) X (the
 *     keys and values passed on cp - 1 times in forward and again in backward, and the visiting blocks'
 *     gradients sent back to their owners), X = B Hkv (T / cp) D 4 for keys and values each; else the
 *     all-gather's 4 (cp - 1) X (keys and values gathered, their gradients reduce-scattered). Printed as
 *     "rank=R cp bytes N (ring|allgather formula)".
 *   On the lazy device (--tpu) the attention's exchanges are nodes of the device's graph: printed as
 *     "rank=R cp collectives in the graph N" (the ring: 3 (cp - 1) sendrecv, cp - 1 rotations each way and
 *     the gradients' returns; the all-gather: 2 all-gathers and 2 reduce-scatters).
 *   --refuse: prints "rank=R refused: MESSAGE" for a masked, a non-causal and a dropout attention under
 *     the split, a sequence that 2 cp does not divide, and a second split without an end.
 *   --mock-gpu: runs on tests/mock_gpu.h's GPU (kind GPU, not host memory: the accelerator takes the GPU's
 *     paths; with use_cpu false); an accelerator it refuses prints "rank=R refused: MESSAGE" and exits 0.
 * Every rank prints "rank=R on device NAME" first. */
#include "mock_gpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, H = 4, HKV = 2, T = 16, D = 8 };

static ca_tensor *randn(ca_device *dev, int ndim, const int64_t *shape, bool grad) {
    ca_tensor *t = ca_rand_normal(dev, CA_F32, ndim, shape, 0.0f, 1.0f);   /* scoped: main's scope */
    if (!t) CA_CHECK(ca_last_status());
    ca_tensor_set_requires_grad(t, grad);
    return t;
}

static ca_tensor *split(ca_accelerator *acc, ca_tensor *x) {
    ca_tensor *b[1] = {x};
    CA_CHECK(ca_maybe_context_parallel(acc, 1, b, (int[]){2}));
    ca_context_parallel_end(acc);
    ca_tensor *leaf = ca_mul_scalar(ca_detach(b[0]), 1.0);   /* a leaf of its own */
    if (!leaf) CA_CHECK(ca_last_status());
    ca_tensor_set_requires_grad(leaf, ca_tensor_requires_grad(x));
    return leaf;
}

/* Largest |a - b| over n floats. */
static double max_diff(ca_tensor *a, ca_tensor *b) {
    int64_t n = ca_tensor_numel(a);
    float *x = malloc(sizeof(float) * (size_t)n * 2);
    if (!x) exit(1);
    CA_CHECK(ca_tensor_to_host(ca_contiguous(a), x, sizeof(float) * (size_t)n));
    CA_CHECK(ca_tensor_to_host(ca_contiguous(b), x + n, sizeof(float) * (size_t)n));
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i] - x[n + i]));
    free(x);
    return m;
}

/* sum(w * attention(q, k, v)), causal, with the split's hook when the batch was split. */
static ca_tensor *loss_of(ca_tensor *q, ca_tensor *k, ca_tensor *v, ca_tensor *w) {
    return ca_sum(ca_mul(w, ca_scaled_dot_product_attention(q, k, v, NULL, true, 0.0, 0.0)));
}

/* The whole loss, summed over the cp ranks' parts, at the current values of the local leaves. */
static double split_loss(ca_accelerator *acc, ca_tensor *const *loc, ca_tensor *w) {
    double v = 0;
    CA_SCOPE {
        ca_tensor *b[1] = {ca_zeros(ca_accelerator_device(acc), CA_F32, 1, (int64_t[]){T})};
        CA_CHECK(ca_maybe_context_parallel(acc, 1, b, (int[]){0}));   /* the attention's hook on */
        ca_tensor *l = ca_detach(loss_of(loc[0], loc[1], loc[2], w));
        ca_context_parallel_end(acc);
        CA_CHECK(l ? ca_reduce(acc, l, CA_OP_SUM) : ca_last_status());
        CA_CHECK(ca_tensor_item(l, &v));
    }
    return v;
}

/* A few elements of each local leaf's gradient against central differences of the whole loss (every
 * rank perturbs in turn; the others perturb nothing but take part in the collectives). */
static int central(ca_accelerator *acc, ca_tensor *const *loc, ca_tensor *w) {
    int bad = 0, world = ca_num_processes(acc), checked = 0;
    const double eps = 1e-2;
    for (int owner = 0; owner < world; owner++)
        for (int i = 0; i < 3; i++) {
            ca_tensor *t = loc[i];
            int64_t n = ca_tensor_numel(t);
            float *h = malloc(sizeof(float) * (size_t)n), *g = malloc(sizeof(float) * (size_t)n);
            if (!h || !g) exit(1);
            CA_CHECK(ca_tensor_to_host(t, h, sizeof(float) * (size_t)n));
            CA_CHECK(ca_tensor_to_host(ca_tensor_grad(t), g, sizeof(float) * (size_t)n));
            for (int64_t e = 0; e < n; e += n / 5) {
                bool mine = owner == ca_process_index(acc);
                float keep = h[e];
                double f[2];
                for (int s = 0; s < 2; s++) {
                    if (mine) h[e] = keep + (float)(s ? -eps : eps);
                    CA_CHECK(ca_tensor_copy_from_host(t, h, sizeof(float) * (size_t)n));
                    f[s] = split_loss(acc, loc, w);
                }
                h[e] = keep;
                CA_CHECK(ca_tensor_copy_from_host(t, h, sizeof(float) * (size_t)n));
                double num = (f[0] - f[1]) / (2 * eps);
                if (mine && fabs(num - g[e]) > 2e-2 * (1 + fabs(num))) {
                    printf("rank=%d central mismatch: tensor %d element %lld numeric %g analytic %g\n",
                           ca_process_index(acc), i, (long long)e, num, (double)g[e]);
                    bad = 1;
                }
                checked += mine;
            }
            free(h);
            free(g);
        }
    if (!bad) printf("rank=%d central ok %d\n", ca_process_index(acc), checked);
    return bad;
}

/* The bytes the cp communicator sent for one attention's forward and backward against the method's
 * formula (nothing at cp 1). */
static int bytes_check(ca_accelerator *acc, uint64_t sent, bool ring) {
    ca_mesh_shape m;
    CA_CHECK(ca_accelerator_mesh(acc, &m, NULL));
    int cp = m.size[CA_MESH_CP];
    uint64_t x = (uint64_t)B * HKV * (T / (cp > 0 ? cp : 1)) * D * 4, want = (uint64_t)(ring ? 6 : 4) * (uint64_t)(cp - 1) * x;
    printf("rank=%d cp bytes %llu (%s formula %llu)\n", ca_process_index(acc), (unsigned long long)sent,
           ring ? "ring" : "allgather", (unsigned long long)want);
    return sent != want;
}

static int attention_check(ca_accelerator *acc, bool with_central, bool ring) {
    ca_device *dev = ca_accelerator_device(acc);
    ca_tensor *q = randn(dev, 4, (int64_t[]){B, H, T, D}, true), *k = randn(dev, 4, (int64_t[]){B, HKV, T, D}, true),
              *v = randn(dev, 4, (int64_t[]){B, HKV, T, D}, true), *w = randn(dev, 4, (int64_t[]){B, H, T, D}, false);
    ca_tensor *out = ca_scaled_dot_product_attention(q, k, v, NULL, true, 0.0, 0.0);
    CA_CHECK(ca_autograd_backward(ca_sum(ca_mul(w, out))));
    ca_tensor *ref[4] = {split(acc, out), split(acc, ca_tensor_grad(q)), split(acc, ca_tensor_grad(k)),
                         split(acc, ca_tensor_grad(v))};
    ca_tensor *loc[3] = {split(acc, q), split(acc, k), split(acc, v)}, *wl = split(acc, w);
    ca_tensor *b[1] = {ca_zeros(dev, CA_F32, 1, (int64_t[]){T})};   /* turns the split's attention on */
    CA_CHECK(ca_device_synchronize(dev));
    ca_xla_metrics xm0 = {0}, xm1 = {0};
    bool lazy = ca_device_is_lazy(dev);
    if (lazy) CA_CHECK(ca_xla_metrics_get(dev, &xm0));
    CA_CHECK(ca_maybe_context_parallel(acc, 1, b, (int[]){0}));
    ca_comm *cpc = ca_mesh_comm(acc, "cp");
    uint64_t sent0 = ca_comm_bytes(cpc);
    ca_tensor *o = ca_scaled_dot_product_attention(loc[0], loc[1], loc[2], NULL, true, 0.0, 0.0);
    if (!o) CA_CHECK(ca_last_status());
    CA_CHECK(ca_autograd_backward(ca_sum(ca_mul(wl, o))));
    uint64_t sent = ca_comm_bytes(cpc) - sent0;
    ca_context_parallel_end(acc);
    if (bytes_check(acc, sent, ring)) return 1;
    ca_tensor *got[4] = {o, ca_tensor_grad(loc[0]), ca_tensor_grad(loc[1]), ca_tensor_grad(loc[2])};
    static const char *const names[] = {"output", "q's gradient", "k's gradient", "v's gradient"};
    int64_t n = 0;
    for (int i = 0; i < 4; i++) {
        double d = max_diff(ref[i], got[i]);
        if (d > 1e-5) {
            printf("rank=%d cp attention mismatch: %s differs by %g\n", ca_process_index(acc), names[i], d);
            return 1;
        }
        n += ca_tensor_numel(got[i]);
    }
    if (lazy) {   /* the graphs of forward and backward have run at the reads above */
        CA_CHECK(ca_xla_metrics_get(dev, &xm1));
        printf("rank=%d cp collectives in the graph %llu\n", ca_process_index(acc),
               (unsigned long long)(xm1.collectives_in_graph - xm0.collectives_in_graph));
    }
    printf("rank=%d cp attention ok %lld holds q [%lld, %lld, %lld, %lld]\n", ca_process_index(acc), (long long)n,
           (long long)ca_tensor_dim(loc[0], 0), (long long)ca_tensor_dim(loc[0], 1),
           (long long)ca_tensor_dim(loc[0], 2), (long long)ca_tensor_dim(loc[0], 3));
    return with_central ? central(acc, loc, wl) : 0;
}

/* The cross-entropy of logits [B, T, V] split over cp against one process's mean; labels -100 at the
 * start of the sequence (so the cp ranks count different numbers of tokens). */
static int loss_check(ca_accelerator *acc) {
    ca_device *dev = ca_accelerator_device(acc);
    enum { V = 5 };
    ca_tensor *logits = randn(dev, 3, (int64_t[]){B, T, V}, true);
    int64_t lab[B * T];
    for (int i = 0; i < B * T; i++) lab[i] = i % T < 5 ? -100 : (i * 7) % V;
    ca_tensor *labels = ca_from_host(dev, CA_I64, 2, (int64_t[]){B, T}, lab);
    ca_tensor *ref = ca_cross_entropy(logits, labels);
    double want, got;
    CA_CHECK(ca_tensor_item(ref, &want));
    CA_CHECK(ca_autograd_backward(ref));
    ca_tensor *gref = ca_mul_scalar(ca_tensor_grad(logits), 1.0);
    ca_tensor *buf[3] = {ca_detach(logits), labels, gref};
    CA_CHECK(ca_maybe_context_parallel(acc, 3, buf, (int[]){1, 1, 1}));
    ca_tensor *leaf = ca_mul_scalar(buf[0], 1.0);
    ca_tensor_set_requires_grad(leaf, true);
    ca_module *lin;   /* a head the plan did not split: ca_tp_cross_entropy is ca_cross_entropy's mean */
    CA_CHECK(ca_linear_create(1, 1, false, &lin));
    ca_tensor *l = ca_tp_cross_entropy(lin, leaf, buf[1]);
    if (!l) CA_CHECK(ca_last_status());
    CA_CHECK(ca_tensor_item(l, &got));
    /* every cp rank backpropagates the whole loss: its logits' gradient is cp times its part of one
     * process's (dp_cp's average divides it back) */
    CA_CHECK(ca_autograd_backward(l));
    ca_context_parallel_end(acc);
    ca_mesh_shape m;
    CA_CHECK(ca_accelerator_mesh(acc, &m, NULL));
    double d = max_diff(ca_mul_scalar(buf[2], m.size[CA_MESH_CP]), ca_tensor_grad(leaf));
    ca_module_destroy(lin);
    if (fabs(want - got) > 1e-5 || d > 1e-6) {
        printf("rank=%d cp loss mismatch: %.9g against one process's %.9g, gradient by %g\n", ca_process_index(acc),
               got, want, d);
        return 1;
    }
    printf("rank=%d cp loss ok %.6f\n", ca_process_index(acc), got);
    return 0;
}

static void refused(ca_accelerator *acc, const char *what, bool failed) {
    if (!failed) {
        printf("rank=%d accepted: %s\n", ca_process_index(acc), what);
        exit(1);
    }
    printf("rank=%d refused: %s\n", ca_process_index(acc), ca_last_error());
    ca_clear_error();
}

static int refuse_check(ca_accelerator *acc) {
    ca_device *dev = ca_accelerator_device(acc);
    ca_tensor *x = ca_zeros(dev, CA_F32, 4, (int64_t[]){1, 1, T, D});
    ca_tensor *b[1] = {x};
    CA_CHECK(ca_maybe_context_parallel(acc, 1, b, (int[]){2}));
    ca_tensor *q = b[0], *mask = ca_zeros(dev, CA_U8, 2, (int64_t[]){ca_tensor_dim(q, 2), T});
    refused(acc, "mask", !ca_scaled_dot_product_attention(q, q, q, mask, true, 0.0, 0.0));
    refused(acc, "non-causal", !ca_scaled_dot_product_attention(q, q, q, NULL, false, 0.0, 0.0));
    refused(acc, "dropout", !ca_scaled_dot_product_attention(q, q, q, NULL, true, 0.1, 0.0));
    b[0] = x;
    refused(acc, "split twice", ca_maybe_context_parallel(acc, 1, b, (int[]){2}) != CA_OK);
    ca_context_parallel_end(acc);
    b[0] = ca_zeros(dev, CA_F32, 2, (int64_t[]){1, T + 2});
    refused(acc, "odd length", ca_maybe_context_parallel(acc, 1, b, (int[]){1}) != CA_OK);
    return 0;
}

static int prefer_mock(char *reason, size_t len) { (void)reason, (void)len; return 50; }

int main(int argc, char **argv) {
    const char *mode = "attention";
    bool with_central = false, ring = false, mock_gpu = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--central") == 0) with_central = true;
        else if (strcmp(argv[i], "--loss") == 0) mode = "loss";
        else if (strcmp(argv[i], "--refuse") == 0) mode = "refuse";
        else if (strcmp(argv[i], "--ring") == 0) ring = true;
        else if (strcmp(argv[i], "--mock-gpu") == 0) mock_gpu = true;
    }
    static ca_device_ops gpu;
    static const ca_device_ops *devs[1];
    static ca_plugin plugin;
    if (mock_gpu) {
        mock_gpu_ops(&gpu, "mock_gpu");
        CA_CHECK(mock_gpu_register(&gpu, devs, &plugin, prefer_mock));
    }
    ca_accelerator *acc;
    ca_status made = ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv}, &acc);
    if (made != CA_OK && mock_gpu) {   /* a combination the GPU refuses: said, and no failure */
        printf("rank=%s refused: %s\n", getenv("RANK") ? getenv("RANK") : "?", ca_last_error());
        return 0;
    }
    CA_CHECK(made);
    printf("rank=%d on device %s\n", ca_process_index(acc), ca_device_name(ca_accelerator_device(acc)));
    CA_CHECK(ca_set_seed(acc, 7));   /* the same q, k, v on every rank */
    int rc = 0;
    CA_SCOPE {
        if (strcmp(mode, "loss") == 0) rc = loss_check(acc);
        else if (strcmp(mode, "refuse") == 0) rc = refuse_check(acc);
        else rc = attention_check(acc, with_central, ring);
    }
    CA_CHECK(ca_wait_for_everyone(acc));
    ca_accelerator_destroy(acc);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
