/* The CUDA caching allocator: segments from cudaMalloc split into blocks, best-fit reuse per stream, coalescing on free, statistics and a clear out-of-memory message. */
#include "backends/cuda/cuda_impl.h"
#include "base/ptr_map_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Why: cudaMalloc and cudaFree synchronise the device and cost tens of
 * microseconds to milliseconds, so a training step must not call them. Memory
 * comes from the device in segments: 2 MiB segments serve requests up to
 * 1 MiB (the small pool), 20 MiB segments serve requests up to 10 MiB, and
 * larger requests get a segment of their own rounded to 2 MiB (the large
 * pool). A segment is split into blocks: a request takes the smallest free
 * block of its pool and stream that fits (sizes are multiples of 512 bytes),
 * and the rest of that block stays free when it is large enough to be worth
 * keeping. A freed block merges with free neighbours of its segment, so a
 * segment whose blocks are all free is one block again and can be returned
 * by empty_cache. Blocks are reused only on the stream they were allocated
 * for: the stream orders the reuse after the kernels that used them.
 *
 * A block used on another stream too (NCCL's, a copy stream) says so with
 * cu_alloc_record_stream, as torch's recordStream: its free then records an
 * event on each such stream and parks the block; it becomes free (merges and
 * serves requests) only once those events completed, which the allocator
 * checks on each alloc. Without this, the block's own stream would hand it to
 * the next request while the other stream still reads or writes it.
 */

#define ROUND 512u
#define SMALL_SIZE (1u << 20)           /* requests up to this: small pool */
#define SMALL_SEGMENT (2u << 20)
#define LARGE_SEGMENT (20u << 20)
#define MIN_LARGE_ALLOC (10u << 20)     /* from here: a segment of its own */
#define LARGE_ROUND (2u << 20)

typedef struct cu_block {
    char *ptr;
    size_t size;
    cudaStream_t stream;
    bool in_use;
    bool small;                        /* which pool */
    struct cu_block *prev, *next;      /* neighbours in the segment, by address */
    cudaStream_t *uses;                /* other streams it was used on while in use (record_stream) */
    int nuses, cap_uses;
    cudaEvent_t *events;               /* parked after free: recorded on those streams */
    int nevents;
    struct cu_block *next_parked;
} cu_block;

typedef struct pool {
    cu_block **v;                      /* free blocks sorted by (stream, size, ptr) */
    size_t n, cap;
} pool;

struct cu_alloc {
    cuda_device *d;
    pthread_mutex_t mu;
    pool small, large;
    ca_ptr_map in_use;                 /* ptr -> block, the blocks in use */
    cu_block *parked;                  /* freed, waiting for their events */
    cudaEvent_t *spare;                /* completed events, recycled */
    int nspare, cap_spare;
    ca_allocator_stats st;
};

/* ------------------------------------------------------- free sets */

static int key_cmp(const cu_block *b, cudaStream_t stream, size_t size, const char *ptr) {
    uintptr_t bs = (uintptr_t)b->stream, s = (uintptr_t)stream;
    if (bs != s) return bs < s ? -1 : 1;
    if (b->size != size) return b->size < size ? -1 : 1;
    if (b->ptr != ptr) return (uintptr_t)b->ptr < (uintptr_t)ptr ? -1 : 1;
    return 0;
}

/* First index whose block is not less than the key. */
static size_t lower_bound(const pool *p, cudaStream_t stream, size_t size, const char *ptr) {
    size_t lo = 0, hi = p->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (key_cmp(p->v[mid], stream, size, ptr) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static bool pool_insert(pool *p, cu_block *b) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        cu_block **v = realloc(p->v, cap * sizeof *v);
        if (!v) return false;
        p->v = v;
        p->cap = cap;
    }
    size_t i = lower_bound(p, b->stream, b->size, b->ptr);
    memmove(p->v + i + 1, p->v + i, (p->n - i) * sizeof *p->v);
    p->v[i] = b;
    p->n++;
    return true;
}

static void pool_remove(pool *p, cu_block *b) {
    size_t i = lower_bound(p, b->stream, b->size, b->ptr);
    if (i < p->n && p->v[i] == b) {
        memmove(p->v + i, p->v + i + 1, (p->n - i - 1) * sizeof *p->v);
        p->n--;
    }
}

/* ------------------------------------------------- blocks in use */

/* ------------------------------------------------------- helpers */

static void fmt_bytes(size_t n, char *buf, size_t len) {
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, len, "%zu bytes", n);
    else snprintf(buf, len, "%.2f %s", v, units[u]);
}

