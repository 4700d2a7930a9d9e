/* Loop fusion of elementwise chains: consecutive f32 unary/binary nodes where each intermediate is
 * written whole by one node, read only by the next and freed by the program in the same graph run
 * as one loop over the data, in chunks that stay in L1; the intermediates are never written.
 * Every element goes through the same operations in the same order as the cpu kernels (the build
 * has no floating-point contraction), so the results are bit-identical to eager execution. */
#include "backends/xla_stub/xla_impl.h"
#include "base/unary_math_impl.h"

#include <math.h>
#include <string.h>

#define CHUNK 256              /* elements per chunk: one chunk of every step fits in L1 */

/* The chunk loops are built for AVX-512, AVX2 and baseline x86-64, as the cpu kernels are, so that
 * they vectorise alike (the build has no contraction, so the lanes round as the scalar code). */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(CA_CPU_NO_CLONES)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif
#define INLINE static inline __attribute__((always_inline))

/* ------------------------------------------------------------------ compile time */

/* Every unary op: the fused loop runs the cpu kernels' own per-element code
 * (base/unary_math_impl.h), so it reproduces them exactly. */
static bool unary_fusable(ca_unary_op op) { return (unsigned)op < CA_UNARY_OP_COUNT; }

static int64_t numel_of(const ca_bcast_args *b) {
    int64_t e = 1;
    for (int i = 0; i < b->ndim; i++) e *= b->shape[i];
    return e;
}

/* Elements of the node's output when it can join a fused loop, else 0. */
static int64_t fusable_numel(const xnode *n) {
    if (n->slot == XS_unary)
        return n->a.unary.dt == CA_F32 && unary_fusable(n->a.unary.op) && n->nref == 2 && n->a.unary.n > 0
                   ? n->a.unary.n : 0;
    if (n->slot != XS_binary || n->a.binary.dt != CA_F32 || n->nref != 3 ||
        (unsigned)n->a.binary.op >= CA_BINARY_OP_COUNT)
        return 0;
    const ca_bcast_args *b = &n->a.binary.shape;
    if (b->ndim < 1 || b->ndim > CA_MAX_DIMS) return 0;
    for (int i = 0; i < b->ndim; i++)
        if (b->shape[i] <= 0) return 0;
    return numel_of(b);
}

/* True when strides address the shape's elements in row-major order (size-1 dims ignored). */
static bool contiguous(const ca_bcast_args *b, const int64_t *stride) {
    int64_t want = 1;
    for (int i = b->ndim - 1; i >= 0; i--) {
        if (b->shape[i] != 1 && stride[i] != want) return false;
        want *= b->shape[i];
    }
    return true;
}

static bool reads_identity(const xnode *n, int operand) {
    if (n->slot == XS_unary) return true;
    const ca_bcast_args *b = &n->a.binary.shape;
    return contiguous(b, operand == 0 ? b->a_stride : b->b_stride);
}

/* Can node j consume node i's output inside one loop? i's output block must be an intermediate
 * (written whole by i at offset 0, freed by the program, touched by no node but i and j), read by j
 * element for element, and not be j's output. */
static bool can_link(const xla_dev *x, int i, int j) {
    const xnode *ni = &x->nodes[i], *nj = &x->nodes[j];
    int64_t e = fusable_numel(ni);
    if (e == 0 || fusable_numel(nj) != e) return false;
    const xref *out = &x->refs[ni->ref0 + ni->nref - 1];
    const xalloc *t = out->al;
    if (!(out->flags & XR_FULL) || out->off != 0 || !t->freed || out->bytes != (uint64_t)e * 4) return false;
    if (x->refs[nj->ref0 + nj->nref - 1].al == t) return false;
    int reads = 0;
    for (int r = 0; r < nj->nref - 1; r++) {
        const xref *ref = &x->refs[nj->ref0 + r];
        if (ref->al != t) continue;
        if (ref->off != 0 || !reads_identity(nj, r)) return false;
        reads++;
    }
    if (reads == 0) return false;
    for (int k = 0; k < x->nnodes; k++) {
        if (k == i || k == j) continue;
        const xnode *nk = &x->nodes[k];
        for (int r = 0; r < nk->nref; r++)
            if (x->refs[nk->ref0 + r].al == t) return false;
    }
    return true;
}

