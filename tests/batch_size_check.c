/* batch_size_check: ca_find_executable_batch_size on several ranks, run by
 * tests/test_batch_size_ranks.sh under caccel launch. Only the last rank's device is capped (at
 * what a step of batch 40 needs), so only it runs out of memory; every rank prints
 * "rank=R found=F calls=64,57,..." and the script checks that all agree.
 *   --fail-other: the last rank's step fails with CA_ERR_IO instead; the others print
 *                 "rank=R status=CA_ERR_PEER". */
#include <caccel/caccel.h>

#include <stdio.h>
#include <string.h>

typedef struct step_ctx {
    ca_device *dev;
    ca_tensor *w1, *w2;
    int64_t calls[32];
    int ncalls;
    bool fail_other;
} step_ctx;

static ca_status mlp_step(void *ctx, int64_t batch) {
    step_ctx *c = ctx;
    if (c->ncalls < 32) c->calls[c->ncalls++] = batch;
    if (c->fail_other) return ca_error(CA_ERR_IO, "batch_size_check: step failed on purpose");
    ca_tensor *x = ca_full(c->dev, CA_F32, 2, (int64_t[]){batch, 64}, 0.5);
    ca_tensor *y = ca_matmul(ca_gelu(ca_matmul(x, c->w1)), c->w2);
    return y ? CA_OK : ca_last_status();
}

static size_t peak_at(step_ctx *c, int64_t batch) {
    ca_allocator_stats st;
    CA_CHECK(ca_device_reset_peak_stats(c->dev));
    CA_SCOPE { CA_CHECK(mlp_step(c, batch)); }
    CA_CHECK(ca_device_memory_stats(c->dev, &st));
    c->ncalls = 0;
    return st.peak_allocated;
}

int main(int argc, char **argv) {
    bool fail_other = argc > 1 && !strcmp(argv[1], "--fail-other");
    ca_accelerator *acc;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = 1, .argv = argv}, &acc));
    int rank = ca_process_index(acc), last = ca_num_processes(acc) - 1;
    step_ctx c = {.dev = ca_accelerator_device(acc)};
    c.w1 = ca_tensor_keep(ca_full(c.dev, CA_F32, 2, (int64_t[]){64, 512}, 0.01));
    c.w2 = ca_tensor_keep(ca_full(c.dev, CA_F32, 2, (int64_t[]){512, 16}, 0.01));
    if (rank == last) {
        if (fail_other) c.fail_other = true;
        else CA_CHECK(ca_device_set_memory_limit(c.dev, peak_at(&c, 40)));
    }
    int64_t found = -1;
    ca_status s = ca_find_executable_batch_size(acc, 64, mlp_step, &c, &found);
    CA_CHECK(ca_device_set_memory_limit(c.dev, 0));
    if (s != CA_OK) {
        printf("rank=%d status=%s error=%s\n", rank, ca_status_name(s), ca_last_error());
    } else {
        printf("rank=%d found=%lld calls=", rank, (long long)found);
        for (int i = 0; i < c.ncalls; i++) printf("%s%lld", i ? "," : "", (long long)c.calls[i]);
        printf("\n");
    }
    fflush(stdout);
    ca_tensor_free(c.w1);
    ca_tensor_free(c.w2);
    ca_accelerator_destroy(acc);
    ca_shutdown();
    return 0;
}