static size_t segment_size(size_t size) {
    if (size <= SMALL_SIZE) return SMALL_SEGMENT;
    if (size < MIN_LARGE_ALLOC) return LARGE_SEGMENT;
    return (size + LARGE_ROUND - 1) / LARGE_ROUND * LARGE_ROUND;
}

/* Returns every segment that is entirely free. Caller holds mu. */
static void release_free_segments(cu_alloc *a) {
    pool *pools[2] = {&a->small, &a->large};
    for (int k = 0; k < 2; k++) {
        pool *p = pools[k];
        size_t w = 0;
        for (size_t i = 0; i < p->n; i++) {
            cu_block *b = p->v[i];
            if (b->prev || b->next) {
                p->v[w++] = b;
                continue;
            }
            cudaFree(b->ptr);
            a->st.reserved -= b->size;
            a->st.num_device_frees++;
            free(b->uses);
            free(b);
        }
        p->n = w;
    }
    cudaGetLastError();
}

static ca_status oom(cu_alloc *a, size_t bytes, size_t seg) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    char req[32], segs[32], res[32], used[32], cached[32], fr[32], tot[32];
    fmt_bytes(bytes, req, sizeof req);
    fmt_bytes(seg, segs, sizeof segs);
    fmt_bytes(a->st.reserved, res, sizeof res);
    fmt_bytes(a->st.allocated, used, sizeof used);
    fmt_bytes(a->st.reserved - a->st.allocated, cached, sizeof cached);
    fmt_bytes(free_b, fr, sizeof fr);
    fmt_bytes(total_b, tot, sizeof tot);
    ca_error(CA_ERR_NOMEM,
             "cuda out of memory on GPU %d (%s): tried to allocate %s (a %s segment); caccel has %s reserved "
             "(%s in tensors, %s cached); the GPU has %s free of %s",
             a->d->ordinal, a->d->name, req, segs, res, used, cached, fr, tot);
    ca_error_hint("use a smaller batch size or model, mixed precision, or gradient accumulation; memory "
                  "held by other processes on this GPU shows in nvidia-smi");
    return CA_ERR_NOMEM;
}

/* -------------------------------------------- release, parked blocks */

/* Makes a block that is no longer used free: merges it with free neighbours of its segment and
 * puts it in its pool. Caller holds mu. */
static void release_block(cu_alloc *a, cu_block *b) {
    pool *p = b->small ? &a->small : &a->large;
    b->in_use = false;
    a->st.allocated -= b->size;
    b->nuses = 0;
    /* merge with free neighbours of the same segment */
    cu_block *n = b->next;
    if (n && !n->in_use) {
        pool_remove(p, n);
        b->size += n->size;
        b->next = n->next;
        if (n->next) n->next->prev = b;
        free(n->uses);
        free(n);
    }
    cu_block *q = b->prev;
    if (q && !q->in_use) {
        pool_remove(p, q);
        q->size += b->size;
        q->next = b->next;
        if (b->next) b->next->prev = q;
        free(b->uses);
        free(b);
        b = q;
    }
    if (!pool_insert(p, b)) {
        /* cannot remember it as free: return it when it is a whole segment, else it is lost to reuse */
        if (!b->prev && !b->next) {
            cudaSetDevice(a->d->ordinal);
            cudaFree(b->ptr);
            cudaGetLastError();
            a->st.reserved -= b->size;
            a->st.num_device_frees++;
            free(b->uses);
            free(b);
        } else {
            CA_LOG_E("cuda allocator: out of host memory; %zu bytes at %p stay unused", b->size, (void *)b->ptr);
        }
    }
}

