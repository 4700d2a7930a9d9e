/* Tests of the DataLoader: batching, shuffle, sharding, padding, resume, casts, errors, threads, scopes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <caccel/caccel.h>

#include "tests/accelerate_shards.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------- helpers */

/* n samples: x = i32 [2] {i, 7i + 1}, y = i64 i. */
static ca_dataset *id_dataset(int64_t n) {
    int32_t *x = malloc(sizeof(int32_t) * 2 * (size_t)(n ? n : 1));
    int64_t *y = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    assert_true(x && y);
    for (int64_t i = 0; i < n; i++) {
        x[2 * i] = (int32_t)i;
        x[2 * i + 1] = (int32_t)(7 * i + 1);
        y[i] = i;
    }
    ca_sample_spec xs = {.dtype = CA_I32, .ndim = 1, .shape = {2}};
    ca_sample_spec ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds = NULL;
    assert_int_equal(ca_dataset_from_memory(&xs, x, &ys, y, n, &ds), CA_OK);
    free(x);
    free(y);
    return ds;
}

static ca_dataloader *loader(ca_dataset *ds, ca_loader_opts o) {
    ca_dataloader *dl = NULL;
    assert_int_equal(ca_dataloader_create(ds, &o, &dl), CA_OK);
    assert_non_null(dl);
    return dl;
}

/* Checks the batch's tensors and appends its sample ids (from y) to ids. */
static void read_batch(const ca_batch *b, int64_t *ids, int64_t *nids) {
    assert_non_null(b->x);
    assert_non_null(b->y);
    assert_int_equal(ca_tensor_dtype(b->x), CA_I32);
    assert_int_equal(ca_tensor_ndim(b->x), 2);
    assert_int_equal(ca_tensor_shape(b->x)[0], b->size);
    assert_int_equal(ca_tensor_shape(b->x)[1], 2);
    assert_int_equal(ca_tensor_dtype(b->y), CA_I64);
    assert_int_equal(ca_tensor_ndim(b->y), 1);
    assert_int_equal(ca_tensor_shape(b->y)[0], b->size);
    int32_t x[2 * 512];
    int64_t y[512];
    assert_true(b->size <= 512);
    assert_int_equal(ca_tensor_to_host(b->x, x, sizeof(int32_t) * 2 * (size_t)b->size), CA_OK);
    assert_int_equal(ca_tensor_to_host(b->y, y, sizeof(int64_t) * (size_t)b->size), CA_OK);
    for (int64_t t = 0; t < b->size; t++) {
        assert_int_equal(x[2 * t], y[t]);             /* x and y come from the same sample */
        assert_int_equal(x[2 * t + 1], 7 * y[t] + 1);
        ids[(*nids)++] = y[t];
    }
}

/* One full epoch: ids in order, batch sizes and padding counts. Returns batches. */
typedef struct epoch_rec {
    int64_t ids[4096];
    int64_t nids;
    int64_t sizes[1024];
    int64_t padded[1024];
    int64_t nbatches;
    int64_t epoch;
} epoch_rec;

static void run_epoch(ca_dataloader *dl, epoch_rec *r) {
    memset(r, 0, sizeof *r);
    r->epoch = ca_dataloader_epoch(dl);
    ca_batch b;
    while (ca_dataloader_next(dl, &b)) {
        assert_int_equal(b.index, r->nbatches);
        assert_int_equal(b.epoch, r->epoch);
        assert_true(r->nbatches < 1024);
        r->sizes[r->nbatches] = b.size;
        r->padded[r->nbatches] = b.num_padded;
        r->nbatches++;
        read_batch(&b, r->ids, &r->nids);
    }
    assert_int_equal(ca_dataloader_status(dl), CA_OK);
    assert_int_equal(ca_dataloader_epoch(dl), r->epoch + 1);
}

static void assert_contains(const char *hay, const char *needle) {
    if (!strstr(hay, needle)) fail_msg("'%s' does not contain '%s'", hay, needle);
}

/* ------------------------------------------------------------- batching */

static void test_batch_counts(void **state) {
    (void)state;
    ca_dataset *ds = id_dataset(10);
    ca_dataloader *dl = loader(ds, (ca_loader_opts){.batch_size = 3});
    assert_int_equal(ca_dataloader_num_batches(dl), 4);
    assert_int_equal(ca_dataloader_num_samples(dl), 10);
    static epoch_rec r;
    run_epoch(dl, &r);
    assert_int_equal(r.nbatches, 4);
    int64_t want_sizes[] = {3, 3, 3, 1};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(r.sizes[i], want_sizes[i]);
        assert_int_equal(r.padded[i], 0);
    }
    for (int64_t i = 0; i < 10; i++) assert_int_equal(r.ids[i], i);   /* no shuffle: in order */
    ca_dataloader_destroy(dl);

    dl = loader(ds, (ca_loader_opts){.batch_size = 3, .drop_last = true});
    assert_int_equal(ca_dataloader_num_batches(dl), 3);
    assert_int_equal(ca_dataloader_num_samples(dl), 9);
    run_epoch(dl, &r);
    assert_int_equal(r.nbatches, 3);
    assert_int_equal(r.nids, 9);
    ca_dataloader_destroy(dl);

    /* Defaults: batch size 1. */
    dl = loader(ds, (ca_loader_opts){0});
    assert_int_equal(ca_dataloader_num_batches(dl), 10);
    ca_dataloader_destroy(dl);
    assert_int_equal(ca_dataloader_create(ds, NULL, &dl), CA_OK);
    assert_int_equal(ca_dataloader_num_batches(dl), 10);
    ca_dataloader_destroy(dl);
    ca_dataloader_destroy(NULL);

    /* Bad options. */
    ca_loader_opts bad = {.batch_size = -2};
    assert_int_equal(ca_dataloader_create(ds, &bad, &dl), CA_ERR_INVALID);
    assert_null(dl);
    assert_int_equal(ca_dataloader_create(NULL, NULL, &dl), CA_ERR_INVALID);
    ca_dataset_destroy(ds);

    /* An empty dataset is an error, not epochs of nothing that report a loss of 0. */
    ds = id_dataset(0);
    dl = NULL;
    assert_int_equal(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = 4, .shuffle = true}, &dl),
                     CA_ERR_INVALID);
    assert_null(dl);
    assert_non_null(strstr(ca_last_error(), "dataloader: in-memory dataset has no items"));
    ca_dataset_destroy(ds);
}

