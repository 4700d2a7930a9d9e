/* caccel/data.h: datasets (IDX / Fashion-MNIST, in-memory, custom) and the sharded, prefetching DataLoader. */
#ifndef CACCEL_DATA_H
#define CACCEL_DATA_H

#include <caccel/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- datasets */

/* Shape and dtype of one sample's input (x) or target (y). ndim 0 = scalar. */
typedef struct ca_sample_spec {
    ca_dtype dtype;
    int ndim;
    int64_t shape[CA_MAX_DIMS];
} ca_sample_spec;

/* A custom dataset: `get` writes sample i's x and y into host buffers of
 * ca_sample_spec size. Called from the loader's prefetch thread, so it must be
 * thread-safe with respect to the program's own use of ctx. */
typedef struct ca_dataset_ops {
    size_t struct_size;
    int64_t (*length)(void *ctx);
    ca_status (*get)(void *ctx, int64_t i, void *x, void *y);
    void (*destroy)(void *ctx);                      /* may be NULL */
} ca_dataset_ops;

typedef struct ca_dataset ca_dataset;

/* An iterable dataset (Accelerate's IterableDataset): a stream with no length
 * and no random access. `begin` restarts the stream for an epoch (every pass
 * calls it; the same epoch must give the same samples on every rank, as every
 * rank reads the whole stream and keeps its shard, unless the loader is
 * prepared with dispatch_batches: then rank 0 alone calls begin and next);
 * `next` writes the next sample into x and y, or sets *end at the end of the
 * stream. Both are called from the loader's prefetch thread. */
typedef struct ca_iterable_ops {
    size_t struct_size;
    ca_status (*begin)(void *ctx, int64_t epoch);
    ca_status (*next)(void *ctx, void *x, void *y, bool *end);
    void (*destroy)(void *ctx);                      /* may be NULL */
} ca_iterable_ops;

/* Wraps custom ops; the dataset owns ctx (destroy is called on ca_dataset_destroy). */
CA_API ca_status ca_dataset_create(const ca_dataset_ops *ops, void *ctx,
                                   const ca_sample_spec *x, const ca_sample_spec *y,
                                   ca_dataset **out);
/* An iterable dataset over ops (owns ctx like ca_dataset_create). A loader over
 * it shards the stream as Accelerate's IterableDatasetShard. */
CA_API ca_status ca_dataset_create_iterable(const ca_iterable_ops *ops, void *ctx, const ca_sample_spec *x,
                                            const ca_sample_spec *y, ca_dataset **out);
/* n samples held in memory: x is n * size(x spec) bytes, y likewise. The
 * data is copied. */
CA_API ca_status ca_dataset_from_memory(const ca_sample_spec *x, const void *xdata,
                                        const ca_sample_spec *y, const void *ydata, int64_t n,
                                        ca_dataset **out);
/* An IDX pair (images, labels), gzip'd or not, as from yann.lecun.com and
 * Fashion-MNIST: x u8 [rows, cols], y i64 scalar. Errors name the file and say
 * what is wrong (missing, bad magic, truncated, counts differ). */
CA_API ca_status ca_idx_dataset_open(const char *images_path, const char *labels_path,
                                     ca_dataset **out);
/* How ca_idx_load_tensors lays out what it reads. */
typedef struct ca_idx_load_opts {
    float x_scale;             /* x = pixel * x_scale (0: 1); 1/255 for [0, 1] */
    /* Row i of x and y holds sample order(i, n, order_ctx), n being the files' sample count: a
     * permutation of 0..n-1 (NULL: the files' order). */
    int64_t (*order)(int64_t i, int64_t n, void *order_ctx);
    void *order_ctx;
} ca_idx_load_opts;

/* An IDX pair (images, labels; gzip'd or not) straight into two persistent tensors on dev: x f32
 * [n, rows * cols] and y i64 [n] (free them with ca_tensor_free). The files are decompressed and
 * converted in chunks of about 1 MiB written into the tensors' memory (on a device whose memory is
 * not host memory, through one staging chunk): the host holds a chunk, never the whole split, so
 * the peak is the tensors plus a chunk where reading through ca_idx_dataset_open and ca_from_host
 * holds the u8 data and an f32 copy beside them. Same checks and messages as ca_idx_dataset_open;
 * a bad order fails with CA_ERR_INVALID naming the entry. */