/* An event to record, recycled when possible. Caller holds mu. */
static cudaError_t take_event(cu_alloc *a, cudaEvent_t *ev) {
    if (a->nspare > 0) {
        *ev = a->spare[--a->nspare];
        return cudaSuccess;
    }
    return cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
}

static void give_event(cu_alloc *a, cudaEvent_t ev) {
    if (a->nspare == a->cap_spare) {
        int cap = a->cap_spare ? a->cap_spare * 2 : 16;
        cudaEvent_t *v = realloc(a->spare, (size_t)cap * sizeof *v);
        if (!v) {
            cudaEventDestroy(ev);
            return;
        }
        a->spare = v;
        a->cap_spare = cap;
    }
    a->spare[a->nspare++] = ev;
}

/* Parks b behind an event on each stream it was used on. False when an event cannot be recorded:
 * then the other streams are waited for here, so the block can be released at once. */
static bool park_block(cu_alloc *a, cu_block *b) {
    b->events = calloc((size_t)b->nuses, sizeof *b->events);
    bool ok = b->events != NULL;
    for (int i = 0; ok && i < b->nuses; i++) {
        cudaEvent_t ev;
        if (take_event(a, &ev) != cudaSuccess) {
            ok = false;
            break;
        }
        if (cudaEventRecord(ev, b->uses[i]) != cudaSuccess) {
            give_event(a, ev);
            ok = false;
            break;
        }
        b->events[b->nevents++] = ev;
    }
    if (ok) {
        b->next_parked = a->parked;
        a->parked = b;
        return true;
    }
    cudaGetLastError();
    for (int i = 0; i < b->nuses; i++) cudaStreamSynchronize(b->uses[i]);
    cudaGetLastError();
    for (int i = 0; i < b->nevents; i++) give_event(a, b->events[i]);
    free(b->events);
    b->events = NULL;
    b->nevents = 0;
    return false;
}

/* Releases the parked blocks whose events completed (wait: waits for them all first). Caller
 * holds mu. */
static void process_parked(cu_alloc *a, bool wait) {
    cu_block **link = &a->parked;
    while (*link) {
        cu_block *b = *link;
        bool done = true;
        while (b->nevents > 0) {
            cudaEvent_t ev = b->events[b->nevents - 1];
            cudaError_t e = wait ? cudaEventSynchronize(ev) : cudaEventQuery(ev);
            if (e == cudaErrorNotReady) {
                done = false;
                break;
            }
            /* an error here is the context's (sticky), reported by the next call that checks */
            give_event(a, ev);
            b->nevents--;
        }
        cudaGetLastError();
        if (!done) {
            link = &b->next_parked;
            continue;
        }
        *link = b->next_parked;
        b->next_parked = NULL;
        free(b->events);
        b->events = NULL;
        release_block(a, b);
    }
}

/* ------------------------------------------------------ alloc/free */