static void test_every_sample_once(void **state) {
    (void)state;
    ca_dataset *ds = id_dataset(1000);
    for (int prefetch = 1; prefetch <= 5; prefetch += 2) {
        ca_dataloader *dl =
            loader(ds, (ca_loader_opts){.batch_size = 32, .shuffle = true, .seed = 11, .prefetch = prefetch});
        static epoch_rec r;
        for (int e = 0; e < 2; e++) {
            run_epoch(dl, &r);
            assert_int_equal(r.nbatches, 32);
            assert_int_equal(r.sizes[31], 1000 - 31 * 32);
            assert_int_equal(r.nids, 1000);
            static int seen[1000];
            memset(seen, 0, sizeof seen);
            int in_place = 0;
            for (int64_t i = 0; i < 1000; i++) {
                assert_true(r.ids[i] >= 0 && r.ids[i] < 1000);
                assert_int_equal(seen[r.ids[i]]++, 0);
                in_place += r.ids[i] == i;
            }
            assert_true(in_place < 20);   /* it is shuffled */
        }
        ca_dataloader_destroy(dl);
    }
    ca_dataset_destroy(ds);
}

static void test_permutation_by_seed_and_epoch(void **state) {
    (void)state;
    ca_dataset *ds = id_dataset(300);
    static epoch_rec a0, a1, b0, b1, c0;
    ca_dataloader *a = loader(ds, (ca_loader_opts){.batch_size = 16, .shuffle = true, .seed = 5});
    ca_dataloader *b = loader(ds, (ca_loader_opts){.batch_size = 16, .shuffle = true, .seed = 5, .prefetch = 1});
    run_epoch(a, &a0);
    run_epoch(a, &a1);                                   /* epoch advanced by itself */
    assert_int_equal(a1.epoch, 1);
    run_epoch(b, &b0);
    assert_memory_equal(a0.ids, b0.ids, sizeof a0.ids);  /* same (seed, epoch): same order */
    assert_true(memcmp(a0.ids, a1.ids, sizeof a0.ids) != 0);
    assert_int_equal(ca_dataloader_set_epoch(b, 1), CA_OK);
    run_epoch(b, &b1);
    assert_memory_equal(a1.ids, b1.ids, sizeof a1.ids);
    assert_int_equal(ca_dataloader_set_epoch(b, -1), CA_ERR_INVALID);

    /* An explicit seed wins over ca_dataloader_set_seed (ca_set_seed). */
    assert_int_equal(ca_dataloader_set_seed(b, 99), CA_OK);
    assert_int_equal(ca_dataloader_set_epoch(b, 0), CA_OK);
    run_epoch(b, &b0);
    assert_memory_equal(a0.ids, b0.ids, sizeof a0.ids);

    /* seed 0: the seed given by set_seed, else 0. */
    ca_dataloader *c = loader(ds, (ca_loader_opts){.batch_size = 16, .shuffle = true});
    run_epoch(c, &c0);
    assert_true(memcmp(c0.ids, a0.ids, sizeof c0.ids) != 0);
    assert_int_equal(ca_dataloader_set_seed(c, 5), CA_OK);
    assert_int_equal(ca_dataloader_set_epoch(c, 0), CA_OK);
    run_epoch(c, &c0);
    assert_memory_equal(c0.ids, a0.ids, sizeof c0.ids);
    ca_dataloader_destroy(a);
    ca_dataloader_destroy(b);
    ca_dataloader_destroy(c);
    ca_dataset_destroy(ds);
}

/* ------------------------------------------------------------- sharding */

static void test_shards_disjoint_covering(void **state) {
    (void)state;
    const int64_t n = 103, bs = 4;   /* 26 batches, the last of 3 */
    ca_dataset *ds = id_dataset(n);
    static epoch_rec r;
    for (int world = 2; world <= 4; world++)
        for (int mode = 0; mode < 3; mode++) {
            bool even = mode == 0, drop_last = mode == 2;
            int count[103] = {0};
            int64_t total = 0, batches0 = -1, padded = 0;
            for (int rank = 0; rank < world; rank++) {
                ca_dataloader *dl = loader(
                    ds, (ca_loader_opts){.batch_size = bs, .shuffle = true, .seed = 3, .drop_last = drop_last});
                assert_int_equal(ca_dataloader_shard(dl, rank, world, even), CA_OK);
                run_epoch(dl, &r);
                assert_int_equal(r.nbatches, ca_dataloader_num_batches(dl));
                if (even || drop_last) {
                    if (batches0 < 0) batches0 = r.nbatches;
                    assert_int_equal(r.nbatches, batches0);    /* every rank the same count */
                }
                int64_t pos = 0, real = 0;
                for (int64_t k = 0; k < r.nbatches; k++) {
                    if (even || drop_last) assert_int_equal(r.sizes[k], bs);
                    for (int64_t t = 0; t < r.sizes[k]; t++, pos++)
                        if (t < r.sizes[k] - r.padded[k]) {
                            count[r.ids[pos]]++;
                            real++;
                        }
                    padded += r.padded[k];
                }
                assert_int_equal(real, ca_dataloader_num_samples(dl));
                total += real;
                ca_dataloader_destroy(dl);
            }
            int64_t expect = drop_last ? (n / bs) / world * world * bs : n;
            assert_int_equal(total, expect);
            for (int64_t i = 0; i < n; i++) assert_true(count[i] <= 1);   /* disjoint */
            if (!drop_last) {
                for (int64_t i = 0; i < n; i++) assert_int_equal(count[i], 1);   /* covering */
                if (even) assert_int_equal(padded + n, batches0 * world * bs);
                else assert_int_equal(padded, 0);
            }
        }
    ca_dataset_destroy(ds);
}

/* Global step s on N ranks covers exactly batch s of one rank with batch size N * bs. */
static void test_global_batch_equivalence(void **state) {
    (void)state;
    const int64_t n = 97, bs = 5;
    ca_dataset *ds = id_dataset(n);
    static epoch_rec one, r[4];
    for (int world = 2; world <= 4; world++)
        for (int even = 0; even < 2; even++) {
            ca_dataloader *single =
                loader(ds, (ca_loader_opts){.batch_size = bs * world, .shuffle = true, .seed = 17});
            assert_int_equal(ca_dataloader_set_epoch(single, 2), CA_OK);
            run_epoch(single, &one);
            for (int rank = 0; rank < world; rank++) {
                ca_dataloader *dl = loader(ds, (ca_loader_opts){.batch_size = bs, .shuffle = true, .seed = 17});
                assert_int_equal(ca_dataloader_shard(dl, rank, world, even), CA_OK);
                assert_int_equal(ca_dataloader_set_epoch(dl, 2), CA_OK);
                run_epoch(dl, &r[rank]);
                ca_dataloader_destroy(dl);
            }
            int64_t opos = 0;
            for (int64_t s = 0; s < one.nbatches; s++) {
                int64_t k = 0;   /* position inside the global batch */
                for (int rank = 0; rank < world; rank++) {
                    if (s >= r[rank].nbatches) continue;
                    int64_t start = 0;
                    for (int64_t j = 0; j < s; j++) start += r[rank].sizes[j];
                    for (int64_t t = 0; t < r[rank].sizes[s] - r[rank].padded[s]; t++, k++)
                        assert_int_equal(r[rank].ids[start + t], one.ids[opos + k]);
                }
                assert_int_equal(k, one.sizes[s]);
                opos += one.sizes[s];
            }
            ca_dataloader_destroy(single);
        }
    ca_dataset_destroy(ds);
}

