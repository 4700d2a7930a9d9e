/* Tests of the dataloader's shuffle generator and shard plan (data/sampler.c, linked in directly). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "data/data_impl.h"
#include "tests/accelerate_shards.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- permutation */

static void assert_is_permutation(const int64_t *p, int64_t n) {
    unsigned char *seen = calloc((size_t)n + 1, 1);
    assert_non_null(seen);
    for (int64_t i = 0; i < n; i++) {
        assert_true(p[i] >= 0 && p[i] < n);
        assert_int_equal(seen[p[i]], 0);
        seen[p[i]] = 1;
    }
    free(seen);
}

static void test_permutation(void **state) {
    (void)state;
    enum { N = 1000 };
    static int64_t a[N], b[N], c[N], d[N];
    int64_t sizes[] = {0, 1, 2, 3, 17, N};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        ca_permutation(true, 42, 0, sizes[k], a);
        assert_is_permutation(a, sizes[k]);
    }
    ca_permutation(true, 42, 3, N, a);
    ca_permutation(true, 42, 3, N, b);
    assert_memory_equal(a, b, sizeof a);           /* same (seed, epoch): same order */
    ca_permutation(true, 42, 4, N, c);
    assert_true(memcmp(a, c, sizeof a) != 0);      /* next epoch: another order */
    ca_permutation(true, 43, 3, N, d);
    assert_true(memcmp(a, d, sizeof a) != 0);      /* another seed: another order */
    /* seed + epoch is not what keys the stream: (42, 4) and (43, 3) differ. */
    assert_true(memcmp(c, d, sizeof c) != 0);
    ca_permutation(false, 42, 3, N, a);
    for (int64_t i = 0; i < N; i++) assert_int_equal(a[i], i);

    /* A shuffle moves most elements. */
    ca_permutation(true, 7, 0, N, a);
    int fixed = 0;
    for (int64_t i = 0; i < N; i++) fixed += a[i] == i;
    assert_true(fixed < 20);
}

/* Pins the algorithm: checkpoints store (seed, epoch, batch), so the order a
 * given (seed, epoch) produces must never change between versions or machines. */
static void test_permutation_golden(void **state) {
    (void)state;
    ca_splitmix g;
    ca_splitmix_init(&g, 0, 0);
    uint64_t first = ca_splitmix_next(&g);
    ca_splitmix_init(&g, 0, 0);
    assert_true(ca_splitmix_next(&g) == first);
    /* Reference values, checked against an independent transcription of the
     * algorithm documented in data_impl.h. */
    ca_splitmix_init(&g, 42, 0);
    uint64_t r0 = ca_splitmix_next(&g), r1 = ca_splitmix_next(&g);
    int64_t p[10];
    ca_permutation(true, 42, 0, 10, p);
    const int64_t want[10] = {3, 6, 5, 1, 9, 2, 8, 7, 0, 4};
    assert_memory_equal(p, want, sizeof want);
    assert_true(r0 == 0x71552897BCCCDE42ull);
    assert_true(r1 == 0xFFDC3FAC6346C29Aull);
}

static void test_below_uniform(void **state) {
    (void)state;
    ca_splitmix g;
    ca_splitmix_init(&g, 1234, 5);
    enum { BOUND = 6, DRAWS = 60000 };
    int64_t count[BOUND] = {0};
    for (int i = 0; i < DRAWS; i++) {
        uint64_t v = ca_splitmix_below(&g, BOUND);
        assert_true(v < BOUND);
        count[v]++;
    }
    /* Chi-square with 5 degrees of freedom; 30 is far beyond p = 0.0001 (20.5). */
    double chi = 0, e = (double)DRAWS / BOUND;
    for (int k = 0; k < BOUND; k++) chi += (count[k] - e) * (count[k] - e) / e;
    assert_true(chi < 30.0);
    assert_true(ca_splitmix_below(&g, 1) == 0);
    /* Bounds near 2^64 still give values below the bound. */
    for (int i = 0; i < 100; i++) assert_true(ca_splitmix_below(&g, UINT64_MAX - 1) < UINT64_MAX - 1);
}

