/* Opened devices: lookup/open through the registry, memory and copies through the device's vtable. */
#include "core/device_impl.h"
#include "core/alloc_impl.h"
#include "core/registry_impl.h"
#include "base/ptr_map_impl.h"
#include <caccel/xla.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* estimate-memory --run's model of a lazy device's memory on an eager one (below) */
static void eager_open(ca_device *d);
static void eager_close(ca_device *d);
static void pmark_open(ca_device *d);

static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static ca_device *devices;
static ca_device *_Atomic cpu_dev;

static ca_status open_locked(const char *name, int index, const ca_device_open_args *args,
                             ca_device **out) {
    for (ca_device *d = devices; d; d = d->next)
        if (d->index == index && strcmp(d->name, name) == 0) {
            *out = d;
            return CA_OK;
        }
    const ca_device_ops *ops = ca_registry_device(name);
    if (!ops) return ca_last_status();
    int count = 0;
    char reason[256] = "";
    if (!ops->device_count || ops->device_count(&count, reason, sizeof reason) != CA_OK || count == 0)
        return ca_error(CA_ERR_UNSUPPORTED, "no %s device available%s%s", name,
                        reason[0] ? ": " : "", reason);
    if (index < 0 || index >= count)
        return ca_error(CA_ERR_INVALID, "%s device %d does not exist (%d visible)", name, index, count);

    ca_device *d = calloc(1, sizeof *d);
    if (!d) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ca_copy_vtable(&d->ops, sizeof d->ops, ops, ops->struct_size);
    if (ops->kernels) ca_copy_vtable(&d->k, sizeof d->k, ops->kernels, ops->kernels->struct_size);
    if (d->ops.kind == CA_DEVICE_KIND_UNSET)   /* a table of an older minor ABI */
        d->ops.kind = d->ops.host_memory ? CA_DEVICE_HOST : CA_DEVICE_GPU;
    d->name = ops->name;
    d->index = index;
    ca_device_open_args def = {.struct_size = sizeof def, .local_rank = -1};
    ca_status s = ops->open(index, args ? args : &def, &d->ctx);
    if (s != CA_OK) {
        free(d);
        return ca_error_context("opening %s device %d", name, index);
    }
    if (d->ops.allocator && d->ops.allocator_ctx) {
        d->aops = d->ops.allocator;
        d->actx = d->ops.allocator_ctx(d->ctx);
    } else {
        s = ca_caching_allocator_create(&d->ops, d->ctx, &d->aops, &d->actx);
        if (s != CA_OK) {
            ops->close(d->ctx);
            free(d);
            return s;
        }
    }
    eager_open(d);
    pmark_open(d);
    if (!d->ops.describe || d->ops.describe(d->ctx, d->description, sizeof d->description) != CA_OK)
        snprintf(d->description, sizeof d->description, "%s:%d", name, index);
    d->next = devices;
    devices = d;
    *out = d;
    return CA_OK;
}

ca_status ca_device_open(const char *name, int index, const ca_device_open_args *args,
                         ca_device **out) {
    if (out) *out = NULL;
    if (!name || !out) return ca_error(CA_ERR_INVALID, "ca_device_open: name and out are required");
    pthread_mutex_lock(&dev_mu);
    ca_status s = open_locked(name, index, args, out);
    pthread_mutex_unlock(&dev_mu);
    return s;
}

ca_device *ca_cpu_device(void) {
    ca_device *d = cpu_dev;
    if (d) return d;
    if (ca_device_open("cpu", 0, NULL, &d) != CA_OK) return NULL;
    cpu_dev = d;
    return d;
}

void ca_device_set_deterministic(ca_device *d, bool on) {
    if (d && d->ops.set_deterministic) d->ops.set_deterministic(d->ctx, on);
}

const char *ca_device_name(const ca_device *d) { return d ? d->name : "?"; }
int ca_device_index(const ca_device *d) { return d ? d->index : -1; }
const char *ca_device_description(const ca_device *d) { return d ? d->description : ""; }
bool ca_device_is_host(const ca_device *d) { return d && d->ops.host_memory; }
ca_device_kind ca_device_kind_of(const ca_device *d) { return d ? d->ops.kind : CA_DEVICE_KIND_UNSET; }
const ca_kernels *ca_device_kernels(const ca_device *d) { return &d->k; }
void *ca_device_context(const ca_device *d) { return d->ctx; }
const ca_device_ops *ca_device_ops_of(const ca_device *d) { return &d->ops; }

