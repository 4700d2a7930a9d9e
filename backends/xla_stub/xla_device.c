/* The lazy device: an address space and memory of its own, the pending graph, the compiler
 * (dead-code elimination, structural cache, buffer placement) and the executor that runs a program
 * on the host backend's kernels. */
#include "backends/xla_stub/xla_impl.h"
#include "base/trace_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define XLA_ALIGN 64
#define XLA_MAX_PROGRAMS 256

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static bool grow(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return false;
    *arr = p;
    *cap = nc;
    return true;
}
#define GROW(arr, cap, need) grow((void **)&(arr), &(cap), (need), sizeof *(arr))

/* ------------------------------------------------------------------ the address space */

/* The device's addresses: a range reserved without access at open, so that a device address is
 * never a host address (kernels can tell host memory handed to them) and a host read or write
 * through one faults, as it would on an accelerator. Blocks take virtual ranges from it; the
 * memory behind them comes later (below). */
#define XLA_VSPACE ((size_t)1 << 37)   /* 128 GiB of addresses, no memory */
#define XLA_VSPACE_MIN ((size_t)1 << 30)   /* ... or less where the process may not reserve so much
                                            * (valgrind's own address space manager: 16 GiB) */

static bool vspace_open(xla_dev *x) {
    void *p = MAP_FAILED;
    size_t size = XLA_VSPACE;
    for (; p == MAP_FAILED && size >= XLA_VSPACE_MIN; size /= 2)
        p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    size *= 2;
    x->vbase = (uintptr_t)p;
    x->vsize = size;
    x->vfree = malloc(sizeof *x->vfree);
    if (!x->vfree) {
        munmap(p, size);
        return false;
    }
    x->vfree[0] = (struct xrange){x->vbase, size};
    x->nvfree = x->capvfree = 1;
    return true;
}

/* First fit over the free ranges (sorted by address); 0 when none is large enough. */
static uintptr_t vrange_take(xla_dev *x, size_t r) {
    for (int i = 0; i < x->nvfree; i++) {
        struct xrange *f = &x->vfree[i];
        if (f->len < r) continue;
        uintptr_t at = f->at;
        f->at += r;
        f->len -= r;
        if (f->len == 0) {
            memmove(f, f + 1, (size_t)(x->nvfree - i - 1) * sizeof *f);
            x->nvfree--;
        }
        return at;
    }
    return 0;
}

/* Returns a range, merged with its neighbours. Without host memory for a new entry the range is
 * lost to later allocations (addresses only: no memory leaks). */
static void vrange_give(xla_dev *x, uintptr_t at, size_t len) {
    int lo = 0, hi = x->nvfree;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (x->vfree[mid].at < at) lo = mid + 1;
        else hi = mid;
    }
    bool left = lo > 0 && x->vfree[lo - 1].at + x->vfree[lo - 1].len == at;
    bool right = lo < x->nvfree && at + len == x->vfree[lo].at;
    if (left && right) {
        x->vfree[lo - 1].len += len + x->vfree[lo].len;
        memmove(x->vfree + lo, x->vfree + lo + 1, (size_t)(x->nvfree - lo - 1) * sizeof *x->vfree);
        x->nvfree--;
    } else if (left) {
        x->vfree[lo - 1].len += len;
    } else if (right) {
        x->vfree[lo].at = at;
        x->vfree[lo].len += len;
    } else if (GROW(x->vfree, x->capvfree, x->nvfree + 1)) {
        memmove(x->vfree + lo + 1, x->vfree + lo, (size_t)(x->nvfree - lo) * sizeof *x->vfree);
        x->vfree[lo] = (struct xrange){at, len};
        x->nvfree++;
    }
}

/* ------------------------------------------------------------------ the memory behind it */

/* Memory of exactly r bytes: a cached piece of that size or a new one (counted as reserved). */
static unsigned char *phys_get(xla_dev *x, size_t r) {
    for (int i = x->ncache - 1; i >= 0; i--)
        if (x->cache[i].bytes == r) {
            void *p = x->cache[i].p;
            x->cache[i] = x->cache[--x->ncache];
            x->st.num_cache_hits++;
            return p;
        }
    void *p = aligned_alloc(XLA_ALIGN, r);
    if (!p) return NULL;
    x->st.num_device_allocs++;
    x->st.reserved += r;
    if (x->st.reserved > x->st.peak_reserved) x->st.peak_reserved = x->st.reserved;
    return p;
}

static void phys_put(xla_dev *x, void *p, size_t r) {
    if (GROW(x->cache, x->capcache, x->ncache + 1)) {
        x->cache[x->ncache++] = (struct xcached){p, r};
        return;
    }
    free(p);
    x->st.reserved -= r;
    x->st.num_device_frees++;
}

/* The graph arena holds at least `bytes` (called between graphs only). */
static bool arena_reserve(xla_dev *x, size_t bytes) {
    if (bytes <= x->arena_cap) return true;
    free(x->arena);
    x->st.reserved -= x->arena_cap;
    x->arena_cap = 0;
    x->arena = aligned_alloc(XLA_ALIGN, bytes);
    if (!x->arena) return false;
    x->arena_cap = bytes;
    x->st.num_device_allocs++;
    x->st.reserved += bytes;
    if (x->st.reserved > x->st.peak_reserved) x->st.peak_reserved = x->st.reserved;
    return true;
}

/* Memory of its own for a block that has none (a transfer, a block outliving the graph). */
static ca_status back_block(xla_dev *x, xalloc *a) {
    if (a->phys) return CA_OK;
    a->phys = phys_get(x, a->bytes);
    return a->phys ? CA_OK : ca_error(CA_ERR_NOMEM, "xla: out of device memory (%zu bytes)", a->bytes);
}

static void unback_block(xla_dev *x, xalloc *a) {
    if (a->phys && !a->placed) phys_put(x, a->phys, a->bytes);
    a->phys = NULL;
    a->placed = false;
}

/* ------------------------------------------------------------------ blocks */