/* ------------------------------------------------------------- shard plan */

/* One sample as the oracle sees it: its index and whether it repeats one. */
typedef struct elem {
    int64_t id;
    bool pad;
} elem;

typedef struct blist {
    int count;
    int64_t size[4096];
    elem *items[4096];
} blist;

static void blist_push(blist *l, const elem *e, int64_t n) {
    assert_true(l->count < 4096);
    l->items[l->count] = malloc(sizeof(elem) * (size_t)(n ? n : 1));
    assert_non_null(l->items[l->count]);
    memcpy(l->items[l->count], e, sizeof(elem) * (size_t)n);
    l->size[l->count] = n;
    l->count++;
}

static void blist_free(blist *l) {
    for (int i = 0; i < l->count; i++) free(l->items[i]);
    l->count = 0;
}

/* What Accelerate's BatchSamplerShard._iter_with_no_split yields for one rank
 * over BatchSampler(range(n), bs, drop_last), transcribed step by step as an
 * independent reference (and plain BatchSampler for world 1, where Accelerate
 * does not wrap the sampler). */
static void oracle(int64_t n, int64_t bs, bool drop_last, int rank, int world, bool even,
                   blist *out) {
    /* The inner BatchSampler. */
    int64_t nb = drop_last ? n / bs : (n + bs - 1) / bs;
    elem *batch = malloc(sizeof(elem) * (size_t)bs);
    elem *to_yield = malloc(sizeof(elem) * (size_t)bs);
    elem *initial = malloc(sizeof(elem) * (size_t)(2 * world * bs + n + 1));
    assert_true(batch && to_yield && initial);
    if (world == 1) {
        for (int64_t j = 0; j < nb; j++) {
            int64_t len = 0;
            for (int64_t i = j * bs; i < n && i < (j + 1) * bs; i++) batch[len++] = (elem){i, false};
            blist_push(out, batch, len);
        }
        goto done;
    }
    int64_t ninit = 0, yield_len = 0, len = 0, idx = 0;
    for (idx = 0; idx < nb; idx++) {
        len = 0;
        for (int64_t i = idx * bs; i < n && i < (idx + 1) * bs; i++) batch[len++] = (elem){i, false};
        if (!drop_last && idx < world)
            for (int64_t k = 0; k < len; k++) initial[ninit++] = batch[k];
        if (idx % world == rank) {
            memcpy(to_yield, batch, sizeof(elem) * (size_t)len);
            yield_len = len;
        }
        if (idx % world == world - 1 && len == bs) {
            blist_push(out, to_yield, yield_len);
            yield_len = 0;
        }
    }
    if (nb > 0) idx = nb - 1;   /* Python's loop variable keeps its last value */
    if (!drop_last && ninit > 0) {
        if (!even) {
            if (yield_len > 0) blist_push(out, to_yield, yield_len);
        } else {
            if (yield_len == bs) blist_push(out, to_yield, yield_len);
            while (ninit < world * bs) {
                memcpy(initial + ninit, initial, sizeof(elem) * (size_t)ninit);
                ninit *= 2;
            }
            if (len == bs) {
                len = 0;
                idx++;
            }
            int64_t cycle = 0;
            while (idx % world != 0 || len > 0) {
                int64_t end = cycle + bs - len;
                for (int64_t k = cycle; k < end; k++) batch[len++] = (elem){initial[k].id, true};
                if (idx % world == rank) blist_push(out, batch, len);
                cycle = end;
                len = 0;
                idx++;
            }
        }
    }
done:
    free(batch);
    free(to_yield);
    free(initial);
}

/* The same rank's batches from the plan, with the identity permutation. */
static void from_plan(const ca_shard_plan *p, blist *out) {
    elem *batch = malloc(sizeof(elem) * (size_t)p->batch_size);
    assert_non_null(batch);
    for (int64_t b = 0; b < p->rank_batches; b++) {
        int64_t start, size, pad;
        ca_shard_plan_batch(p, b, &start, &size, &pad);
        assert_true(size >= 1 && size <= p->batch_size);
        int64_t npad = 0;
        for (int64_t t = 0; t < size; t++) {
            batch[t] = (elem){(start + t) % p->n, start + t >= p->n};
            npad += batch[t].pad;
        }
        assert_int_equal(npad, pad);
        blist_push(out, batch, size);
    }
    free(batch);
}