ca_status ca_device_synchronize(ca_device *d) {
    return d->ops.synchronize ? d->ops.synchronize(d->ctx) : CA_OK;
}

bool ca_device_is_lazy(const ca_device *d) { return d && d->ops.kind == CA_DEVICE_LAZY; }

ca_status ca_device_mark_step(ca_device *d) {
    if (!d) return ca_error(CA_ERR_INVALID, "ca_device_mark_step: device is NULL");
    return d->ops.mark_step ? d->ops.mark_step(d->ctx) : CA_OK;
}

/* The caccel/xla.h extra `proc` of d's backend, or NULL with the error recorded. */
static void *xla_proc(const ca_device *d, const char *proc, const char *fn) {
    void *p = d && d->ops.get_proc ? d->ops.get_proc(proc) : NULL;
    if (!p)
        ca_error(CA_ERR_INVALID, "%s: device %s:%d is not an xla device", fn, d ? d->name : "(null)",
                 d ? d->index : -1);
    return p;
}

ca_status ca_xla_metrics_get(const ca_device *d, ca_xla_metrics *out) {
    void *p = xla_proc(d, CA_XLA_PROC_METRICS, "ca_xla_metrics_get");
    if (!p) return ca_last_status();
    if (!out) return ca_error(CA_ERR_INVALID, "ca_xla_metrics_get: out is NULL");
    ((ca_xla_metrics_fn)(uintptr_t)p)(d->ctx, out);
    return CA_OK;
}

ca_status ca_xla_metrics_reset(ca_device *d) {
    void *p = xla_proc(d, CA_XLA_PROC_METRICS_RESET, "ca_xla_metrics_reset");
    if (!p) return ca_last_status();
    ((ca_xla_metrics_reset_fn)(uintptr_t)p)(d->ctx);
    return CA_OK;
}

ca_status ca_xla_metrics_report(const ca_device *d, char *buf, size_t len) {
    ca_xla_metrics m;
    ca_status s = ca_xla_metrics_get(d, &m);
    if (s != CA_OK) return s;
    void *p = xla_proc(d, CA_XLA_PROC_FORMAT_METRICS, "ca_xla_metrics_report");
    if (!p) return ca_last_status();
    if (!buf || !len) return ca_error(CA_ERR_INVALID, "ca_xla_metrics_report: buffer is NULL or empty");
    ((ca_xla_format_metrics_fn)(uintptr_t)p)(&m, buf, len);
    return CA_OK;
}

ca_status ca_xla_set_bf16_storage(ca_device *d, bool on) {
    if (!d || !d->ops.set_storage_dtype || !ca_device_is_lazy(d))
        return ca_error(CA_ERR_INVALID, "ca_xla_set_bf16_storage: device %s:%d is not an xla device",
                        d ? d->name : "(null)", d ? d->index : -1);
    return d->ops.set_storage_dtype(d->ctx, on ? CA_BF16 : CA_F32);
}

bool ca_xla_bf16_storage(const ca_device *d) {
    return d && d->ops.storage_dtype && d->ops.storage_dtype(d->ctx) == CA_BF16;
}

ca_status ca_device_memory_stats(ca_device *d, ca_allocator_stats *out) {
    memset(out, 0, sizeof *out);
    d->aops->stats(d->actx, out);
    return CA_OK;
}

ca_status ca_device_empty_cache(ca_device *d) {
    if (d->aops->empty_cache) d->aops->empty_cache(d->actx);
    return CA_OK;
}

ca_status ca_device_reset_peak_stats(ca_device *d) {
    if (d->aops->reset_peak) d->aops->reset_peak(d->actx);
    return CA_OK;
}

ca_status ca_device_set_memory_limit(ca_device *d, size_t bytes) {
    if (!d) return ca_error(CA_ERR_INVALID, "ca_device_set_memory_limit: device is NULL");
    __atomic_store_n(&d->memory_limit, bytes, __ATOMIC_RELAXED);
    return CA_OK;
}