/* Index of the first block whose base is > p. */
static int upper(const xla_dev *x, uintptr_t p) {
    int lo = 0, hi = x->ntab;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (x->tab[mid]->base <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static xalloc *find_block(const xla_dev *x, const void *ptr) {
    uintptr_t p = (uintptr_t)ptr;
    int i = upper(x, p) - 1;
    if (i < 0) return NULL;
    xalloc *a = x->tab[i];
    return p < a->base + a->bytes ? a : NULL;
}

/* An allocation takes addresses only: memory backs them when a graph or a transfer needs it. */
static ca_status alloc_locked(xla_dev *x, size_t bytes, void **ptr) {
    if (bytes > x->vsize) return ca_error(CA_ERR_NOMEM, "xla: cannot allocate %zu bytes", bytes);
    size_t r = (bytes + XLA_ALIGN - 1) / XLA_ALIGN * XLA_ALIGN;
    if (r == 0) r = XLA_ALIGN;
    xalloc *a = calloc(1, sizeof *a);
    if (!a || !GROW(x->tab, x->captab, x->ntab + 1)) {
        free(a);
        return ca_error(CA_ERR_NOMEM, "xla: out of host memory for the device's block table");
    }
    uintptr_t v = vrange_take(x, r);
    if (!v) {
        free(a);
        return ca_error(CA_ERR_NOMEM, "xla: out of device addresses (%zu bytes; %zu GiB reserved)", bytes,
                        x->vsize >> 30);
    }
    a->base = v;
    a->bytes = r;
    a->born_gen = x->gen;
    int i = upper(x, a->base);
    memmove(x->tab + i + 1, x->tab + i, (size_t)(x->ntab - i) * sizeof *x->tab);
    x->tab[i] = a;
    x->ntab++;
    x->st.allocated += r;
    if (x->st.allocated > x->st.peak_allocated) x->st.peak_allocated = x->st.allocated;
    x->st.num_allocs++;
    *ptr = (void *)v;
    return CA_OK;
}

/* Takes the block out of the table; its addresses go back at once. */
static void unmap(xla_dev *x, xalloc *a) {
    int i = upper(x, a->base) - 1;
    if (i >= 0 && x->tab[i] == a) {
        memmove(x->tab + i, x->tab + i + 1, (size_t)(x->ntab - i - 1) * sizeof *x->tab);
        x->ntab--;
    }
    vrange_give(x, a->base, a->bytes);
}

/* A block freed while pending nodes use it keeps its record (the nodes refer to it) and its
 * memory until the graph has run; its addresses serve later allocations at once (the records, not
 * the addresses, say which block a node uses). An intermediate, allocated and freed inside the
 * graph, never gets memory of its own: the program places it in the graph arena by liveness. */
static void free_locked(xla_dev *x, void *ptr) {
    xalloc *a = find_block(x, ptr);
    if (!a || a->base != (uintptr_t)ptr || a->freed) {
        ca_log_printf(CA_LOG_WARNING, "xla: free of %p, which is not a live block of the device", ptr);
        return;
    }
    x->st.allocated -= a->bytes;
    x->st.num_frees++;
    bool pending = x->nnodes > 0 && a->seen_gen == x->gen;
    if (pending && !GROW(x->freed, x->capfreed, x->nfreed + 1)) {
        /* no host memory to keep the record: run the pending nodes now, before the memory goes */
        if (xla_flush_locked(x) != CA_OK) {
            ca_log_printf(CA_LOG_WARNING, "xla: running the pending graph before a free failed: %s", ca_last_error());
            ca_clear_error();
        }
        pending = false;
    }
    unmap(x, a);
    if (pending) {
        a->freed = true;
        x->freed[x->nfreed++] = a;
        return;
    }
    unback_block(x, a);
    free(a);
}

static void release_freed(xla_dev *x) {
    for (int i = 0; i < x->nfreed; i++) {
        unback_block(x, x->freed[i]);
        free(x->freed[i]);
    }
    x->nfreed = 0;
}

static void empty_cache_locked(xla_dev *x) {
    for (int i = 0; i < x->ncache; i++) {
        free(x->cache[i].p);
        x->st.reserved -= x->cache[i].bytes;
        x->st.num_device_frees++;
    }
    x->ncache = 0;
    if (x->arena) x->st.num_device_frees++;
    free(x->arena);
    x->st.reserved -= x->arena_cap;
    x->arena = NULL;
    x->arena_cap = 0;
}

static ca_status a_alloc(void *actx, size_t bytes, void *stream, void **ptr) {
    xla_dev *x = actx;
    if (!ptr) return ca_error(CA_ERR_INVALID, "xla alloc: output pointer is NULL");
    pthread_mutex_lock(&x->mu);
    ca_status s = alloc_locked(x, bytes, ptr);
    pthread_mutex_unlock(&x->mu);
    return s;
}

static void a_free(void *actx, void *ptr) {
    xla_dev *x = actx;
    if (!ptr) return;
    pthread_mutex_lock(&x->mu);
    free_locked(x, ptr);
    pthread_mutex_unlock(&x->mu);
}

static void a_stats(void *actx, ca_allocator_stats *out) {
    xla_dev *x = actx;
    pthread_mutex_lock(&x->mu);
    *out = x->st;
    pthread_mutex_unlock(&x->mu);
}

static void a_empty_cache(void *actx) {
    xla_dev *x = actx;
    pthread_mutex_lock(&x->mu);
    empty_cache_locked(x);
    pthread_mutex_unlock(&x->mu);
}

static void a_reset_peak(void *actx) {
    xla_dev *x = actx;
    pthread_mutex_lock(&x->mu);
    x->st.peak_allocated = x->st.allocated;
    x->st.peak_reserved = x->st.reserved;
    pthread_mutex_unlock(&x->mu);
}

static const ca_allocator_ops xla_allocator = {
    .struct_size = sizeof(ca_allocator_ops),
    .abi_version = CA_ABI_VERSION,
    .name = "xla-arena",
    .alloc = a_alloc,
    .free = a_free,
    .stats = a_stats,
    .empty_cache = a_empty_cache,
    .reset_peak = a_reset_peak,
};

/* ------------------------------------------------------------------ recording */

xnode *xla_node_begin(xla_dev *x, xslot slot) {
    pthread_mutex_lock(&x->mu);
    xnode *n = GROW(x->nodes, x->capnodes, x->nnodes + 1) ? &x->nodes[x->nnodes] : &x->spare;
    memset(n, 0, sizeof *n);
    n->slot = slot;
    n->ref0 = x->nrefs;
    n->key0 = x->nkeys;
    xla_key(x, n, slot);
    return n;
}

static bool is_list(xslot s) { return s >= XS_adamw && s <= XS_clamp_list; }

static void drop_node_data(xnode *n) {
    if (is_list(n->slot)) free(n->a.list.l.mem);
    if (n->slot == XS_HOST && n->a.host.ctx) n->a.host.fn(n->a.host.ctx, false, NULL, NULL);   /* never ran */
    if (n->slot == XS_HOST) n->a.host.ctx = NULL;
}

ca_status xla_ref(xla_dev *x, xnode *n, const void *p, int field, void **slot, uint64_t bytes, int flags, int dt,
                  const char *what) {
    if (!p) return CA_OK;      /* optional argument not given */
    xalloc *a = find_block(x, p);
    if (!a || a->freed)
        return ca_error(CA_ERR_INVALID, "xla %s: argument %s (%p) is not %s memory of the xla device "
                        "(device buffers come from its allocator; host memory needs a copy)",
                        xla_slot_name(n->slot), what, p, a ? "live" : "");
    if (!GROW(x->refs, x->caprefs, x->nrefs + 1))
        return ca_error(CA_ERR_NOMEM, "xla: out of host memory recording a node");
    uint64_t off = (uint64_t)((uintptr_t)p - a->base);
    if ((flags & XR_FULL) && !(off == 0 && bytes >= a->bytes - (XLA_ALIGN - 1) && bytes <= a->bytes &&
                               bytes + XLA_ALIGN > a->bytes))
        flags &= ~XR_FULL;     /* a write that does not cover the block kills nothing */
    x->refs[x->nrefs++] = (xref){.al = a, .off = off, .bytes = bytes, .flags = flags, .dt = dt, .field = field,
                                 .slot = slot};
    a->seen_gen = x->gen;
    n->nref++;
    return CA_OK;
}

void xla_key(xla_dev *x, xnode *n, int64_t v) {
    if (!GROW(x->keys, x->capkeys, x->nkeys + 1)) return;
    x->keys[x->nkeys++] = v;
    n->nkey++;
}

ca_status xla_node_end(xla_dev *x, xnode *n, ca_status s) {
    if (s == CA_OK && n == &x->spare) s = ca_error(CA_ERR_NOMEM, "xla: out of host memory recording a node");
    if (s == CA_OK && n->nkey != x->nkeys - n->key0) s = ca_error(CA_ERR_NOMEM, "xla: out of host memory");
    if (s != CA_OK) {          /* not recorded: the call fails as the eager one would */
        drop_node_data(n);
        x->nrefs = n->ref0;
        x->nkeys = n->key0;
    } else {
        x->nnodes++;
        x->m.nodes_recorded++;
    }
    pthread_mutex_unlock(&x->mu);
    return s;
}

static void clear_graph(xla_dev *x) {
    for (int i = 0; i < x->nnodes; i++) drop_node_data(&x->nodes[i]);
    x->nnodes = x->nrefs = x->nkeys = 0;
    x->gen++;
}

/* ------------------------------------------------------------------ the compiler */

/* FNV-1a over the key's 64-bit words, each folded once more so that its high bits reach the low ones.
 * Why words, not bytes: the hash runs at every synchronisation point, and byte by byte its chain of
 * dependent multiplies cost about 5 us for the MLP step's 5 KB key, 4% of a step at batch 16. The
 * whole key is compared on a hit, so the hash only has to spread keys, not tell them apart. */
static uint64_t key_hash(const int64_t *k, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ (uint64_t)k[i]) * 1099511628211ULL;
        h ^= h >> 29;
    }
    return h;
}