static void test_num_padded(void **state) {
    (void)state;
    ca_dataset *ds = id_dataset(10);
    static epoch_rec r;
    /* 10 samples, batch 3, 3 ranks: the global stream 0..9 is padded with
     * 0..7 to 6 batches; rank r gets global batches r and r + 3. */
    const int64_t want[3][6] = {{0, 1, 2, 9, 0, 1}, {3, 4, 5, 2, 3, 4}, {6, 7, 8, 5, 6, 7}};
    const int64_t want_pad[3] = {2, 3, 3};
    for (int rank = 0; rank < 3; rank++) {
        ca_dataloader *dl = loader(ds, (ca_loader_opts){.batch_size = 3});
        assert_int_equal(ca_dataloader_shard(dl, rank, 3, true), CA_OK);
        assert_int_equal(ca_dataloader_num_batches(dl), 2);
        assert_int_equal(ca_dataloader_num_samples(dl), rank == 0 ? 4 : 3);
        run_epoch(dl, &r);
        assert_int_equal(r.nbatches, 2);
        assert_int_equal(r.padded[0], 0);
        assert_int_equal(r.padded[1], want_pad[rank]);
        assert_memory_equal(r.ids, want[rank], sizeof want[rank]);
        ca_dataloader_destroy(dl);

        /* Without even_batches: rank 0 gets a short batch [9], the others one batch. */
        dl = loader(ds, (ca_loader_opts){.batch_size = 3});
        assert_int_equal(ca_dataloader_shard(dl, rank, 3, false), CA_OK);
        run_epoch(dl, &r);
        assert_int_equal(r.nbatches, rank == 0 ? 2 : 1);
        if (rank == 0) {
            assert_int_equal(r.sizes[1], 1);
            assert_int_equal(r.ids[3], 9);
            assert_int_equal(r.padded[1], 0);
        }
        ca_dataloader_destroy(dl);
    }
    ca_dataloader *dl = loader(ds, (ca_loader_opts){.batch_size = 3});
    assert_int_equal(ca_dataloader_shard(dl, 3, 3, true), CA_ERR_INVALID);
    assert_int_equal(ca_dataloader_shard(dl, 0, 0, true), CA_ERR_INVALID);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
}

/* ------------------------------------------------------------- resume */

static void test_skip_batches(void **state) {
    (void)state;
    ca_dataset *ds = id_dataset(200);
    static epoch_rec full, full1, part;
    ca_loader_opts o = {.batch_size = 8, .shuffle = true, .seed = 77};
    ca_dataloader *ref = loader(ds, o);
    assert_int_equal(ca_dataloader_shard(ref, 1, 2, true), CA_OK);
    assert_int_equal(ca_dataloader_set_epoch(ref, 4), CA_OK);
    run_epoch(ref, &full);
    run_epoch(ref, &full1);
    assert_int_equal(full.nbatches, 13);

    /* Resume at epoch 4, batch 5: the same batches as the uninterrupted run. */
    ca_dataloader *dl = loader(ds, o);
    assert_int_equal(ca_dataloader_shard(dl, 1, 2, true), CA_OK);
    assert_int_equal(ca_dataloader_skip_batches(dl, 5), CA_OK);
    assert_int_equal(ca_dataloader_set_epoch(dl, 4), CA_OK);   /* order of the two calls is free */
    ca_batch b;
    int64_t ids[4096], nids = 0, expect_index = 5;
    while (ca_dataloader_next(dl, &b)) {
        assert_int_equal(b.index, expect_index++);
        assert_int_equal(b.epoch, 4);
        read_batch(&b, ids, &nids);
    }
    assert_int_equal(expect_index, 13);
    assert_int_equal(nids, full.nids - 5 * 8);
    assert_memory_equal(ids, full.ids + 5 * 8, sizeof(int64_t) * (size_t)nids);
    /* The skip is for one pass only: epoch 5 starts at batch 0. */
    run_epoch(dl, &part);
    assert_int_equal(part.epoch, 5);
    assert_int_equal(part.nbatches, 13);
    assert_memory_equal(part.ids, full1.ids, sizeof part.ids);

    /* Skipping everything gives an empty pass that still ends the epoch. */
    assert_int_equal(ca_dataloader_skip_batches(dl, 13), CA_OK);
    assert_false(ca_dataloader_next(dl, &b));
    assert_int_equal(ca_dataloader_status(dl), CA_OK);
    assert_int_equal(ca_dataloader_epoch(dl), 7);
    assert_int_equal(ca_dataloader_skip_batches(dl, 14), CA_ERR_INVALID);
    assert_contains(ca_last_error(), "13");
    assert_int_equal(ca_dataloader_skip_batches(dl, -1), CA_ERR_INVALID);
    ca_dataloader_destroy(dl);
    ca_dataloader_destroy(ref);
    ca_dataset_destroy(ds);
}

