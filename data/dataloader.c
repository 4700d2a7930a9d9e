/* The DataLoader: seeded per-epoch shuffle, rank sharding, a prefetch thread, and batches as step-scoped tensors. */
#include "data/data_impl.h"
#include "tensor/tensor_impl.h"
#include "base/trace_impl.h"
#include "base/thread_impl.h"

#include <caccel/log.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * One pass = one epoch (or its tail, after skip_batches) of this rank's
 * batches. The pass starts at the first ca_dataloader_next: a worker thread
 * computes the epoch's permutation and fills a ring of `prefetch` host staging
 * buffers in batch order; next() takes the oldest full buffer, copies it into
 * fresh tensors on the loader's device (synchronously, so the buffer is free
 * again at once) and hands the batch out.
 *
 * Changing the epoch, seed, shard, device or start batch while a pass is in
 * flight (the caller stopped iterating early) abandons that pass: the worker
 * is stopped and joined, buffered batches are dropped, and the next call of
 * ca_dataloader_next starts a fresh pass with the new settings. Calls that
 * change nothing leave the pass alone.
 *
 * Errors are sticky: once next() has returned false with an error, it keeps
 * doing so (re-recording the message) until one of the setters is called,
 * so a training loop cannot silently run on past a failed read.
 *
 * A loader is driven by one thread at a time (the one calling next(), which
 * owns the step scopes); only the worker runs beside it.
 */

#define DL_MSG 1536
#define DL_HINT 512

typedef struct slot {
    unsigned char *mem;            /* x bytes, then y bytes at y_off */
    int64_t index, size, num_padded;
    ca_status status;
    char msg[DL_MSG];
    char hint[DL_HINT];
} slot;

struct ca_dataloader {
    ca_dataset *ds;
    int64_t batch_size;
    bool shuffle, drop_last;
    uint64_t seed_opt;             /* opts.seed: when non-zero it wins */
    uint64_t seed_set;             /* from ca_dataloader_set_seed (ca_set_seed) */
    int prefetch;
    bool x_cast;
    ca_dtype x_dtype;
    float x_scale;
    int rank, world;
    bool even_batches;
    bool split;                    /* split_batches: batch_size is global, each rank reads a slice */
    int parts;                     /* deterministic mode: micro-batches per batch (0: off) */
    ca_dispatch_ops dops;          /* dispatch_batches: the accelerator's broadcast (bcast NULL: off) */
    void *dctx;
    ca_device *dev;
    int64_t epoch;                 /* epoch of the pass in flight, else of the next one */
    int64_t skip;                  /* first batch of the next pass */

    ca_status status;              /* sticky error */
    char msg[DL_MSG];
    char hint[DL_HINT];

    ca_scope *step_scope;
    uint64_t step_scope_id;        /* the handle may outlive the scope (break out of CA_SCOPE) */
    pthread_t scope_thread;
    bool handed_last;              /* the batch handed out last ends the epoch */
    int part, handed_part;         /* next micro-batch of the current batch; the one handed out last */
    uint64_t handed_seq;           /* when it was handed out, in process-wide order */
    void *owner;                   /* the accelerator that prepared it */
    void (*owner_forget)(void *owner, const void *obj);

    /* a custom batch sampler (has_sampler): its batches this epoch, and this rank's */
    bool has_sampler;
    ca_batch_sampler_ops sops;
    void *sctx;
    int64_t sampler_bs;            /* 0: sizes vary */
    bool sampler_drop;
    ca_index_batches sin, sout;

    /* an iterable dataset: the global batch being read, the first one (padding of
     * the last), and this rank's slice of each */
    unsigned char *gbuf, *fbuf;
    int64_t gcap;                  /* samples each holds */
    int64_t real_bs, proc_bs, proc_lo;

    /* staging ring (allocated for `staging_dev` and these sizes) */
    slot *slots;
    int nslots;
    ca_device *staging_dev;
    bool staging_pinned;
    size_t slot_bytes, y_off;

    /* the pass in flight */
    bool active;
    ca_shard_plan plan;
    int64_t first, count;          /* batches first .. first + count - 1 (count -1: a stream, unknown) */
    bool done;                     /* the worker has produced its last batch */
    uint64_t pass_seed;
    int64_t pass_epoch;
    int64_t *perm;
    int64_t perm_cap;
    pthread_t thread;
    bool thread_live;
    pthread_mutex_t mu;
    pthread_cond_t ready, freed;
    int64_t produced, consumed;    /* batches of this pass written / handed out */
    atomic_bool stop;
};

/* dispatch_batches in effect: rank 0 reads global batches, every rank gets its slice. */
static bool dispatching(const ca_dataloader *dl) { return dl->dops.bcast && dl->world > 1; }

/* The batch rank 0 reads when dispatching (DataLoaderDispatcher's total_batch_size). */
static int64_t global_bs(const ca_dataloader *dl) {
    return dl->split ? dl->batch_size : dl->batch_size * dl->world;
}

/* -------------------------------------------------------------- errors */

/* The calling thread's error (message without the rank suffix, which
 * ca_error adds again when the message is re-recorded) into buf/hint. */
/* Orders batches across loaders: the loader that handed out the newest batch is
 * the one being iterated (the gradient state's end-of-dataloader follows it). */
static _Atomic uint64_t handed_counter;

static void capture_error(char *buf, size_t len, char *hint, size_t hlen) {
    snprintf(buf, len, "%s", ca_last_error());
    snprintf(hint, hlen, "%s", ca_last_hint());
    int rank = ca_log_get_rank();
    if (rank >= 0) {
        char suffix[32];
        int n = snprintf(suffix, sizeof suffix, " (rank %d)", rank);
        size_t bl = strlen(buf);
        if (n > 0 && bl >= (size_t)n && !strcmp(buf + bl - (size_t)n, suffix)) buf[bl - (size_t)n] = '\0';
    }
}

/* Re-records the sticky error on the calling thread; returns false for next(). */
static bool report_sticky(const ca_dataloader *dl) {
    ca_error(dl->status, "%s", dl->msg);
    if (dl->hint[0]) ca_error_hint("%s", dl->hint);
    return false;
}

/* Makes the calling thread's current error the loader's sticky one. */
static void set_sticky_from_thread(ca_dataloader *dl, ca_status s) {
    dl->status = s;
    capture_error(dl->msg, sizeof dl->msg, dl->hint, sizeof dl->hint);
}

/* -------------------------------------------------------------- staging */

static void staging_free(ca_dataloader *dl) {
    if (!dl->slots) return;
    const ca_device_ops *ops = dl->staging_dev ? ca_device_ops_of(dl->staging_dev) : NULL;
    for (int i = 0; i < dl->nslots; i++) {
        if (!dl->slots[i].mem) continue;
        if (dl->staging_pinned)
            ops->host_free(ca_device_context(dl->staging_dev), dl->slots[i].mem);
        else
            free(dl->slots[i].mem);
    }
    free(dl->slots);
    dl->slots = NULL;
    dl->nslots = 0;
    dl->staging_dev = NULL;
    dl->slot_bytes = 0;
}

/* Ring buffers for the current device and batch shape: page-locked host
 * memory from the device where it offers some, else malloc. */