/* The structural key of the pending graph: every node's attributes and its references as
 * (block number in order of first use, offset, bytes, flags), then each block's size and whether
 * it outlives the graph. Values, scalars and addresses are not part of it. Returns the number of
 * blocks, or -1 without memory. */
static int build_key(xla_dev *x, int64_t **out, size_t *len) {
    size_t cap = (size_t)x->nkeys + (size_t)x->nnodes + 6 * (size_t)x->nrefs + 8;
    int64_t *k = malloc(cap * sizeof *k);
    if (!k) return -1;
    size_t n = 0;
    int nblocks = 0;
    uint64_t stamp = x->gen + 1;   /* canon numbers of this graph (seen_gen stays gen) */
    xalloc **order = malloc(((size_t)x->nrefs + 1) * sizeof *order);
    if (!order) {
        free(k);
        return -1;
    }
    k[n++] = x->nnodes;
    for (int i = 0; i < x->nnodes; i++) {
        const xnode *nd = &x->nodes[i];
        memcpy(k + n, x->keys + nd->key0, (size_t)nd->nkey * sizeof *k);
        n += (size_t)nd->nkey;
        k[n++] = nd->nref;
        for (int r = 0; r < nd->nref; r++) {
            xref *ref = &x->refs[nd->ref0 + r];
            int id;
            if (ref->al->seen_gen == stamp) id = ref->al->canon;
            else {
                ref->al->seen_gen = stamp;
                ref->al->canon = id = nblocks;
                order[nblocks++] = ref->al;
            }
            k[n++] = id;
            k[n++] = (int64_t)ref->off;
            k[n++] = (int64_t)ref->bytes;
            k[n++] = ref->flags;
        }
    }
    for (int b = 0; b < nblocks; b++) {
        k[n++] = (int64_t)order[b]->bytes;
        k[n++] = order[b]->freed ? (order[b]->born_gen == x->gen ? 2 : 0) : 1;   /* intermediate: 2 */
        order[b]->seen_gen = x->gen;   /* still referenced by this graph */
    }
    free(order);
    *out = k;
    *len = n;
    return nblocks;
}

/* Dead-code elimination by a backward liveness pass over blocks: a node runs when it writes a
 * block that is live after it; a block is live at the end when the program has not freed it
 * (parameters, optimizer state, gradients, anything the host may read), a full overwrite kills
 * it for the nodes before, and a running node's inputs become live. */
static int eliminate(const xla_dev *x, uint8_t *run, int nblocks) {
    uint8_t *live = calloc((size_t)nblocks + 1, 1);
    if (!live) return -1;
    for (int i = 0; i < x->nnodes; i++)
        for (int r = 0; r < x->nodes[i].nref; r++) {
            const xref *ref = &x->refs[x->nodes[i].ref0 + r];
            live[ref->al->canon] = !ref->al->freed;
        }
    int nrun = 0;
    for (int i = x->nnodes - 1; i >= 0; i--) {
        const xnode *nd = &x->nodes[i];
        bool needed = true, writes = false;   /* a node that writes nothing is kept: it only checks */
        if (nd->slot == XS_HOST) {   /* a host function (a collective) has effects outside the graph */
            run[i] = 1;
            nrun++;
            for (int r = 0; r < nd->nref; r++) live[x->refs[nd->ref0 + r].al->canon] = 1;
            continue;
        }
        for (int r = 0; r < nd->nref; r++) writes |= (x->refs[nd->ref0 + r].flags & XR_WRITE) != 0;
        if (writes) needed = false;
        for (int r = 0; r < nd->nref && !needed; r++) {
            const xref *ref = &x->refs[nd->ref0 + r];
            if ((ref->flags & XR_WRITE) && live[ref->al->canon]) needed = true;
        }
        run[i] = needed;
        if (!needed) continue;
        nrun++;
        for (int r = 0; r < nd->nref; r++) {
            const xref *ref = &x->refs[nd->ref0 + r];
            if ((ref->flags & XR_FULL) && !(ref->flags & XR_READ)) live[ref->al->canon] = 0;
        }
        for (int r = 0; r < nd->nref; r++) {
            const xref *ref = &x->refs[nd->ref0 + r];
            if (ref->flags & XR_READ) live[ref->al->canon] = 1;
        }
    }
    free(live);
    return nrun;
}

static xprogram *cache_find(xla_dev *x, uint64_t h, const int64_t *key, size_t len) {
    for (int i = 0; i < x->nprogs; i++) {
        xprogram *p = &x->progs[i];
        if (p->hash == h && p->klen == len && memcmp(p->key, key, len * sizeof *key) == 0) return p;
    }
    return NULL;
}

/* CACCEL_XLA_DUMP: each compiled graph on stderr, a node a line (slot, attributes, references as
 * block:offset+bytes with r/w/f flags, and '-' for eliminated nodes). */
static void dump_graph(const xla_dev *x, const xprogram *p) {
    fprintf(stderr, "xla graph: %d nodes, %d run as %d kernels (%d fused loops); intermediates %llu bytes, "
            "planned peak %llu, arena %llu\n", x->nnodes, p->nrun, p->nlaunch, p->nfused,
            (unsigned long long)p->intermediate_bytes, (unsigned long long)p->planned_peak,
            (unsigned long long)p->arena_bytes);
    for (int i = 0; i < x->nnodes; i++) {
        const xnode *nd = &x->nodes[i];
        fprintf(stderr, "%c%3d %-22s", p->run[i] ? (p->chain && p->chain[i] > 1 ? '>' : ' ') : '-', i,
                xla_slot_name(nd->slot));
        for (int k = 1; k < nd->nkey; k++) fprintf(stderr, " %lld", (long long)x->keys[nd->key0 + k]);
        fprintf(stderr, " |");
        for (int r = 0; r < nd->nref; r++) {
            const xref *ref = &x->refs[nd->ref0 + r];
            fprintf(stderr, " b%d:%llu+%llu%s%s%s%s", ref->al->canon, (unsigned long long)ref->off,
                    (unsigned long long)ref->bytes, ref->flags & XR_READ ? "r" : "", ref->flags & XR_WRITE ? "w" : "",
                    ref->flags & XR_FULL ? "f" : "", ref->al->freed ? "T" : "");
        }
        fputc('\n', stderr);
    }
}