/* Changing settings mid-pass abandons the pass; the next one uses the new settings. */
static void test_change_mid_pass(void **state) {
    (void)state;
    ca_dataset *ds = id_dataset(120);
    static epoch_rec ref5, ref_seed, ref_shard;
    ca_loader_opts o = {.batch_size = 10, .shuffle = true};
    ca_dataloader *r = loader(ds, o);
    assert_int_equal(ca_dataloader_set_epoch(r, 5), CA_OK);
    run_epoch(r, &ref5);
    assert_int_equal(ca_dataloader_set_seed(r, 8), CA_OK);
    assert_int_equal(ca_dataloader_set_epoch(r, 5), CA_OK);
    run_epoch(r, &ref_seed);
    assert_int_equal(ca_dataloader_shard(r, 1, 3, true), CA_OK);
    assert_int_equal(ca_dataloader_set_epoch(r, 5), CA_OK);
    run_epoch(r, &ref_shard);
    ca_dataloader_destroy(r);

    ca_dataloader *dl = loader(ds, o);
    ca_batch b;
    static epoch_rec got;
    assert_true(ca_dataloader_next(dl, &b));
    assert_true(ca_dataloader_next(dl, &b));
    assert_int_equal(ca_dataloader_set_epoch(dl, 5), CA_OK);   /* stop early, jump */
    run_epoch(dl, &got);
    assert_int_equal(got.epoch, 5);
    assert_memory_equal(got.ids, ref5.ids, sizeof got.ids);

    assert_int_equal(ca_dataloader_set_epoch(dl, 5), CA_OK);
    assert_true(ca_dataloader_next(dl, &b));
    assert_int_equal(ca_dataloader_set_seed(dl, 8), CA_OK);
    run_epoch(dl, &got);
    assert_memory_equal(got.ids, ref_seed.ids, sizeof got.ids);

    assert_int_equal(ca_dataloader_set_epoch(dl, 5), CA_OK);
    assert_true(ca_dataloader_next(dl, &b));
    assert_true(ca_dataloader_next(dl, &b));
    assert_int_equal(ca_dataloader_shard(dl, 1, 3, true), CA_OK);
    run_epoch(dl, &got);
    assert_int_equal(got.nbatches, 4);
    assert_memory_equal(got.ids, ref_shard.ids, sizeof got.ids);

    /* A setter that changes nothing leaves the pass alone. */
    assert_int_equal(ca_dataloader_set_epoch(dl, 5), CA_OK);
    assert_true(ca_dataloader_next(dl, &b));
    assert_int_equal(b.index, 0);
    assert_int_equal(ca_dataloader_set_epoch(dl, 5), CA_OK);
    assert_int_equal(ca_dataloader_set_device(dl, ca_cpu_device()), CA_OK);
    assert_int_equal(ca_dataloader_shard(dl, 1, 3, true), CA_OK);
    assert_true(ca_dataloader_next(dl, &b));
    assert_int_equal(b.index, 1);
    assert_int_equal(ca_dataloader_set_device(dl, NULL), CA_ERR_INVALID);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
}

/* ------------------------------------------------------------- cast */

static void test_cast_u8_to_f32(void **state) {
    (void)state;
    enum { N = 37 };
    static uint8_t px[N * 2 * 3];
    int64_t lab[N];
    for (int i = 0; i < N * 6; i++) px[i] = (uint8_t)(i * 13 % 256);
    for (int i = 0; i < N; i++) lab[i] = i % 10;
    ca_sample_spec xs = {.dtype = CA_U8, .ndim = 2, .shape = {2, 3}};
    ca_sample_spec ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds = NULL;
    assert_int_equal(ca_dataset_from_memory(&xs, px, &ys, lab, N, &ds), CA_OK);
    ca_dataloader *dl = loader(ds, (ca_loader_opts){.batch_size = 8, .x_dtype = CA_F32,
                                                     .x_dtype_set = true, .x_scale = 1.0f / 255.0f});
    ca_batch b;
    int64_t seen = 0;
    while (ca_dataloader_next(dl, &b)) {
        assert_int_equal(ca_tensor_dtype(b.x), CA_F32);
        assert_int_equal(ca_tensor_ndim(b.x), 3);
        assert_int_equal(ca_tensor_shape(b.x)[0], b.size);
        assert_int_equal(ca_tensor_shape(b.x)[1], 2);
        assert_int_equal(ca_tensor_shape(b.x)[2], 3);
        float xv[8 * 6];
        int64_t yv[8];
        assert_int_equal(ca_tensor_to_host(b.x, xv, sizeof(float) * 6 * (size_t)b.size), CA_OK);
        assert_int_equal(ca_tensor_to_host(b.y, yv, sizeof(int64_t) * (size_t)b.size), CA_OK);
        for (int64_t t = 0; t < b.size; t++) {
            assert_int_equal(yv[t], (seen + t) % 10);
            for (int k = 0; k < 6; k++) {
                float want = px[(seen + t) * 6 + k] / 255.0f;
                assert_true(fabsf(xv[t * 6 + k] - want) < 1e-6f);
            }
        }
        seen += b.size;
    }
    assert_int_equal(seen, N);
    assert_int_equal(ca_dataloader_status(dl), CA_OK);
    ca_dataloader_destroy(dl);

    /* x_scale 0 means 1: plain conversion. */
    dl = loader(ds, (ca_loader_opts){.batch_size = 4, .x_dtype = CA_F32, .x_dtype_set = true});
    assert_true(ca_dataloader_next(dl, &b));
    float xv[4 * 6];
    assert_int_equal(ca_tensor_to_host(b.x, xv, sizeof xv), CA_OK);
    for (int k = 0; k < 24; k++) assert_true(xv[k] == (float)px[k]);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
}

/* ------------------------------------------------------------- errors, threads */

typedef struct failing_ctx {
    int64_t n, bad;
    bool with_message;
    _Atomic int64_t gets;
    _Atomic int slow;               /* get sleeps 1 ms while set (destroy test) */
} failing_ctx;

static int64_t failing_length(void *ctx) { return ((failing_ctx *)ctx)->n; }

static ca_status failing_get(void *ctx, int64_t i, void *x, void *y) {
    failing_ctx *c = ctx;
    atomic_fetch_add(&c->gets, 1);
    if (atomic_load(&c->slow)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (i == c->bad) {
        if (!c->with_message) return CA_ERR_BACKEND;
        ca_status s = ca_error(CA_ERR_IO, "disk on fire while reading record %lld", (long long)i);
        ca_error_hint("call the fire brigade");
        return s;
    }
    int32_t *xi = x;
    xi[0] = (int32_t)i;
    xi[1] = (int32_t)(7 * i + 1);
    *(int64_t *)y = i;
    return CA_OK;
}

static ca_dataset *failing_dataset(failing_ctx *c) {
    ca_dataset_ops ops = {.struct_size = sizeof ops, .length = failing_length, .get = failing_get};
    ca_sample_spec xs = {.dtype = CA_I32, .ndim = 1, .shape = {2}};
    ca_sample_spec ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds = NULL;
    assert_int_equal(ca_dataset_create(&ops, c, &xs, &ys, &ds), CA_OK);
    return ds;
}

static void test_worker_error_surfaces(void **state) {
    (void)state;
    static failing_ctx c = {.n = 40, .bad = 13, .with_message = true};
    ca_dataset *ds = failing_dataset(&c);
    ca_dataloader *dl = loader(ds, (ca_loader_opts){.batch_size = 4});
    ca_batch b;
    int64_t ids[64], nids = 0;
    for (int k = 0; k < 3; k++) {
        assert_true(ca_dataloader_next(dl, &b));
        read_batch(&b, ids, &nids);
    }
    ca_clear_error();
    assert_false(ca_dataloader_next(dl, &b));                /* batch 3 holds sample 13 */
    assert_null(b.x);
    assert_int_equal(ca_dataloader_status(dl), CA_ERR_IO);
    assert_int_equal(ca_last_status(), CA_ERR_IO);
    assert_contains(ca_last_error(), "disk on fire while reading record 13");
    assert_contains(ca_last_error(), "sample 13");
    assert_contains(ca_last_hint(), "fire brigade");
    int64_t epoch = ca_dataloader_epoch(dl);
    assert_int_equal(epoch, 0);                              /* a failed epoch does not count */

    /* Sticky: the loop cannot run on past the failure. */
    ca_clear_error();
    assert_false(ca_dataloader_next(dl, &b));
    assert_int_equal(ca_dataloader_status(dl), CA_ERR_IO);
    assert_contains(ca_last_error(), "disk on fire");

    /* A setter clears it; from batch 4 on the epoch reads fine. */
    assert_int_equal(ca_dataloader_skip_batches(dl, 4), CA_OK);
    assert_int_equal(ca_dataloader_status(dl), CA_OK);
    int n = 0;
    while (ca_dataloader_next(dl, &b)) n++;
    assert_int_equal(n, 6);
    assert_int_equal(ca_dataloader_status(dl), CA_OK);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);

    /* A get failing without a message still gets one. */
    static failing_ctx c2 = {.n = 10, .bad = 0, .with_message = false};
    ds = failing_dataset(&c2);
    dl = loader(ds, (ca_loader_opts){.batch_size = 2});
    assert_false(ca_dataloader_next(dl, &b));
    assert_int_equal(ca_dataloader_status(dl), CA_ERR_BACKEND);
    assert_contains(ca_last_error(), "sample 0");
    assert_contains(ca_last_error(), "CA_ERR_BACKEND");
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
}

