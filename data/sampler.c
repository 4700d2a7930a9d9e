/* The loader's seeded permutation and the per-rank shard plan (Accelerate's BatchSamplerShard). */
#include "data/data_impl.h"

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

void ca_shard_plan_batch(const ca_shard_plan *p, int64_t b, int64_t *start, int64_t *size,
                         int64_t *num_padded) {
    int64_t j = b * p->world + p->rank;
    int64_t s = j * p->batch_size;
    int64_t len = p->total - s < p->batch_size ? p->total - s : p->batch_size;
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