static ca_status staging_ensure(ca_dataloader *dl, int64_t cap) {
    size_t xb = dl->ds->x_bytes, yb = dl->ds->y_bytes;
    size_t B = (size_t)cap;
    if (B > SIZE_MAX / 2 / (xb + yb + 64))
        return ca_error(CA_ERR_INVALID, "dataloader: batch_size %lld is too large", (long long)cap);
    size_t y_off = (B * xb + 63) & ~(size_t)63;
    size_t bytes = y_off + B * yb;
    /* dispatching, rank 0 looks one batch ahead while it holds the current one */
    int want = dispatching(dl) && dl->prefetch < 2 ? 2 : dl->prefetch;
    if (dl->slots && dl->staging_dev == dl->dev && dl->slot_bytes == bytes &&
        dl->y_off == y_off && dl->nslots == want)
        return CA_OK;
    staging_free(dl);

    const ca_device_ops *ops = ca_device_ops_of(dl->dev);
    bool pinned = ops && ops->host_alloc && ops->host_free;
    dl->slots = calloc((size_t)want, sizeof *dl->slots);
    if (!dl->slots) return ca_error(CA_ERR_NOMEM, "dataloader: out of host memory");
    dl->nslots = want;
    dl->staging_dev = dl->dev;
    dl->staging_pinned = pinned;
    dl->slot_bytes = bytes;
    dl->y_off = y_off;
    for (int i = 0; i < dl->nslots; i++) {
        void *p = NULL;
        if (pinned) {
            ca_status s = ops->host_alloc(ca_device_context(dl->dev), bytes, &p);
            if (s != CA_OK) {
                staging_free(dl);
                return ca_error_context("dataloader: staging buffer of %zu bytes on %s", bytes,
                                        ca_device_name(dl->dev));
            }
        } else {
            p = malloc(bytes);
            if (!p) {
                staging_free(dl);
                return ca_error(CA_ERR_NOMEM,
                                "dataloader: cannot allocate a staging buffer of %zu bytes", bytes);
            }
        }
        dl->slots[i].mem = p;
    }
    return CA_OK;
}

/* -------------------------------------------------------------- worker */

static void fill_slot(ca_dataloader *dl, slot *s, int64_t b) {
    ca_dataset *ds = dl->ds;
    int64_t start, size, pad;
    if (dl->has_sampler) {
        start = dl->sout.off[b];
        size = ca_index_batches_len(&dl->sout, b);
        pad = dl->sout.pad[b];
    } else {
        ca_shard_plan_batch(&dl->plan, b, &start, &size, &pad);
    }
    /* dispatching, a last batch that world does not divide is completed by the
     * epoch's first samples (DataLoaderDispatcher's first_batch), cyclically when
     * the epoch has fewer than world */
    int64_t real = size, lim = dl->plan.n < dl->world ? dl->plan.n : dl->world;
    if (dispatching(dl)) {
        size = ca_dispatch_padded(real, dl->world);
        pad = size - real;
    }
    s->index = b;
    s->size = size;
    s->num_padded = pad;
    s->status = CA_OK;
    s->msg[0] = s->hint[0] = '\0';
    unsigned char *x = s->mem, *y = s->mem + dl->y_off;
    for (int64_t t = 0; t < size; t++) {
        if (atomic_load_explicit(&dl->stop, memory_order_relaxed)) return;
        int64_t i = dl->has_sampler ? dl->sout.idx[start + t]
                    : t < real      ? dl->perm[(start + t) % dl->plan.n]
                                    : dl->perm[(t - real) % lim];
        ca_clear_error();
        ca_status st = ds->ops.get(ds->ctx, i, x + (size_t)t * ds->x_bytes,
                                   y + (size_t)t * ds->y_bytes);
        if (st == CA_OK) continue;
        char why[DL_MSG];
        if (ca_last_status() == CA_OK) {
            snprintf(why, sizeof why, "get returned %s", ca_status_name(st));
            s->hint[0] = '\0';
        } else {
            capture_error(why, sizeof why, s->hint, sizeof s->hint);
        }
        s->status = st;
        snprintf(s->msg, sizeof s->msg, "%s: sample %lld (batch %lld of epoch %lld): %s",
                 ds->name, (long long)i, (long long)b, (long long)dl->pass_epoch, why);
        return;
    }
}

/* The next free slot of the ring, or NULL when the pass is being stopped. */
static slot *acquire_slot(ca_dataloader *dl) {
    pthread_mutex_lock(&dl->mu);
    while (!atomic_load(&dl->stop) && dl->produced - dl->consumed >= dl->nslots)
        pthread_cond_wait(&dl->freed, &dl->mu);
    bool stop = atomic_load(&dl->stop);
    pthread_mutex_unlock(&dl->mu);
    return stop ? NULL : &dl->slots[dl->produced % dl->nslots];
}

static void publish_slot(ca_dataloader *dl) {
    pthread_mutex_lock(&dl->mu);
    dl->produced++;
    pthread_cond_signal(&dl->ready);
    pthread_mutex_unlock(&dl->mu);
}

/* Hands the consumer the stream's error as batch b (it stops there). */
static void stream_error(ca_dataloader *dl, int64_t b, ca_status st, const char *what) {
    slot *s = acquire_slot(dl);
    if (!s) return;
    char why[DL_MSG];
    if (ca_last_status() == CA_OK) {
        snprintf(why, sizeof why, "%s returned %s", what, ca_status_name(st));
        s->hint[0] = '\0';
    } else {
        capture_error(why, sizeof why, s->hint, sizeof s->hint);
    }
    s->status = st;
    s->index = b;
    s->size = s->num_padded = 0;
    snprintf(s->msg, sizeof s->msg, "%s: %s (batch %lld of epoch %lld): %s", dl->ds->name, what, (long long)b,
             (long long)dl->pass_epoch, why);
    publish_slot(dl);
}

/* Hands out this rank's slice [lo, lo + size) of the global batch in gbuf as
 * batch b, unless b is skipped (resume). False when the pass is being stopped. */
static bool stream_emit(ca_dataloader *dl, int64_t b, int64_t lo, int64_t size, int64_t pad) {
    if (b < dl->first) return true;
    slot *s = acquire_slot(dl);
    if (!s) return false;
    size_t xb = dl->ds->x_bytes, yb = dl->ds->y_bytes;
    const unsigned char *gy = dl->gbuf + (size_t)dl->gcap * xb;
    memcpy(s->mem, dl->gbuf + (size_t)lo * xb, (size_t)size * xb);
    memcpy(s->mem + dl->y_off, gy + (size_t)lo * yb, (size_t)size * yb);
    s->index = b;
    s->size = size;
    s->num_padded = pad;
    s->status = CA_OK;
    s->msg[0] = s->hint[0] = '\0';
    publish_slot(dl);
    return true;
}

/* Copies sample j of src (a global batch buffer) to sample i of dst. */
static void stream_copy(const ca_dataloader *dl, unsigned char *dst, int64_t i, const unsigned char *src,
                        int64_t j) {
    size_t xb = dl->ds->x_bytes, yb = dl->ds->y_bytes, yo = (size_t)dl->gcap * xb;
    memcpy(dst + (size_t)i * xb, src + (size_t)j * xb, xb);
    memcpy(dst + yo + (size_t)i * yb, src + yo + (size_t)j * yb, yb);
}

/*
 * An iterable dataset, as Accelerate's IterableDatasetShard: every rank reads
 * the whole stream in global batches of real_bs samples (batch_size * world, or
 * batch_size with split_batches) and keeps its slice [proc_lo, proc_lo +
 * proc_bs). A short last global batch is completed by repeating the first full
 * one (or itself when there is none), cyclically, unless drop_last; the repeats
 * are the batch's padding. One process: plain batches, the last one short.
 */
