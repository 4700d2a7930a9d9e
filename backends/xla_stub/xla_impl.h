/* xla_impl.h: private definitions of the lazy device: the arena, recorded nodes, the graph of a
 * step, compiled programs and their cache. */
#ifndef CACCEL_XLA_IMPL_H
#define CACCEL_XLA_IMPL_H

#include "base/base_impl.h"
#include "backends/xla_stub/xla_plugin.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* One allocation of the device. Its address is virtual: a range of the device's own address space,
 * which the host cannot read or write (reserved without access, as a real device's memory is out of
 * the host's reach). Memory backs it when a graph or a transfer first needs it: a block of its own,
 * or, for an intermediate of a graph, its planned offset in the graph's arena. Records are stable
 * while referenced: a block freed while pending nodes use it is only released once the graph has
 * run. */
typedef struct xalloc {
    uintptr_t base;            /* virtual address */
    size_t bytes;              /* rounded size */
    unsigned char *phys;       /* the memory behind it, or NULL while it needs none */
    bool placed;               /* phys lies in the graph arena (an intermediate), not owned */
    bool freed;                /* freed by the program, release deferred to the end of the graph */
    uint64_t seen_gen;         /* graph generation that last referenced it */
    int canon;                 /* number in the current graph's identity pattern */
    uint64_t born_gen;         /* graph generation during which it was allocated */
    bool raw;                  /* bf16 storage: written without an element type (a transfer from the
                                * host, a copy, a collective); rounded when a node reads it as f32 */
} xalloc;

/* A reference of a node to device memory. */
enum { XR_READ = 1, XR_WRITE = 2, XR_FULL = 4 };   /* FULL: the write covers the whole block */
typedef struct xref {
    xalloc *al;
    uint64_t off, bytes;       /* bytes 0: from off to the block's end (extent not computed) */
    int flags;
    int dt;                    /* the element type (ca_dtype), or -1 for raw bytes */
    int field;                 /* where the node keeps the address: an offset into its xargs, or -1 */
    void **slot;               /* ... or this slot of a copied tensor list (field -1) */
} xref;

/* What a node runs: a kernel slot (XS_<slot>, in CA_KERNEL_LIST's order), a copy, a host function. */
#define XS_ENUM_(slot) XS_##slot,
typedef enum xslot { CA_KERNEL_LIST(XS_ENUM_) XS_MEMCPY, XS_HOST, XS_COUNT } xslot;
#undef XS_ENUM_

/* A tensor list copied with the node (the caller's arrays do not outlive the call). */
typedef struct xlist {
    ca_tensor_list t;
    void *mem;
} xlist;

/* The arguments of one kernel call, copied: the node runs later. One member per slot (its args
 * struct); the slots whose args point at arrays also keep a copy of them after the args, in the
 * members that begin with the same args struct (copy, where_x, list). */
#define XARGS_(slot) ca_##slot##_args slot;
typedef union xargs {
    CA_KERNEL_LIST(XARGS_)
    struct { ca_copy_strided_args a; int64_t shape[CA_MAX_DIMS], xs[CA_MAX_DIMS], ys[CA_MAX_DIMS]; } copy;
    struct { ca_where_args a; int64_t cond_stride[CA_MAX_DIMS]; } where_x;
    struct {
        union { ca_adamw_args adamw; ca_sgd_args sgd; ca_sum_squares_args sum_squares; ca_scale_list_args scale_list;
                ca_unscale_check_args unscale_check; ca_clamp_list_args clamp_list; } a;
        xlist l;
    } list;
    struct { void *dst; const void *src; size_t bytes; } memcpy;
    struct { ca_status (*fn)(void *ctx, bool run, const void *in, void *out); void *ctx; const void *in;
             void *out; } host;   /* ctx owned until run or dropped */
} xargs;
#undef XARGS_

typedef struct xnode {
    xslot slot;
    xargs a;
    int ref0, nref;            /* the node's references in the graph's pool */
    int key0, nkey;            /* its structural attributes in the graph's key pool */
} xnode;

/* A compiled program: which recorded nodes run (the rest is dead code), how they are grouped
 * into fused loops, and the buffer plan's figures. */
typedef struct xprogram {
    uint64_t hash;
    int64_t *key;
    size_t klen;
    int nnodes, nrun;
    uint8_t *run;
    uint8_t *chain;            /* at a group's first node: the number of running nodes it holds */
    int nlaunch, nfused;       /* kernels launched per run; of them, fused loops */
    uint64_t planned_peak, intermediate_bytes;
    int nblocks;
    int64_t *place;            /* per block number: its offset in the graph arena, or XP_OWN / XP_NONE */
    uint64_t arena_bytes;      /* the placement's size: planned_peak or a little more */
    uint64_t hits;
} xprogram;
enum { XP_OWN = -1, XP_NONE = -2 };   /* memory of its own (outlives the graph); none (fused away) */

#define XLA_MAX_CHAIN 16

typedef struct xla_dev {
    pthread_mutex_t mu;
    const ca_device_ops *exec;     /* executor backend (cpu) */
    const ca_kernels *k;
    void *exec_ctx;
    ca_xla_parallel_for_fn parallel_for;   /* the executor's threads for the device's own loops */
    /* the address space: virtual ranges, free ones sorted by address and coalesced */
    uintptr_t vbase;
    size_t vsize;
    struct xrange { uintptr_t at; size_t len; } *vfree;
    int nvfree, capvfree;
    /* the graph arena: intermediates at their planned offsets */
    unsigned char *arena;
    size_t arena_cap;
    /* blocks */
    xalloc **tab;                  /* live blocks by base address */
    int ntab, captab;
    xalloc **freed;                /* freed during the current graph, released after it runs */
    int nfreed, capfreed;
    struct xcached { void *p; size_t bytes; } *cache;   /* released memory kept for reuse */
    int ncache, capcache;
    ca_allocator_stats st;
    bool bf16_storage;             /* f32 data held as bf16 values (XLA_USE_BF16 / downcast_bf16) */
    /* the pending graph */
    xnode *nodes;
    int nnodes, capnodes;
    xnode spare;                   /* recorded into when the node array cannot grow (then refused) */
    xref *refs;
    int nrefs, caprefs;
    int64_t *keys;
    int nkeys, capkeys;
    uint64_t gen;
    /* compiled programs */
    xprogram *progs;
    int nprogs, capprogs;
    ca_xla_metrics m;
} xla_dev;

extern const ca_kernels xla_kernels;

/* Recording: begin a node (locks), add references and attributes, end (unlocks). */
xnode *xla_node_begin(xla_dev *x, xslot slot);
/* field: where n keeps p (an offset into n->a, XLA_FIELD), or -1 with slot: the tensor list's slot
 * holding it. */
#define XLA_FIELD(n, f) ((int)((char *)&(n)->a.f - (char *)&(n)->a))
ca_status xla_ref(xla_dev *x, xnode *n, const void *p, int field, void **slot, uint64_t bytes, int flags, int dt,
                  const char *what);
void xla_key(xla_dev *x, xnode *n, int64_t v);
/* Counts a step boundary and runs the pending graph. */
ca_status xla_mark_step(xla_dev *x);
ca_status xla_node_end(xla_dev *x, xnode *n, ca_status s);

/* Runs the pending graph (compiling it unless cached); caller holds x->mu. */
ca_status xla_flush_locked(xla_dev *x);
ca_status xla_exec_node(xla_dev *x, const xnode *n);
/* bytes from src to dst on the executor's threads (x->parallel_for) when they do not overlap, else one
 * memmove: a recorded copy and the transfers to and from the host. */
void xla_copy(const xla_dev *x, void *dst, const void *src, size_t bytes);
const char *xla_slot_name(xslot s);

/* Fusion (xla_fusion.c): groups the running nodes into chains (chain[i] = length at a chain's
 * first node); returns the number of chains of two or more. */
int xla_fuse_plan(const xla_dev *x, const uint8_t *run, uint8_t *chain);
/* Runs the chain of nodes idx[0..len) as one loop; false (nothing run) when an input overlaps the
 * output in a way the loop cannot honour: then the nodes run one by one. */
bool xla_run_fused(const xla_dev *x, const int *idx, int len);

#endif