int xla_fuse_plan(const xla_dev *x, const uint8_t *run, uint8_t *chain) {
    int groups = 0;
    memset(chain, 0, (size_t)x->nnodes);
    for (int i = 0; i < x->nnodes; i++) {
        if (!run[i]) continue;
        int last = i, len = 1;
        for (int j = i + 1; j < x->nnodes && len < XLA_MAX_CHAIN; j++) {
            if (!run[j]) continue;
            if (!can_link(x, last, j)) break;
            last = j;
            len++;
        }
        chain[i] = (uint8_t)len;
        if (len > 1) groups++;
        i = last;
    }
    return groups;
}

/* ------------------------------------------------------------------ run time */

typedef struct operand {
    const float *p;            /* NULL: the previous step's chunk */
    int64_t stride[CA_MAX_DIMS];
    bool contig;
} operand;

typedef struct step {
    const xnode *n;
    int nops;
    operand op[2];
} step;

/* Highest element the operand reads, plus one. */
static int64_t extent(const ca_bcast_args *b, const operand *o) {
    int64_t hi = 0;
    for (int d = 0; d < b->ndim; d++) hi += (b->shape[d] - 1) * (o->stride[d] > 0 ? o->stride[d] : 0);
    return hi + 1;
}

static void set_operands(step *s, const void *prev) {
    const xnode *n = s->n;
    if (n->slot == XS_unary) {
        s->nops = 1;
        s->op[0] = (operand){.p = n->a.unary.x == prev ? NULL : n->a.unary.x, .contig = true};
        return;
    }
    const ca_bcast_args *b = &n->a.binary.shape;
    const void *src[2] = {n->a.binary.a, n->a.binary.b};
    const int64_t *st[2] = {b->a_stride, b->b_stride};
    s->nops = 2;
    for (int k = 0; k < 2; k++) {
        operand *o = &s->op[k];
        o->p = src[k] == prev ? NULL : src[k];
        memcpy(o->stride, st[k], sizeof o->stride);
        o->contig = contiguous(b, st[k]);
    }
}

/* An input that overlaps the output is safe only when it is read element for element at the
 * output's own index: each chunk is read whole before it is written. */
static bool overlaps_badly(const step *s, const float *y, int64_t e) {
    for (int k = 0; k < s->nops; k++) {
        const operand *o = &s->op[k];
        if (!o->p) continue;
        int64_t ext = s->n->slot == XS_unary ? e : extent(&s->n->a.binary.shape, o);
        bool apart = o->p + ext <= y || y + e <= o->p;
        if (!apart && !(o->contig && o->p == y)) return true;
    }
    return false;
}

/* Gathers c elements of a broadcast operand starting at output element e0, a run of the innermost
 * dimension at a time (copied, or repeated when that dimension is broadcast). */
INLINE void gather(const ca_bcast_args *b, const operand *o, int64_t e0, int64_t c, float *out) {
    int nd = b->ndim, last = nd - 1;
    int64_t idx[CA_MAX_DIMS], off = 0, r = e0;
    for (int d = last; d >= 0; d--) {
        idx[d] = r % b->shape[d];
        r /= b->shape[d];
        off += idx[d] * o->stride[d];
    }
    int64_t s = o->stride[last], len = b->shape[last];
    for (int64_t i = 0; i < c;) {
        int64_t run = len - idx[last] < c - i ? len - idx[last] : c - i;
        const float *src = o->p + off;
        if (s == 1) memcpy(out + i, src, (size_t)run * sizeof *out);
        else for (int64_t k = 0; k < run; k++) out[i + k] = src[k * s];
        i += run;
        off += run * s;
        idx[last] += run;
        if (idx[last] < len) continue;
        off -= s * len;
        idx[last] = 0;
        for (int d = last - 1; d >= 0; d--) {
            off += o->stride[d];
            if (++idx[d] < b->shape[d]) break;
            off -= o->stride[d] * b->shape[d];
            idx[d] = 0;
        }
    }
}