static void stream_run(ca_dataloader *dl) {
    ca_dataset *ds = dl->ds;
    size_t xb = ds->x_bytes, yb = ds->y_bytes, yo = (size_t)dl->gcap * xb;
    int64_t R = dl->real_bs, count = 0, b = 0, flen = 0;
    ca_clear_error();
    ca_status st = ds->it.begin(ds->ctx, dl->pass_epoch);
    if (st != CA_OK) {
        stream_error(dl, 0, st, "begin");
        return;
    }
    for (;;) {
        if (atomic_load_explicit(&dl->stop, memory_order_relaxed)) return;
        bool end = false;
        ca_clear_error();
        st = ds->it.next(ds->ctx, dl->gbuf + (size_t)count * xb, dl->gbuf + yo + (size_t)count * yb, &end);
        if (st != CA_OK) {
            stream_error(dl, b, st, "next");
            return;
        }
        if (end) break;
        if (++count < R) continue;
        if (!flen) {
            memcpy(dl->fbuf, dl->gbuf, yo + (size_t)dl->gcap * yb);
            flen = R;
        }
        if (!stream_emit(dl, b++, dl->proc_lo, dl->proc_bs, 0)) return;
        count = 0;
    }
    if (count == 0 || dl->drop_last) return;
    if (dl->world == 1) {
        stream_emit(dl, b, 0, count, 0);
        return;
    }
    if (!flen) {
        memcpy(dl->fbuf, dl->gbuf, yo + (size_t)dl->gcap * yb);
        flen = count;
    }
    /* dispatching: completed to a multiple of world, sent whole (rank 0 reads alone) */
    int64_t to = dispatching(dl) ? ca_dispatch_padded(count, dl->world) : R;
    for (int64_t k = count; k < to; k++) stream_copy(dl, dl->gbuf, k, dl->fbuf, (k - count) % flen);
    if (dispatching(dl)) {
        stream_emit(dl, b, 0, to, to - count);
        return;
    }
    int64_t lo = dl->proc_lo, hi = lo + dl->proc_bs;
    int64_t pad = hi - (lo > count ? lo : count);
    stream_emit(dl, b, lo, dl->proc_bs, pad > 0 ? pad : 0);
}

static void *worker_main(void *arg) {
    ca_dataloader *dl = arg;
    ca_thread_begin("dataloader");
    if (dl->ds->iterable) {
        stream_run(dl);
    } else {
        if (!dl->has_sampler)
            ca_permutation(dl->shuffle, dl->pass_seed, (uint64_t)dl->pass_epoch, dl->plan.n, dl->perm);
        for (int64_t k = 0; k < dl->count; k++) {
            slot *s = acquire_slot(dl);
            if (!s) break;
            fill_slot(dl, s, dl->first + k);
            if (atomic_load(&dl->stop)) break;
            publish_slot(dl);
            if (s->status != CA_OK) break;   /* the consumer stops at this batch */
        }
    }
    pthread_mutex_lock(&dl->mu);
    dl->done = true;
    pthread_cond_signal(&dl->ready);
    pthread_mutex_unlock(&dl->mu);
    return NULL;
}

/* -------------------------------------------------------------- passes */

static uint64_t effective_seed(const ca_dataloader *dl) {
    return dl->seed_opt ? dl->seed_opt : dl->seed_set;
}

static void plan_now(const ca_dataloader *dl, ca_shard_plan *p) {
    int64_t n = ca_dataset_length(dl->ds);
    /* deterministic mode with split_batches: the same global batches, a slice per rank */
    int64_t rank_bs = dl->split && dl->world > 1 ? dl->batch_size / dl->world : dl->batch_size;
    if (dispatching(dl))   /* rank 0's reading: one process over global batches */
        ca_shard_plan_init(p, n, global_bs(dl), dl->drop_last, 0, 1, true);
    else if (dl->parts > 0)
        ca_shard_plan_init_det(p, n, rank_bs, dl->drop_last, dl->rank, dl->world);
    else if (dl->split)
        ca_shard_plan_init_split(p, n, dl->batch_size, dl->drop_last, dl->rank, dl->world, dl->even_batches);
    else
        ca_shard_plan_init(p, n, dl->batch_size, dl->drop_last, dl->rank, dl->world, dl->even_batches);
}

/* Runs the custom batch sampler over `epoch` into dl->sin and shards it into out. */
static ca_status sampler_epoch(ca_dataloader *dl, int64_t epoch, ca_index_batches *out) {
    ca_index_batches_clear(&dl->sin);
    int64_t cap = dl->sampler_bs ? dl->sampler_bs : CA_BATCH_SAMPLER_MAX, n = ca_dataset_length(dl->ds);
    int64_t *buf = malloc((size_t)cap * sizeof *buf);
    if (!buf) return ca_error(CA_ERR_NOMEM, "batch sampler: out of memory for a batch of %lld", (long long)cap);
    ca_status s = dl->sops.begin ? dl->sops.begin(dl->sctx, epoch) : CA_OK;
    if (s != CA_OK) ca_error_context("batch sampler: begin of epoch %lld", (long long)epoch);
    while (s == CA_OK) {
        int64_t len = 0;
        s = dl->sops.next(dl->sctx, buf, cap, &len);
        if (s != CA_OK) {
            ca_error_context("batch sampler: batch %lld of epoch %lld", (long long)dl->sin.count, (long long)epoch);
            break;
        }
        if (len == 0) break;
        if (len < 0 || len > cap) {
            s = ca_error(CA_ERR_INVALID, "batch sampler: batch %lld of epoch %lld has %lld indices; at most %lld fit",
                         (long long)dl->sin.count, (long long)epoch, (long long)len, (long long)cap);
            break;
        }
        for (int64_t t = 0; t < len && s == CA_OK; t++)
            if (buf[t] < 0 || buf[t] >= n)
                s = ca_error(CA_ERR_INVALID, "batch sampler: batch %lld of epoch %lld holds index %lld, but %s has "
                             "%lld samples", (long long)dl->sin.count, (long long)epoch, (long long)buf[t],
                             dl->ds->name, (long long)n);
        if (s == CA_OK) s = ca_index_batches_push(&dl->sin, buf, len, 0);
    }
    free(buf);
    if (s != CA_OK) return s;
    return ca_batch_sampler_shard(&dl->sin, dl->sampler_bs, dl->sampler_drop, dl->rank, dl->world, dl->split,
                                  dl->even_batches, out);
}

/* An iterable dataset's global batch and this rank's slice (IterableDatasetShard). */
static ca_status stream_setup(ca_dataloader *dl) {
    int64_t bs = dl->batch_size, w = dl->world;
    bool split = dl->split && w > 1;
    dl->real_bs = split ? bs : bs * w;
    dl->proc_bs = dispatching(dl) ? dl->real_bs : split ? bs / w : bs;
    dl->proc_lo = dispatching(dl) ? 0 : dl->rank * dl->proc_bs;
    if (dl->gbuf && dl->gcap == dl->real_bs) return CA_OK;
    free(dl->gbuf);
    free(dl->fbuf);
    size_t bytes = (size_t)dl->real_bs * (dl->ds->x_bytes + dl->ds->y_bytes);
    dl->gbuf = malloc(bytes);
    dl->fbuf = malloc(bytes);
    dl->gcap = dl->gbuf && dl->fbuf ? dl->real_bs : 0;
    if (!dl->gcap)
        return ca_error(CA_ERR_NOMEM, "dataloader: cannot allocate the global batch of %lld samples (%zu bytes)",
                        (long long)dl->real_bs, bytes);
    return CA_OK;
}