static void test_plan_matches_accelerate(void **state) {
    (void)state;
    static blist want, got;
    int cases = 0;
    for (int world = 1; world <= 5; world++)
        for (int64_t bs = 1; bs <= 5; bs++)
            for (int64_t n = 1; n <= 37; n++)
                for (int flags = 0; flags < 4; flags++) {
                    bool drop_last = flags & 1, even = flags & 2;
                    for (int rank = 0; rank < world; rank++) {
                        ca_shard_plan p;
                        ca_shard_plan_init(&p, n, bs, drop_last, rank, world, even);
                        oracle(n, bs, drop_last, rank, world, even, &want);
                        from_plan(&p, &got);
                        if (want.count != got.count)
                            fail_msg("n=%lld bs=%lld world=%d rank=%d drop_last=%d even=%d: "
                                     "%d batches, Accelerate gives %d",
                                     (long long)n, (long long)bs, world, rank, drop_last, even,
                                     got.count, want.count);
                        for (int b = 0; b < want.count; b++) {
                            assert_int_equal(got.size[b], want.size[b]);
                            for (int64_t t = 0; t < want.size[b]; t++) {
                                assert_int_equal(got.items[b][t].id, want.items[b][t].id);
                                assert_int_equal(got.items[b][t].pad, want.items[b][t].pad);
                            }
                        }
                        blist_free(&want);
                        blist_free(&got);
                        cases++;
                    }
                }
    assert_true(cases > 5000);
}

static void test_plan_lengths(void **state) {
    (void)state;
    /* Accelerate's BatchSamplerShard.__len__ for 10 samples, batch 3 (4 batches, last short). */
    ca_shard_plan p;
    ca_shard_plan_init(&p, 10, 3, false, 0, 3, true);
    assert_int_equal(p.rank_batches, 2);
    assert_int_equal(p.total, 18);
    ca_shard_plan_init(&p, 10, 3, false, 1, 3, false);
    assert_int_equal(p.rank_batches, 1);
    assert_int_equal(ca_shard_plan_samples(&p), 3);
    ca_shard_plan_init(&p, 10, 3, false, 0, 3, false);
    assert_int_equal(p.rank_batches, 2);
    assert_int_equal(ca_shard_plan_samples(&p), 4);   /* batches 0 and 3 (1 sample) */
    ca_shard_plan_init(&p, 10, 3, true, 2, 3, true);
    assert_int_equal(p.rank_batches, 1);
    ca_shard_plan_init(&p, 10, 3, true, 0, 1, true);
    assert_int_equal(p.rank_batches, 3);
    ca_shard_plan_init(&p, 10, 3, false, 0, 1, true);
    assert_int_equal(p.rank_batches, 4);
    int64_t start, size, pad;
    ca_shard_plan_batch(&p, 3, &start, &size, &pad);
    assert_int_equal(size, 1);                         /* one rank: short last batch kept */
    assert_int_equal(pad, 0);
    ca_shard_plan_init(&p, 0, 4, false, 1, 2, true);
    assert_int_equal(p.rank_batches, 0);
}

/* Shards are disjoint and cover the epoch; with even_batches every rank gets
 * the same number of full batches and only padding repeats. */
