/* tensor/safetensors_impl.h: the safetensors file format (reader, writer) and atomic file writes.
 * Private to the library; accelerator/checkpoint.c builds the model files on it. */
#ifndef CACCEL_SAFETENSORS_IMPL_H
#define CACCEL_SAFETENSORS_IMPL_H

#include <caccel/types.h>

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

/* A whole safetensors file in memory, validated: every entry's dtype is known, its shape's byte
 * size equals end - begin, and the ranges lie inside the data section without overlapping. */
typedef struct ca_st_file {
    char *path;
    uint8_t *buf;                      /* the file's bytes */
    size_t size;
    size_t data_start;                 /* 8 + header length */
    int n;
    ca_st_entry *entries;              /* in header order */
} ca_st_file;

/* Reads and validates `path`. Errors (CA_ERR_NOT_FOUND, CA_ERR_IO for a truncated or malformed
 * file, CA_ERR_NOMEM) name the file and, where one is involved, the tensor. On failure *f is
 * left empty (ca_st_close is still allowed). */
ca_status ca_st_open(const char *path, ca_st_file *f);
void ca_st_close(ca_st_file *f);
/* The entry called `name`, or NULL. */
const ca_st_entry *ca_st_find(const ca_st_file *f, const char *name);
static inline const void *ca_st_data(const ca_st_file *f, const ca_st_entry *e) {
    return f->buf + f->data_start + e->begin;
}

/* A tensor to write: host data, row-major, ca_dtype_size(dtype) * numel bytes. */
typedef struct ca_st_tensor {
    const char *name;
    ca_dtype dtype;
    int ndim;
    const int64_t *shape;
    const void *data;
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
} ca_st_held;
typedef struct ca_st_capture {
    ca_st_held *files;
    int n, cap;
    int kept;       /* buffers kept by ca_st_capture_reset for the next capture: files[0..kept) */
    size_t bytes;   /* all files together */
} ca_st_capture;
/* Sets the calling thread's capture (NULL: write to the disk again); returns the previous one. */
ca_st_capture *ca_st_capture_set(ca_st_capture *c);
/* Writes every held file as ca_st_write_atomic does (to path.tmp, fsync, rename, fsync of the
 * directory; renamed in the order they were captured), all files' data first, so that the disk
 * writes them while crcs[i] (crcs non-NULL) gets each file's CRC-32 from memory. A failure names
 * the file and leaves no .tmp file. */
ca_status ca_st_capture_write(const ca_st_capture *c, uint32_t *crcs);
void ca_st_capture_free(ca_st_capture *c);   /* the buffers; the struct is the caller's */
/* Empties the capture but keeps its buffers: the next capture of files of the same sizes (the
 * next save of the same state) reuses them, without the page faults of fresh memory. */
void ca_st_capture_reset(ca_st_capture *c);

/* "F32", "F16", "BF16", "I32", "I64", "U8". */
const char *ca_st_dtype_name(ca_dtype dt);

#endif