static void program_free(xprogram *p) {
    free(p->key);
    free(p->run);
    free(p->chain);
    free(p->place);
}

/* Placement: offsets in the graph arena for the intermediates, greedily in decreasing size (where
 * TFLite's arena planner and XLA's heap simulator start): each takes the lowest offset at which it
 * overlaps no block already placed whose groups overlap its own. Two blocks touched by one group
 * never share memory, so a kernel's inputs and outputs stay apart. Returns the arena's size, or
 * UINT64_MAX without host memory. */
typedef struct pblock { uint64_t bytes; int b; } pblock;
typedef struct pspan { uint64_t at, end; } pspan;

static int by_size(const void *l, const void *r) {
    const pblock *a = l, *b = r;
    if (a->bytes != b->bytes) return a->bytes > b->bytes ? -1 : 1;
    return a->b - b->b;
}

static int by_offset(const void *l, const void *r) {
    const pspan *a = l, *b = r;
    return a->at < b->at ? -1 : a->at > b->at;
}

static uint64_t place_blocks(int nblocks, const int *first, const int *last, const uint64_t *bytes, int64_t *place) {
    pblock *order = malloc(((size_t)nblocks + 1) * sizeof *order);
    pspan *busy = malloc(((size_t)nblocks + 1) * sizeof *busy);
    if (!order || !busy) {
        free(order);
        free(busy);
        return UINT64_MAX;
    }
    int n = 0;
    for (int b = 0; b < nblocks; b++)
        if (place[b] == 0) order[n++] = (pblock){bytes[b], b};
    qsort(order, (size_t)n, sizeof *order, by_size);
    uint64_t size = 0;
    for (int i = 0; i < n; i++) {
        int b = order[i].b, nb = 0;
        for (int j = 0; j < i; j++) {
            int c = order[j].b;
            if (first[c] <= last[b] && first[b] <= last[c])
                busy[nb++] = (pspan){(uint64_t)place[c], (uint64_t)place[c] + bytes[c]};
        }
        qsort(busy, (size_t)nb, sizeof *busy, by_offset);
        uint64_t at = 0;
        for (int j = 0; j < nb && busy[j].at < at + bytes[b]; j++)
            if (busy[j].end > at) at = busy[j].end;
        place[b] = (int64_t)at;
        if (at + bytes[b] > size) size = at + bytes[b];
    }
    free(order);
    free(busy);
    return size;
}

/* Intermediates: blocks allocated and freed by the program inside this graph. Their live range runs
 * from the first group that touches one to the last; the planned peak is the largest sum of those
 * live at once, leaving out those that a fused loop never writes (they get no memory). The
 * program keeps each block's placement: an offset in the graph arena, memory of its own (blocks
 * that outlive the graph), or none (fused away). */
static bool plan_buffers(const xla_dev *x, xprogram *p, int nblocks) {
    int *first = malloc(2 * ((size_t)nblocks + 1) * sizeof *first);
    uint64_t *bytes = calloc((size_t)nblocks + 1, sizeof *bytes);
    uint64_t *delta = calloc(2 * ((size_t)x->nnodes + 1), sizeof *delta);
    p->place = malloc(((size_t)nblocks + 1) * sizeof *p->place);
    p->nblocks = nblocks;
    bool ok = first && bytes && delta && p->place;
    int *last = ok ? first + nblocks + 1 : NULL;
    for (int b = 0; ok && b < nblocks; b++) {
        first[b] = last[b] = -1;
        p->place[b] = XP_OWN;
    }
    int group = -1, remaining = 0;
    for (int i = 0; ok && i < x->nnodes; i++) {
        if (!p->run[i]) continue;
        if (remaining == 0) {
            group = i;
            remaining = p->chain[i];
        }
        remaining--;
        const xnode *nd = &x->nodes[i];
        for (int r = 0; r < nd->nref; r++) {
            const xalloc *a = x->refs[nd->ref0 + r].al;
            if (!a->freed || a->born_gen != x->gen) continue;
            if (first[a->canon] < 0) first[a->canon] = group;
            last[a->canon] = group;
            bytes[a->canon] = a->bytes;
        }
    }
    uint64_t sum = 0, live = 0, peak = 0;
    for (int b = 0; ok && b < nblocks; b++) {
        if (first[b] < 0) continue;
        if (first[b] == last[b] && p->chain[first[b]] > 1) {   /* fused away */
            p->place[b] = XP_NONE;
            continue;
        }
        p->place[b] = 0;   /* to be placed */
        delta[2 * first[b]] += bytes[b];
        delta[2 * last[b] + 1] += bytes[b];
        sum += bytes[b];
    }
    for (int i = 0; ok && i < x->nnodes; i++) {
        live += delta[2 * i];
        if (live > peak) peak = live;
        live -= delta[2 * i + 1];
    }
    p->planned_peak = peak;
    p->intermediate_bytes = sum;
    p->arena_bytes = ok ? place_blocks(nblocks, first, last, bytes, p->place) : UINT64_MAX;
    free(first);
    free(bytes);
    free(delta);
    return ok && p->arena_bytes != UINT64_MAX;
}

/* CACCEL_XLA_FUSION=0 turns fusion off (every node its own kernel), for comparisons. */
static bool fusion_enabled(void) {
    const char *v = getenv("CACCEL_XLA_FUSION");
    return !v || strcmp(v, "0") != 0;
}

static int no_fusion(const xla_dev *x, const uint8_t *run, uint8_t *chain) {
    for (int i = 0; i < x->nnodes; i++) chain[i] = run[i] ? 1 : 0;
    return 0;
}

/* Compiles the pending graph into a cached program (the cache takes key). */
static xprogram *compile(xla_dev *x, uint64_t h, int64_t *key, size_t len, int nblocks) {
    uint8_t *run = malloc((size_t)x->nnodes + 1);
    int nrun = run ? eliminate(x, run, nblocks) : -1;
    if (nrun < 0 || (x->nprogs == x->capprogs && x->nprogs < XLA_MAX_PROGRAMS &&
                     !GROW(x->progs, x->capprogs, x->nprogs + 1))) {
        free(run);
        free(key);
        ca_error(CA_ERR_NOMEM, "xla: out of host memory compiling a graph of %d nodes", x->nnodes);
        return NULL;
    }
    if (x->nprogs == XLA_MAX_PROGRAMS) {   /* full: the oldest program goes */
        program_free(&x->progs[0]);
        memmove(x->progs, x->progs + 1, (size_t)(x->nprogs - 1) * sizeof *x->progs);
        x->nprogs--;
    }
    xprogram *p = &x->progs[x->nprogs++];
    *p = (xprogram){.hash = h, .key = key, .klen = len, .nnodes = x->nnodes, .nrun = nrun, .run = run};
    p->chain = malloc((size_t)x->nnodes + 1);
    if (p->chain) {
        p->nfused = fusion_enabled() ? xla_fuse_plan(x, run, p->chain) : no_fusion(x, run, p->chain);
        for (int i = 0; i < x->nnodes; i++) p->nlaunch += p->chain[i] > 0;
    }
    if (!p->chain || !plan_buffers(x, p, nblocks)) {
        x->nprogs--;
        program_free(p);
        ca_error(CA_ERR_NOMEM, "xla: out of host memory compiling a graph of %d nodes", x->nnodes);
        return NULL;
    }
    x->m.compiles++;
    if (getenv("CACCEL_XLA_DUMP")) dump_graph(x, p);
    return p;
}

