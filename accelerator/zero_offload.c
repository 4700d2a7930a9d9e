/* Optimizer offload for sharded data parallelism (DeepSpeed offload_optimizer / offload_param:
 * cpu, FSDP fsdp_offload_params), as ZeRO-Offload does it: the optimizer state of this rank's shard
 * lives in host memory and the update runs there, on the CPU backend's fused kernels. Each step the
 * shard's parameters and averaged gradient go to two pinned host buffers, the host updates the
 * parameters with the host state, and the parameters go back. The device keeps parameters and
 * gradients only, so its optimizer-state memory (2 x shard for AdamW) is gone.
 *
 * The parameters are read back from the device every step rather than kept as a host master copy: a
 * checkpoint load, ca_summon_full_params or sync_module_states may write them on the device between
 * steps, and a host copy would then be stale. The cost is one more shard-sized copy per step.
 *
 * On the CPU backend offload is a no-op (everything is host memory already) unless
 * CACCEL_OFFLOAD_ON_CPU=1 asks for it: the same copies and host update then run between two host
 * buffers, which is how the tests check this path without a GPU. */
#include "accelerator/accelerator_impl.h"

#include <stdlib.h>
#include <string.h>

bool ca_zero_offload_wanted(const ca_accelerator *acc) {
    if (!acc->zero.offload || acc->zero.stage == 0) return false;
    const ca_device_ops *ops = ca_device_ops_of(acc->device);
    if (ops && !ops->host_memory) return true;
    const char *v = getenv("CACCEL_OFFLOAD_ON_CPU");
    return v && !strcmp(v, "1");
}

/* Pinned where the device can pin (the copies then run at full speed), plain host memory otherwise. */
static ca_status host_buffer(ca_accelerator *acc, size_t bytes, float **out) {
    const ca_device_ops *ops = ca_device_ops_of(acc->device);
    void *p = NULL;
    if (ops && ops->host_alloc && ops->host_free) {
        if (ops->host_alloc(ca_device_context(acc->device), bytes, &p) != CA_OK)
            return ca_error_context("offload: %zu bytes of pinned host memory", bytes);
    } else if (!(p = calloc(1, bytes ? bytes : 1))) {
        return ca_error(CA_ERR_NOMEM, "offload: cannot allocate %zu bytes of host memory", bytes);
    }
    *out = p;
    return CA_OK;
}

static void host_free(ca_accelerator *acc, float *p) {
    if (!p) return;
    const ca_device_ops *ops = ca_device_ops_of(acc->device);
    if (ops && ops->host_alloc && ops->host_free) ops->host_free(ca_device_context(acc->device), p);
    else free(p);
}

ca_status ca_zero_offload_init(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    if (z->hp) return CA_OK;
    size_t bytes = (size_t)z->shard * sizeof(float);
    ca_status s = host_buffer(acc, bytes, &z->hp);
    if (s == CA_OK) s = host_buffer(acc, bytes, &z->hg);
    if (s == CA_OK) {
        memset(z->hp, 0, bytes);   /* the shard's padding past the last parameter stays 0 */
        memset(z->hg, 0, bytes);
    }
    return s;
}

/* The shard's parameters and its averaged gradient, device -> host. */
ca_status ca_zero_offload_fetch(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    size_t bytes = (size_t)z->shard * sizeof(float);
    ca_status s = ca_device_copy_to_host(acc->device, z->hg, ca_tptr(z->gshard), bytes);
    if (s == CA_OK && z->pshard) s = ca_device_copy_to_host(acc->device, z->hp, ca_tptr(z->pshard), bytes);
    for (int i = 0; s == CA_OK && !z->pshard && i < z->nsegs; i++) {
        const ca_zero_seg *sg = &z->segs[i];
        s = ca_device_copy_to_host(acc->device, z->hp + sg->soff, ca_zero_fptr(sg->param, sg->poff),
                                   (size_t)sg->n * sizeof(float));
    }
    return s == CA_OK ? CA_OK : ca_error_context("offload: copying the shard to the host");
}

/* The updated parameters, host -> device (stage 3: the shard; stages 1, 2: each parameter's part, which
 * the all-gather then sends to the other ranks). */
ca_status ca_zero_offload_store(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    ca_status s = CA_OK;
    if (z->pshard)
        s = ca_device_copy_from_host(acc->device, ca_tptr(z->pshard), z->hp, (size_t)z->shard * sizeof(float));
    for (int i = 0; s == CA_OK && !z->pshard && i < z->nsegs; i++) {
        const ca_zero_seg *sg = &z->segs[i];
        if (!sg->opt) continue;   /* no optimizer holds it: unchanged */
        s = ca_device_copy_from_host(acc->device, ca_zero_fptr(sg->param, sg->poff), z->hp + sg->soff,
                                     (size_t)sg->n * sizeof(float));
    }
    return s == CA_OK ? CA_OK : ca_error_context("offload: copying the updated shard back to %s",
                                                 ca_device_name(acc->device));
}

void ca_zero_offload_free(ca_accelerator *acc) {
    host_free(acc, acc->zero.hp);
    host_free(acc, acc->zero.hg);
    acc->zero.hp = acc->zero.hg = NULL;
}