CA_API ca_status ca_idx_load_tensors(ca_device *dev, const char *images_path, const char *labels_path,
                                     const ca_idx_load_opts *opts, ca_tensor **x, ca_tensor **y);
/* Fashion-MNIST from `dir` (NULL: $CACCEL_DATA_DIR/fashion-mnist, then
 * /usr/share/datasets/fashion-mnist from Debian's dataset-fashion-mnist).
 * Missing files fail with CA_ERR_IO and a hint naming the package and --data. */
CA_API ca_status ca_fashion_mnist_open(const char *dir, bool train, ca_dataset **out);
/* A Fashion-MNIST split (dir as ca_fashion_mnist_open) through ca_idx_load_tensors. */
CA_API ca_status ca_fashion_mnist_load_tensors(const char *dir, bool train, ca_device *dev,
                                               const ca_idx_load_opts *opts, ca_tensor **x, ca_tensor **y);
/* The directory ca_fashion_mnist_open(NULL, ...) would use, or NULL. */
CA_API const char *ca_fashion_mnist_default_dir(void);

/* Samples in d; -1 for an iterable dataset. */
CA_API int64_t ca_dataset_length(const ca_dataset *d);
CA_API bool ca_dataset_is_iterable(const ca_dataset *d);
CA_API const ca_sample_spec *ca_dataset_x_spec(const ca_dataset *d);
CA_API const ca_sample_spec *ca_dataset_y_spec(const ca_dataset *d);
/* Reads sample i into host buffers (not for an iterable dataset). */
CA_API ca_status ca_dataset_get(ca_dataset *d, int64_t i, void *x, void *y);
CA_API void ca_dataset_destroy(ca_dataset *d);      /* accepts NULL */

/* ------------------------------------------------------------- loader */

typedef struct ca_loader_opts {
    int64_t batch_size;        /* 0: 1 */
    bool shuffle;              /* permutation from (seed, epoch): same on every rank */
    bool drop_last;            /* false: a short last batch is kept (PyTorch's default) */
    uint64_t seed;             /* 0 with shuffle: the accelerator's (data_seed with
                                  use_seedable_sampler, else ca_set_seed's), else 0 */
    int prefetch;              /* batches read ahead by the background thread (0: 2) */
    /* Device-side conversion of x: dtype (0 = CA_F32... see x_dtype_set) and scale. */
    ca_dtype x_dtype;          /* with x_dtype_set: cast x to this on the device */
    bool x_dtype_set;
    float x_scale;             /* multiply x by this while casting (0: 1); 1/255 for pixels */
} ca_loader_opts;

/* One batch: x [B, ...] and y [B, ...] on the loader's device, in the step
 * scope (released when the next batch is handed out). */
typedef struct ca_batch {
    ca_tensor *x, *y;
    int64_t size;              /* B (the last batch may be shorter) */
    int64_t index;             /* batch number within this epoch (per rank) */
    int64_t epoch;
    int64_t num_padded;        /* samples repeated to keep ranks even (gather_for_metrics drops them) */
} ca_batch;

typedef struct ca_dataloader ca_dataloader;

/* A loader over ds (not owned: ds must outlive the loader). Batches go to the
 * CPU device until ca_prepare (or ca_dataloader_set_device) gives it the
 * training device and this rank's shard. */
CA_API ca_status ca_dataloader_create(ca_dataset *ds, const ca_loader_opts *opts,
                                      ca_dataloader **out);
CA_API void ca_dataloader_destroy(ca_dataloader *dl);  /* accepts NULL; joins the thread */

/* Hands out the next batch of this epoch: ends the previous batch's scope and
 * opens a new one (the step scope). Returns false at the end of the epoch
 * (after which the next call starts epoch+1) or on error: check
 * ca_dataloader_status(). A loader prepared with dispatch_batches on more than
 * one process receives the batch from rank 0 here: every rank must call it,
 * from the thread that drives the accelerator's collectives. */
