/* The core's caching allocator: size classes over a device's raw allocation, per-stream free lists, statistics. */
#include "core/alloc_impl.h"
#include <caccel/device.h>
#include <pthread.h>
#include "base/ptr_map_impl.h"
#include "base/trace_impl.h"
#include <stdio.h>

#include <stdlib.h>
#include <string.h>

/*
 * Why a cache on every device: on CUDA, cudaMalloc/cudaFree synchronise and
 * cost milliseconds; on the CPU, a flat allocation count after warm-up is how
 * tests prove a training loop does not leak. Sizes are rounded to classes of
 * 2^k * {1, 1.25, 1.5, 1.75} (at most 25% slack); a freed block goes back to
 * its class's free list for the same stream and is reused as is.
 *
 * Shapes that vary from step to step (text batches padded to their longest
 * sequence) ask for ever new classes; if blocks cached for one class never
 * served another, the cache would grow to the sum of every size ever used. So
 * a miss takes the smallest free block of up to twice its size, and a miss that
 * would leave more than max(CA_CACHE_FLOOR, peak in use / 2) cached first frees
 * cached blocks, least recently used class first, down to half that. Steady
 * shapes stop missing after the first steps, so they never pay for this.
 */

#define CA_MIN_BLOCK 64
#define CA_CACHE_FLOOR ((size_t)64 << 20)

typedef struct block {
    void *ptr;
    size_t size;          /* class size actually reserved */
    size_t requested;
    void *stream;
    bool in_use;
    struct block *next_free;
} block;

typedef struct free_list {
    size_t size;
    void *stream;
    block *head;
    uint64_t last_use;    /* tick of the last push or pop: trimming frees the oldest first */
    struct free_list *next;
} free_list;

typedef struct caching {
    const ca_device_ops *ops;
    void *dev;
    pthread_mutex_t mu;
    ca_ptr_map blocks;            /* ptr -> block, every block reserved from the device */
    free_list *lists;
    uint64_t tick;
    ca_allocator_stats st;
} caching;

size_t ca_caching_size_class(size_t n) {
    if (n <= CA_MIN_BLOCK) return CA_MIN_BLOCK;
    size_t p = (size_t)1 << (63 - __builtin_clzll((unsigned long long)(n - 1)));
    /* p is the highest power of two below n; classes p*1.25, 1.5, 1.75, 2 */
    for (size_t q = 5; q <= 8; q++) {
        size_t c = p / 4 * q;
        if (c >= n) return (c + 63) & ~(size_t)63;
    }
    return 2 * p;
}

static free_list *list_for(caching *c, size_t size, void *stream, bool create) {
    for (free_list *l = c->lists; l; l = l->next)
        if (l->size == size && l->stream == stream) return l;
    if (!create) return NULL;
    free_list *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->size = size;
    l->stream = stream;
    l->next = c->lists;
    c->lists = l;
    return l;
}

static void note_alloc(caching *c, block *b) {
    c->st.allocated += b->size;
    if (c->st.allocated > c->st.peak_allocated) c->st.peak_allocated = c->st.allocated;
    c->st.num_allocs++;
}

static void free_block(caching *c, block *b) {
    ca_ptr_map_take(&c->blocks, b->ptr);
    c->ops->mem_free(c->dev, b->ptr);
    c->st.reserved -= b->size;
    c->st.num_device_frees++;
    free(b);
}

/* Frees every cached (unused) block back to the device. Caller holds mu. */
static void release_cached(caching *c) {
    for (free_list *l = c->lists; l; l = l->next) {
        while (l->head) {
            block *b = l->head;
            l->head = b->next_free;
            free_block(c, b);
        }
    }
}

/* Frees cached blocks, least recently used class first, down to half the limit. Caller holds mu. */
static void trim_cache(caching *c, size_t need) {
    size_t limit = c->st.peak_allocated / 2 > CA_CACHE_FLOOR ? c->st.peak_allocated / 2 : CA_CACHE_FLOOR;
    if (c->st.reserved - c->st.allocated + need <= limit) return;
    while (c->st.reserved - c->st.allocated > limit / 2) {
        free_list *lru = NULL;
        for (free_list *l = c->lists; l; l = l->next)
            if (l->head && (!lru || l->last_use < lru->last_use)) lru = l;
        if (!lru) return;
        while (lru->head && c->st.reserved - c->st.allocated > limit / 2) {
            block *b = lru->head;
            lru->head = b->next_free;
            free_block(c, b);
        }
    }
}

/* A free block of the class, else the smallest free one of at most twice the size. */
static block *pop_free(caching *c, size_t size, void *stream) {
    free_list *best = list_for(c, size, stream, false);
    if (!best || !best->head) {
        best = NULL;
        for (free_list *l = c->lists; l; l = l->next)
            if (l->head && l->stream == stream && l->size > size && l->size <= 2 * size &&
                (!best || l->size < best->size))
                best = l;
    }
    if (!best) return NULL;
    block *b = best->head;
    best->head = b->next_free;
    best->last_use = ++c->tick;
    c->st.num_cache_hits++;
    return b;
}