/* This rank's batches per epoch (-1: a stream) and the largest one. */
static ca_status pass_size(ca_dataloader *dl, int64_t *total, int64_t *cap) {
    if (dl->ds->iterable) {
        ca_status s = stream_setup(dl);
        *total = -1;
        *cap = dl->proc_bs;
        return s;
    }
    if (dl->has_sampler) {
        ca_status s = sampler_epoch(dl, dl->epoch, &dl->sout);
        *total = dl->sout.count;
        *cap = 1;
        for (int64_t b = 0; b < dl->sout.count; b++)
            if (ca_index_batches_len(&dl->sout, b) > *cap) *cap = ca_index_batches_len(&dl->sout, b);
        return s;
    }
    plan_now(dl, &dl->plan);
    *total = dl->plan.rank_batches;
    *cap = dispatching(dl) ? global_bs(dl) : dl->batch_size;
    return CA_OK;
}

/* Stops and joins the worker and forgets the pass (buffered batches included). */
static void stop_pass(ca_dataloader *dl) {
    if (dl->thread_live) {
        atomic_store(&dl->stop, true);
        pthread_mutex_lock(&dl->mu);
        pthread_cond_broadcast(&dl->freed);
        pthread_mutex_unlock(&dl->mu);
        pthread_join(dl->thread, NULL);
        dl->thread_live = false;
    }
    dl->active = false;
}

static ca_status start_pass(ca_dataloader *dl) {
    int64_t total, cap;
    ca_status st = pass_size(dl, &total, &cap);
    if (st != CA_OK) return st;
    int64_t first = dl->skip;
    if (total >= 0 && first > total) {
        CA_LOG_W("dataloader: skip_batches(%lld) is beyond the %lld batches of epoch %lld on "
                 "this rank; the epoch is empty",
                 (long long)first, (long long)total, (long long)dl->epoch);
        first = total;
    }
    dl->first = first;
    dl->count = total < 0 ? -1 : total - first;
    dl->done = dl->count == 0;
    dl->produced = dl->consumed = 0;
    dl->part = 0;
    dl->pass_seed = effective_seed(dl);
    dl->pass_epoch = dl->epoch;
    atomic_store(&dl->stop, false);

    /* dispatching, only rank 0 reads; the others receive into the first slot */
    bool reads = !dispatching(dl) || dl->rank == 0;
    if (dl->count != 0 || !reads) {
        ca_status s = staging_ensure(dl, cap);
        if (s != CA_OK) return s;
    }
    if (dl->count != 0 && reads) {
        if (!dl->ds->iterable && !dl->has_sampler && dl->plan.n > dl->perm_cap) {
            int64_t *p = realloc(dl->perm, sizeof *p * (size_t)dl->plan.n);
            if (!p)
                return ca_error(CA_ERR_NOMEM,
                                "dataloader: cannot allocate the permutation of %lld samples",
                                (long long)dl->plan.n);
            dl->perm = p;
            dl->perm_cap = dl->plan.n;
        }
        int rc = pthread_create(&dl->thread, NULL, worker_main, dl);
        if (rc != 0)
            return ca_error(CA_ERR_NOMEM, "dataloader: cannot start the prefetch thread: %s",
                            strerror(rc));
        dl->thread_live = true;
    }
    /* The skip is used up only by a pass that started. */
    dl->skip = 0;
    dl->active = true;
    return CA_OK;
}

/* Abandons a pass in flight because a setting changed; clears a sticky error. */
static void reset_for_change(ca_dataloader *dl, bool changed) {
    if (changed && dl->active) stop_pass(dl);
    dl->status = CA_OK;
    dl->msg[0] = dl->hint[0] = '\0';
}

/* -------------------------------------------------------------- batches */

static ca_status copy_in(ca_device *dev, ca_tensor *t, const void *src, size_t bytes) {
    if (!t) return ca_last_status() != CA_OK ? ca_last_status() : CA_ERR_NOMEM;
    if (bytes == 0) return CA_OK;
    return ca_device_copy_from_host(dev, ca_tensor_data(t), src, bytes);
}

/* Samples first .. first + size - 1 of slot s as x and y tensors on the
 * loader's device, in the current scope; `padded` of them are repeats. */
static ca_status batch_from(ca_dataloader *dl, const slot *s, int64_t first, int64_t size, int64_t padded,
                            ca_batch *b) {
    ca_dataset *ds = dl->ds;
    ca_device *dev = dl->dev;
    int64_t shape[CA_MAX_DIMS];
    const unsigned char *xmem = s->mem + (size_t)first * ds->x_bytes;
    const unsigned char *ymem = s->mem + dl->y_off + (size_t)first * ds->y_bytes;
    size_t xbytes = (size_t)size * ds->x_bytes, ybytes = (size_t)size * ds->y_bytes;

    shape[0] = size;
    for (int d = 0; d < ds->x.ndim; d++) shape[1 + d] = ds->x.shape[d];
    ca_tensor *x;
    bool cast = dl->x_cast && (dl->x_dtype != ds->x.dtype || dl->x_scale != 1.0f);
    if (cast) {
        const ca_kernels *k = ca_device_kernels(dev);
        if (!k || !k->cast)
            return ca_error(CA_ERR_UNSUPPORTED,
                            "dataloader: device %s has no 'cast' kernel to convert x from %s to %s",
                            ca_device_name(dev), ca_dtype_name(ds->x.dtype),
                            ca_dtype_name(dl->x_dtype));
        /* The raw batch is freed as soon as it is converted, not with the step. */
        ca_tensor *raw = ca_tensor_keep(ca_empty(dev, ds->x.dtype, 1 + ds->x.ndim, shape));
        ca_status st = copy_in(dev, raw, xmem, xbytes);
        x = ca_empty(dev, dl->x_dtype, 1 + ds->x.ndim, shape);
        if (st == CA_OK && !x) st = ca_last_status() != CA_OK ? ca_last_status() : CA_ERR_NOMEM;
        if (st == CA_OK)
            st = CA_KCALL(dev, cast, .src_dt = ds->x.dtype, .x = ca_tensor_data(raw), .dst_dt = dl->x_dtype,
                          .y = ca_tensor_data(x), .n = ca_tensor_numel(x), .alpha = dl->x_scale);
        ca_tensor_free(raw);
        if (st != CA_OK) return ca_error_context("dataloader: converting x (%s -> %s) on %s",
                                                 ca_dtype_name(ds->x.dtype),
                                                 ca_dtype_name(dl->x_dtype), ca_device_name(dev));
    } else {
        x = ca_empty(dev, ds->x.dtype, 1 + ds->x.ndim, shape);
        ca_status st = copy_in(dev, x, xmem, xbytes);
        if (st != CA_OK) return ca_error_context("dataloader: batch x on %s", ca_device_name(dev));
    }

    for (int d = 0; d < ds->y.ndim; d++) shape[1 + d] = ds->y.shape[d];
    ca_tensor *y = ca_empty(dev, ds->y.dtype, 1 + ds->y.ndim, shape);
    ca_status st = copy_in(dev, y, ymem, ybytes);
    if (st != CA_OK) return ca_error_context("dataloader: batch y on %s", ca_device_name(dev));

    b->x = x;
    b->y = y;
    b->size = size;
    b->index = s->index;
    b->epoch = dl->epoch;
    b->num_padded = padded;
    return CA_OK;
}

