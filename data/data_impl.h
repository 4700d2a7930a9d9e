/* data_impl.h: private parts of data/: the dataset object, the shuffle generator and the shard plan. */
#ifndef CACCEL_DATA_IMPL_H
#define CACCEL_DATA_IMPL_H

#include <caccel/data.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A dataset: normalised ops + the context it owns + the two sample specs. */
struct ca_dataset {
    ca_dataset_ops ops;            /* copy; slots beyond the caller's struct_size are NULL */
    ca_iterable_ops it;            /* an iterable dataset's ops (it.next set) */
    bool iterable;
    void *ctx;
    ca_sample_spec x, y;
    size_t x_bytes, y_bytes;       /* bytes of one sample's x and y */
    char name[256];                /* for messages: "IDX images.gz", "in-memory", "custom" */
};

/* Validates a sample spec (dtype, 0 <= ndim < CA_MAX_DIMS so a batch dim fits,
 * positive dims) and gives its size in bytes. `what` names it in the error. */
ca_status ca_sample_spec_bytes(const ca_sample_spec *s, const char *what, size_t *bytes);

/* ------------------------------------------------------------------ shuffle */

/* The loader's generator: splitmix64 (Steele, Lea, Flood 2014). The stream for
 * (seed, epoch) starts at state = mix(seed) ^ mix(epoch ^ 0x6A09E667F3BCC909),
 * so each epoch has its own stream and every rank derives the same one. */
typedef struct ca_splitmix {
    uint64_t state;
} ca_splitmix;

void ca_splitmix_init(ca_splitmix *g, uint64_t seed, uint64_t epoch);
uint64_t ca_splitmix_next(ca_splitmix *g);
/* Uniform integer in [0, bound) without modulo bias (bound > 0). */
uint64_t ca_splitmix_below(ca_splitmix *g, uint64_t bound);

/* perm[0..n) = 0..n-1, shuffled by Fisher-Yates (Durstenfeld, from the end)
 * with the (seed, epoch) stream when `shuffle`. */
void ca_permutation(bool shuffle, uint64_t seed, uint64_t epoch, int64_t n, int64_t *perm);

/* --------------------------------------------------------------- shard plan */

/*
 * Which samples one rank reads in one epoch, as Accelerate's BatchSamplerShard
 * (split_batches=False) over a BatchSampler(batch_size, drop_last).
 *
 * The epoch's permutation is extended into a global stream g[i] = perm[i % n]
 * and cut into global batches of batch_size; global batch j goes to rank
 * j % world, so rank r's batch b is global batch b * world + r. Hence global
 * step s on N ranks covers exactly batch s of a single-rank loader with batch
 * size N * batch_size.
 *  - drop_last: only whole rounds of `world` full batches are used;
 *  - even_batches (world > 1, !drop_last): the stream is padded from its start
 *    (g[i] for i >= n repeats perm[i - n], cyclically when n is tiny) up to a
 *    whole round of full batches; positions >= n are counted in num_padded;
 *  - otherwise the last global batch may be short and the first
 *    (batches % world) ranks get one batch more.
 */
typedef struct ca_shard_plan {
    int64_t n;                     /* samples in the dataset */
    int64_t batch_size;            /* of the loader: per rank, or global with split */
    int rank, world;
    bool drop_last, even_batches;
    bool split;                    /* split_batches: rank r reads slice r of every global batch */
    int64_t total;                 /* length of the global stream (with padding) */
    int64_t global_batches;        /* batches in the global stream, all ranks */
    int64_t rank_batches;          /* batches of this rank */
} ca_shard_plan;

void ca_shard_plan_init(ca_shard_plan *p, int64_t n, int64_t batch_size, bool drop_last,
                        int rank, int world, bool even_batches);
/*
 * split_batches (BatchSamplerShard._iter_with_split): batch_size is global and
 * must be a multiple of world; global batch b is positions [b * bs, (b + 1) * bs)
 * of the same stream and rank r reads its slice [r * bs / world, (r + 1) * bs / world).
 * even_batches pads the last global batch from the stream's start; without it
 * the slices of a short last batch are cut (and a rank past its end gets none);
 * drop_last drops it. One process: the plain plan (Accelerate does not shard).
 */
void ca_shard_plan_init_split(ca_shard_plan *p, int64_t n, int64_t batch_size, bool drop_last, int rank,
                              int world, bool even_batches);
/* Rank batch b (0 <= b < rank_batches): its first stream position, size, and
 * how many of its samples are padding. */
void ca_shard_plan_batch(const ca_shard_plan *p, int64_t b, int64_t *start, int64_t *size,
                         int64_t *num_padded);
/* Samples of this rank per epoch, padding excluded. */
int64_t ca_shard_plan_samples(const ca_shard_plan *p);

/*
 * Deterministic mode (docs/DETERMINISM.md). The global batch of step s is the
 * stream positions [s * G, (s + 1) * G) with G = world * batch_size, cut into
 * `shards` virtual shards of G / shards samples: shard v is positions
 * [s * G + v * G / shards, ...), whatever the world size. Rank r holds shards
 * r * parts .. r * parts + parts - 1 (parts = shards / world), which are
 * exactly its ordinary batch, handed out as `parts` micro-batches.
 *
 * The plan: like ca_shard_plan_init with even_batches, but the last global
 * batch is padded (or, with drop_last, dropped) at every world size, one
 * process included, so the global stream does not depend on the world size.
 */
void ca_shard_plan_init_det(ca_shard_plan *p, int64_t n, int64_t batch_size, bool drop_last, int rank,
                            int world);
/* Micro-batch `part` (0 <= part < parts) of rank batch b: first stream position,
 * size and padding; batch_size must be a multiple of parts. */
