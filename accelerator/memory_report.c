/* memory_report.c: the memory report of `caccel estimate-memory --run`. With CACCEL_MEMORY_REPORT
 * set, the first real optimizer step writes what the training device holds, by category, to
 * CACCEL_MEMORY_REPORT.<rank> and ends the process: the command runs a program for one step, on
 * the lazy xla device for an estimate or on its own device to measure. */
#include "accelerator/accelerator_impl.h"
#include "accelerator/sync_impl.h"
#include "core/device_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of the optimizer's parameters and of their gradients that live on the training device. */
static void param_bytes(const ca_accelerator *acc, const ca_optimizer *o, size_t *params, size_t *grads) {
    *params = *grads = 0;
    for (int i = 0; i < ca_optimizer_num_params(o); i++) {
        ca_tensor *p = ca_optimizer_param_at(o, i), *g = ca_tensor_grad(p);
        if (ca_tensor_device(p) == acc->device) *params += ca_tensor_nbytes(p);
        if (g && ca_tensor_device(g) == acc->device) *grads += ca_tensor_nbytes(g);
    }
}

static size_t dev_bytes(const ca_accelerator *acc, const ca_tensor *t) {
    return t && ca_tensor_device(t) == acc->device ? ca_tensor_nbytes(t) : 0;
}

/* The model states under sharded data parallelism (zero.c, zero3.c), which live in the strategy's
 * flat buffers, not in the optimizer's or the parameters' tensors: the optimizer state is this rank's
 * shard (s1, s2); the gradient is the full flat one at stage 1 (the shard is a view of it), else the
 * shard; the parameters are whole at stages 1 and 2, the shard at stage 3. `unsharded` is what the
 * strategy holds whole for a while during the step: at stage 2 the flat gradient of every parameter
 * from the backward to its reduce-scatter, at stage 3 the gathered units' bytes (their full
 * parameters and gradient buffers) at the moment of the step's peak (the device's peak mark, which
 * zero3.c sets to its running total), so that the activations are the peak's own rest; `most` the
 * most of them held at once. On the device only: an offloaded state is the host's. */
static void zero_states(const ca_accelerator *acc, size_t *params, size_t *grads, size_t *state, size_t *unsharded,
                        size_t *most) {
    const ca_zero *z = &acc->zero;
    *state = dev_bytes(acc, z->s1) + dev_bytes(acc, z->s2);
    *unsharded = 0;
    if (z->stage == 3) {
        *params = dev_bytes(acc, z->pshard);
        *grads = dev_bytes(acc, z->gshard);
        *unsharded = ca_device_mark_at_peak(acc->device);
        *most = z->held_peak;
    } else if (z->stage == 1) {
        *grads = dev_bytes(acc, z->gflat);
    } else {
        *grads = dev_bytes(acc, z->gshard);
        *unsharded = (size_t)(z->shard * z->world) * sizeof(float);
    }
    if (z->stage != 3) *most = *unsharded;
}

/* One line of key=value pairs: the device's peak of bytes held by tensors so far (the allocator's
 * accounting: on xla the addresses handed out, which is what a device would have to back), the
 * model states (under ZeRO the strategy's, above), the rest of the peak as activations and temporaries, and the most the allocator held
 * (peak_reserved: in use plus its cache of free blocks). */
static ca_status write_report(ca_accelerator *acc, ca_optimizer *o, const char *base) {
    ca_status s = ca_device_synchronize(acc->device);   /* on xla: run the step's graph */
    ca_allocator_stats st = {0};
    if (s == CA_OK) s = ca_device_memory_stats(acc->device, &st);
    if (s != CA_OK) return ca_error_context("CACCEL_MEMORY_REPORT on rank %d", acc->rank);
    size_t params, grads, state = (size_t)ca_optimizer_state_bytes(o), unsharded = 0, most = 0;
    param_bytes(acc, o, &params, &grads);
    int zero = acc->sync_ops == &ca_sync_zero ? acc->zero.stage : 0;
    if (zero) zero_states(acc, &params, &grads, &state, &unsharded, &most);
    size_t states = params + grads + state + unsharded;
    /* on a lazy device, the peak an eager device's allocator would hold (core/device.c) */
    size_t eager = ca_device_eager_peak(acc->device), peak = eager ? eager : st.peak_allocated;
    size_t act = peak > states ? peak - states : 0;
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", base, acc->rank < 0 ? 0 : acc->rank);
    FILE *f = fopen(path, "w");
    if (!f) return ca_error(CA_ERR_IO, "CACCEL_MEMORY_REPORT: cannot write %s: %s", path, strerror(errno));
    fprintf(f, "rank=%d world=%d device=%s zero=%d parameters=%zu gradients=%zu optimizer_state=%zu unsharded=%zu "
            "activations=%zu peak=%zu lazy_peak=%zu peak_reserved=%zu unsharded_most=%zu shards=%d\n", acc->rank < 0 ? 0 : acc->rank,
            acc->world < 1 ? 1 : acc->world, ca_device_name(acc->device), zero, params, grads, state, unsharded, act,
            peak, st.peak_allocated, st.peak_reserved, most, zero ? acc->zero.world : 1);
    if (fclose(f) != 0) return ca_error(CA_ERR_IO, "CACCEL_MEMORY_REPORT: writing %s failed", path);
    return CA_OK;
}

ca_status ca_memory_report_step(ca_accelerator *acc, ca_optimizer *o) {
    const char *base = getenv("CACCEL_MEMORY_REPORT");
    if (!base || !*base || o->skipped) return CA_OK;
    ca_status s = write_report(acc, o, base);
    if (s != CA_OK) return s;
    /* The report is what the run was for: the program stops here, every rank at the same step. */
    fflush(NULL);
    exit(0);
}