/* Slot s (its micro-batch dl->part in deterministic mode) as the batch. */
static ca_status make_batch(ca_dataloader *dl, const slot *s, ca_batch *b) {
    int64_t first = 0, size = s->size, padded = s->num_padded;
    if (dl->parts > 1) {
        int64_t start;
        ca_shard_plan_part(&dl->plan, dl->parts, s->index, dl->part, &start, &size, &padded);
        first = (int64_t)dl->part * (dl->plan.batch_size / dl->parts);
    }
    return batch_from(dl, s, first, size, padded, b);
}

static void end_step_scope(ca_dataloader *dl) {
    if (!dl->step_scope) return;
    ca_scope_end_id(dl->step_scope, dl->step_scope_id);
    dl->step_scope = NULL;
}

bool ca_dataloader_handed_last(const ca_dataloader *dl) { return dl && dl->handed_last; }

void ca_dataloader_handed_part(const ca_dataloader *dl, int *part, int *parts) {
    *part = dl && dl->parts > 1 ? dl->handed_part : 0;
    *parts = dl ? dl->parts : 0;
}

uint64_t ca_dataloader_handed_seq(const ca_dataloader *dl) {
    return dl && dl->active ? dl->handed_seq : 0;
}

void ca_dataloader_set_owner(ca_dataloader *dl, const ca_dataloader_owner *owner) {
    dl->owner = owner ? owner->owner : NULL;
    dl->owner_forget = owner ? owner->forget : NULL;
}

/* After a batch is consumed: whether it was the pass's last. A stream's end is
 * known only once the worker has tried to read the next batch, so this waits for
 * that (Accelerate's DataLoaderShard also reads one batch ahead to know it). */
static bool last_of_pass(ca_dataloader *dl) {
    if (dl->count >= 0) return dl->consumed == dl->count;
    pthread_mutex_lock(&dl->mu);
    while (dl->produced <= dl->consumed && !dl->done) pthread_cond_wait(&dl->ready, &dl->mu);
    bool last = dl->produced <= dl->consumed;
    pthread_mutex_unlock(&dl->mu);
    return last;
}

/* ------------------------------------------------------------ dispatch_batches */

/* The header rank 0 broadcasts before each batch (and at the end of the pass). */
enum { H_STATUS, H_SIZE, H_PADDED, H_INDEX, H_FLAGS, H_LEN };
enum { H_END = 1, H_LAST = 2 };

/* Rank 0: whether the batch about to be handed out is the pass's last; a
 * stream's end is known once the worker has tried the next one (it has a
 * second slot for it, staging_ensure). */
static bool pending_is_last(ca_dataloader *dl) {
    if (dl->count >= 0) return dl->consumed + 1 >= dl->count;
    pthread_mutex_lock(&dl->mu);
    while (dl->produced <= dl->consumed + 1 && !dl->done) pthread_cond_wait(&dl->ready, &dl->mu);
    bool last = dl->produced <= dl->consumed + 1;
    pthread_mutex_unlock(&dl->mu);
    return last;
}

/* Rank 0: the header of the next global batch, or of the end of the pass. */
static void dispatch_header(ca_dataloader *dl, int64_t *h) {
    pthread_mutex_lock(&dl->mu);
    while (dl->produced <= dl->consumed && !dl->done) pthread_cond_wait(&dl->ready, &dl->mu);
    bool end = dl->produced <= dl->consumed;
    pthread_mutex_unlock(&dl->mu);
    if (end) {
        h[H_FLAGS] = H_END;
        return;
    }
    const slot *s = &dl->slots[dl->consumed % dl->nslots];
    h[H_STATUS] = s->status;
    h[H_SIZE] = s->size;
    h[H_PADDED] = s->num_padded;
    h[H_INDEX] = s->index;
    h[H_FLAGS] = s->status == CA_OK && pending_is_last(dl) ? H_LAST : 0;
}

/* Ends the pass on an error of this rank; false for next(). */
static bool dispatch_fail(ca_dataloader *dl, ca_status st) {
    set_sticky_from_thread(dl, st);
    stop_pass(dl);
    return report_sticky(dl);
}

/* The header as received: what a rank other than 0 can check of it. */
static ca_status check_header(const ca_dataloader *dl, const int64_t *h) {
    int64_t g = global_bs(dl);
    if (h[H_SIZE] > 0 && h[H_SIZE] <= g && h[H_SIZE] % dl->world == 0 && h[H_PADDED] >= 0 &&
        h[H_PADDED] < dl->world && h[H_PADDED] < h[H_SIZE])
        return CA_OK;
    return ca_error(CA_ERR_BACKEND,
                    "dispatch_batches: rank 0 sent batch %lld of %lld samples (%lld repeats); rank %d expects a "
                    "multiple of %d up to %lld (are batch_size and split_batches the same on every rank?)",
                    (long long)h[H_INDEX], (long long)h[H_SIZE], (long long)h[H_PADDED], dl->rank, dl->world,
                    (long long)g);
}

/* Rank 0 sends the global batch (host bytes of its slot); the others receive it
 * into their first slot. */
static ca_status dispatch_payload(ca_dataloader *dl, slot *s, const int64_t *h) {
    if (dl->rank != 0) {
        ca_status st = check_header(dl, h);
        if (st != CA_OK) return st;
        s->size = h[H_SIZE];
        s->num_padded = h[H_PADDED];
        s->index = h[H_INDEX];
        s->status = CA_OK;
    }
    size_t xb = (size_t)s->size * dl->ds->x_bytes, yb = (size_t)s->size * dl->ds->y_bytes;
    ca_status st = xb ? dl->dops.bcast(dl->dctx, s->mem, xb) : CA_OK;
    if (st == CA_OK && yb) st = dl->dops.bcast(dl->dctx, s->mem + dl->y_off, yb);
    if (st != CA_OK)
        ca_error_context("dispatch_batches: broadcasting batch %lld of epoch %lld from rank 0 (rank %d)",
                         (long long)s->index, (long long)dl->epoch, dl->rank);
    return st;
}

/* Rank 0's read error, which it reports itself; the others name it. */
static bool dispatch_read_error(ca_dataloader *dl, const int64_t *h) {
    if (dl->rank == 0) {
        const slot *s = &dl->slots[dl->consumed % dl->nslots];
        dl->status = s->status;
        snprintf(dl->msg, sizeof dl->msg, "%s", s->msg);
        snprintf(dl->hint, sizeof dl->hint, "%s", s->hint);
        stop_pass(dl);
        return report_sticky(dl);
    }
    ca_error((ca_status)h[H_STATUS],
             "dispatch_batches: rank 0 could not read batch %lld of epoch %lld (%s); its log names the cause",
             (long long)h[H_INDEX], (long long)dl->epoch, ca_status_name((ca_status)h[H_STATUS]));
    return dispatch_fail(dl, (ca_status)h[H_STATUS]);
}

/* Opens the step scope around this rank's slice of the global batch in s. */
static ca_status dispatch_batch(ca_dataloader *dl, const slot *s, ca_batch *b, ca_scope **scope) {
    int64_t first, len, pad;
    ca_dispatch_slice(s->size, s->num_padded, dl->rank, dl->world, &first, &len, &pad);
    *scope = ca_scope_begin();
    if (!*scope) return ca_error(CA_ERR_NOMEM, "dataloader: cannot open the step scope");
    ca_status st = batch_from(dl, s, first, len, pad, b);
    if (st != CA_OK) {
        ca_scope_end(*scope);
        *scope = NULL;
        memset(b, 0, sizeof *b);
    }
    return st;
}