/* ---- bf16 storage: every f32 value on the device is a bf16 value, as on a TPU under torch_xla's
 * XLA_USE_BF16 (Accelerate's mixed_precision bf16 there; downcast_bf16 differs only for f64, which
 * caccel has not). Values stay in 4-byte slots: the numbers are the TPU's, the memory is not halved.
 * A node's f32 outputs are rounded (to nearest even) after it ran; f32 inputs written without an
 * element type (a host transfer, a copy, a collective) are rounded before a node reads them. A fused
 * loop keeps its intermediates in f32 registers, as a TPU's fusions do, and rounds what it stores. */

/* Rounds to bf16 (nearest even; NaN stays a quiet NaN) in place: integer steps without branches, in
 * blocks of 16 that the compiler vectorises at -O2. */
static inline uint32_t bf16_bits(uint32_t u) {
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) & 0xffff0000u : r;
}

/* Floats [lo, hi) of the run at ctx. */
static void round_bf16_range(void *ctx, int64_t lo, int64_t hi) {
    unsigned char *p = (unsigned char *)ctx + lo * 4;   /* f32 values, read as bits through memcpy */
    int64_t n = hi - lo, i = 0;
    for (; i + 16 <= n; i += 16) {
        uint32_t u[16];
        memcpy(u, p + i * 4, sizeof u);
        for (int j = 0; j < 16; j++) u[j] = bf16_bits(u[j]);
        memcpy(p + i * 4, u, sizeof u);
    }
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + i * 4, 4);
        u = bf16_bits(u);
        memcpy(p + i * 4, &u, 4);
    }
}

static void round_bf16(const xla_dev *x, xalloc *a, uint64_t off, uint64_t bytes) {
    if (!a->phys) return;      /* fused away: never stored */
    if (bytes == 0 || off + bytes > a->bytes) bytes = off < a->bytes ? a->bytes - off : 0;
    x->parallel_for((int64_t)(bytes / sizeof(float)), 1, round_bf16_range, a->phys + off);
}

static void round_inputs(xla_dev *x, const xnode *n) {
    for (int r = n->ref0; r < n->ref0 + n->nref; r++) {
        xref *f = &x->refs[r];
        if ((f->flags & XR_READ) && f->dt == CA_F32 && f->al->raw) {
            round_bf16(x, f->al, 0, f->al->bytes);
            f->al->raw = false;
        }
    }
}

static void round_outputs(xla_dev *x, const xnode *n) {
    for (int r = n->ref0; r < n->ref0 + n->nref; r++) {
        xref *f = &x->refs[r];
        if (!(f->flags & XR_WRITE)) continue;
        if (f->dt == CA_F32) round_bf16(x, f->al, f->off, f->bytes);
        else if (f->dt < 0) f->al->raw = true;
    }
}

/* Writes the address of each referenced block's memory into the node's arguments, where it had
 * the block's device address; references to blocks without memory (fused away) keep theirs. */
static void patch_node(xla_dev *x, xnode *n) {
    for (int r = n->ref0; r < n->ref0 + n->nref; r++) {
        const xref *f = &x->refs[r];
        if (!f->al->phys) continue;
        void *mem = f->al->phys + f->off;
        void *where = f->field >= 0 ? (void *)((char *)&n->a + f->field) : (void *)f->slot;
        memcpy(where, &mem, sizeof mem);
    }
}

/* Gives every block the program runs on its memory: an intermediate its planned offset in the
 * graph arena, a block outliving the graph memory of its own (kept from earlier graphs or taken
 * now), a fused-away one none; then patches the running nodes. */
static ca_status bind(xla_dev *x, const xprogram *p) {
    if (!arena_reserve(x, p->arena_bytes))
        return ca_error(CA_ERR_NOMEM, "xla: out of device memory for a graph arena of %llu bytes",
                        (unsigned long long)p->arena_bytes);
    for (int i = 0; i < x->nnodes; i++) {
        if (!p->run[i]) continue;
        xnode *n = &x->nodes[i];
        for (int r = n->ref0; r < n->ref0 + n->nref; r++) {
            xalloc *a = x->refs[r].al;
            int64_t at = a->canon < p->nblocks ? p->place[a->canon] : XP_OWN;
            if (a->phys || at == XP_NONE) continue;
            if (at >= 0) {
                a->phys = x->arena + at;
                a->placed = true;
            } else if (back_block(x, a) != CA_OK) {
                return ca_error_context("xla: giving memory to the blocks of a graph of %d nodes", x->nnodes);
            }
        }
        patch_node(x, n);
    }
    return CA_OK;
}

/* A fused chain that runs node by node after all: its fused-away intermediates get memory. */
static ca_status unfuse(xla_dev *x, const int *idx, int len) {
    for (int k = 0; k < len; k++) {
        xnode *n = &x->nodes[idx[k]];
        for (int r = n->ref0; r < n->ref0 + n->nref; r++) {
            ca_status s = back_block(x, x->refs[r].al);
            if (s != CA_OK) return s;
        }
        patch_node(x, n);
    }
    return CA_OK;
}

static ca_status exec_one(xla_dev *x, int i) {
    bool host = x->nodes[i].slot == XS_HOST;
    if (x->bf16_storage) round_inputs(x, &x->nodes[i]);
    ca_status s = xla_exec_node(x, &x->nodes[i]);
    if (x->bf16_storage && s == CA_OK) round_outputs(x, &x->nodes[i]);
    if (host) {   /* the host function freed its context: the node is not dropped with it */
        x->nodes[i].a.host.ctx = NULL;
        x->m.collectives_in_graph++;
    }
    if (s != CA_OK)
        return ca_error_context("xla: running node %d (%s) of a graph of %d nodes", i,
                                xla_slot_name(x->nodes[i].slot), x->nnodes);
    return CA_OK;
}

/* Runs the program's groups in order: a chain of two or more as one fused loop (or node by node
 * when its buffers overlap in a way the loop cannot honour), the others as single kernels. */
/* The profiler's slice of a graph's compile or run: the nodes recorded and the nodes that run. */
static void trace_graph(const char *what, int64_t t0, int nodes, int nrun) {
    char a[80];
    snprintf(a, sizeof a, "\"nodes\":%d,\"nodes_run\":%d", nodes, nrun);
    ca_trace_slice("xla", what, t0, a);
}

