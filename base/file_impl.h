/* file_impl.h: how every reader of the library opens a file it is handed. A FIFO in place of a
 * config file, a model or a checkpoint would block its reader forever, and a device such as
 * /dev/zero would be read until memory ran out; so a reader opens without blocking, accepts only a
 * regular file and refuses one larger than the bound of its kind before reading a byte. The kinds
 * and their bounds are the table of docs/RELIABILITY.md, "File sizes". /proc and /sys files are not
 * regular-sized and are read into fixed buffers instead. */
#ifndef CACCEL_FILE_IMPL_H
#define CACCEL_FILE_IMPL_H

#include <caccel/status.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* What a reader reads: named in its messages, bounded in size. */
typedef struct ca_file_kind {
    const char *what;       /* with its article, "a config file": "...; a config file must be one" */
    uint64_t max_bytes;     /* a larger file is refused before a byte of it is read */
    ca_status missing;      /* the status for a file that does not exist (the readers' contracts differ) */
    ca_status too_large;    /* the status for one above max_bytes */
} ca_file_kind;

#define CA_FILE_KIND(what, max, missing, too_large) ((ca_file_kind){(what), (max), (missing), (too_large)})

#define CA_FILE_MIB ((uint64_t)1 << 20)
#define CA_FILE_GIB ((uint64_t)1 << 30)
#define CA_FILE_NO_LIMIT UINT64_MAX

/* Accelerate's YAML or JSON config file and DeepSpeed's JSON: a few hundred bytes each. */
#define CA_FILE_MAX_CONFIG CA_FILE_MIB
#define CA_FILE_CONFIG CA_FILE_KIND("a config file", CA_FILE_MAX_CONFIG, CA_ERR_IO, CA_ERR_CONFIG)
#define CA_FILE_DEEPSPEED CA_FILE_KIND("a DeepSpeed config file", CA_FILE_MAX_CONFIG, CA_ERR_CONFIG, CA_ERR_CONFIG)
/* A model's config.json: about 1 KB; a classifier's label names may add some. */
#define CA_FILE_MODEL_CONFIG CA_FILE_KIND("a model config file", 16 * CA_FILE_MIB, CA_ERR_NOT_FOUND, CA_ERR_INVALID)
/* tokenizer.json or vocab.txt: the largest multilingual tokenizers are tens of MB. */
#define CA_FILE_TOKENIZER CA_FILE_KIND("a tokenizer file", 256 * CA_FILE_MIB, CA_ERR_IO, CA_ERR_INVALID)
/* A safetensors file is memory-mapped (read whole into host memory where it cannot be); the JSON
 * header has its own bound (100 MB, the reference reader's). */
#define CA_FILE_MAX_SAFETENSORS (256 * CA_FILE_GIB)
#define CA_FILE_SAFETENSORS CA_FILE_KIND("a safetensors file", CA_FILE_MAX_SAFETENSORS, CA_ERR_NOT_FOUND, CA_ERR_IO)
/* model.safetensors.index.json: one line per tensor. */
#define CA_FILE_INDEX CA_FILE_KIND("a safetensors index", 64 * CA_FILE_MIB, CA_ERR_NOT_FOUND, CA_ERR_IO)
/* An IDX file: a header of up to 16 bytes and at most 2^40 bytes of data (its dimensions' bound). */
#define CA_FILE_IDX CA_FILE_KIND("an IDX file", ((uint64_t)1 << 40) + 16, CA_ERR_IO, CA_ERR_IO)
/* A fortune collection: the largest of the fortunes packages is under 1 MB. */
#define CA_FILE_FORTUNES CA_FILE_KIND("a fortunes file", 64 * CA_FILE_MIB, CA_ERR_IO, CA_ERR_IO)
/* A checkpoint's JSON: caccel_state.json, complete.json, random_states_<rank>.json, zero_index.json. */
#define CA_FILE_CHECKPOINT_JSON CA_FILE_KIND("a checkpoint's JSON file", 64 * CA_FILE_MIB, CA_ERR_NOT_FOUND, CA_ERR_IO)
/* Any file of a checkpoint; a load also refuses one whose size is not the size complete.json records. */
#define CA_FILE_CHECKPOINT CA_FILE_KIND("a checkpoint file", CA_FILE_MAX_SAFETENSORS, CA_ERR_NOT_FOUND, CA_ERR_IO)
/* A plugin: only its ELF headers are read (before dlopen maps it). */
#define CA_FILE_PLUGIN CA_FILE_KIND("a plugin", CA_FILE_NO_LIMIT, CA_ERR_NOT_FOUND, CA_ERR_IO)
/* caccel launch's job token file: one line of at most a few hundred characters. */
#define CA_FILE_TOKEN CA_FILE_KIND("a job token file", 64 * 1024, CA_ERR_NOT_FOUND, CA_ERR_IO)
/* An MLflow experiment's meta.yaml: a few lines. */
#define CA_FILE_MLFLOW_META CA_FILE_KIND("an MLflow meta.yaml", CA_FILE_MIB, CA_ERR_NOT_FOUND, CA_ERR_IO)

/* Opens `path` for reading (close-on-exec, without blocking on a FIFO, never as a controlling
 * terminal), refuses anything but a regular file and a file larger than kind.max_bytes, and returns
 * a blocking descriptor and the file's size. Every error names the file. */
ca_status ca_file_open(const char *path, ca_file_kind kind, int *fd, uint64_t *size);

/* The same as a stdio stream, for readers that read by lines or ranges. */
ca_status ca_file_fopen(const char *path, ca_file_kind kind, FILE **f, uint64_t *size);

/* The whole file into a fresh buffer (the caller frees it), with a NUL after its *len bytes. */
ca_status ca_file_read(const char *path, ca_file_kind kind, char **buf, size_t *len);

/* Reads exactly n bytes at the descriptor's position, through short reads and EINTR; returns how
 * many it read (fewer at the end of the file), or -1 with errno set. */
int64_t ca_file_read_fd(int fd, void *buf, size_t n);

#endif