/* One step of a dispatching loader: every rank takes part in the same
 * broadcasts, so every rank ends the epoch on the same step. */
static bool dispatch_next(ca_dataloader *dl, ca_batch *b) {
    int64_t h[H_LEN] = {0};
    bool root = dl->rank == 0;
    if (root) dispatch_header(dl, h);
    ca_status st = dl->dops.bcast(dl->dctx, h, sizeof h);
    if (st != CA_OK) {
        ca_error_context("dispatch_batches: the header of batch %lld of epoch %lld from rank 0 (rank %d)",
                         (long long)(dl->first + dl->consumed), (long long)dl->epoch, dl->rank);
        return dispatch_fail(dl, st);
    }
    if (h[H_FLAGS] & H_END) {
        stop_pass(dl);
        dl->epoch++;
        return false;
    }
    if (h[H_STATUS] != CA_OK) return dispatch_read_error(dl, h);
    slot *s = &dl->slots[root ? dl->consumed % dl->nslots : 0];
    ca_scope *scope = NULL;
    st = dispatch_payload(dl, s, h);
    if (st == CA_OK) st = dispatch_batch(dl, s, b, &scope);
    if (st != CA_OK) return dispatch_fail(dl, st);
    pthread_mutex_lock(&dl->mu);
    dl->consumed++;
    pthread_cond_signal(&dl->freed);
    pthread_mutex_unlock(&dl->mu);
    dl->handed_part = 0;
    dl->step_scope = scope;
    dl->step_scope_id = ca_scope_id(scope);
    dl->scope_thread = pthread_self();
    dl->handed_last = (h[H_FLAGS] & H_LAST) != 0;
    dl->handed_seq = atomic_fetch_add(&handed_counter, 1) + 1;
    return true;
}

/* The profiler's slice of the training loop's wait for the prefetching worker's next batch. */
static void trace_wait(const ca_dataloader *dl, int64_t t0, bool end) {
    char a[96];
    snprintf(a, sizeof a, "\"batch\":%llu,\"epoch\":%llu,\"end_of_pass\":%s", (unsigned long long)dl->consumed,
             (unsigned long long)dl->epoch, end ? "true" : "false");
    ca_trace_slice("dataloader", "dataloader_wait", t0, a);
}

bool ca_dataloader_next(ca_dataloader *dl, ca_batch *b) {
    if (!dl || !b) {
        ca_error(CA_ERR_INVALID, "ca_dataloader_next: NULL argument");
        return false;
    }
    memset(b, 0, sizeof *b);
    /* The previous step's temporaries go first, then (prepared) its graph runs: Accelerate's
     * MpDeviceLoader marks the step. In this order a lazy device sees them freed, as torch_xla sees
     * Python's dead tensors at mark_step: they are the graph's intermediates, placed by liveness
     * in its arena or eliminated, instead of blocks that outlive it. */
    end_step_scope(dl);
    if (dl->owner && dl->dev && ca_device_mark_step(dl->dev) != CA_OK) {
        set_sticky_from_thread(dl, ca_last_status());
        return false;
    }
    dl->handed_last = false;
    if (dl->status != CA_OK) return report_sticky(dl);

    if (!dl->active) {
        ca_status s = start_pass(dl);
        if (s != CA_OK) {
            set_sticky_from_thread(dl, s);
            return false;
        }
    }
    if (dispatching(dl)) return dispatch_next(dl, b);
    int64_t t0 = ca_trace_on() ? ca_trace_now_ns() : 0;
    pthread_mutex_lock(&dl->mu);
    while (dl->produced <= dl->consumed && !dl->done) pthread_cond_wait(&dl->ready, &dl->mu);
    bool end = dl->produced <= dl->consumed;
    pthread_mutex_unlock(&dl->mu);
    if (t0) trace_wait(dl, t0, end);
    if (end) {
        stop_pass(dl);
        dl->epoch++;
        return false;
    }
    slot *s = &dl->slots[dl->consumed % dl->nslots];
    if (s->status != CA_OK) {
        dl->status = s->status;
        snprintf(dl->msg, sizeof dl->msg, "%s", s->msg);
        snprintf(dl->hint, sizeof dl->hint, "%s", s->hint);
        stop_pass(dl);
        return report_sticky(dl);
    }

    ca_scope *scope = ca_scope_begin();
    ca_status st = scope ? make_batch(dl, s, b)
                         : ca_error(CA_ERR_NOMEM, "dataloader: cannot open the step scope");
    dl->handed_part = dl->part;
    bool more = st == CA_OK && dl->part + 1 < dl->parts;   /* the slot holds more micro-batches */
    dl->part = more ? dl->part + 1 : 0;
    if (!more) {
        pthread_mutex_lock(&dl->mu);
        dl->consumed++;
        pthread_cond_signal(&dl->freed);
        pthread_mutex_unlock(&dl->mu);
    }
    if (st != CA_OK) {
        set_sticky_from_thread(dl, st);
        ca_scope_end(scope);
        memset(b, 0, sizeof *b);
        stop_pass(dl);
        return report_sticky(dl);
    }
    dl->step_scope = scope;
    dl->step_scope_id = ca_scope_id(scope);
    dl->scope_thread = pthread_self();
    dl->handed_last = dl->part == 0 && last_of_pass(dl);
    dl->handed_seq = atomic_fetch_add(&handed_counter, 1) + 1;
    return true;
}

/* -------------------------------------------------------------- lifecycle */

ca_status ca_dataloader_create(ca_dataset *ds, const ca_loader_opts *opts, ca_dataloader **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_dataloader_create: out is NULL");
    *out = NULL;
    if (!ds) return ca_error(CA_ERR_INVALID, "ca_dataloader_create: dataset is NULL");
    if (!ds->iterable && ca_dataset_length(ds) == 0)   /* else every epoch is silently empty: loss 0 */
        return ca_error(CA_ERR_INVALID, "dataloader: %s has no items", ds->name);
    ca_loader_opts o = opts ? *opts : (ca_loader_opts){0};
    if (o.batch_size < 0)
        return ca_error(CA_ERR_INVALID, "dataloader: batch_size is %lld", (long long)o.batch_size);
    if (o.prefetch < 0)
        return ca_error(CA_ERR_INVALID, "dataloader: prefetch is %d", o.prefetch);
    if (o.x_dtype_set && ca_dtype_size(o.x_dtype) == 0)
        return ca_error(CA_ERR_INVALID, "dataloader: x_dtype %d is not a dtype", (int)o.x_dtype);
    ca_device *dev = ca_cpu_device();
    if (!dev) return ca_error_context("dataloader: no CPU device");

    ca_dataloader *dl = calloc(1, sizeof *dl);
    if (!dl) return ca_error(CA_ERR_NOMEM, "ca_dataloader_create: out of memory");
    dl->ds = ds;
    dl->batch_size = o.batch_size ? o.batch_size : 1;
    dl->shuffle = o.shuffle;
    dl->drop_last = o.drop_last;
    dl->seed_opt = o.seed;
    dl->prefetch = o.prefetch ? o.prefetch : 2;
    dl->x_cast = o.x_dtype_set;
    dl->x_dtype = o.x_dtype;
    dl->x_scale = o.x_scale != 0.0f ? o.x_scale : 1.0f;
    dl->rank = 0;
    dl->world = 1;
    dl->even_batches = true;
    dl->dev = dev;
    atomic_init(&dl->stop, false);
    if (pthread_mutex_init(&dl->mu, NULL) != 0) {
        free(dl);
        return ca_error(CA_ERR_NOMEM, "ca_dataloader_create: cannot create a mutex");
    }
    if (pthread_cond_init(&dl->ready, NULL) != 0) {
        pthread_mutex_destroy(&dl->mu);
        free(dl);
        return ca_error(CA_ERR_NOMEM, "ca_dataloader_create: cannot create a condition variable");
    }
    if (pthread_cond_init(&dl->freed, NULL) != 0) {
        pthread_cond_destroy(&dl->ready);
        pthread_mutex_destroy(&dl->mu);
        free(dl);
        return ca_error(CA_ERR_NOMEM, "ca_dataloader_create: cannot create a condition variable");
    }
    *out = dl;
    return CA_OK;
}

