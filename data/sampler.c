/* The loader's seeded permutation and the per-rank shard plan (Accelerate's BatchSamplerShard). */
#include "data/data_impl.h"

#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void ca_splitmix_init(ca_splitmix *g, uint64_t seed, uint64_t epoch) {
    /* Mixing both before combining keeps (seed, epoch) and (seed + 1, epoch - 1)
     * apart, which a plain seed + epoch (Accelerate's choice) does not. */
    g->state = mix64(seed) ^ mix64(epoch ^ 0x6A09E667F3BCC909ull);
}

uint64_t ca_splitmix_next(ca_splitmix *g) {
    g->state += 0x9E3779B97F4A7C15ull;
    return mix64(g->state);
}

uint64_t ca_splitmix_below(ca_splitmix *g, uint64_t bound) {
    /* Reject the lowest (2^64 mod bound) values so every residue is equally likely. */
    uint64_t threshold = (0 - bound) % bound;
    uint64_t r;
    do {
        r = ca_splitmix_next(g);
    } while (r < threshold);
    return r % bound;
}

void ca_permutation(bool shuffle, uint64_t seed, uint64_t epoch, int64_t n, int64_t *perm) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    if (!shuffle || n < 2) return;
    ca_splitmix g;
    ca_splitmix_init(&g, seed, epoch);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)ca_splitmix_below(&g, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

void ca_shard_plan_init(ca_shard_plan *p, int64_t n, int64_t batch_size, bool drop_last,
                        int rank, int world, bool even_batches) {
    if (n < 0) n = 0;
    if (batch_size < 1) batch_size = 1;
    if (world < 1) world = 1;
    if (rank < 0 || rank >= world) rank = 0;
    p->n = n;
    p->batch_size = batch_size;
    p->rank = rank;
    p->world = world;
    p->drop_last = drop_last;
    p->even_batches = even_batches;
    p->split = false;

    if (drop_last) {
        int64_t rounds = (n / batch_size) / world;
        p->global_batches = rounds * world;
        p->total = p->global_batches * batch_size;
        p->rank_batches = rounds;
        return;
    }
    int64_t batches = (n + batch_size - 1) / batch_size;
    if (even_batches && world > 1) {
        int64_t rounds = (batches + world - 1) / world;
        p->global_batches = rounds * world;
        p->total = p->global_batches * batch_size;
        p->rank_batches = rounds;
    } else {
        p->global_batches = batches;
        p->total = n;
        p->rank_batches = batches / world + (rank < batches % world ? 1 : 0);
    }
}

void ca_shard_plan_init_split(ca_shard_plan *p, int64_t n, int64_t batch_size, bool drop_last, int rank,
                              int world, bool even_batches) {
    ca_shard_plan_init(p, n, batch_size, drop_last, rank, world, even_batches);
    if (p->world == 1) return;
    p->split = true;
    int64_t bs = p->batch_size, bl = bs / p->world;
    int64_t batches = drop_last ? p->n / bs : (p->n + bs - 1) / bs;
    p->global_batches = batches;
    if (drop_last || even_batches) {
        p->total = batches * bs;        /* with even_batches, positions >= n wrap to the start */
        p->rank_batches = batches;
        return;
    }
    p->total = p->n;
    /* a short last batch reaches rank r only when it has more than r * bl samples */
    bool short_last = batches > 0 && p->n < batches * bs;
    p->rank_batches = batches - (short_last && p->n - (batches - 1) * bs <= p->rank * bl ? 1 : 0);
}

void ca_shard_plan_batch(const ca_shard_plan *p, int64_t b, int64_t *start, int64_t *size,
                         int64_t *num_padded) {
    int64_t width = p->split ? p->batch_size / p->world : p->batch_size;
    int64_t s = p->split ? b * p->batch_size + p->rank * width : (b * p->world + p->rank) * p->batch_size;
    int64_t len = p->total - s < width ? p->total - s : width;
    if (len < 0) len = 0;
    int64_t real_end = p->n > s ? p->n : s;   /* positions >= n are padding */
    int64_t pad = s + len - real_end;
    *start = s;
    *size = len;
    *num_padded = pad > 0 ? pad : 0;
}

int64_t ca_shard_plan_samples(const ca_shard_plan *p) {
    int64_t sum = 0;
    for (int64_t b = 0; b < p->rank_batches; b++) {
        int64_t s, len, pad;
        ca_shard_plan_batch(p, b, &s, &len, &pad);
        sum += len - pad;
    }
    return sum;
}

void ca_shard_plan_init_det(ca_shard_plan *p, int64_t n, int64_t batch_size, bool drop_last, int rank,
                            int world) {
    ca_shard_plan_init(p, n, batch_size, drop_last, rank, world, true);
    if (drop_last || p->world > 1) return;   /* world > 1: even_batches already pads to whole rounds */
    p->total = p->global_batches * p->batch_size;   /* one process: pad the last batch as well */
    p->even_batches = true;
}

void ca_shard_plan_part(const ca_shard_plan *p, int parts, int64_t b, int part, int64_t *start,
                        int64_t *size, int64_t *num_padded) {
    int64_t s, len, pad;
    ca_shard_plan_batch(p, b, &s, &len, &pad);
    int64_t m = p->batch_size / (parts > 0 ? parts : 1);
    int64_t lo = (int64_t)part * m, hi = lo + m;      /* [lo, hi) inside the batch */
    if (hi > len) hi = len;
    if (lo > hi) lo = hi;
    int64_t real = len - pad;                         /* padding sits at the batch's end */
    int64_t padded = hi - (lo > real ? lo : real);
    *start = s + lo;
    *size = hi - lo;
    *num_padded = padded > 0 ? padded : 0;
}

/* ------------------------------------------------------------- index batches */

static ca_status grow(void **buf, int64_t *cap, int64_t need, size_t elem, int64_t extra) {
    if (need <= *cap) return CA_OK;
    int64_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *p = realloc(*buf, (size_t)(c + extra) * elem);
    if (!p) return ca_error(CA_ERR_NOMEM, "batch sampler: out of memory for %lld entries", (long long)c);
    *buf = p;
    *cap = c;
    return CA_OK;
}

ca_status ca_index_batches_push(ca_index_batches *l, const int64_t *idx, int64_t len, int64_t pad) {
    int64_t used = l->count ? l->off[l->count] : 0;
    int64_t cb = l->cap_b;
    ca_status s = grow((void **)&l->off, &cb, l->count + 1, sizeof *l->off, 1);
    if (s == CA_OK && cb != l->cap_b) {
        int64_t *np = realloc(l->pad, (size_t)cb * sizeof *np);
        if (!np) return ca_error(CA_ERR_NOMEM, "batch sampler: out of memory");
        l->pad = np;
    }
    if (s != CA_OK) return s;
    l->cap_b = cb;
    s = grow((void **)&l->idx, &l->cap_i, used + len, sizeof *l->idx, 0);
    if (s != CA_OK) return s;
    if (len > 0) memcpy(l->idx + used, idx, (size_t)len * sizeof *idx);
    l->off[0] = 0;
    l->pad[l->count] = pad;
    l->off[++l->count] = used + len;
    return CA_OK;
}

void ca_index_batches_clear(ca_index_batches *l) { l->count = 0; }

void ca_index_batches_free(ca_index_batches *l) {
    free(l->off);
    free(l->idx);
    free(l->pad);
    memset(l, 0, sizeof *l);
}

/* Pushes entries [lo, hi) of `batch` (len entries) continued by init[ioff],
 * init[ioff + 1], ... read cyclically; those up to `full` count as padding. */
static ca_status push_slice(ca_index_batches *out, const int64_t *batch, int64_t len, const int64_t *init,
                            int64_t ioff, int64_t ninit, int64_t full, int64_t lo, int64_t hi) {
    int64_t *tmp = malloc((size_t)(hi > lo ? hi - lo : 1) * sizeof *tmp), pad = 0;
    if (!tmp) return ca_error(CA_ERR_NOMEM, "batch sampler: out of memory");
    for (int64_t k = lo; k < hi; k++) {
        tmp[k - lo] = k < len ? batch[k] : init[(ioff + k - len) % ninit];
        pad += k >= len && k < full;
    }
    ca_status s = ca_index_batches_push(out, tmp, hi - lo, pad);
    free(tmp);
    return s;
}

/* BatchSamplerShard._iter_with_split. */
static ca_status shard_split(const ca_index_batches *in, int64_t bs, bool drop_last, int rank, int world,
                             bool even, ca_index_batches *out) {
    int64_t bl = bs / world, lo = bl * rank, hi = lo + bl;
    ca_status s = CA_OK;
    for (int64_t i = 0; i < in->count && s == CA_OK; i++)
        if (ca_index_batches_len(in, i) == bs) s = push_slice(out, in->idx + in->off[i], bs, NULL, 0, 1, bs, lo, hi);
    if (s != CA_OK || drop_last || in->count == 0) return s;
    int64_t last = in->count - 1, len = ca_index_batches_len(in, last);
    const int64_t *batch = in->idx + in->off[last];
    int64_t ninit = ca_index_batches_len(in, 0);
    if (len >= bs || ninit == 0) return CA_OK;
    if (!even) {
        if (len <= lo) return CA_OK;
        return push_slice(out, batch, len, NULL, 0, 1, len, lo, hi < len ? hi : len);
    }
    /* initial_data (the first batch) doubled until it covers a batch: a cyclic read of it */
    return push_slice(out, batch, len, in->idx + in->off[0], 0, ninit, bs, lo, hi);
}

/* BatchSamplerShard._iter_with_no_split; `initial` is the first `world` batches
 * flattened (fixed size) or as a list of batches (varying size). */
static ca_status shard_no_split(const ca_index_batches *in, int64_t bs, bool drop_last, int rank, int world,
                                bool even, ca_index_batches *out) {
    ca_status s = CA_OK;
    int64_t keep = -1;                 /* batch_to_yield: an index into in, -1 for None */
    for (int64_t i = 0; i < in->count && s == CA_OK; i++) {
        if (i % world == rank) keep = i;
        if (i % world == world - 1 && (bs == 0 || ca_index_batches_len(in, i) == bs)) {
            if (keep >= 0) s = ca_index_batches_push(out, in->idx + in->off[keep], ca_index_batches_len(in, keep), 0);
            keep = -1;
        }
    }
    int64_t nfirst = in->count < world ? in->count : world;   /* batches in initial_data */
    int64_t ninit = nfirst ? in->off[nfirst] : 0;
    if (s != CA_OK || drop_last || ninit == 0) return s;
    int64_t klen = keep >= 0 ? ca_index_batches_len(in, keep) : 0;
    if (!even) return klen > 0 ? ca_index_batches_push(out, in->idx + in->off[keep], klen, 0) : CA_OK;
    if (klen > 0 && (bs == 0 || klen == bs)) {
        s = ca_index_batches_push(out, in->idx + in->off[keep], klen, 0);
        if (s != CA_OK) return s;
    }
    int64_t idx = in->count - 1, last_len = ca_index_batches_len(in, idx);
    const int64_t *batch = in->idx + in->off[idx];
    int64_t len = last_len;
    if (bs == 0 || last_len == bs) {
        len = 0;
        idx++;
    }
    int64_t cycle = 0;
    while ((idx % world != 0 || len > 0) && s == CA_OK) {
        if (idx % world == rank) {
            if (bs == 0) {
                int64_t j = cycle % nfirst;   /* initial_data doubled until it has `world` batches */
                s = ca_index_batches_push(out, in->idx + in->off[j], ca_index_batches_len(in, j),
                                          ca_index_batches_len(in, j));
            } else {   /* the short last batch completed, then whole batches of initial_data */
                s = push_slice(out, batch, len, in->idx, cycle, ninit, bs, 0, bs);
            }
        }
        cycle += bs == 0 ? 1 : bs - len;
        len = 0;
        idx++;
    }
    return s;
}

ca_status ca_batch_sampler_shard(const ca_index_batches *in, int64_t batch_size, bool drop_last, int rank,
                                 int world, bool split, bool even_batches, ca_index_batches *out) {
    ca_index_batches_clear(out);
    if (world < 1 || rank < 0 || rank >= world)
        return ca_error(CA_ERR_INVALID, "batch sampler: rank %d of world size %d is not valid", rank, world);
    if (split && world > 1 && (batch_size <= 0 || batch_size % world != 0))
        return ca_error(CA_ERR_INVALID,
                        "split_batches: the batch sampler's batch_size (%lld) must be a multiple of the number "
                        "of processes (%d)",
                        (long long)batch_size, world);
    if (world == 1) {
        ca_status s = CA_OK;
        for (int64_t i = 0; i < in->count && s == CA_OK; i++)
            s = ca_index_batches_push(out, in->idx + in->off[i], ca_index_batches_len(in, i), 0);
        return s;
    }
    return split ? shard_split(in, batch_size, drop_last, rank, world, even_batches, out)
                 : shard_no_split(in, batch_size, drop_last, rank, world, even_batches, out);
}

/* ---------------------------------------------------------- dispatched batches */

int64_t ca_dispatch_padded(int64_t m, int world) {
    return world > 1 && m % world ? (m / world + 1) * world : m;
}

/* DataLoaderDispatcher slices the (completed) global batch in rank order, so the
 * repeats, at its end, fall to the last ranks. */
void ca_dispatch_slice(int64_t size, int64_t padded, int rank, int world, int64_t *first, int64_t *len,
                       int64_t *pad) {
    int64_t bs = size / world, lo = (int64_t)rank * bs, real = size - padded;
    *first = lo;
    *len = bs;
    int64_t from = lo > real ? lo : real;
    *pad = lo + bs > from ? lo + bs - from : 0;
}