static ca_status reserve_block(caching *c, size_t size, size_t bytes, void *stream, block **out) {
    void *p = NULL;
    ca_status s = c->ops->mem_alloc(c->dev, size, &p);
    if (s != CA_OK) {
        release_cached(c);   /* give the cache back and try once more */
        ca_clear_error();
        s = c->ops->mem_alloc(c->dev, size, &p);
    }
    if (s != CA_OK)
        return ca_error(CA_ERR_NOMEM,
                        "%s: out of memory allocating %zu bytes (%zu reserved, %zu in use by tensors)",
                        c->ops->name, bytes, c->st.reserved, c->st.allocated);
    block *b = calloc(1, sizeof *b);
    if (b) b->ptr = p;
    if (!b || !ca_ptr_map_put(&c->blocks, p, b)) {
        c->ops->mem_free(c->dev, p);
        free(b);
        return ca_error(CA_ERR_NOMEM, "out of host memory for allocator bookkeeping");
    }
    b->size = size;
    b->stream = stream;
    c->st.reserved += size;
    if (c->st.reserved > c->st.peak_reserved) c->st.peak_reserved = c->st.reserved;
    c->st.num_device_allocs++;
    *out = b;
    return CA_OK;
}

/* The profiler's counter track (profile_memory): bytes in use by tensors and reserved from the
 * device, one sample per allocation and free, taken under the allocator's lock. */
static void trace_memory(const caching *c) {
    if (!(ca_trace_flags() & CA_TRACE_MEMORY)) return;
    char a[128], name[64];
    snprintf(a, sizeof a, "\"allocated\":%zu,\"reserved\":%zu", c->st.allocated, c->st.reserved);
    snprintf(name, sizeof name, "memory %s", c->ops->name);
    ca_trace_counter(name, a);
}

static ca_status caching_alloc(void *actx, size_t bytes, void *stream, void **ptr) {
    caching *c = actx;
    size_t size = ca_caching_size_class(bytes ? bytes : 1);
    ca_status s = CA_OK;
    block *b = NULL;
    pthread_mutex_lock(&c->mu);
    b = pop_free(c, size, stream);
    if (!b) {
        trim_cache(c, size);
        s = reserve_block(c, size, bytes, stream, &b);
    }
    if (s == CA_OK) {
        b->in_use = true;
        b->requested = bytes;
        b->next_free = NULL;
        note_alloc(c, b);
        *ptr = b->ptr;
        if (ca_trace_on()) trace_memory(c);
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

static void caching_free(void *actx, void *ptr) {
    caching *c = actx;
    if (!ptr) return;
    pthread_mutex_lock(&c->mu);
    block *b = ca_ptr_map_get(&c->blocks, ptr);
    if (b && b->in_use) {
        free_list *l = list_for(c, b->size, b->stream, true);
        b->in_use = false;
        c->st.allocated -= b->size;
        c->st.num_frees++;
        if (l) {
            b->next_free = l->head;
            l->head = b;
            l->last_use = ++c->tick;
        } else {           /* no memory for a list: return the block to the device */
            free_block(c, b);
        }
        if (ca_trace_on()) trace_memory(c);
    } else {
        ca_log_printf(CA_LOG_ERROR, "%s allocator: free of %p, which it did not allocate or already freed",
                      c->ops->name, ptr);
    }
    pthread_mutex_unlock(&c->mu);
}

static void caching_stats(void *actx, ca_allocator_stats *out) {
    caching *c = actx;
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}

static void caching_empty(void *actx) {
    caching *c = actx;
    pthread_mutex_lock(&c->mu);
    release_cached(c);
    pthread_mutex_unlock(&c->mu);
}

static void caching_reset_peak(void *actx) {
    caching *c = actx;
    pthread_mutex_lock(&c->mu);
    c->st.peak_allocated = c->st.allocated;
    c->st.peak_reserved = c->st.reserved;
    pthread_mutex_unlock(&c->mu);
}

static const ca_allocator_ops caching_ops = {
    .struct_size = sizeof(ca_allocator_ops),
    .abi_version = CA_ABI_VERSION,
    .name = "caching",
    .alloc = caching_alloc,
    .free = caching_free,
    .stats = caching_stats,
    .empty_cache = caching_empty,
    .reset_peak = caching_reset_peak,
};

ca_status ca_caching_allocator_create(const ca_device_ops *ops, void *dev,
                                      const ca_allocator_ops **aops, void **actx) {
    if (!ops->mem_alloc || !ops->mem_free)
        return ca_error(CA_ERR_UNSUPPORTED, "device backend '%s' has no mem_alloc/mem_free", ops->name);
    caching *c = calloc(1, sizeof *c);
    if (!c) return ca_error(CA_ERR_NOMEM, "out of host memory");
    c->ops = ops;
    c->dev = dev;
    pthread_mutex_init(&c->mu, NULL);
    *aops = &caching_ops;
    *actx = c;
    return CA_OK;
}

void ca_caching_allocator_destroy(void *actx) {
    caching *c = actx;
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    release_cached(c);
    /* blocks still in use belong to tensors that outlive the device; free them too */
    for (size_t i = 0; i < c->blocks.nslots; i++) {
        block *b = c->blocks.slots[i].val;
        if (!b) continue;
        c->ops->mem_free(c->dev, b->ptr);
        free(b);
    }
    pthread_mutex_unlock(&c->mu);
    for (free_list *l = c->lists; l;) {
        free_list *n = l->next;
        free(l);
        l = n;
    }
    ca_ptr_map_free(&c->blocks);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