static void test_plan_disjoint_covering(void **state) {
    (void)state;
    enum { NMAX = 103 };
    int64_t perm[NMAX];
    for (int world = 2; world <= 4; world++)
        for (int64_t n = 1; n <= NMAX; n += 7)
            for (int64_t bs = 1; bs <= 8; bs++)
                for (int flags = 0; flags < 4; flags++) {
                    bool drop_last = flags & 1, even = flags & 2;
                    ca_permutation(true, 99, (uint64_t)n, n, perm);
                    int seen[NMAX] = {0};
                    int64_t counted = 0, batches0 = -1;
                    for (int r = 0; r < world; r++) {
                        ca_shard_plan p;
                        ca_shard_plan_init(&p, n, bs, drop_last, r, world, even);
                        if (even || drop_last) {
                            if (batches0 < 0) batches0 = p.rank_batches;
                            assert_int_equal(p.rank_batches, batches0);
                        }
                        for (int64_t b = 0; b < p.rank_batches; b++) {
                            int64_t start, size, pad;
                            ca_shard_plan_batch(&p, b, &start, &size, &pad);
                            if (even || drop_last) assert_int_equal(size, bs);
                            for (int64_t t = 0; t < size - pad; t++) seen[perm[start + t]]++;
                        }
                        counted += ca_shard_plan_samples(&p);
                    }
                    int64_t expect = drop_last ? (n / bs) / world * world * bs : n;
                    assert_int_equal(counted, expect);
                    int64_t distinct = 0;
                    for (int64_t i = 0; i < n; i++) {
                        assert_true(seen[i] <= 1);
                        distinct += seen[i];
                    }
                    assert_int_equal(distinct, expect);
                }
}

/* Global step s on N ranks = batch s of one rank with batch size N * bs. */
static void test_plan_global_batch(void **state) {
    (void)state;
    enum { N = 50 };
    int64_t perm[N];
    ca_permutation(true, 5, 1, N, perm);
    for (int world = 2; world <= 4; world++)
        for (int64_t bs = 1; bs <= 7; bs++)
            for (int flags = 0; flags < 4; flags++) {
                bool drop_last = flags & 1, even = flags & 2;
                ca_shard_plan one;
                ca_shard_plan_init(&one, N, bs * world, drop_last, 0, 1, even);
                for (int r = 0; r < world; r++) {
                    ca_shard_plan p;
                    ca_shard_plan_init(&p, N, bs, drop_last, r, world, even);
                    for (int64_t s = 0; s < p.rank_batches; s++) {
                        int64_t start, size, pad, ostart, osize, opad;
                        ca_shard_plan_batch(&p, s, &start, &size, &pad);
                        assert_true(s < one.rank_batches);
                        ca_shard_plan_batch(&one, s, &ostart, &osize, &opad);
                        for (int64_t t = 0; t < size - pad; t++) {
                            int64_t k = r * bs + t;       /* position inside the global batch */
                            assert_true(k < osize);
                            assert_int_equal(perm[start + t], perm[ostart + k]);
                        }
                    }
                }
            }
}

/* Deterministic mode: virtual shard v of global step s is the same stream slice on 1, 2 and 4
 * ranks (rank v / parts, micro-batch v % parts), the last global batch is padded (or dropped) at
 * every world size, and the padding counts follow the samples. */
static void test_det_virtual_shards(void **state) {
    (void)state;
    enum { V = 4, G = 8 };
    int64_t ns[] = {21, 24, 3, 8, 1};
    for (size_t in = 0; in < sizeof ns / sizeof *ns; in++)
        for (int drop = 0; drop < 2; drop++) {
            int64_t n = ns[in], steps = drop ? n / G : (n + G - 1) / G;
            for (int world = 1; world <= 4; world *= 2) {
                int parts = V / world;
                for (int r = 0; r < world; r++) {
                    ca_shard_plan p;
                    ca_shard_plan_init_det(&p, n, G / world, drop, r, world);
                    assert_int_equal(p.rank_batches, steps);
                    assert_int_equal(p.total, steps * G);
                    for (int64_t b = 0; b < steps; b++)
                        for (int part = 0; part < parts; part++) {
                            int64_t v = (int64_t)r * parts + part, start, size, pad;
                            ca_shard_plan_part(&p, parts, b, part, &start, &size, &pad);
                            assert_int_equal(start, b * G + v * (G / V));     /* world-independent */
                            assert_int_equal(size, G / V);
                            int64_t real = n - start;                        /* positions >= n are padding */
                            int64_t want = real >= size ? 0 : real <= 0 ? size : size - real;
                            assert_int_equal(pad, want);
                        }
                }
            }
        }
}

