/* tensor/safetensors_impl.h: the safetensors file format (reader, writer) and atomic file writes.
 * Private to the library; accelerator/checkpoint.c builds the model files on it. */
#ifndef CACCEL_SAFETENSORS_IMPL_H
#define CACCEL_SAFETENSORS_IMPL_H

#include <caccel/types.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One tensor of a file read by ca_st_open: its data lies at data + begin of the file's buffer. */
typedef struct ca_st_entry {
    char *name;
    ca_dtype dtype;
    int ndim;
    int64_t shape[CA_MAX_DIMS];
    uint64_t begin, end;               /* data_offsets, relative to the data section */
} ca_st_entry;

/* What a checkpoint's complete.json records of a file: its size, its CRC-32 and, for files written
 * since chunk sums exist, the CRC-32 of every chunk_size bytes (the last chunk shorter). */
typedef struct ca_st_sums {
    uint64_t size;
    uint32_t crc32;
    uint64_t chunk_size;               /* 0: no chunk sums (an older checkpoint): verified whole */
    size_t nchunks;                    /* ceil(size / chunk_size) */
    const uint32_t *chunk_crc;         /* copied by ca_st_open_checked */
} ca_st_sums;

/* The chunk size save_state records (docs/CHECKPOINTS.md, "Chunk sums"): a slice a rank reads costs
 * at most one chunk more at each end, and the list stays under 1 MB for a 256 GiB file. */
#define CA_ST_CHUNK_SIZE ((uint64_t)4 << 20)

/* A whole safetensors file, memory-mapped (read-only, private) where the file system allows it,
 * else read into memory; validated: every entry's dtype is known, its shape's byte size equals
 * end - begin, and the ranges lie inside the data section without overlapping. A mapped file's
 * pages are read from disk only when touched: a caller that reads part of a tensor reads that part. */
typedef struct ca_st_file {
    char *path;
    uint8_t *buf;                      /* the file's bytes (read-only when mapped) */
    size_t size;
    size_t data_start;                 /* 8 + header length */
    int n;
    ca_st_entry *entries;              /* in header order */
    /* private to tensor/safetensors.c and tensor/st_parts.c */
    bool mapped;                       /* buf is a mapping of fd (else malloc'd) */
    int fd;                            /* valid when mapped: for the size check before a use */
    bool has_sums, all_ok;             /* sums given; every byte verified */
    ca_st_sums sums;
    uint8_t *chunk_ok;                 /* [sums.nchunks]: chunk verified (each is hashed once) */
    uint64_t verified;                 /* bytes hashed so far (CACCEL_TEST_ST_REPORT) */
    uint64_t read;                     /* bytes read by ca_st_read_range's pread (CACCEL_TEST_ST_REPORT) */
} ca_st_file;

/* Maps (or reads) and validates `path`. Errors (CA_ERR_NOT_FOUND, CA_ERR_IO for a truncated or
 * malformed file, CA_ERR_NOMEM) name the file and, where one is involved, the tensor. On failure
 * *f is left empty (ca_st_close is still allowed). Sums are not checked: ca_st_open_checked. */
ca_status ca_st_open(const char *path, ca_st_file *f);
/* ca_st_open for a file a checkpoint lists with `sums`: a file of another size is refused, and the
 * bytes are verified before the header is parsed, all of them (whole) or only the chunks holding
 * the header (!whole: the caller verifies the ranges it reads with ca_st_verify_range). A CRC
 * mismatch is CA_ERR_IO "<path>: corrupt: ..." naming the chunk where there are chunk sums. */
ca_status ca_st_open_checked(const char *path, const ca_st_sums *sums, bool whole, ca_st_file *f);
/* ca_st_open_checked verifying nothing, not even the header: for processes that verify every chunk
 * together by parts (ca_st_parts_verify) before anything they read from the file is used; the parse
 * still refuses a malformed header. */
ca_status ca_st_open_unverified(const char *path, const ca_st_sums *sums, ca_st_file *f);
/* Verifies bytes [off, off + len) of the file (the chunks that hold them, each once; without chunk
 * sums the whole file, once) and that the file still has its size (a file truncated under a
 * mapping would fault on access: SIGBUS). A file opened without sums has nothing to verify: only
 * the size is checked. */
ca_status ca_st_verify_range(ca_st_file *f, uint64_t off, uint64_t len);
/* Bytes [off, off + len) of the file into dst, verified as ca_st_verify_range verifies them, read
 * with pread rather than through the mapping (whose pages then stay out of the process): a chunk
 * not yet verified is read whole into a buffer of the chunk's size, hashed and the part copied; a
 * verified one's part is read alone. A file in memory (no mapping), or one verified whole (sums
 * without chunks), is copied from there. Errors name the file (a file cut short: CA_ERR_IO). */
ca_status ca_st_read_range(ca_st_file *f, uint64_t off, uint64_t len, void *dst);
/* pread of len bytes at off from descriptor fd of file `path`, all of them: a short file is CA_ERR_IO
 * "<path>: reading N bytes at offset O: the file is shorter than when it was checked". */
ca_status ca_st_pread(int fd, const char *path, void *dst, size_t len, uint64_t off);
/* The bytes one of k processes read of a checkpoint file opened with chunk sums, hashed as they are
 * read (tensor/st_parts.c), to verify the chunks together without any process reading one whole: the
 * processes' parts of each chunk must partition it (each byte added by exactly one of them), then
 * ca_st_parts_sums gives this process's sum of every chunk (its bytes, the others taken as zero) and
 * ca_st_parts_verify checks the k processes' sums against the recorded chunk CRC-32s (CRC-32 is affine:
 * their XOR is the chunk's), marking the chunks verified. ca_st_parts_apply: whether f has chunk sums
 * (else ca_st_parts_new gives NULL and the file is verified whole instead). ca_st_parts_add takes any
 * file offset and length (a ca_meta_src_set_tap callback; a failed allocation is reported by
 * ca_st_parts_sums); ca_st_parts_add_rest adds, from the mapping, every byte outside the file's tensors
 * in a chunk not verified yet (the header's end, gaps): one process adds them. Not thread-safe. */