CA_API bool ca_dataloader_next(ca_dataloader *dl, ca_batch *b);
/* CA_OK, or the error that made ca_dataloader_next return false. */
CA_API ca_status ca_dataloader_status(const ca_dataloader *dl);

/* Batches per epoch on this rank; -1 over an iterable dataset (unknown until
 * the stream ends). */
CA_API int64_t ca_dataloader_num_batches(const ca_dataloader *dl);
/* Samples per epoch on this rank (without padding); -1 over an iterable dataset. */
CA_API int64_t ca_dataloader_num_samples(const ca_dataloader *dl);
CA_API int64_t ca_dataloader_epoch(const ca_dataloader *dl);
/* Sets the epoch of the next pass (the shuffle depends on it). */
CA_API ca_status ca_dataloader_set_epoch(ca_dataloader *dl, int64_t epoch);
/* Seed of the shuffle (ca_set_seed calls this for prepared loaders). */
CA_API ca_status ca_dataloader_set_seed(ca_dataloader *dl, uint64_t seed);
/* Makes the next pass start at batch k of the current epoch (resume). */
CA_API ca_status ca_dataloader_skip_batches(ca_dataloader *dl, int64_t k);
/* Batches are delivered on dev (pinned staging + copy where it is not host memory). */
CA_API ca_status ca_dataloader_set_device(ca_dataloader *dl, ca_device *dev);
/* This loader yields rank's share of every epoch: ranks get disjoint samples
 * of the same permutation; with even_batches every rank gets the same number of
 * batches by repeating samples from the start (like Accelerate). */
CA_API ca_status ca_dataloader_shard(ca_dataloader *dl, int rank, int world_size,
                                     bool even_batches);

/* split_batches (Accelerate's DataLoaderConfiguration): the loader's batch_size
 * is the global batch and each of the world_size processes gets its slice of
 * batch_size / world_size samples (the batch size must be a multiple of it); a
 * short last batch is padded from the start with even_batches, cut without it.
 * Off: every process gets whole batches of batch_size. ca_prepare sets it from
 * the split_batches key. */
CA_API ca_status ca_dataloader_set_split_batches(ca_dataloader *dl, bool split);

/* A custom batch sampler (PyTorch's batch_sampler): `begin` starts an epoch,
 * `next` writes the indices of the next batch (at most `cap`) into idx and their
 * number into *len, 0 at the end of the epoch. For the same epoch it must give
 * the same batches on every rank and every call (the loader runs it at the start
 * of a pass and for ca_dataloader_num_batches). Called on the thread that drives
 * the loader. */
typedef struct ca_batch_sampler_ops {
    size_t struct_size;
    ca_status (*begin)(void *ctx, int64_t epoch);   /* may be NULL */
    ca_status (*next)(void *ctx, int64_t *idx, int64_t cap, int64_t *len);
    void (*destroy)(void *ctx);                      /* may be NULL */
} ca_batch_sampler_ops;

/* Largest batch a sampler with varying batch sizes may give. */
#define CA_BATCH_SAMPLER_MAX 65536

/* Makes dl read the batches of a batch sampler (owning ctx) instead of its own
 * (shuffle, batch_size and drop_last of the options no longer apply). batch_size
 * is the size of its batches but perhaps the last, 0 when they vary (Accelerate's
 * batch_size None; cap is then CA_BATCH_SAMPLER_MAX); drop_last as the sampler's.
 * Across processes the batches are sharded as Accelerate's BatchSamplerShard. Not
 * for an iterable dataset, nor a loader prepared with dispatch_batches. Varying
 * sizes on more than one process need even_batches false: with it this call, or
 * ca_dataloader_shard (ca_prepare), fails with CA_ERR_INVALID, as Accelerate. */
CA_API ca_status ca_dataloader_set_batch_sampler(ca_dataloader *dl, const ca_batch_sampler_ops *ops, void *ctx,
                                                 int64_t batch_size, bool drop_last);

#ifdef __cplusplus
}
#endif
#endif