/* ------------------------------------------------------------- Accelerate's lists */

/* Parses a Python list literal ("[[[0,1],[4,5]],[[2,3]]]") into groups: a '['
 * reaching depth `level` opens a batch, one reaching level - 1 opens the next
 * group. Returns the number of groups. */
static int parse_lists(const char *s, int level, ca_index_batches *groups, int max) {
    int depth = 0, g = -1;
    int64_t buf[4096], len = 0;
    for (const char *c = s; *c; c++) {
        if (*c == '[') {
            depth++;
            if (depth == level - 1) g++;
            if (depth == level) len = 0;
        } else if (*c == ']') {
            if (depth == level) {
                assert_true(g >= 0 && g < max);
                assert_int_equal(ca_index_batches_push(&groups[g], buf, len, 0), CA_OK);
            }
            depth--;
        } else if (*c >= '0' && *c <= '9') {
            char *end;
            assert_true(len < 4096);
            buf[len++] = strtoll(c, &end, 10);
            c = end - 1;
        }
    }
    if (level == 1) return 1;
    return g + 1;
}

static void assert_batches_equal(const ca_index_batches *got, const ca_index_batches *want, const char *what) {
    if (got->count != want->count) fail_msg("%s: %lld batches, Accelerate gives %lld", what,
                                            (long long)got->count, (long long)want->count);
    for (int64_t b = 0; b < want->count; b++) {
        if (ca_index_batches_len(got, b) != ca_index_batches_len(want, b))
            fail_msg("%s: batch %lld has %lld samples, Accelerate's %lld", what, (long long)b,
                     (long long)ca_index_batches_len(got, b), (long long)ca_index_batches_len(want, b));
        for (int64_t t = 0; t < ca_index_batches_len(want, b); t++)
            if (got->idx[got->off[b] + t] != want->idx[want->off[b] + t])
                fail_msg("%s: batch %lld position %lld is %lld, Accelerate's %lld", what, (long long)b,
                         (long long)t, (long long)got->idx[got->off[b] + t], (long long)want->idx[want->off[b] + t]);
    }
}

/* The plan's batches of one rank with the identity permutation, with their padding. */
static void plan_batches(const ca_shard_plan *p, ca_index_batches *out) {
    int64_t buf[64];
    for (int64_t b = 0; b < p->rank_batches; b++) {
        int64_t start, size, pad;
        ca_shard_plan_batch(p, b, &start, &size, &pad);
        assert_true(size <= 64);
        int64_t npad = 0;
        for (int64_t t = 0; t < size; t++) {
            buf[t] = (start + t) % p->n;
            npad += start + t >= p->n;
        }
        assert_int_equal(npad, pad);
        assert_int_equal(ca_index_batches_push(out, buf, size, pad), CA_OK);
    }
}

/* BatchSamplerShard at 1 to 4 processes, with and without split_batches,
 * even_batches and drop_last (Accelerate's test_batch_sampler_shards_* cases at
 * 2 processes are among them): the loader's plan and the custom-sampler shard
 * both give Accelerate's lists, with the same padding counts. */