static void test_destroy_mid_epoch(void **state) {
    (void)state;
    static failing_ctx c = {.n = 1000000, .bad = -1, .with_message = true};
    ca_dataset *ds = failing_dataset(&c);
    ca_dataloader *dl = loader(ds, (ca_loader_opts){.batch_size = 10, .shuffle = true, .prefetch = 3});
    ca_batch b;
    assert_true(ca_dataloader_next(dl, &b));
    assert_true(ca_dataloader_next(dl, &b));
    ca_dataloader_destroy(dl);                 /* must stop and join the worker */
    int64_t after = atomic_load(&c.gets);
    assert_true(after < c.n);
    /* The worker reads ahead at most `prefetch` batches past those handed out. */
    assert_true(after <= (2 + 3) * 10);
    usleep(20000);
    assert_int_equal(atomic_load(&c.gets), after);   /* nothing runs any more */

    /* Destroy while the worker is busy inside slow gets (it checks for stop
     * before every sample, so this returns within one get, not one epoch). */
    atomic_store(&c.gets, 0);
    atomic_store(&c.slow, 1);
    dl = loader(ds, (ca_loader_opts){.batch_size = 50, .prefetch = 2});
    assert_true(ca_dataloader_next(dl, &b));
    ca_dataloader_destroy(dl);
    after = atomic_load(&c.gets);
    assert_true(after <= (1 + 2) * 50);
    atomic_store(&c.slow, 0);
    ca_dataset_destroy(ds);
}

/* ------------------------------------------------------------- scopes */

static void test_scopes_released(void **state) {
    (void)state;
    ca_dataset *ds = id_dataset(64);
    for (int cast = 0; cast < 2; cast++) {
        ca_loader_opts o = {.batch_size = 5, .shuffle = true};
        if (cast) {
            o.x_dtype = CA_F32;
            o.x_dtype_set = true;
            o.x_scale = 0.5f;
        }
        ca_dataloader *dl = loader(ds, o);
        int64_t base = ca_scope_live_tensors();
        ca_batch b;
        int64_t batches = 0;
        for (int e = 0; e < 8; e++) {
            while (ca_dataloader_next(dl, &b)) {
                batches++;
                /* x and y only; the previous batch (and the raw u8 x) are gone. */
                assert_int_equal(ca_scope_live_tensors(), base + 2);
                /* Tensors made inside the step go with it. */
                ca_tensor *tmp = ca_zeros(ca_cpu_device(), CA_F32, CA_SHAPE(3, 3));
                assert_non_null(tmp);
                assert_int_equal(ca_scope_live_tensors(), base + 3);
            }
            assert_int_equal(ca_scope_live_tensors(), base);
        }
        assert_int_equal(batches, 8 * 13);
        /* A loop left early: destroy ends the open step scope. */
        assert_true(ca_dataloader_next(dl, &b));
        assert_int_equal(ca_scope_live_tensors(), base + 2);
        ca_dataloader_destroy(dl);
        assert_int_equal(ca_scope_live_tensors(), base);
    }
    ca_dataset_destroy(ds);
}

/* ------------------------------------------------------------- Fashion-MNIST */

static void test_fashion_mnist_epoch(void **state) {
    (void)state;
    const char *dir = ca_fashion_mnist_default_dir();
    char probe[4200];
    if (dir) snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", dir);
    if (!dir || access(probe, R_OK) != 0) {
        skip();
        return;
    }
    ca_dataset *ds = NULL;
    assert_int_equal(ca_fashion_mnist_open(NULL, true, &ds), CA_OK);
    ca_dataloader *dl = loader(ds, (ca_loader_opts){.batch_size = 128, .shuffle = true, .seed = 1,
                                                     .x_dtype = CA_F32, .x_dtype_set = true,
                                                     .x_scale = 1.0f / 255.0f});
    assert_int_equal(ca_dataloader_num_batches(dl), 469);
    ca_batch b;
    int64_t seen = 0, nb = 0;
    int64_t classes[10] = {0};
    static float xv[128 * 784];
    int64_t yv[128];
    while (ca_dataloader_next(dl, &b)) {
        assert_int_equal(ca_tensor_ndim(b.x), 3);
        assert_int_equal(ca_tensor_shape(b.x)[1], 28);
        assert_int_equal(ca_tensor_shape(b.x)[2], 28);
        assert_int_equal(ca_tensor_to_host(b.y, yv, sizeof(int64_t) * (size_t)b.size), CA_OK);
        for (int64_t t = 0; t < b.size; t++) {
            assert_true(yv[t] >= 0 && yv[t] < 10);
            classes[yv[t]]++;
        }
        if (nb == 0) {
            assert_int_equal(ca_tensor_to_host(b.x, xv, sizeof xv), CA_OK);
            float lo = 1, hi = 0;
            for (int k = 0; k < 128 * 784; k++) {
                lo = xv[k] < lo ? xv[k] : lo;
                hi = xv[k] > hi ? xv[k] : hi;
            }
            assert_true(lo >= 0.0f && hi <= 1.0f && hi > 0.5f);
        }
        seen += b.size;
        nb++;
    }
    assert_int_equal(ca_dataloader_status(dl), CA_OK);
    assert_int_equal(nb, 469);
    assert_int_equal(seen, 60000);
    for (int k = 0; k < 10; k++) assert_int_equal(classes[k], 6000);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
}