size_t ca_device_memory_limit(const ca_device *d) {
    return d ? __atomic_load_n(&d->memory_limit, __ATOMIC_RELAXED) : 0;
}

/* The limit counts the allocator's bytes in use by tensors (what a smaller GPU would refuse), in
 * its own terms (size classes), not its cache: the allocation is made, and undone when it took the
 * bytes in use past the limit, so the check is exact for any allocator. */
static ca_status check_memory_limit(ca_device *d, size_t bytes, size_t limit, void **ptr) {
    ca_allocator_stats st = {0};
    d->aops->stats(d->actx, &st);
    if (st.allocated <= limit) return CA_OK;
    d->aops->free(d->actx, *ptr);
    *ptr = NULL;
    return ca_error(CA_ERR_NOMEM,
                    "%s:%d: out of memory allocating %zu bytes: the device's memory limit is %zu bytes "
                    "and tensors would hold %zu",
                    d->name, d->index, bytes, limit, st.allocated);
}

/* A lazy device's allocations replayed through the eager caching allocator itself, over memory
 * it never touches: the lazy device counts its addresses at 64-byte alignment, an eager device
 * holds whole size classes (up to a quarter more) and serves a miss from a cached free block of up
 * to twice the size, counting the whole block (under bf16 autocast the half-size copies land in
 * blocks the f32 tensors freed). An estimate of the eager peak must count as the eager device does. */
typedef struct ca_eager_model {
    pthread_mutex_t mu;
    ca_ptr_map addr;                /* lazy ptr -> the ptr the replayed allocator gave it */
    ca_device_ops ops;              /* mem_alloc hands out addresses, no memory */
    const ca_allocator_ops *aops;
    void *actx;
    uintptr_t next;                 /* the next address mem_alloc gives */
} ca_eager_model;

static ca_status eager_mem_alloc(void *dev, size_t bytes, void **ptr) {
    ca_eager_model *m = dev;        /* called under m->mu (eager_note) */
    m->next += bytes ? bytes : 1;
    *ptr = (void *)m->next;
    return CA_OK;
}

static void eager_mem_free(void *dev, void *ptr) { (void)dev, (void)ptr; }

static void eager_open(ca_device *d) {
    const char *r = getenv("CACCEL_MEMORY_REPORT");
    if (d->ops.kind != CA_DEVICE_LAZY || !r || !*r) return;
    ca_eager_model *m = calloc(1, sizeof *m);   /* without it the report falls back to the lazy count */
    if (!m) return;
    m->ops = (ca_device_ops){.struct_size = sizeof m->ops, .abi_version = CA_ABI_VERSION, .name = "eager model",
                             .mem_alloc = eager_mem_alloc, .mem_free = eager_mem_free};
    m->next = 4096;
    if (ca_caching_allocator_create(&m->ops, m, &m->aops, &m->actx) != CA_OK) {
        ca_clear_error();
        free(m);
        return;
    }
    pthread_mutex_init(&m->mu, NULL);
    d->eager = m;
}

static void eager_close(ca_device *d) {
    if (!d->eager) return;
    ca_caching_allocator_destroy(d->eager->actx);
    ca_ptr_map_free(&d->eager->addr);
    pthread_mutex_destroy(&d->eager->mu);
    free(d->eager);
    d->eager = NULL;
}

static void eager_note(ca_eager_model *m, void *ptr, size_t bytes) {
    void *e = NULL;
    pthread_mutex_lock(&m->mu);
    if (m->aops->alloc(m->actx, bytes, NULL, &e) == CA_OK && !ca_ptr_map_put(&m->addr, ptr, e))
        m->aops->free(m->actx, e);  /* no memory to remember it: leave it out of the count */
    pthread_mutex_unlock(&m->mu);
}

static void eager_forget(ca_eager_model *m, void *ptr) {
    pthread_mutex_lock(&m->mu);
    void *e = ca_ptr_map_take(&m->addr, ptr);
    if (e) m->aops->free(m->actx, e);
    pthread_mutex_unlock(&m->mu);
}

bool ca_device_models_eager(const ca_device *d) { return d && d->eager; }