#define BIN(EXPR) for (int64_t i = 0; i < n; i++) { float av = a[i], bv = b[i]; y[i] = (EXPR); } break

INLINE void binary_chunk(ca_binary_op op, int64_t n, const float *restrict a, const float *restrict b,
                         float *restrict y) {
    switch (op) {
    case CA_BINARY_ADD: BIN(av + bv);
    case CA_BINARY_SUB: BIN(av - bv);
    case CA_BINARY_MUL: BIN(av * bv);
    case CA_BINARY_DIV: BIN(av / bv);
    case CA_BINARY_MAX: BIN((av > bv || av != av) ? av : bv);
    case CA_BINARY_MIN: BIN((av < bv || av != av) ? av : bv);
    case CA_BINARY_OP_COUNT: break;   /* not an op; no default, so -Wswitch wants a case per op */
    }
}

/* Operand k of step s for the chunk [e0, e0 + c): the previous step's chunk, memory read in place,
 * or a gathered copy. */
INLINE const float *operand_chunk(const step *s, int k, const float *prev, int64_t e0, int64_t c, float *tmp) {
    const operand *o = &s->op[k];
    if (!o->p) return prev;
    if (o->contig) return o->p + e0;
    gather(&s->n->a.binary.shape, o, e0, c, tmp);
    return tmp;
}

/* Outputs [lo, hi) of the chain. Every step writes a chunk buffer (never memory an operand may
 * share), the last one's is copied out: so each loop's pointers are distinct. */
CLONES static void run_chunks(const step *st, int len, float *y, int64_t lo, int64_t hi) {
    float buf[2][CHUNK] __attribute__((aligned(64))), ta[CHUNK], tb[CHUNK];
    for (int64_t e0 = lo; e0 < hi; e0 += CHUNK) {
        int64_t c = hi - e0 < CHUNK ? hi - e0 : CHUNK;
        const float *prev = NULL;
        float *out = NULL;
        for (int s = 0; s < len; s++) {
            out = buf[s & 1];
            const xnode *n = st[s].n;
            if (n->slot == XS_unary) {
                ca_unary_f32_loop(n->a.unary.op, c, operand_chunk(&st[s], 0, prev, e0, c, ta), out, n->a.unary.alpha);
            } else {
                const float *a = operand_chunk(&st[s], 0, prev, e0, c, ta);
                binary_chunk(n->a.binary.op, c, a, operand_chunk(&st[s], 1, prev, e0, c, tb), out);
            }
            prev = out;
        }
        memcpy(y + e0, out, (size_t)c * sizeof *y);
    }
}

typedef struct chain_run {
    const step *st;
    int len;
    float *y;
} chain_run;

static void chain_range(void *ctx, int64_t lo, int64_t hi) {
    const chain_run *r = ctx;
    run_chunks(r->st, r->len, r->y, lo, hi);
}

static void *out_of(const xnode *n) { return n->slot == XS_unary ? n->a.unary.y : n->a.binary.y; }

bool xla_run_fused(const xla_dev *x, const int *idx, int len) {
    step st[XLA_MAX_CHAIN];
    const void *prev = NULL;
    for (int s = 0; s < len; s++) {
        st[s].n = &x->nodes[idx[s]];
        set_operands(&st[s], prev);
        prev = out_of(st[s].n);
    }
    float *y = out_of(st[len - 1].n);
    int64_t e = fusable_numel(st[0].n);
    for (int s = 0; s < len; s++)
        if (overlaps_badly(&st[s], y, e)) return false;
    /* Split among the executor's threads: an output element depends on the same elements of the
     * inputs alone, and an input overlapping y is read only at y's own element (overlaps_badly),
     * so any split computes the same bits. A step costs about a streaming element. */
    chain_run r = {st, len, y};
    x->parallel_for(e, len, chain_range, &r);
    return true;
}