/* ------------------------------------------------------------- Accelerate's lists through the loader */

/* Per-rank expectations parsed from a Python list literal: ids flattened, and
 * batch lengths when the literal has batches (level 3). */
typedef struct want_rank {
    int64_t ids[256], nids;
    int64_t lens[64], nbatches;
} want_rank;

static int parse_want(const char *s, int level, want_rank *w, int max) {
    int depth = 0, r = -1;
    memset(w, 0, sizeof *w * (size_t)max);
    for (const char *c = s; *c; c++) {
        if (*c == '[') {
            if (++depth == 2) r++;
            if (depth == 3) w[r].lens[w[r].nbatches] = 0;
        } else if (*c == ']') {
            if (depth-- == 3) w[r].nbatches++;
        } else if (*c >= '0' && *c <= '9') {
            char *end;
            assert_true(r >= 0 && r < max && w[r].nids < 256);
            w[r].ids[w[r].nids++] = strtoll(c, &end, 10);
            if (level == 3) w[r].lens[w[r].nbatches]++;
            c = end - 1;
        }
    }
    return r + 1;
}

static void assert_ids(const epoch_rec *got, const want_rank *w, bool check_batches, const char *what) {
    if (got->nids != w->nids)
        fail_msg("%s: %lld samples, Accelerate gives %lld", what, (long long)got->nids, (long long)w->nids);
    for (int64_t i = 0; i < w->nids; i++)
        if (got->ids[i] != w->ids[i])
            fail_msg("%s: sample %lld is %lld, Accelerate's %lld", what, (long long)i, (long long)got->ids[i],
                     (long long)w->ids[i]);
    if (!check_batches) return;
    assert_int_equal(got->nbatches, w->nbatches);
    for (int64_t b = 0; b < w->nbatches; b++) assert_int_equal(got->sizes[b], w->lens[b]);
}

/* An iterable dataset of n samples read in order: sample i of epoch e has id
 * i + stride * e; next fails at sample `bad` (when >= 0). */
typedef struct stream_ctx {
    int64_t n, pos, epoch, stride, bad;
    int begins;
} stream_ctx;

static ca_status stream_begin(void *ctx, int64_t epoch) {
    stream_ctx *c = ctx;
    c->pos = 0;
    c->epoch = epoch;
    c->begins++;
    return CA_OK;
}

static ca_status stream_next(void *ctx, void *x, void *y, bool *end) {
    stream_ctx *c = ctx;
    if (c->pos == c->bad) return ca_error(CA_ERR_IO, "socket closed after %lld records", (long long)c->pos);
    if (c->pos >= c->n) {
        *end = true;
        return CA_OK;
    }
    int64_t id = c->pos++ + c->stride * c->epoch;
    int32_t *xi = x;
    xi[0] = (int32_t)id;
    xi[1] = (int32_t)(7 * id + 1);
    *(int64_t *)y = id;
    return CA_OK;
}

static ca_dataset *stream_dataset(stream_ctx *c) {
    ca_iterable_ops ops = {.struct_size = sizeof ops, .begin = stream_begin, .next = stream_next};
    ca_sample_spec xs = {.dtype = CA_I32, .ndim = 1, .shape = {2}};
    ca_sample_spec ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds = NULL;
    assert_int_equal(ca_dataset_create_iterable(&ops, c, &xs, &ys, &ds), CA_OK);
    return ds;
}

/* IterableDatasetShard at 1 to 4 processes with and without split_batches and
 * drop_last: each rank's samples are Accelerate's, every batch has the
 * per-process size, and gathering the ranks' batches in rank order and dropping
 * their padding (what ca_gather_for_metrics does) gives the stream exactly once. */
static void test_iterable_shards_match_accelerate(void **state) {
    (void)state;
    static epoch_rec rec[4];
    char what[128];
    for (size_t k = 0; k < sizeof accel_iterable_cases / sizeof *accel_iterable_cases; k++) {
        const struct accel_iterable_case *c = &accel_iterable_cases[k];
        want_rank want[4];
        assert_int_equal(parse_want(c->want, 2, want, 4), c->world);
        int64_t pbs = c->split && c->world > 1 ? c->bs / c->world : c->bs;
        for (int r = 0; r < c->world; r++) {
            snprintf(what, sizeof what, "stream of %d, bs %d, drop_last %d, split %d, rank %d of %d", c->n, c->bs,
                     c->drop_last, c->split, r, c->world);
            stream_ctx sc = {.n = c->n, .bad = -1};
            ca_dataset *ds = stream_dataset(&sc);
            ca_dataloader *dl = loader(ds, (ca_loader_opts){.batch_size = c->bs, .drop_last = c->drop_last});
            assert_int_equal(ca_dataloader_set_split_batches(dl, c->split), CA_OK);
            assert_int_equal(ca_dataloader_shard(dl, r, c->world, true), CA_OK);
            assert_int_equal(ca_dataloader_num_batches(dl), -1);
            run_epoch(dl, &rec[r]);
            assert_ids(&rec[r], &want[r], false, what);
            for (int64_t b = 0; b < rec[r].nbatches; b++)
                if (c->world > 1 || b + 1 < rec[r].nbatches) assert_int_equal(rec[r].sizes[b], pbs);
            ca_dataloader_destroy(dl);
            ca_dataset_destroy(ds);
        }
        /* gather_for_metrics: step b gathers batch b of every rank, less the padding */
        int64_t next = 0, pos[4] = {0};
        for (int64_t b = 0; b < rec[0].nbatches; b++) {
            int64_t rows = 0, pad = 0, got[64];
            for (int r = 0; r < c->world; r++) {
                assert_int_equal(rec[r].nbatches, rec[0].nbatches);
                for (int64_t t = 0; t < rec[r].sizes[b]; t++) got[rows++] = rec[r].ids[pos[r]++];
                pad += rec[r].padded[b];
            }
            for (int64_t t = 0; t < rows - pad; t++) assert_int_equal(got[t], next++);
        }
        int64_t R = c->split ? c->bs : c->bs * c->world;
        assert_int_equal(next, c->drop_last ? c->n / R * R : c->n);
    }
}