void ca_dataloader_destroy(ca_dataloader *dl) {
    if (!dl) return;
    if (dl->owner && dl->owner_forget) dl->owner_forget(dl->owner, dl);
    stop_pass(dl);
    /* A loop left with break still has its last step scope open: end it
     * (scopes belong to a thread, so only from the thread that opened it). */
    if (dl->step_scope && pthread_equal(dl->scope_thread, pthread_self())) end_step_scope(dl);
    staging_free(dl);
    free(dl->perm);
    free(dl->gbuf);
    free(dl->fbuf);
    if (dl->has_sampler && dl->sops.destroy) dl->sops.destroy(dl->sctx);
    ca_index_batches_free(&dl->sin);
    ca_index_batches_free(&dl->sout);
    pthread_cond_destroy(&dl->freed);
    pthread_cond_destroy(&dl->ready);
    pthread_mutex_destroy(&dl->mu);
    free(dl);
}

/* -------------------------------------------------------------- queries and settings */

ca_status ca_dataloader_status(const ca_dataloader *dl) { return dl ? dl->status : CA_ERR_INVALID; }

/* This rank's batches of the current epoch from the custom sampler (-1 on error). */
static int64_t sampler_batches(const ca_dataloader *dl, int64_t *samples) {
    ca_dataloader *m = (ca_dataloader *)dl;   /* the sampler's scratch list only */
    ca_index_batches out = {0};
    int64_t n = -1;
    if (sampler_epoch(m, dl->epoch, &out) == CA_OK) {
        n = out.count;
        *samples = out.count ? out.off[out.count] : 0;
        for (int64_t b = 0; b < out.count; b++) *samples -= out.pad[b];
    }
    ca_index_batches_free(&out);
    return n;
}

int64_t ca_dataloader_num_batches(const ca_dataloader *dl) {
    if (!dl) return 0;
    if (dl->ds->iterable) return -1;
    int64_t samples;
    if (dl->has_sampler) return sampler_batches(dl, &samples);
    ca_shard_plan p;
    plan_now(dl, &p);
    return p.rank_batches;
}

/* Dispatching: this rank's slices of rank 0's global batches, repeats excluded. */
static int64_t dispatch_samples(const ca_dataloader *dl, const ca_shard_plan *p) {
    int64_t sum = 0;
    for (int64_t b = 0; b < p->rank_batches; b++) {
        int64_t start, m, pad, first, len;
        ca_shard_plan_batch(p, b, &start, &m, &pad);
        int64_t size = ca_dispatch_padded(m, dl->world);
        ca_dispatch_slice(size, size - m, dl->rank, dl->world, &first, &len, &pad);
        sum += len - pad;
    }
    return sum;
}

int64_t ca_dataloader_num_samples(const ca_dataloader *dl) {
    if (!dl) return 0;
    if (dl->ds->iterable) return -1;
    int64_t samples = -1;
    if (dl->has_sampler) return sampler_batches(dl, &samples) < 0 ? -1 : samples;
    ca_shard_plan p;
    plan_now(dl, &p);
    return dispatching(dl) ? dispatch_samples(dl, &p) : ca_shard_plan_samples(&p);
}

int64_t ca_dataloader_epoch(const ca_dataloader *dl) { return dl ? dl->epoch : 0; }

ca_status ca_dataloader_set_epoch(ca_dataloader *dl, int64_t epoch) {
    if (!dl) return ca_error(CA_ERR_INVALID, "ca_dataloader_set_epoch: loader is NULL");
    if (epoch < 0) return ca_error(CA_ERR_INVALID, "dataloader: epoch %lld is negative", (long long)epoch);
    reset_for_change(dl, epoch != dl->epoch);
    dl->epoch = epoch;
    return CA_OK;
}

ca_status ca_dataloader_set_seed(ca_dataloader *dl, uint64_t seed) {
    if (!dl) return ca_error(CA_ERR_INVALID, "ca_dataloader_set_seed: loader is NULL");
    uint64_t before = effective_seed(dl);
    dl->seed_set = seed;
    reset_for_change(dl, dl->shuffle && effective_seed(dl) != before);
    return CA_OK;
}

ca_status ca_dataloader_skip_batches(ca_dataloader *dl, int64_t k) {
    if (!dl) return ca_error(CA_ERR_INVALID, "ca_dataloader_skip_batches: loader is NULL");
    int64_t nb = ca_dataloader_num_batches(dl);
    if (k < 0 || (nb >= 0 && k > nb))
        return ca_error(CA_ERR_INVALID,
                        "dataloader: cannot skip %lld batches: an epoch has %lld on this rank "
                        "(%lld samples, batch size %lld, rank %d of %d)",
                        (long long)k, (long long)nb, (long long)ca_dataset_length(dl->ds),
                        (long long)dl->batch_size, dl->rank, dl->world);
    reset_for_change(dl, true);
    dl->skip = k;
    return CA_OK;
}

void ca_dataloader_get_state(const ca_dataloader *dl, ca_loader_state *out) {
    *out = (ca_loader_state){.epoch = dl->epoch,
                             .position = dl->active ? dl->first + dl->consumed : dl->skip,
                             .batch_size = dl->has_sampler ? dl->sampler_bs : dl->batch_size,
                             .dataset_len = ca_dataset_length(dl->ds),
                             .rank_batches = ca_dataloader_num_batches(dl), .seed = effective_seed(dl),
                             .seed_fixed = dl->seed_opt, .shuffle = dl->shuffle,
                             .drop_last = dl->drop_last, .split = dl->split, .world = dl->world};
}

ca_status ca_dataloader_set_device(ca_dataloader *dl, ca_device *dev) {
    if (!dl || !dev) return ca_error(CA_ERR_INVALID, "ca_dataloader_set_device: NULL argument");
    reset_for_change(dl, dev != dl->dev);
    dl->dev = dev;
    return CA_OK;
}

/* The batch size the loader declares: its batch sampler's (0: sizes vary) or its own. */
static int64_t declared_bs(const ca_dataloader *dl) { return dl->has_sampler ? dl->sampler_bs : dl->batch_size; }

/* split_batches needs the global batch (of declared size bs) to divide among the processes. */
static ca_status check_split(int64_t bs, bool split, int world) {
    if (!split || world <= 1 || (bs > 0 && bs % world == 0)) return CA_OK;
    if (bs == 0)
        return ca_error(CA_ERR_INVALID, "split_batches: the batch sampler's batches vary in size (batch_size 0); "
                        "split_batches needs a batch size that the %d processes divide", world);
    return ca_error(CA_ERR_INVALID,
                    "split_batches: the batch size %lld is not a multiple of the %d processes (with split_batches "
                    "the loader's batch_size is the global batch and each process gets batch_size / %d)",
                    (long long)bs, world, world);
}