static ca_status cu_alloc_alloc(void *actx, size_t bytes, void *stream, void **ptr) {
    cu_alloc *a = actx;
    if (!ptr) return ca_error(CA_ERR_INVALID, "cuda allocator: output pointer is NULL");
    *ptr = NULL;
    if (bytes > SIZE_MAX - LARGE_ROUND * 2) return oom(a, bytes, bytes);
    size_t size = bytes < ROUND ? ROUND : (bytes + ROUND - 1) / ROUND * ROUND;
    cudaStream_t s = stream ? (cudaStream_t)stream : a->d->stream;
    bool small = size <= SMALL_SIZE;
    pool *p = small ? &a->small : &a->large;
    ca_status st = cu_enter(a->d, "allocator");
    if (st != CA_OK) return st;

    pthread_mutex_lock(&a->mu);
    if (a->parked) process_parked(a, false);
    cu_block *b = NULL;
    size_t i = lower_bound(p, s, size, NULL);
    if (i < p->n && p->v[i]->stream == s) {
        b = p->v[i];
        pool_remove(p, b);
        a->st.num_cache_hits++;
    } else {
        size_t seg = segment_size(size);
        void *mem = NULL;
        cudaError_t e = cudaMalloc(&mem, seg);
        if (e != cudaSuccess) {
            cudaGetLastError();
            process_parked(a, true);    /* blocks other streams still hold, then */
            release_free_segments(a);   /* give back what is cached and try once more */
            e = cudaMalloc(&mem, seg);
        }
        if (e != cudaSuccess) {
            cudaGetLastError();
            if (e == cudaErrorMemoryAllocation) st = oom(a, bytes, seg);
            else st = cu_error_at(e, __FILE__, __LINE__, "cuda allocator: cudaMalloc of %zu bytes", seg);
            pthread_mutex_unlock(&a->mu);
            return st;
        }
        b = calloc(1, sizeof *b);
        if (!b) {
            cudaFree(mem);
            pthread_mutex_unlock(&a->mu);
            return ca_error(CA_ERR_NOMEM, "cuda allocator: out of host memory for bookkeeping");
        }
        b->ptr = mem;
        b->size = seg;
        b->stream = s;
        b->small = small;
        a->st.reserved += seg;
        if (a->st.reserved > a->st.peak_reserved) a->st.peak_reserved = a->st.reserved;
        a->st.num_device_allocs++;
    }
    /* split: the rest stays free when it can serve another request of this pool */
    size_t rest = b->size - size;
    if (small ? rest >= ROUND : rest > SMALL_SIZE) {
        cu_block *r = calloc(1, sizeof *r);
        if (r) {
            r->ptr = b->ptr + size;
            r->size = rest;
            r->stream = s;
            r->small = b->small;
            r->prev = b;
            r->next = b->next;
            if (b->next) b->next->prev = r;
            b->next = r;
            b->size = size;
            if (!pool_insert(p, r)) {   /* no room to remember it: keep it inside b */
                b->next = r->next;
                if (r->next) r->next->prev = b;
                b->size += rest;
                free(r);
            }
        }
    }
    if (!ca_ptr_map_put(&a->in_use, b->ptr, b)) {
        pool_insert(p, b);
        pthread_mutex_unlock(&a->mu);
        return ca_error(CA_ERR_NOMEM, "cuda allocator: out of host memory for bookkeeping");
    }
    b->in_use = true;
    a->st.allocated += b->size;
    if (a->st.allocated > a->st.peak_allocated) a->st.peak_allocated = a->st.allocated;
    a->st.num_allocs++;
    *ptr = b->ptr;
    pthread_mutex_unlock(&a->mu);
    return CA_OK;
}

static void cu_alloc_free(void *actx, void *ptr) {
    cu_alloc *a = actx;
    if (!ptr || !a) return;
    pthread_mutex_lock(&a->mu);
    cu_block *b = ca_ptr_map_take(&a->in_use, ptr);
    if (!b) {
        pthread_mutex_unlock(&a->mu);
        CA_LOG_E("cuda allocator: free of %p, which it did not allocate or already freed", ptr);
        return;
    }
    a->st.num_frees++;
    if (b->nuses == 0 || !park_block(a, b)) release_block(a, b);
    pthread_mutex_unlock(&a->mu);
}

/* The block in use that holds ptr (a tensor may start inside its allocation). Caller holds mu. */
static cu_block *block_holding(cu_alloc *a, const void *ptr) {
    cu_block *b = ca_ptr_map_get(&a->in_use, ptr);
    if (b) return b;
    for (size_t i = 0; i < a->in_use.nslots; i++) {
        b = a->in_use.slots[i].val;
        if (b && (const char *)ptr >= b->ptr && (const char *)ptr < b->ptr + b->size) return b;
    }
    return NULL;
}

void cu_alloc_record_stream(cu_alloc *a, const void *ptr, cudaStream_t stream) {
    if (!a || !ptr) return;
    pthread_mutex_lock(&a->mu);
    cu_block *b = block_holding(a, ptr);
    bool known = b == NULL || b->stream == stream;
    for (int i = 0; b && !known && i < b->nuses; i++) known = b->uses[i] == stream;
    if (!known && b->nuses == b->cap_uses) {
        int cap = b->cap_uses ? b->cap_uses * 2 : 2;
        cudaStream_t *v = realloc(b->uses, (size_t)cap * sizeof *v);
        if (v) {
            b->uses = v;
            b->cap_uses = cap;
        }
    }
    if (!known && b->nuses < b->cap_uses) b->uses[b->nuses++] = stream;
    else if (!known)   /* no room to remember it: the block is not reused before that stream is done */
        cudaStreamSynchronize(stream);
    pthread_mutex_unlock(&a->mu);
}