void ca_shard_plan_part(const ca_shard_plan *p, int parts, int64_t b, int part, int64_t *start,
                        int64_t *size, int64_t *num_padded);

/* ------------------------------------------------------------- index batches */

/* A list of batches of sample indices, as a batch sampler yields them: batch i
 * is idx[off[i] .. off[i + 1]), of which the last pad[i] repeat earlier ones. */
typedef struct ca_index_batches {
    int64_t count;
    int64_t *off;                  /* count + 1 entries */
    int64_t *idx;
    int64_t *pad;                  /* count entries */
    int64_t cap_b, cap_i;
} ca_index_batches;

ca_status ca_index_batches_push(ca_index_batches *l, const int64_t *idx, int64_t len, int64_t pad);
void ca_index_batches_clear(ca_index_batches *l);
void ca_index_batches_free(ca_index_batches *l);
static inline int64_t ca_index_batches_len(const ca_index_batches *l, int64_t i) {
    return l->off[i + 1] - l->off[i];
}

/*
 * Accelerate's BatchSamplerShard over the batches `in` of a batch sampler with
 * batch_size (0: sizes vary, Accelerate's batch_size None) and drop_last: the
 * batches of `rank` of `world` into out, with how many entries of each are
 * repeats (padding). split needs batch_size a multiple of world. One process:
 * the batches unchanged, as Accelerate does not wrap the sampler then.
 */
ca_status ca_batch_sampler_shard(const ca_index_batches *in, int64_t batch_size, bool drop_last, int rank,
                                 int world, bool split, bool even_batches, ca_index_batches *out);

/* True when the batch handed out last was the final one of its epoch (the
 * accelerator makes that micro-step an accumulation boundary). */
bool ca_dataloader_handed_last(const ca_dataloader *dl);
/* Deterministic mode: hand each batch out as `parts` micro-batches (0: off);
 * the plan pads or drops the last global batch at any world size. Fails,
 * naming the keys, when the loader cannot (ca_dataloader_check_parts). */
ca_status ca_dataloader_set_parts(ca_dataloader *dl, int parts);
/* Whether dl can split into `parts`: batch_size a multiple of parts, and
 * even_batches or drop_last set; the error names deterministic_shards. */
ca_status ca_dataloader_check_parts(const ca_dataloader *dl, int parts);
/* Which micro-batch of its batch the loader handed out last (0 .. parts - 1),
 * and parts (0 when the loader is not in deterministic mode). */
void ca_dataloader_handed_part(const ca_dataloader *dl, int *part, int *parts);
/* When the loader last handed out a batch of the pass in flight, in process-wide
 * order (larger is newer); 0 when no pass is in flight. */
uint64_t ca_dataloader_handed_seq(const ca_dataloader *dl);
/* What the owner of a prepared loader (the Accelerator) installs, as ca_optimizer_owner and
 * ca_module_owner: told when the loader is destroyed first. */
typedef struct ca_dataloader_owner {
    void *owner;
    void (*forget)(void *owner, const void *obj);
} ca_dataloader_owner;

/* Installs (or, with NULL, removes: plain use again) the owner of dl. */
void ca_dataloader_set_owner(ca_dataloader *dl, const ca_dataloader_owner *owner);

/*
 * dispatch_batches (Accelerate's DataLoaderDispatcher). The accelerator installs
 * `bcast` on a prepared loader of world > 1: inside ca_dataloader_next, on the
 * thread calling it (never the prefetch worker), rank 0's loader reads a global
 * batch as one process would (batch_size * world samples, or batch_size with
 * split_batches), completes a last batch whose size world does not divide with
 * the epoch's first samples, and broadcasts a header and the batch's host bytes;
 * each rank keeps its slice. The other ranks never call the dataset's get, begin
 * or next. The layer below the communicator only sees this callback.
 */
typedef struct ca_dispatch_ops {
    /* Sends `bytes` at buf from rank 0 to every rank (host memory on both sides);
     * every rank calls it with the same size, in the same order. */
    ca_status (*bcast)(void *ctx, void *buf, size_t bytes);
} ca_dispatch_ops;

/* Installs the hook (ops NULL: every rank reads again). Fails, naming
 * dispatch_batches, over a custom batch sampler or in deterministic mode. The
 * ops are copied; ctx must outlive the loader or the next call. */
ca_status ca_dataloader_set_dispatch(ca_dataloader *dl, const ca_dispatch_ops *ops, void *ctx);

/* One rank's slice of a dispatched global batch of `size` samples (a multiple of
 * world) whose last `padded` repeat the epoch's first ones: rank r gets
 * [r * size / world, (r + 1) * size / world), *pad of them repeats. */
void ca_dispatch_slice(int64_t size, int64_t padded, int rank, int world, int64_t *first, int64_t *len,
                       int64_t *pad);
/* Samples a dispatched global batch of m real samples is sent as: m rounded up
 * to a multiple of world (Accelerate completes it from the first batch). */
int64_t ca_dispatch_padded(int64_t m, int world);

/* What a checkpoint records of a loader (save_state) to continue where it stopped. */
typedef struct ca_loader_state {
    int64_t epoch;                 /* epoch of the pass in flight, else of the next pass */
    int64_t position;              /* batches of that epoch handed out (or to skip) on this rank */
    int64_t batch_size, dataset_len, rank_batches;
    uint64_t seed;                 /* the shuffle's seed in effect */
    uint64_t seed_fixed;           /* opts.seed (0: none; it then wins over set_seed) */
    bool shuffle, drop_last;
    bool split;                    /* split_batches: a batch is the global one, position counts global batches */
    int world;
} ca_loader_state;
void ca_dataloader_get_state(const ca_dataloader *dl, ca_loader_state *out);

#endif