/* even_batches completes the last round so that every process gets a batch of the same size;
 * batches of varying size cannot be (the processes' batches differ, and collectives over them,
 * gather_for_metrics, stop matching). Accelerate's BatchSamplerShard refuses the pair too. */
static ca_status check_even(const ca_dataloader *dl, int64_t bs, bool even, int world) {
    if (!even || world <= 1 || bs > 0) return CA_OK;
    ca_status s = ca_error(CA_ERR_INVALID, "even_batches: %s: the batch sampler's batches vary in size (batch_size "
                           "0), so the %d processes cannot be given batches of one size; even_batches needs a "
                           "sampler with a fixed batch_size", dl->ds->name, world);
    ca_error_hint("set even_batches false (key even_batches, --even_batches false, CACCEL_EVEN_BATCHES=false), "
                  "as Accelerate asks of a batch sampler without a batch size");
    return s;
}

ca_status ca_dataloader_set_split_batches(ca_dataloader *dl, bool split) {
    if (!dl) return ca_error(CA_ERR_INVALID, "ca_dataloader_set_split_batches: loader is NULL");
    ca_status s = check_split(declared_bs(dl), split, dl->world);
    if (s != CA_OK) return s;
    reset_for_change(dl, split != dl->split);
    dl->split = split;
    return CA_OK;
}

ca_status ca_dataloader_set_batch_sampler(ca_dataloader *dl, const ca_batch_sampler_ops *ops, void *ctx,
                                          int64_t batch_size, bool drop_last) {
    if (!dl || !ops) return ca_error(CA_ERR_INVALID, "ca_dataloader_set_batch_sampler: NULL argument");
    size_t need = offsetof(ca_batch_sampler_ops, next) + sizeof ops->next;
    if (ops->struct_size < need || !ops->next)
        return ca_error(CA_ERR_INVALID, "ca_dataloader_set_batch_sampler: ops->next is required and "
                        "ops->struct_size must be sizeof(ca_batch_sampler_ops) (%zu given)", ops->struct_size);
    if (dl->ds->iterable)
        return ca_error(CA_ERR_INVALID, "ca_dataloader_set_batch_sampler: %s has no indices to sample",
                        dl->ds->name);
    if (batch_size < 0 || batch_size > CA_BATCH_SAMPLER_MAX)
        return ca_error(CA_ERR_INVALID, "ca_dataloader_set_batch_sampler: batch_size %lld (0 .. %d)",
                        (long long)batch_size, CA_BATCH_SAMPLER_MAX);
    if (dl->dops.bcast)
        return ca_error(CA_ERR_UNSUPPORTED, "ca_dataloader_set_batch_sampler: not on a loader prepared with "
                        "dispatch_batches (rank 0 reads global batches of batch_size samples)");
    /* a loader prepared already keeps its sharding options: they must hold for this sampler too */
    ca_status s = check_split(batch_size, dl->split, dl->world);
    if (s == CA_OK) s = check_even(dl, batch_size, dl->even_batches, dl->world);
    if (s != CA_OK) return s;
    reset_for_change(dl, true);
    if (dl->active) stop_pass(dl);
    if (dl->has_sampler && dl->sops.destroy) dl->sops.destroy(dl->sctx);
    memset(&dl->sops, 0, sizeof dl->sops);
    memcpy(&dl->sops, ops, ops->struct_size < sizeof dl->sops ? ops->struct_size : sizeof dl->sops);
    dl->sctx = ctx;
    dl->sampler_bs = batch_size;
    dl->sampler_drop = drop_last;
    dl->has_sampler = true;
    return CA_OK;
}

ca_status ca_dataloader_shard(ca_dataloader *dl, int rank, int world_size, bool even_batches) {
    if (!dl) return ca_error(CA_ERR_INVALID, "ca_dataloader_shard: loader is NULL");
    if (world_size < 1 || rank < 0 || rank >= world_size)
        return ca_error(CA_ERR_INVALID, "dataloader: rank %d of world size %d is not valid", rank,
                        world_size);
    ca_status s = check_split(declared_bs(dl), dl->split, world_size);
    if (s == CA_OK) s = check_even(dl, declared_bs(dl), even_batches, world_size);
    if (s != CA_OK) return s;
    bool changed = rank != dl->rank || world_size != dl->world || even_batches != dl->even_batches;
    reset_for_change(dl, changed);
    dl->rank = rank;
    dl->world = world_size;
    dl->even_batches = even_batches;
    return CA_OK;
}

ca_status ca_dataloader_check_parts(const ca_dataloader *dl, int parts) {
    if (!dl) return ca_error(CA_ERR_INVALID, "ca_dataloader_check_parts: loader is NULL");
    if (parts < 0) return ca_error(CA_ERR_INVALID, "dataloader: %d micro-batches per batch", parts);
    if (parts > 0 && dl->dops.bcast)
        return ca_error(CA_ERR_UNSUPPORTED, "deterministic mode does not combine with dispatch_batches (rank 0 "
                        "reads whole global batches; the virtual shards cut each rank's own reads)");
    if (parts > 0 && (dl->ds->iterable || dl->has_sampler))
        return ca_error(CA_ERR_INVALID, "deterministic mode needs a loader over a map-style dataset with its own "
                        "sampler (not %s)", dl->ds->iterable ? "an iterable dataset" : "a custom batch sampler");
    int64_t rank_bs = dl->split && dl->world > 1 ? dl->batch_size / dl->world : dl->batch_size;
    if (parts > 0 && rank_bs % parts != 0)
        return ca_error(CA_ERR_INVALID,
                        "deterministic mode: batch_size %lld per process is not a multiple of %d "
                        "(deterministic_shards / num_processes): the global batch must split into "
                        "deterministic_shards equal virtual shards",
                        (long long)rank_bs, parts);
    if (parts > 0 && !dl->even_batches && !dl->drop_last)
        return ca_error(CA_ERR_INVALID,
                        "deterministic mode needs even_batches=true or a loader with drop_last: the last "
                        "global batch must be whole at every world size");
    return CA_OK;
}

ca_status ca_dataloader_set_parts(ca_dataloader *dl, int parts) {
    ca_status s = ca_dataloader_check_parts(dl, parts);
    if (s != CA_OK) return s;
    reset_for_change(dl, parts != dl->parts);
    dl->parts = parts;
    return CA_OK;
}

ca_status ca_dataloader_set_dispatch(ca_dataloader *dl, const ca_dispatch_ops *ops, void *ctx) {
    if (!dl) return ca_error(CA_ERR_INVALID, "ca_dataloader_set_dispatch: loader is NULL");
    bool on = ops && ops->bcast;
    if (on && (dl->has_sampler || dl->parts > 0))
        return ca_error(CA_ERR_UNSUPPORTED, "dispatch_batches: not supported with %s; set dispatch_batches false",
                        dl->has_sampler ? "a custom batch sampler (its batches may vary in size)"
                                        : "deterministic mode (deterministic_shards)");
    reset_for_change(dl, on != (dl->dops.bcast != NULL) || (on && ctx != dl->dctx));
    dl->dops = on ? *ops : (ca_dispatch_ops){0};
    dl->dctx = on ? ctx : NULL;
    return CA_OK;
}