static void cu_alloc_stats(void *actx, ca_allocator_stats *out) {
    cu_alloc *a = actx;
    pthread_mutex_lock(&a->mu);
    *out = a->st;
    pthread_mutex_unlock(&a->mu);
}

static void cu_alloc_empty(void *actx) {
    cu_alloc *a = actx;
    if (cu_enter(a->d, "empty_cache") != CA_OK) {
        ca_clear_error();
        return;
    }
    /* blocks freed a moment ago may still be read by queued kernels */
    cudaStreamSynchronize(a->d->stream);
    cudaGetLastError();
    pthread_mutex_lock(&a->mu);
    process_parked(a, true);
    release_free_segments(a);
    pthread_mutex_unlock(&a->mu);
}

static void cu_alloc_reset_peak(void *actx) {
    cu_alloc *a = actx;
    pthread_mutex_lock(&a->mu);
    a->st.peak_allocated = a->st.allocated;
    a->st.peak_reserved = a->st.reserved;
    pthread_mutex_unlock(&a->mu);
}

const ca_allocator_ops cu_allocator_ops = {
    .struct_size = sizeof(ca_allocator_ops),
    .abi_version = CA_ABI_VERSION,
    .name = "cuda-caching",
    .alloc = cu_alloc_alloc,
    .free = cu_alloc_free,
    .stats = cu_alloc_stats,
    .empty_cache = cu_alloc_empty,
    .reset_peak = cu_alloc_reset_peak,
};

ca_status cu_alloc_create(cuda_device *d, cu_alloc **out) {
    cu_alloc *a = calloc(1, sizeof *a);
    if (!a) return ca_error(CA_ERR_NOMEM, "cuda allocator: out of host memory");
    a->d = d;
    pthread_mutex_init(&a->mu, NULL);
    *out = a;
    return CA_OK;
}

/* Frees every segment, also those whose blocks are still in use (tensors
 * that outlive the device). */
void cu_alloc_destroy(cu_alloc *a) {
    if (!a) return;
    cudaSetDevice(a->d->ordinal);
    /* collect the segment heads: free blocks and blocks in use, walked to their first block */
    size_t cap = a->small.n + a->large.n + a->in_use.nused, n = 0;
    for (cu_block *b = a->parked; b; b = b->next_parked) cap++;
    cu_block **heads = calloc(cap ? cap : 1, sizeof *heads);
    pool *pools[2] = {&a->small, &a->large};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < pools[k]->n; i++) {
            cu_block *b = pools[k]->v[i];
            if (!b->prev && heads) heads[n++] = b;
        }
    for (size_t i = 0; i < a->in_use.nslots; i++) {
        cu_block *b = a->in_use.slots[i].val;
        if (b && !b->prev && heads) heads[n++] = b;
    }
    /* parked blocks: the device was synchronised by close; their events go */
    for (cu_block *b = a->parked; b; b = b->next_parked) {
        for (int i = 0; i < b->nevents; i++) cudaEventDestroy(b->events[i]);
        free(b->events);
        if (!b->prev && heads) heads[n++] = b;
    }
    for (int i = 0; i < a->nspare; i++) cudaEventDestroy(a->spare[i]);
    free(a->spare);
    for (size_t i = 0; i < n; i++) {
        cu_block *b = heads[i];
        cudaFree(b->ptr);
        while (b) {
            cu_block *next = b->next;
            free(b->uses);
            free(b);
            b = next;
        }
    }
    cudaGetLastError();
    free(heads);
    free(a->small.v);
    free(a->large.v);
    ca_ptr_map_free(&a->in_use);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

ca_status cu_tmp_alloc(cuda_device *d, size_t bytes, void **ptr) {
    return cu_alloc_alloc(d->alloc, bytes, d->stream, ptr);
}

void cu_tmp_free(cuda_device *d, void *ptr) { cu_alloc_free(d->alloc, ptr); }
