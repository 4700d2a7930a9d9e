/* The IDX reader (gzip'd or plain, through zlib's gz* API) and the IDX image/label dataset. */
#include "data/data_impl.h"
#include "base/file_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define IDX_MAGIC_IMAGES 0x00000803u  /* u8, 3 dimensions: n, rows, cols */
#define IDX_MAGIC_LABELS 0x00000801u  /* u8, 1 dimension: n */
#define IDX_CHUNK (4u << 20)

/* One IDX file read into memory. */
typedef struct idx_file {
    uint32_t dims[3];
    unsigned char *data;
    size_t bytes;
} idx_file;

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static const char *idx_kind(uint32_t magic) {
    switch (magic) {
    case IDX_MAGIC_IMAGES: return " (IDX images)";
    case IDX_MAGIC_LABELS: return " (IDX labels)";
    default: return "";
    }
}

/* zlib's message for a failed gzread, or NULL when the stream merely ended. */
static const char *gz_failure(gzFile f) {
    int errnum = Z_OK;
    const char *msg = gzerror(f, &errnum);
    if (errnum == Z_OK) return NULL;
    if (errnum == Z_ERRNO) return strerror(errno);
    return msg && *msg ? msg : "unknown zlib error";
}

/* Reads up to `want` bytes; returns how many, or -1 on a zlib/read error. */
static int64_t gz_read_all(gzFile f, unsigned char *dst, size_t want) {
    size_t got = 0;
    while (got < want) {
        size_t ask = want - got < IDX_CHUNK ? want - got : IDX_CHUNK;
        int r = gzread(f, dst + got, (unsigned)ask);
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (int64_t)got;
}

static ca_status corrupt(gzFile f, const char *path) {
    const char *why = gz_failure(f);
    if (!why) why = "unknown zlib error";
    /* zlib prefixes its message with the path, which ours names already. */
    size_t plen = strlen(path);
    if (!strncmp(why, path, plen) && !strncmp(why + plen, ": ", 2)) why += plen + 2;
    ca_status s = ca_error(CA_ERR_IO, "'%s' is not a valid gzip file or is corrupt (zlib: %s)",
                           path, why);
    ca_error_hint("download or install the file again");
    return s;
}

static ca_status truncated_header(const char *path, int64_t got, size_t hdr_len) {
    return ca_error(CA_ERR_IO, "IDX file '%s' is truncated: %lld bytes, a header of %zu bytes expected",
                    path, (long long)got, hdr_len);
}

/* The magic number and the dimensions; *payload gets the data's size in bytes. */
static ca_status read_header(gzFile f, const char *path, uint32_t want_magic, int want_ndims,
                             idx_file *out, uint64_t *payload) {
    unsigned char hdr[4 + 4 * 3];
    size_t hdr_len = 4 + 4 * (size_t)want_ndims;
    int64_t got = gz_read_all(f, hdr, 4);
    if (got < 0) return corrupt(f, path);
    if (got < 4) return truncated_header(path, got, hdr_len);
    uint32_t magic = be32(hdr);
    if (magic != want_magic && (hdr[0] != 0 || hdr[1] != 0))
        return ca_error(CA_ERR_IO, "'%s' is not an IDX file: bad magic 0x%08x, expected 0x%08x%s", path,
                        magic, want_magic, idx_kind(want_magic));
    if (magic != want_magic)
        return ca_error(CA_ERR_IO, "IDX file '%s' has magic 0x%08x%s (type 0x%02x, %u dimensions), "
                        "expected 0x%08x%s", path, magic, idx_kind(magic), hdr[2], hdr[3], want_magic,
                        idx_kind(want_magic));
    got = gz_read_all(f, hdr + 4, hdr_len - 4);
    if (got < 0) return corrupt(f, path);
    if ((size_t)got < hdr_len - 4) return truncated_header(path, got + 4, hdr_len);
    *payload = 1;
    for (int d = 0; d < want_ndims; d++) {
        out->dims[d] = be32(hdr + 4 + 4 * d);
        /* The sample count may be 0; rows and cols may not. */
        if (d > 0 && out->dims[d] == 0) return ca_error(CA_ERR_IO, "IDX file '%s': dimension %d is 0", path, d);
        if (out->dims[d] && *payload > ((uint64_t)1 << 40) / out->dims[d])
            return ca_error(CA_ERR_IO, "IDX file '%s': header dimensions are implausibly large", path);
        *payload *= out->dims[d];
    }
#if SIZE_MAX < UINT64_MAX
    if (*payload > SIZE_MAX) return ca_error(CA_ERR_IO, "IDX file '%s' is too large for this machine", path);
#endif
    return CA_OK;
}

/* Reads up to `payload` bytes into out->data, growing the buffer as data arrives, so a corrupt
 * header claiming terabytes ends as "truncated", not as a failed giant allocation. */
static ca_status read_payload(gzFile f, const char *path, uint64_t payload, idx_file *out, size_t *have) {
    size_t cap = payload < (64u << 20) ? (size_t)payload : (64u << 20);
    *have = 0;
    out->data = malloc(cap ? cap : 1);
    if (!out->data) return ca_error(CA_ERR_NOMEM, "reading '%s': cannot allocate %zu bytes", path, cap);
    for (;;) {
        int64_t got = gz_read_all(f, out->data + *have, cap - *have);
        if (got < 0) return corrupt(f, path);
        *have += (size_t)got;
        if (*have < cap || cap == payload) return CA_OK;
        size_t ncap = cap * 2 < payload ? cap * 2 : (size_t)payload;
        unsigned char *p = realloc(out->data, ncap);
        if (!p) return ca_error(CA_ERR_NOMEM, "reading '%s': cannot allocate %zu bytes", path, ncap);
        out->data = p;
        cap = ncap;
    }
}

static ca_status truncated_data(gzFile f, const char *path, const idx_file *out, int want_ndims,
                                uint64_t payload, size_t have, size_t hdr_len) {
    const char *cut = gz_failure(f) ? "; the gzip stream is cut short" : "";
    const char *raw = gzdirect(f) ? "" : " (uncompressed)";
    if (want_ndims == 3)
        return ca_error(CA_ERR_IO, "IDX file '%s' is truncated: its header (%u x %u x %u) needs %llu bytes, "
                        "the file has %llu%s%s", path, out->dims[0], out->dims[1], out->dims[2],
                        (unsigned long long)(payload + hdr_len), (unsigned long long)(have + hdr_len), raw, cut);
    return ca_error(CA_ERR_IO, "IDX file '%s' is truncated: its header (%u labels) needs %llu bytes, "
                    "the file has %llu%s%s", path, out->dims[0], (unsigned long long)(payload + hdr_len),
                    (unsigned long long)(have + hdr_len), raw, cut);
}

/* Trailing bytes mean the header and the data disagree; reading on also makes zlib check the
 * gzip trailer (CRC and length). */
static ca_status check_end(gzFile f, const char *path, uint64_t expected) {
    unsigned char extra[4096];
    uint64_t more = 0;
    for (;;) {
        int64_t got = gz_read_all(f, extra, sizeof extra);
        if (got < 0) return corrupt(f, path);
        if (got == 0) break;
        more += (uint64_t)got;
    }
    if (!more) return CA_OK;
    return ca_error(CA_ERR_IO, "IDX file '%s' is longer than its header says: %llu bytes expected, "
                    "the file has %llu%s", path, (unsigned long long)expected,
                    (unsigned long long)(expected + more), gzdirect(f) ? "" : " (uncompressed)");
}

static ca_status idx_read(const char *path, uint32_t want_magic, int want_ndims, idx_file *out) {
    memset(out, 0, sizeof *out);
    if (!path) return ca_error(CA_ERR_INVALID, "IDX path is NULL");
    int fd;
    ca_status st = ca_file_open(path, CA_FILE_IDX, &fd, NULL);
    if (st != CA_OK) return st;
    gzFile f = gzdopen(fd, "rb");   /* owns fd from here, gzclose closes it */
    if (!f) {
        close(fd);
        return ca_error(CA_ERR_NOMEM, "IDX file '%s': out of memory for the gzip stream", path);
    }
    gzbuffer(f, 1u << 18);
    size_t hdr_len = 4 + 4 * (size_t)want_ndims, have = 0;
    uint64_t payload = 0;
    st = read_header(f, path, want_magic, want_ndims, out, &payload);
    if (st == CA_OK) st = read_payload(f, path, payload, out, &have);
    if (st == CA_OK && have < payload) st = truncated_data(f, path, out, want_ndims, payload, have, hdr_len);
    if (st == CA_OK) st = check_end(f, path, payload + hdr_len);
    if (st == CA_OK) out->bytes = (size_t)payload;
    gzclose(f);
    if (st != CA_OK) {
        free(out->data);
        out->data = NULL;
    }
    return st;
}

/* ------------------------------------------------------------- dataset */

typedef struct idx_ctx {
    int64_t n;
    size_t image_bytes;
    unsigned char *images;
    unsigned char *labels;
} idx_ctx;

static int64_t idx_length(void *ctx) { return ((idx_ctx *)ctx)->n; }

static ca_status idx_get(void *ctx, int64_t i, void *x, void *y) {
    idx_ctx *c = ctx;
    memcpy(x, c->images + (size_t)i * c->image_bytes, c->image_bytes);
    int64_t label = c->labels[i];
    memcpy(y, &label, sizeof label);
    return CA_OK;
}

static void idx_destroy(void *ctx) {
    idx_ctx *c = ctx;
    free(c->images);
    free(c->labels);
    free(c);
}

static const ca_dataset_ops idx_ops = {
    .struct_size = sizeof(ca_dataset_ops),
    .length = idx_length,
    .get = idx_get,
    .destroy = idx_destroy,
};

ca_status ca_idx_dataset_open(const char *images_path, const char *labels_path,
                              ca_dataset **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_idx_dataset_open: out is NULL");
    *out = NULL;
    if (!images_path || !labels_path)
        return ca_error(CA_ERR_INVALID, "ca_idx_dataset_open: a path is NULL");
    idx_file img, lab;
    ca_status s = idx_read(images_path, IDX_MAGIC_IMAGES, 3, &img);
    if (s != CA_OK) return s;
    s = idx_read(labels_path, IDX_MAGIC_LABELS, 1, &lab);
    if (s != CA_OK) {
        free(img.data);
        return s;
    }
    if (img.dims[0] != lab.dims[0]) {
        free(img.data);
        free(lab.data);
        return ca_error(CA_ERR_IO, "IDX sample counts differ: '%s' has %u images, '%s' has %u labels",
                        images_path, img.dims[0], labels_path, lab.dims[0]);
    }
    idx_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        free(img.data);
        free(lab.data);
        return ca_error(CA_ERR_NOMEM, "ca_idx_dataset_open: out of memory");
    }
    c->n = img.dims[0];
    c->image_bytes = (size_t)img.dims[1] * img.dims[2];
    c->images = img.data;
    c->labels = lab.data;
    ca_sample_spec xs = {.dtype = CA_U8, .ndim = 2, .shape = {img.dims[1], img.dims[2]}};
    ca_sample_spec ys = {.dtype = CA_I64, .ndim = 0};
    s = ca_dataset_create(&idx_ops, c, &xs, &ys, out);
    if (s != CA_OK) {
        idx_destroy(c);
        return s;
    }
    snprintf((*out)->name, sizeof (*out)->name, "IDX dataset '%s'", images_path);
    return CA_OK;
}