static void test_iterable_resume_epochs_errors(void **state) {
    (void)state;
    stream_ctx sc = {.n = 22, .stride = 1000, .bad = -1};
    ca_dataset *ds = stream_dataset(&sc);
    assert_true(ca_dataset_is_iterable(ds));
    assert_int_equal(ca_dataset_length(ds), -1);
    int32_t x[2];
    int64_t y;
    assert_int_equal(ca_dataset_get(ds, 0, x, &y), CA_ERR_UNSUPPORTED);
    assert_contains(ca_last_error(), "iterable dataset has no sample 0");
    ca_dataloader *dl = loader(ds, (ca_loader_opts){.batch_size = 4});
    assert_int_equal(ca_dataloader_shard(dl, 1, 2, true), CA_OK);

    /* epoch 0 on rank 1 of 2: global batches of 8, slice [4, 8); the last one padded */
    epoch_rec e;
    run_epoch(dl, &e);
    int64_t want0[] = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 0, 1};
    assert_int_equal(e.nids, 12);
    assert_memory_equal(e.ids, want0, sizeof want0);
    assert_int_equal(e.padded[2], 2);
    assert_int_equal(sc.begins, 1);

    /* the stream restarts for epoch 1 (begin gets the epoch); resume at batch 1 */
    assert_int_equal(ca_dataloader_skip_batches(dl, 1), CA_OK);
    ca_batch b;
    assert_true(ca_dataloader_next(dl, &b));
    assert_int_equal(b.index, 1);
    assert_int_equal(b.epoch, 1);
    int64_t ids[8], n = 0;
    read_batch(&b, ids, &n);
    assert_int_equal(ids[0], 1012);
    assert_true(ca_dataloader_next(dl, &b));
    assert_int_equal(b.index, 2);
    assert_int_equal(b.num_padded, 2);
    assert_false(ca_dataloader_next(dl, &b));
    assert_int_equal(ca_dataloader_status(dl), CA_OK);
    assert_int_equal(ca_dataloader_epoch(dl), 2);

    /* a failing stream: the message names the dataset, the call and the batch */
    sc.bad = 9;
    ca_clear_error();
    assert_true(ca_dataloader_next(dl, &b));                 /* batch 0 (samples 0..7) */
    assert_false(ca_dataloader_next(dl, &b));
    assert_int_equal(ca_dataloader_status(dl), CA_ERR_IO);
    assert_contains(ca_last_error(), "iterable dataset: next (batch 1 of epoch 2): socket closed after 9 records");

    /* no batch sampler over a stream */
    ca_batch_sampler_ops so = {.struct_size = sizeof so, .next = NULL};
    assert_int_equal(ca_dataloader_set_batch_sampler(dl, &so, NULL, 4, false), CA_ERR_INVALID);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
}

/* A batch sampler giving BatchSampler(range(n), bs, drop_last); odd epochs in reverse order of batches
 * when `reverse_odd`; fixed lists (varying sizes) when `lists` is set. */
typedef struct bsampler_ctx {
    int64_t n, bs, next_batch, epoch;
    bool drop_last, reverse_odd;
    const want_rank *lists;
    int64_t bad_index;          /* >= 0: batch 1 holds this index */
} bsampler_ctx;

static ca_status bs_begin(void *ctx, int64_t epoch) {
    bsampler_ctx *c = ctx;
    c->next_batch = 0;
    c->epoch = epoch;
    return CA_OK;
}

static ca_status bs_next(void *ctx, int64_t *idx, int64_t cap, int64_t *len) {
    bsampler_ctx *c = ctx;
    *len = 0;
    if (c->lists) {
        if (c->next_batch >= c->lists->nbatches) return CA_OK;
        int64_t off = 0;
        for (int64_t b = 0; b < c->next_batch; b++) off += c->lists->lens[b];
        *len = c->lists->lens[c->next_batch++];
        memcpy(idx, c->lists->ids + off, sizeof *idx * (size_t)*len);
        return CA_OK;
    }
    int64_t nb = c->drop_last ? c->n / c->bs : (c->n + c->bs - 1) / c->bs;
    if (c->next_batch >= nb) return CA_OK;
    int64_t j = c->reverse_odd && c->epoch % 2 ? nb - 1 - c->next_batch : c->next_batch;
    c->next_batch++;
    for (int64_t i = j * c->bs; i < c->n && i < (j + 1) * c->bs && *len < cap; i++) idx[(*len)++] = i;
    if (c->bad_index >= 0 && j == 1) idx[0] = c->bad_index;
    return CA_OK;
}

static const ca_batch_sampler_ops bs_ops = {.struct_size = sizeof(ca_batch_sampler_ops), .begin = bs_begin,
                                            .next = bs_next};

/* BatchSamplerShard through the loader: a custom batch sampler, and the loader's
 * own sampler with split_batches, give Accelerate's batches at 1 to 4 processes. */
static void test_batch_sampler_shards_match_accelerate(void **state) {
    (void)state;
    static epoch_rec rec;
    char what[160];
    for (size_t k = 0; k < sizeof accel_sampler_cases / sizeof *accel_sampler_cases; k++) {
        const struct accel_sampler_case *c = &accel_sampler_cases[k];
        want_rank want[4];
        assert_int_equal(parse_want(c->want, 3, want, 4), c->world);
        ca_dataset *ds = id_dataset(c->n);
        for (int r = 0; r < c->world; r++)
            for (int custom = 0; custom < 2; custom++) {
                snprintf(what, sizeof what, "%s: n %d bs %d drop_last %d split %d even %d, rank %d of %d",
                         custom ? "custom sampler" : "loader", c->n, c->bs, c->drop_last, c->split, c->even, r,
                         c->world);
                ca_dataloader *dl = loader(ds, (ca_loader_opts){.batch_size = c->bs, .drop_last = c->drop_last});
                bsampler_ctx *bc = calloc(1, sizeof *bc);
                assert_non_null(bc);
                *bc = (bsampler_ctx){.n = c->n, .bs = c->bs, .drop_last = c->drop_last, .bad_index = -1};
                if (custom) {
                    ca_batch_sampler_ops o = bs_ops;
                    o.destroy = free;
                    assert_int_equal(ca_dataloader_set_batch_sampler(dl, &o, bc, c->bs, c->drop_last), CA_OK);
                } else {
                    free(bc);
                }
                assert_int_equal(ca_dataloader_set_split_batches(dl, c->split), CA_OK);
                assert_int_equal(ca_dataloader_shard(dl, r, c->world, c->even), CA_OK);
                assert_int_equal(ca_dataloader_num_batches(dl), want[r].nbatches);
                run_epoch(dl, &rec);
                assert_ids(&rec, &want[r], true, what);
                ca_dataloader_destroy(dl);
            }
        ca_dataset_destroy(ds);
    }
}