size_t ca_device_eager_peak(const ca_device *d) {
    if (!d || !d->eager) return 0;
    ca_allocator_stats st = {0};
    d->eager->aops->stats(d->eager->actx, &st);
    return st.peak_allocated;
}

/* ca_device_set_peak_mark's bookkeeping: the mark, the peak seen so far and the mark then. */
typedef struct ca_peak_mark {
    pthread_mutex_t mu;
    size_t mark, peak, at_peak;
} ca_peak_mark;

static void pmark_open(ca_device *d) {
    const char *r = getenv("CACCEL_MEMORY_REPORT");
    if (!r || !*r || !(d->pmark = calloc(1, sizeof *d->pmark))) return;   /* without it: no mark, 0 read */
    pthread_mutex_init(&d->pmark->mu, NULL);
}

static void pmark_close(ca_device *d) {
    if (!d->pmark) return;
    pthread_mutex_destroy(&d->pmark->mu);
    free(d->pmark);
    d->pmark = NULL;
}

void ca_device_set_peak_mark(ca_device *d, size_t mark) {
    if (!d || !d->pmark) return;
    pthread_mutex_lock(&d->pmark->mu);
    d->pmark->mark = mark;
    pthread_mutex_unlock(&d->pmark->mu);
}

size_t ca_device_mark_at_peak(const ca_device *d) {
    if (!d || !d->pmark) return 0;
    pthread_mutex_lock(&d->pmark->mu);
    size_t v = d->pmark->at_peak;
    pthread_mutex_unlock(&d->pmark->mu);
    return v;
}

/* After an allocation: a new peak of the figure the report reads takes the mark as it is now. */
static void pmark_note(ca_device *d) {
    ca_allocator_stats st = {0};
    if (d->eager) st.peak_allocated = ca_device_eager_peak(d);
    else d->aops->stats(d->actx, &st);
    pthread_mutex_lock(&d->pmark->mu);
    if (st.peak_allocated > d->pmark->peak) {
        d->pmark->peak = st.peak_allocated;
        d->pmark->at_peak = d->pmark->mark;
    }
    pthread_mutex_unlock(&d->pmark->mu);
}

ca_status ca_device_alloc(ca_device *d, size_t bytes, void **ptr) {
    ca_status s = d->aops->alloc(d->actx, bytes, NULL, ptr);
    size_t limit = __atomic_load_n(&d->memory_limit, __ATOMIC_RELAXED);
    if (s == CA_OK && limit) s = check_memory_limit(d, bytes, limit, ptr);
    if (s == CA_OK && d->eager) eager_note(d->eager, *ptr, bytes);
    if (s == CA_OK && d->pmark) pmark_note(d);
    return s;
}

void ca_device_free(ca_device *d, void *ptr) {
    if (!ptr) return;
    if (d->eager) eager_forget(d->eager, ptr);
    d->aops->free(d->actx, ptr);
}

static ca_status copy(ca_device *d, void *dst, const void *src, size_t bytes, ca_copy_kind kind) {
    if (bytes == 0) return CA_OK;
    if (!d->ops.memcpy) return ca_kernel_missing(d, "memcpy");
    return d->ops.memcpy(d->ctx, dst, src, bytes, kind, false);
}

ca_status ca_device_copy_from_host(ca_device *d, void *dst, const void *src, size_t bytes) {
    return copy(d, dst, src, bytes, CA_COPY_H2D);
}

ca_status ca_device_copy_to_host(ca_device *d, void *dst, const void *src, size_t bytes) {
    return copy(d, dst, src, bytes, CA_COPY_D2H);
}

ca_status ca_device_copy(ca_device *d, void *dst, const void *src, size_t bytes) {
    return copy(d, dst, src, bytes, CA_COPY_D2D);
}

void ca_shutdown(void) {
    pthread_mutex_lock(&dev_mu);
    for (ca_device *d = devices; d;) {
        ca_device *n = d->next;
        if (d->aops && !d->ops.allocator) ca_caching_allocator_destroy(d->actx);
        eager_close(d);
        pmark_close(d);
        if (d->ops.close) d->ops.close(d->ctx);
        free(d);
        d = n;
    }
    devices = NULL;
    cpu_dev = NULL;
    pthread_mutex_unlock(&dev_mu);
    ca_registry_shutdown();
}