typedef struct ca_st_parts ca_st_parts;
bool ca_st_parts_apply(const ca_st_file *f);
ca_status ca_st_parts_new(const ca_st_file *f, ca_st_parts **out);
void ca_st_parts_add(void *parts, uint64_t off, const void *bytes, size_t len);
ca_status ca_st_parts_add_rest(ca_st_parts *parts, ca_st_file *f);
/* out: f->sums.nchunks sums. Errors name `path`. */
ca_status ca_st_parts_sums(ca_st_parts *parts, const char *path, uint32_t *out);
/* sums: `rows` rows of f->sums.nchunks, the sums of k processes (a row may be the XOR of several
 * processes' sums, combined in a first exchange). A mismatch is CA_ERR_IO "<path>: corrupt: ..." naming
 * the chunk, on every process alike. */
ca_status ca_st_parts_verify(ca_st_file *f, const uint32_t *sums, int rows, int k);
void ca_st_parts_free(ca_st_parts *parts);   /* accepts NULL */
/* Releases the mapping or the buffer; with CACCEL_TEST_ST_REPORT set, first prints to stderr
 * "safetensors: <path>: <v> of <size> bytes verified, <r> resident, <p> read" (r: the mapping's
 * resident bytes from /proc/self/smaps, -1 where unknown; p: the bytes ca_st_read_range read), the
 * tests' measure of what a load read. */
void ca_st_close(ca_st_file *f);
/* The entry called `name`, or NULL. */
const ca_st_entry *ca_st_find(const ca_st_file *f, const char *name);
static inline const void *ca_st_data(const ca_st_file *f, const ca_st_entry *e) {
    return f->buf + f->data_start + e->begin;
}

/* A tensor to write: host data, row-major, ca_dtype_size(dtype) * numel bytes. With data NULL, fill
 * writes those bytes to dst when the file is made (a device tensor copied out): under a capture
 * straight into the captured file's buffer, so the bytes are copied once; else into a buffer of the
 * writer's, freed after the write. A failed fill fails the write. */
typedef struct ca_st_tensor {
    const char *name;
    ca_dtype dtype;
    int ndim;
    const int64_t *shape;
    const void *data;
    ca_status (*fill)(void *ctx, void *dst, size_t len);
    void *ctx;
} ca_st_tensor;

/* Writes the n tensors to `path` atomically (ca_st_write_atomic), sorted by name, with
 * "__metadata__": {"format": "pt"} and the header padded with spaces to a multiple of 8. */
ca_status ca_st_write(const char *path, const ca_st_tensor *t, int n);

/* Writes the concatenation of parts to path.tmp, fsyncs it, renames it to path and fsyncs the
 * directory: readers see the old file or the whole new one. Errors name the file. */
ca_status ca_st_write_atomic(const char *path, const void *const *parts, const size_t *lens,
                             int nparts);

/* Files held in memory instead of written: while a capture is set on a thread, that thread's
 * ca_st_write_atomic (and so ca_st_write) copies the bytes it would write into one buffer per file
 * and returns; nothing touches the disk. An asynchronous save_state takes its snapshot so (the bytes
 * are those a direct write would have written) and writes the files later, on another thread, with
 * ca_st_capture_write. */
typedef struct ca_st_held {
    char *path;
    unsigned char *data;
    size_t len, size;   /* bytes held, bytes allocated */
    uint32_t *sums;     /* ca_st_capture_write with a chunk size: each chunk's CRC-32 (NULL: none) */
    size_t nsums;
    bool hooked;        /* data came from the capture's alloc (else malloc) */
} ca_st_held;
typedef struct ca_st_capture {
    ca_st_held *files;
    int n, cap;
    int kept;       /* buffers kept by ca_st_capture_reset for the next capture: files[0..kept) */
    size_t bytes;   /* all files together */
    /* Optional: where the file buffers come from (a device's pinned host memory); NULL, or an alloc that
     * returns NULL: malloc. free gets back what alloc gave. */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *ptr);
    void *alloc_ctx;
} ca_st_capture;
/* Sets the calling thread's capture (NULL: write to the disk again); returns the previous one. */
ca_st_capture *ca_st_capture_set(ca_st_capture *c);
/* Writes every held file as ca_st_write_atomic does (to path.tmp, fsync, rename, fsync of the
 * directory; renamed in the order they were captured), all files' data first, so that the disk
 * writes them while crcs[i] (crcs non-NULL) gets each file's CRC-32 from memory; with chunk > 0
 * (a larger one than UINT32_MAX counts as 0) also files[i].sums, the CRC-32 of every chunk bytes (the last shorter), in
 * the same one pass: the file's CRC-32 is combined from them (crc32_combine). A failure names the
 * file and leaves no .tmp file. */
ca_status ca_st_capture_write(ca_st_capture *c, uint32_t *crcs, uint64_t chunk);
void ca_st_capture_free(ca_st_capture *c);   /* the buffers; the struct is the caller's (its allocator stays) */
/* Empties the capture but keeps its buffers: the next capture of files of the same sizes (the
 * next save of the same state) reuses them, without the page faults of fresh memory. */
void ca_st_capture_reset(ca_st_capture *c);

/* "F32", "F16", "BF16", "I32", "I64", "U8". */
const char *ca_st_dtype_name(ca_dtype dt);

#endif