static void test_batch_sampler_varying_epochs_errors(void **state) {
    (void)state;
    static epoch_rec rec;
    ca_dataset *ds = id_dataset(30);
    for (size_t k = 0; k < sizeof accel_varying_cases / sizeof *accel_varying_cases; k++) {
        const struct accel_varying_case *c = &accel_varying_cases[k];
        want_rank in, want[4];
        char wrapped[512];
        snprintf(wrapped, sizeof wrapped, "[%s]", c->batches);   /* one "rank": the sampler's batches */
        assert_int_equal(parse_want(wrapped, 3, &in, 1), 1);
        assert_int_equal(parse_want(c->want, 3, want, 4), c->world);
        for (int r = 0; r < c->world; r++) {
            static bsampler_ctx bc;
            bc = (bsampler_ctx){.lists = &in, .bad_index = -1};
            ca_dataloader *dl = loader(ds, (ca_loader_opts){0});
            assert_int_equal(ca_dataloader_set_batch_sampler(dl, &bs_ops, &bc, 0, false), CA_OK);
            if (c->even && c->world > 1) {
                /* batches of varying size cannot be evened out across processes: refused when the
                 * loader is sharded (ca_prepare), as Accelerate's BatchSamplerShard refuses a sampler
                 * without a batch size under even_batches (these lists are of an older Accelerate) */
                assert_int_equal(ca_dataloader_shard(dl, r, c->world, true), CA_ERR_INVALID);
                assert_contains(ca_last_error(), "even_batches: in-memory dataset: the batch sampler's batches "
                                                 "vary in size (batch_size 0)");
                assert_contains(ca_last_hint(), "set even_batches false");
                ca_dataloader_destroy(dl);
                continue;
            }
            assert_int_equal(ca_dataloader_shard(dl, r, c->world, c->even), CA_OK);
            run_epoch(dl, &rec);
            assert_ids(&rec, &want[r], true, c->want);
            if (c->world > 1) {   /* split_batches needs a fixed batch size */
                assert_int_equal(ca_dataloader_set_split_batches(dl, true), CA_ERR_INVALID);
                assert_contains(ca_last_error(), "batch sampler's batches vary in size");
            }
            ca_dataloader_destroy(dl);
        }
    }

    /* The sampler sees the epoch: odd epochs reverse the batch order, on every rank alike. */
    static bsampler_ctx bc;
    bc = (bsampler_ctx){.n = 12, .bs = 3, .reverse_odd = true, .bad_index = -1};
    ca_dataloader *dl = loader(ds, (ca_loader_opts){0});
    assert_int_equal(ca_dataloader_set_batch_sampler(dl, &bs_ops, &bc, 3, false), CA_OK);
    assert_int_equal(ca_dataloader_shard(dl, 1, 2, true), CA_OK);
    run_epoch(dl, &rec);
    int64_t want0[] = {3, 4, 5, 9, 10, 11};
    assert_memory_equal(rec.ids, want0, sizeof want0);
    run_epoch(dl, &rec);
    int64_t want1[] = {6, 7, 8, 0, 1, 2};
    assert_memory_equal(rec.ids, want1, sizeof want1);

    /* split_batches with a batch size the processes do not divide */
    assert_int_equal(ca_dataloader_set_split_batches(dl, true), CA_ERR_INVALID);
    assert_contains(ca_last_error(), "split_batches: the batch size 3 is not a multiple of the 2 processes");

    /* an index past the dataset: the error names the batch, the epoch and the size */
    bc.bad_index = 30;
    ca_batch b;
    ca_clear_error();
    assert_false(ca_dataloader_next(dl, &b));
    assert_int_equal(ca_dataloader_status(dl), CA_ERR_INVALID);
    assert_contains(ca_last_error(), "batch sampler: batch 1 of epoch 2 holds index 30, but in-memory dataset has 30 samples");
    ca_dataloader_destroy(dl);

    /* split_batches set first (one process), then sharded over 3 (as ca_prepare does) */
    dl = loader(ds, (ca_loader_opts){.batch_size = 10});
    assert_int_equal(ca_dataloader_set_split_batches(dl, true), CA_OK);
    assert_int_equal(ca_dataloader_shard(dl, 0, 3, true), CA_ERR_INVALID);
    assert_contains(ca_last_error(), "split_batches: the batch size 10 is not a multiple of the 3 processes");
    assert_int_equal(ca_dataloader_shard(dl, 1, 2, true), CA_OK);
    assert_int_equal(ca_dataloader_num_batches(dl), 3);       /* 30 samples in global batches of 10 */
    run_epoch(dl, &rec);
    int64_t want2[] = {5, 6, 7, 8, 9, 15, 16, 17, 18, 19, 25, 26, 27, 28, 29};
    assert_int_equal(rec.nids, 15);
    assert_memory_equal(rec.ids, want2, sizeof want2);
    ca_dataloader_destroy(dl);

    /* a varying sampler set on a loader already sharded with even_batches: refused the same way;
     * accepted once even_batches is off */
    static bsampler_ctx vc;
    vc = (bsampler_ctx){.n = 12, .bs = 3, .bad_index = -1};
    dl = loader(ds, (ca_loader_opts){.batch_size = 4});
    assert_int_equal(ca_dataloader_shard(dl, 0, 2, true), CA_OK);
    assert_int_equal(ca_dataloader_set_batch_sampler(dl, &bs_ops, &vc, 0, false), CA_ERR_INVALID);
    assert_contains(ca_last_error(), "even_batches: in-memory dataset: the batch sampler's batches vary in size");
    assert_int_equal(ca_dataloader_shard(dl, 0, 2, false), CA_OK);
    assert_int_equal(ca_dataloader_set_batch_sampler(dl, &bs_ops, &vc, 0, false), CA_OK);
    assert_int_equal(ca_dataloader_shard(dl, 0, 2, true), CA_ERR_INVALID);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_counts),
        cmocka_unit_test(test_every_sample_once),
        cmocka_unit_test(test_permutation_by_seed_and_epoch),
        cmocka_unit_test(test_shards_disjoint_covering),
        cmocka_unit_test(test_global_batch_equivalence),
        cmocka_unit_test(test_num_padded),
        cmocka_unit_test(test_skip_batches),
        cmocka_unit_test(test_change_mid_pass),
        cmocka_unit_test(test_cast_u8_to_f32),
        cmocka_unit_test(test_worker_error_surfaces),
        cmocka_unit_test(test_destroy_mid_epoch),
        cmocka_unit_test(test_scopes_released),
        cmocka_unit_test(test_fashion_mnist_epoch),
        cmocka_unit_test(test_iterable_shards_match_accelerate),
        cmocka_unit_test(test_iterable_resume_epochs_errors),
        cmocka_unit_test(test_batch_sampler_shards_match_accelerate),
        cmocka_unit_test(test_batch_sampler_varying_epochs_errors),
    };
    int rc = cmocka_run_group_tests_name("data_loader", tests, NULL, NULL);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