static void test_sampler_shard_lists(void **state) {
    (void)state;
    char what[160];
    for (size_t c = 0; c < sizeof accel_sampler_cases / sizeof *accel_sampler_cases; c++) {
        const struct accel_sampler_case *k = &accel_sampler_cases[c];
        ca_index_batches want[4] = {{0}}, in = {0};
        assert_int_equal(parse_lists(k->want, 3, want, 4), k->world);
        for (int64_t b = 0; b * k->bs < k->n; b++) {   /* BatchSampler(range(n), bs, drop_last) */
            int64_t buf[8], len = 0;
            for (int64_t i = b * k->bs; i < k->n && i < (b + 1) * k->bs; i++) buf[len++] = i;
            if (len == k->bs || !k->drop_last) assert_int_equal(ca_index_batches_push(&in, buf, len, 0), CA_OK);
        }
        for (int r = 0; r < k->world; r++) {
            snprintf(what, sizeof what, "n=%d bs=%d drop_last=%d split=%d even=%d rank %d of %d", k->n, k->bs,
                     k->drop_last, k->split, k->even, r, k->world);
            ca_shard_plan p;
            if (k->split)
                ca_shard_plan_init_split(&p, k->n, k->bs, k->drop_last, r, k->world, k->even);
            else
                ca_shard_plan_init(&p, k->n, k->bs, k->drop_last, r, k->world, k->even);
            ca_index_batches got = {0}, shard = {0};
            plan_batches(&p, &got);
            assert_batches_equal(&got, &want[r], what);
            int64_t real = got.count ? got.off[got.count] : 0;
            for (int64_t b = 0; b < got.count; b++) real -= got.pad[b];
            assert_int_equal(ca_shard_plan_samples(&p), real);
            assert_int_equal(ca_batch_sampler_shard(&in, k->bs, k->drop_last, r, k->world, k->split, k->even,
                                                    &shard), CA_OK);
            assert_batches_equal(&shard, &want[r], what);
            for (int64_t b = 0; b < got.count; b++) assert_int_equal(shard.pad[b], got.pad[b]);
            ca_index_batches_free(&got);
            ca_index_batches_free(&shard);
            ca_index_batches_free(&want[r]);
        }
        ca_index_batches_free(&in);
    }
}

/* A batch sampler whose batches vary in size (Accelerate's batch_size None),
 * including test_batch_sampler_with_varying_batch_size and
 * test_batch_sampler_varying_batch_size_even_batches. */
static void test_sampler_shard_varying(void **state) {
    (void)state;
    for (size_t c = 0; c < sizeof accel_varying_cases / sizeof *accel_varying_cases; c++) {
        const struct accel_varying_case *k = &accel_varying_cases[c];
        ca_index_batches in = {0}, want[4] = {{0}};
        assert_int_equal(parse_lists(k->batches, 2, &in, 1), 1);
        assert_int_equal(parse_lists(k->want, 3, want, 4), k->world);
        for (int r = 0; r < k->world; r++) {
            char what[96];
            snprintf(what, sizeof what, "case %zu even=%d rank %d of %d", c, k->even, r, k->world);
            ca_index_batches got = {0};
            assert_int_equal(ca_batch_sampler_shard(&in, 0, false, r, k->world, false, k->even, &got), CA_OK);
            assert_batches_equal(&got, &want[r], what);
            ca_index_batches_free(&got);
            ca_index_batches_free(&want[r]);
        }
        ca_index_batches_free(&in);
    }
    /* split_batches needs a batch size that the processes divide, as in Accelerate */
    ca_index_batches in = {0}, out = {0};
    int64_t b[3] = {0, 1, 2};
    assert_int_equal(ca_index_batches_push(&in, b, 3, 0), CA_OK);
    assert_int_equal(ca_batch_sampler_shard(&in, 3, false, 0, 2, true, true, &out), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "batch_size (3) must be a multiple of the number of processes (2)"));
    assert_int_equal(ca_batch_sampler_shard(&in, 0, false, 0, 2, true, true, &out), CA_ERR_INVALID);
    ca_index_batches_free(&in);
    ca_index_batches_free(&out);
}

/* split_batches on N ranks = the same global batches as one rank: slice r of batch s. */
static void test_plan_split_global_batch(void **state) {
    (void)state;
    for (int world = 2; world <= 4; world++)
        for (int64_t bs = world; bs <= 4 * world; bs += world)
            for (int64_t n = 1; n <= 40; n++)
                for (int flags = 0; flags < 4; flags++) {
                    bool drop_last = flags & 1, even = flags & 2;
                    ca_shard_plan one;
                    ca_shard_plan_init(&one, n, bs, drop_last, 0, 1, even);
                    for (int r = 0; r < world; r++) {
                        ca_shard_plan p;
                        ca_shard_plan_init_split(&p, n, bs, drop_last, r, world, even);
                        assert_true(p.rank_batches == one.rank_batches || p.rank_batches == one.rank_batches - 1);
                        for (int64_t b = 0; b < p.rank_batches; b++) {
                            int64_t start, size, pad, os, osz, op;
                            ca_shard_plan_batch(&p, b, &start, &size, &pad);
                            ca_shard_plan_batch(&one, b, &os, &osz, &op);
                            assert_int_equal(start, os + r * (bs / world));
                            for (int64_t t = 0; t < size - pad; t++) assert_true(start + t < os + osz);
                        }
                    }
                }
}