static ca_status execute(xla_dev *x, const xprogram *p) {
    int idx[XLA_MAX_CHAIN];
    ca_status s = bind(x, p);
    if (s != CA_OK) return s;
    for (int i = 0; i < x->nnodes; i++) {
        int len = p->chain[i];
        if (len == 0) continue;
        if (len == 1) {
            s = exec_one(x, i);
            if (s != CA_OK) return s;
            x->m.kernels_launched++;
            continue;
        }
        int c = 0;
        for (int j = i; c < len; j++)
            if (p->run[j]) idx[c++] = j;
        if (x->bf16_storage)
            for (int k = 0; k < len; k++) round_inputs(x, &x->nodes[idx[k]]);
        if (xla_run_fused(x, idx, len)) {
            /* a fused loop writes only its last node's output: the intermediates never reach memory */
            if (x->bf16_storage) round_outputs(x, &x->nodes[idx[len - 1]]);
            x->m.fused_kernels++;
            x->m.fused_nodes += (uint64_t)len;
            x->m.kernels_launched++;
        } else {
            s = unfuse(x, idx, len);
            for (int k = 0; k < len && s == CA_OK; k++) {
                s = exec_one(x, idx[k]);
                x->m.kernels_launched++;
            }
            if (s != CA_OK) return s;
        }
        i = idx[len - 1];
    }
    return CA_OK;
}

ca_status xla_flush_locked(xla_dev *x) {
    if (x->nnodes == 0) {
        release_freed(x);
        return CA_OK;
    }
    double t0 = now_ms();
    int64_t *key = NULL;
    size_t len = 0;
    int nblocks = build_key(x, &key, &len);
    ca_status s = CA_OK;
    xprogram *p = NULL;
    if (nblocks < 0) {
        s = ca_error(CA_ERR_NOMEM, "xla: out of host memory compiling a graph of %d nodes", x->nnodes);
    } else {
        uint64_t h = key_hash(key, len);
        p = cache_find(x, h, key, len);
        if (p) {
            free(key);
            p->hits++;
            x->m.cache_hits++;
        } else {
            int64_t tc = ca_trace_on() ? ca_trace_now_ns() : 0;
            p = compile(x, h, key, len, nblocks);
            if (!p) s = ca_last_status();
            x->m.compile_ms += now_ms() - t0;
            if (tc) trace_graph("xla_compile", tc, x->nnodes, p ? p->nrun : 0);
        }
    }
    if (s == CA_OK) {
        double t1 = now_ms();
        int64_t te = ca_trace_on() ? ca_trace_now_ns() : 0;
        s = execute(x, p);
        x->m.execute_ms += now_ms() - t1;
        if (te) trace_graph("xla_execute", te, x->nnodes, p->nrun);
        x->m.graphs++;
        x->m.nodes_executed += (uint64_t)p->nrun;
        x->m.nodes_eliminated += (uint64_t)(x->nnodes - p->nrun);
        x->m.last_graph_nodes = (uint64_t)x->nnodes;
        x->m.planned_peak_bytes = p->planned_peak;
        x->m.intermediate_bytes = p->intermediate_bytes;
        x->m.arena_bytes = p->arena_bytes;
        if (x->m.last_graph_nodes > x->m.max_graph_nodes) x->m.max_graph_nodes = x->m.last_graph_nodes;
    }
    clear_graph(x);
    release_freed(x);
    return s;
}

/* ------------------------------------------------------------------ the device */

static const ca_device_ops *exec_ops;   /* set by ca_xla_plugin */
static ca_xla_parallel_for_fn exec_parallel_for;

/* Without the executor's splitter: the whole range on the calling thread. */
static void serial_for(int64_t n, int64_t cost, ca_xla_range_fn fn, void *ctx) {
    (void)cost;
    if (n > 0) fn(ctx, 0, n);
}

static ca_status x_device_count(int *count, char *reason, size_t reason_len) {
    if (!count) return ca_error(CA_ERR_INVALID, "xla device_count: count is NULL");
    *count = exec_ops ? 1 : 0;
    if (reason && reason_len) snprintf(reason, reason_len, "%s", exec_ops ? "" : "no executor backend");
    return CA_OK;
}

static xla_dev *metrics_dev;   /* the device whose metrics are printed at exit */
static pthread_mutex_t metrics_mu = PTHREAD_MUTEX_INITIALIZER;

static void x_format_metrics(const ca_xla_metrics *m, char *buf, size_t len);

static void print_metrics(xla_dev *x) {
    char buf[2048];
    ca_xla_metrics m = x->m;
    m.cached_programs = (uint64_t)x->nprogs;
    x_format_metrics(&m, buf, sizeof buf);
    fprintf(stderr, "caccel xla metrics:\n%s", buf);
}

static void print_at_exit(void) {
    pthread_mutex_lock(&metrics_mu);
    if (metrics_dev) print_metrics(metrics_dev);
    metrics_dev = NULL;
    pthread_mutex_unlock(&metrics_mu);
}

static bool metrics_wanted(void) {
    const char *v = getenv("CACCEL_XLA_METRICS");
    return v && *v && strcmp(v, "0") != 0;
}

static bool env_one(const char *name) {
    const char *v = getenv(name);
    return v && !strcmp(v, "1");
}

static ca_status x_open(int index, const ca_device_open_args *args, void **dev) {
    if (!dev) return ca_error(CA_ERR_INVALID, "xla open: output pointer is NULL");
    *dev = NULL;
    if (index != 0) return ca_error(CA_ERR_NOT_FOUND, "xla open: no device %d (the xla backend has one device, 0)", index);
    if (!exec_ops || !exec_ops->kernels) return ca_error(CA_ERR_UNSUPPORTED, "xla open: no executor backend");
    xla_dev *x = calloc(1, sizeof *x);
    if (!x) return ca_error(CA_ERR_NOMEM, "xla open: out of host memory");
    pthread_mutex_init(&x->mu, NULL);
    x->exec = exec_ops;
    x->k = exec_ops->kernels;
    x->parallel_for = exec_parallel_for ? exec_parallel_for : serial_for;
    x->gen = 1;
    x->bf16_storage = env_one("XLA_USE_BF16") || env_one("XLA_DOWNCAST_BF16");   /* torch_xla's names */
    if (!vspace_open(x)) {
        free(x);
        return ca_error(CA_ERR_NOMEM, "xla open: cannot reserve %zu GiB of device addresses", XLA_VSPACE_MIN >> 30);
    }
    ca_status s = exec_ops->open(0, args, &x->exec_ctx);
    if (s != CA_OK) {
        munmap((void *)x->vbase, x->vsize);
        free(x->vfree);
        free(x);
        return ca_error_context("xla open: opening the %s executor", exec_ops->name);
    }
    if (metrics_wanted()) {
        static bool registered;
        pthread_mutex_lock(&metrics_mu);
        if (!registered) registered = atexit(print_at_exit) == 0;
        metrics_dev = x;
        pthread_mutex_unlock(&metrics_mu);
    }
    *dev = x;
    return CA_OK;
}

static void x_close(void *dev) {
    xla_dev *x = dev;
    if (!x) return;
    pthread_mutex_lock(&metrics_mu);
    if (metrics_dev == x) {
        print_metrics(x);
        metrics_dev = NULL;
    }
    pthread_mutex_unlock(&metrics_mu);
    pthread_mutex_lock(&x->mu);
    if (xla_flush_locked(x) != CA_OK) ca_clear_error();
    for (int i = 0; i < x->ntab; i++) {
        unback_block(x, x->tab[i]);
        free(x->tab[i]);
    }
    empty_cache_locked(x);
    munmap((void *)x->vbase, x->vsize);
    for (int i = 0; i < x->nprogs; i++) program_free(&x->progs[i]);
    pthread_mutex_unlock(&x->mu);
    x->exec->close(x->exec_ctx);
    free(x->tab); free(x->freed); free(x->cache); free(x->vfree);
    free(x->nodes); free(x->refs); free(x->keys); free(x->progs);
    pthread_mutex_destroy(&x->mu);
    free(x);
}