/* ------------------------------------------------------- dispatched batches */

/* A model of Accelerate's DataLoaderDispatcher over the ids 0 .. n-1 read in order
 * by process 0's loader (batches of bs, drop_last), written from its source:
 * _fetch_batches takes `world` loader batches (one with split) and concatenates
 * them; at the end a group of fewer than world batches is still sent unless
 * drop_last. __iter__ keeps the first `world` ids of the first global batch; a
 * last global batch of m ids that world does not divide gets them appended and
 * each process m / world + 1 ids; process r keeps [r * k, (r + 1) * k) of it,
 * clamped to its length as Python's slicing is. Writes rank's ids of global
 * step `step` into ids and how many of them are appended ones into *rep;
 * returns their number, -1 past the last step. */
static int64_t accelerate_dispatch(int64_t n, int64_t bs, bool drop_last, bool split, int world, int rank,
                                   int64_t step, int64_t *ids, int64_t *rep) {
    int64_t loader_batches = drop_last ? n / bs : (n + bs - 1) / bs;
    int64_t group = split ? 1 : world;
    int64_t groups = drop_last ? loader_batches / group : (loader_batches + group - 1) / group;
    if (step >= groups) return -1;
    int64_t lo = step * group * bs, hi = lo + group * bs;
    if (hi > n) hi = n;
    int64_t m = hi - lo, k = m / world, ext[1024], len = 0;
    for (int64_t i = lo; i < hi; i++) ext[len++] = i;
    bool last = step == groups - 1;
    if (!drop_last && last && m % world) {
        int64_t first_len = group * bs < n ? group * bs : n;
        for (int64_t i = 0; i < world && i < first_len; i++) ext[len++] = i;
        k++;
    }
    int64_t a = rank * k < len ? rank * k : len, b = (rank + 1) * k < len ? (rank + 1) * k : len;
    *rep = 0;
    for (int64_t i = a; i < b; i++) {
        ids[i - a] = ext[i];
        *rep += i >= m;
    }
    return b - a;
}

/* The loader's composition: process 0's plan over global batches (one process),
 * completed by ca_dispatch_padded from the epoch's first ids (cyclically when the
 * epoch has fewer than world, dataloader.c's fill_slot), sliced by
 * ca_dispatch_slice. Returns the ids and the repeats of rank's step. */
static int64_t caccel_dispatch(int64_t n, int64_t bs, bool drop_last, bool split, int world, int rank,
                               int64_t step, int64_t *ids, int64_t *pad) {
    ca_shard_plan p;
    ca_shard_plan_init(&p, n, split ? bs : bs * world, drop_last, 0, 1, true);
    if (step >= p.rank_batches) return -1;
    int64_t start, m, unused, first, len;
    ca_shard_plan_batch(&p, step, &start, &m, &unused);
    int64_t size = ca_dispatch_padded(m, world), lim = n < world ? n : world;
    ca_dispatch_slice(size, size - m, rank, world, &first, &len, pad);
    for (int64_t t = 0; t < len; t++) {
        int64_t q = first + t;
        ids[t] = q < m ? start + q : (q - m) % lim;
    }
    return len;
}

/* Every (n, batch, world, split, drop_last): the same ids per rank and step as
 * Accelerate, the repeats counted; where Accelerate hands a process an empty or
 * short slice (an epoch of fewer than world / 2 samples), caccel's slice starts
 * with Accelerate's ids and completes it cyclically (docs/DATA.md). */