static ca_status x_describe(void *dev, char *buf, size_t len) {
    xla_dev *x = dev;
    if (!buf || !len) return ca_error(CA_ERR_INVALID, "xla describe: buffer is NULL or empty");
    char inner[384] = "";
    if (x->exec->describe) x->exec->describe(x->exec_ctx, inner, sizeof inner);
    snprintf(buf, len, "xla_stub lazy device (graphs compiled and cached, run on the %s backend: %s)%s",
             x->exec->name, inner, x->bf16_storage ? "; bf16 storage" : "");
    return CA_OK;
}

static ca_status x_mem_alloc(void *dev, size_t bytes, void **ptr) { return a_alloc(dev, bytes, NULL, ptr); }
static void x_mem_free(void *dev, void *ptr) { a_free(dev, ptr); }

/* H2D runs at once (after the pending graph when that uses the block); D2H runs the pending
 * graph first; D2D is a node. A block a transfer reaches gets memory of its own. Every byte
 * crossing to or from the host is counted. */
static ca_status memcpy_locked(xla_dev *x, void *dst, const void *src, size_t bytes, ca_copy_kind kind) {
    static const char *const kinds[] = {"host to device", "device to host", "device to device"};
    const void *dp = kind == CA_COPY_D2H ? src : dst;
    xalloc *a = find_block(x, dp);
    if (!a || a->freed || (uintptr_t)dp + bytes > a->base + a->bytes)
        return ca_error(CA_ERR_INVALID, "xla memcpy (%s, %zu bytes): %p is not memory of the xla device",
                        kinds[kind], bytes, dp);
    if (kind == CA_COPY_D2D)
        return ca_error(CA_ERR_INVALID, "xla memcpy: %s copies are recorded, not run here", kinds[kind]);
    ca_status s = CA_OK;
    if (kind == CA_COPY_D2H || (x->nnodes > 0 && a->seen_gen == x->gen)) s = xla_flush_locked(x);
    if (s == CA_OK) s = back_block(x, a);
    if (s != CA_OK) return s;
    unsigned char *mem = a->phys + ((uintptr_t)dp - a->base);
    if (kind == CA_COPY_H2D) {
        xla_copy(x, mem, src, bytes);
        a->raw = x->bf16_storage;
        x->m.h2d_transfers++;
        x->m.h2d_bytes += bytes;
    } else {
        xla_copy(x, dst, mem, bytes);
        x->m.d2h_transfers++;
        x->m.d2h_bytes += bytes;
    }
    return CA_OK;
}

/* A device-to-device copy is a node like a kernel. */
static ca_status record_copy(xla_dev *x, void *dst, const void *src, size_t bytes) {
    xnode *n = xla_node_begin(x, XS_MEMCPY);
    n->a.memcpy.dst = dst; n->a.memcpy.src = src; n->a.memcpy.bytes = bytes;
    xla_key(x, n, (int64_t)bytes);
    ca_status s = xla_ref(x, n, src, XLA_FIELD(n, memcpy.src), NULL, bytes, XR_READ, -1, "src");
    if (s == CA_OK)
        s = xla_ref(x, n, dst, XLA_FIELD(n, memcpy.dst), NULL, bytes, XR_WRITE | (src == dst ? 0 : XR_FULL), -1, "dst");
    return xla_node_end(x, n, s);
}

/* A host function in graph order (the core's collectives): a node that always runs, never fused. Its
 * attributes (a collective's kind, counts, peers) are part of the graph's key: a program holds the
 * collectives it runs, so an exchange with another peer compiles another one. */
static ca_status x_enqueue_host_fn_keyed(void *dev, ca_status (*fn)(void *ctx, bool run, const void *in, void *out),
                                         void *ctx, const void *in, size_t in_bytes, void *out, size_t out_bytes,
                                         const int64_t *attr, int nattr) {
    xla_dev *x = dev;
    xnode *n = xla_node_begin(x, XS_HOST);
    n->a.host.fn = fn;
    n->a.host.ctx = ctx;
    n->a.host.in = in;
    n->a.host.out = out;
    xla_key(x, n, (int64_t)in_bytes);
    xla_key(x, n, (int64_t)out_bytes);
    xla_key(x, n, attr ? nattr : 0);
    for (int i = 0; attr && i < nattr; i++) xla_key(x, n, attr[i]);
    ca_status s = in ? xla_ref(x, n, in, XLA_FIELD(n, host.in), NULL, in_bytes, XR_READ, -1, "in") : CA_OK;
    if (s == CA_OK && out)
        s = xla_ref(x, n, out, XLA_FIELD(n, host.out), NULL, out_bytes, XR_READ | XR_WRITE, -1, "out");
    return xla_node_end(x, n, s);   /* on failure the node's data is dropped: fn(ctx, false) */
}

static ca_status x_enqueue_host_fn(void *dev, ca_status (*fn)(void *ctx, bool run, const void *in, void *out),
                                   void *ctx, const void *in, size_t in_bytes, void *out, size_t out_bytes) {
    return x_enqueue_host_fn_keyed(dev, fn, ctx, in, in_bytes, out, out_bytes, NULL, 0);
}

static ca_status x_memcpy(void *dev, void *dst, const void *src, size_t bytes, ca_copy_kind kind, bool async) {
    xla_dev *x = dev;
    if (bytes == 0) return CA_OK;
    if (!dst || !src)
        return ca_error(CA_ERR_INVALID, "xla memcpy: %s pointer is NULL (%zu bytes)", dst ? "source" : "destination",
                        bytes);
    if ((unsigned)kind > CA_COPY_D2D) return ca_error(CA_ERR_INVALID, "xla memcpy: unknown copy kind %d", (int)kind);
    if (kind == CA_COPY_D2D) return record_copy(x, dst, src, bytes);
    pthread_mutex_lock(&x->mu);
    ca_status s = memcpy_locked(x, dst, src, bytes, kind);
    pthread_mutex_unlock(&x->mu);
    return s;
}

/* One stream: kernels are recorded in program order, so streams and events are handles only. */
static ca_status x_handle(void *dev, void **h) {
    if (!h) return ca_error(CA_ERR_INVALID, "xla: output pointer is NULL");
    *h = malloc(1);
    return *h ? CA_OK : ca_error(CA_ERR_NOMEM, "xla: out of host memory");
}
static void x_handle_free(void *dev, void *h) { free(h); }
static ca_status x_set_stream(void *dev, void *stream) { return CA_OK; }
static ca_status x_event_record(void *dev, void *event, void *stream) { return CA_OK; }
static ca_status x_stream_wait_event(void *dev, void *stream, void *event) { return CA_OK; }

static ca_status x_synchronize(void *dev) {
    xla_dev *x = dev;
    pthread_mutex_lock(&x->mu);
    ca_status s = xla_flush_locked(x);
    pthread_mutex_unlock(&x->mu);
    return s;
}
ca_status xla_mark_step(xla_dev *x) {
    pthread_mutex_lock(&x->mu);
    x->m.mark_steps++;
    ca_status s = xla_flush_locked(x);
    pthread_mutex_unlock(&x->mu);
    return s;
}