static void test_dispatch_matches_accelerate(void **state) {
    (void)state;
    int short_cases = 0;
    for (int world = 2; world <= 5; world++)
        for (int64_t bs = 1; bs <= 12; bs++)
            for (int64_t n = 1; n <= 50; n++)
                for (int flags = 0; flags < 4; flags++) {
                    bool drop_last = flags & 1, split = flags & 2;
                    if (split && bs % world) continue;
                    for (int64_t step = 0;; step++) {
                        int64_t want[1024], got[1024], pad = 0, rep = 0, len0 = -2;
                        for (int r = 0; r < world; r++) {
                            int64_t a = accelerate_dispatch(n, bs, drop_last, split, world, r, step, want, &rep);
                            int64_t c = caccel_dispatch(n, bs, drop_last, split, world, r, step, got, &pad);
                            if (a < 0 || c < 0) {
                                assert_true(a < 0 && c < 0);   /* the same number of steps */
                                break;
                            }
                            if (len0 == -2) len0 = c;
                            assert_int_equal(c, len0);         /* every rank the same size */
                            assert_true(pad >= 0 && pad <= c);
                            if (a == c) {
                                assert_memory_equal(want, got, sizeof *got * (size_t)c);
                                assert_int_equal(pad, rep);
                            } else {
                                assert_true(a < c && 2 * n < world);
                                assert_memory_equal(want, got, sizeof *got * (size_t)a);
                                short_cases++;
                            }
                        }
                        if (len0 == -2) break;
                    }
                }
    assert_true(short_cases > 0);
}

/* The repeats: DataLoaderDispatcher's remainder is the real size of the last
 * global batch, so the padding sits at its end: the last ranks' slices. */
static void test_dispatch_slice(void **state) {
    (void)state;
    assert_int_equal(ca_dispatch_padded(10, 3), 12);
    assert_int_equal(ca_dispatch_padded(9, 3), 9);
    assert_int_equal(ca_dispatch_padded(2, 4), 4);
    assert_int_equal(ca_dispatch_padded(7, 1), 7);
    int64_t first, len, pad;
    /* 4 real + 2 repeats over 3 ranks: [6,7] [8,9] [0,1] */
    ca_dispatch_slice(6, 2, 2, 3, &first, &len, &pad);
    assert_int_equal(first, 4);
    assert_int_equal(len, 2);
    assert_int_equal(pad, 2);
    ca_dispatch_slice(6, 2, 1, 3, &first, &len, &pad);
    assert_int_equal(pad, 0);
    /* 5 real + 3 repeats over 4 ranks of 2: rank 2 holds one repeat, rank 3 two */
    ca_dispatch_slice(8, 3, 2, 4, &first, &len, &pad);
    assert_int_equal(pad, 1);
    ca_dispatch_slice(8, 3, 3, 4, &first, &len, &pad);
    assert_int_equal(first, 6);
    assert_int_equal(pad, 2);
    /* the repeats of all ranks add up to the batch's */
    for (int world = 2; world <= 6; world++)
        for (int64_t m = 1; m <= 40; m++) {
            int64_t size = ca_dispatch_padded(m, world), total = 0;
            assert_int_equal(size % world, 0);
            assert_true(size - m < world);
            for (int r = 0; r < world; r++) {
                ca_dispatch_slice(size, size - m, r, world, &first, &len, &pad);
                assert_int_equal(first, r * (size / world));
                total += pad;
            }
            assert_int_equal(total, size - m);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_permutation),
        cmocka_unit_test(test_permutation_golden),
        cmocka_unit_test(test_below_uniform),
        cmocka_unit_test(test_plan_matches_accelerate),
        cmocka_unit_test(test_plan_lengths),
        cmocka_unit_test(test_plan_disjoint_covering),
        cmocka_unit_test(test_plan_global_batch),
        cmocka_unit_test(test_det_virtual_shards),
        cmocka_unit_test(test_sampler_shard_lists),
        cmocka_unit_test(test_sampler_shard_varying),
        cmocka_unit_test(test_plan_split_global_batch),
        cmocka_unit_test(test_dispatch_matches_accelerate),
        cmocka_unit_test(test_dispatch_slice),
    };
    return cmocka_run_group_tests_name("data_sampler", tests, NULL, NULL);
}