static ca_status x_event_synchronize(void *dev, void *event) { return x_synchronize(dev); }

static void *x_allocator_ctx(void *dev) { return dev; }

/* ------------------------------------------------------------------ metrics and plugin */

static void x_metrics(void *dev, ca_xla_metrics *out) {
    xla_dev *x = dev;
    pthread_mutex_lock(&x->mu);
    *out = x->m;
    out->cached_programs = (uint64_t)x->nprogs;
    pthread_mutex_unlock(&x->mu);
}

static ca_status x_mark_step(void *dev) { return xla_mark_step(dev); }

/* Deterministic mode is the executor's: its kernels and GEMMs run the graphs (the cpu backend's GEMMs in
 * blocks fixed by the shape, its BLAS on one thread), so the lazy device gives the same bits at every
 * thread count as the cpu device does. */
static void x_set_deterministic(void *dev, bool on) {
    const xla_dev *x = dev;
    if (x->exec->set_deterministic) x->exec->set_deterministic(x->exec_ctx, on);
}

/* CA_BF16: every f32 value rounds to bf16 (ca_xla_set_bf16_storage); CA_F32: native. */
static ca_status x_set_storage_dtype(void *dev, ca_dtype dt) {
    xla_dev *x = dev;
    if (dt != CA_F32 && dt != CA_BF16)
        return ca_error(CA_ERR_INVALID, "xla device: storage dtype %s is not f32 or bf16", ca_dtype_name(dt));
    bool on = dt == CA_BF16;
    pthread_mutex_lock(&x->mu);
    ca_status s = xla_flush_locked(x);   /* the pending graph runs in the mode it was recorded in */
    if (s == CA_OK && on && !x->bf16_storage)
        for (int i = 0; i < x->ntab; i++) x->tab[i]->raw = true;   /* what is there rounds when read */
    if (s == CA_OK) x->bf16_storage = on;
    pthread_mutex_unlock(&x->mu);
    return s;
}

static ca_dtype x_storage_dtype(void *dev) {
    xla_dev *x = dev;
    pthread_mutex_lock(&x->mu);
    bool on = x->bf16_storage;
    pthread_mutex_unlock(&x->mu);
    return on ? CA_BF16 : CA_F32;
}

static void x_metrics_reset(void *dev) {
    xla_dev *x = dev;
    pthread_mutex_lock(&x->mu);
    memset(&x->m, 0, sizeof x->m);
    pthread_mutex_unlock(&x->mu);
}

static void x_format_metrics(const ca_xla_metrics *m, char *buf, size_t len) {
    snprintf(buf, len,
             "  graphs: %llu\n  compiles: %llu\n  cache_hits: %llu\n  cached_programs: %llu\n"
             "  nodes_recorded: %llu\n  nodes_executed: %llu\n  nodes_eliminated: %llu\n"
             "  last_graph_nodes: %llu\n  max_graph_nodes: %llu\n"
             "  h2d_transfers: %llu\n  h2d_bytes: %llu\n  d2h_transfers: %llu\n  d2h_bytes: %llu\n"
             "  mark_steps: %llu\n  compile_ms: %.3f\n  execute_ms: %.3f\n"
             "  kernels_launched: %llu\n  fused_kernels: %llu\n  fused_nodes: %llu\n"
             "  planned_peak_bytes: %llu\n  arena_bytes: %llu\n  intermediate_bytes: %llu\n"
             "  collectives_in_graph: %llu\n",
             (unsigned long long)m->graphs, (unsigned long long)m->compiles, (unsigned long long)m->cache_hits,
             (unsigned long long)m->cached_programs, (unsigned long long)m->nodes_recorded,
             (unsigned long long)m->nodes_executed, (unsigned long long)m->nodes_eliminated,
             (unsigned long long)m->last_graph_nodes, (unsigned long long)m->max_graph_nodes,
             (unsigned long long)m->h2d_transfers, (unsigned long long)m->h2d_bytes,
             (unsigned long long)m->d2h_transfers, (unsigned long long)m->d2h_bytes,
             (unsigned long long)m->mark_steps, m->compile_ms, m->execute_ms,
             (unsigned long long)m->kernels_launched, (unsigned long long)m->fused_kernels,
             (unsigned long long)m->fused_nodes, (unsigned long long)m->planned_peak_bytes,
             (unsigned long long)m->arena_bytes, (unsigned long long)m->intermediate_bytes,
             (unsigned long long)m->collectives_in_graph);
}

/* The extras caccel/xla.h names (ca_xla_metrics_get and friends resolve through them). */
static void *x_get_proc(const char *name) {
    if (!name) return NULL;
    if (strcmp(name, CA_XLA_PROC_METRICS) == 0) return (void *)(uintptr_t)x_metrics;
    if (strcmp(name, CA_XLA_PROC_METRICS_RESET) == 0) return (void *)(uintptr_t)x_metrics_reset;
    if (strcmp(name, CA_XLA_PROC_FORMAT_METRICS) == 0) return (void *)(uintptr_t)x_format_metrics;
    return NULL;
}

static const ca_device_ops xla_device_ops = {
    .struct_size = sizeof(ca_device_ops),
    .abi_version = CA_ABI_VERSION,
    .name = "xla",
    .device_count = x_device_count,
    .open = x_open,
    .close = x_close,
    .describe = x_describe,
    .mem_alloc = x_mem_alloc,
    .mem_free = x_mem_free,
    .memcpy = x_memcpy,
    .stream_create = x_handle,
    .stream_destroy = x_handle_free,
    .set_stream = x_set_stream,
    .event_create = x_handle,
    .event_destroy = x_handle_free,
    .event_record = x_event_record,
    .stream_wait_event = x_stream_wait_event,
    .event_synchronize = x_event_synchronize,
    .synchronize = x_synchronize,
    .kernels = &xla_kernels,
    .allocator = &xla_allocator,
    .allocator_ctx = x_allocator_ctx,
    .host_memory = false,
    .enqueue_host_fn = x_enqueue_host_fn,
    .kind = CA_DEVICE_LAZY,
    .mark_step = x_mark_step,
    .set_deterministic = x_set_deterministic,
    .set_storage_dtype = x_set_storage_dtype,
    .storage_dtype = x_storage_dtype,
    .get_proc = x_get_proc,
    .enqueue_host_fn_keyed = x_enqueue_host_fn_keyed,
    .attention_strides = true,   /* the executor's (cpu) attention reads them; the strides are keys */
};

static const ca_device_ops *const xla_devices[] = {&xla_device_ops};

static const ca_plugin xla_plugin = {
    .struct_size = sizeof(ca_plugin),
    .abi_version = CA_ABI_VERSION,
    .name = "xla",
    .version = "xla_stub (host executor)",
    .num_devices = 1,
    .devices = xla_devices,
    .num_collectives = 0,
    .collectives = NULL,
    .score = NULL,
};

const ca_plugin *ca_xla_plugin(const ca_device_ops *executor, ca_xla_parallel_for_fn parallel_for) {
    exec_ops = executor;
    exec_parallel_for = parallel_for;
    return &xla_plugin;
}
