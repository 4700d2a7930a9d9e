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

/* Opens path and reads its header: *f is the stream positioned at the data, *payload its size. */
static ca_status idx_open(const char *path, uint32_t want_magic, int want_ndims, idx_file *out, gzFile *f,
                          uint64_t *payload) {
    memset(out, 0, sizeof *out);
    *f = NULL;
    if (!path) return ca_error(CA_ERR_INVALID, "IDX path is NULL");
    int fd;
    ca_status st = ca_file_open(path, CA_FILE_IDX, &fd, NULL);
    if (st != CA_OK) return st;
    *f = gzdopen(fd, "rb");   /* owns fd from here, gzclose closes it */
    if (!*f) {
        close(fd);
        return ca_error(CA_ERR_NOMEM, "IDX file '%s': out of memory for the gzip stream", path);
    }
    gzbuffer(*f, 1u << 18);
    st = read_header(*f, path, want_magic, want_ndims, out, payload);
    if (st != CA_OK) {
        gzclose(*f);
        *f = NULL;
    }
    return st;
}

static ca_status idx_read(const char *path, uint32_t want_magic, int want_ndims, idx_file *out) {
    gzFile f;
    uint64_t payload = 0;
    ca_status st = idx_open(path, want_magic, want_ndims, out, &f, &payload);
    if (st != CA_OK) return st;
    size_t hdr_len = 4 + 4 * (size_t)want_ndims, have = 0;
    st = read_payload(f, path, payload, out, &have);
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

/* ------------------------------------------------------------- straight into device tensors */

/* Decompressed bytes converted per pass: the host staging of ca_idx_load_tensors is one such chunk
 * (and its converted copy where the device's memory is not host memory), whatever the file's size. */
#define IDX_LOAD_CHUNK (1u << 20)

/* Where the rows of one IDX file go: a [n, row] tensor of f32 (pixel * scale) or i64 (labels). */
typedef struct idx_sink {
    ca_tensor *t;
    ca_device *dev;
    unsigned char *base;       /* ca_tensor_data(t) */
    size_t in_row, out_row;    /* bytes of a row in the file and in the tensor */
    float scale;
    const int64_t *dest;       /* dest[j]: the tensor row of the file's row j (NULL: j) */
    unsigned char *stage;      /* one chunk of converted rows, where the device is not the host */
} idx_sink;

static void convert_row(const idx_sink *k, const unsigned char *in, unsigned char *out) {
    if (ca_tensor_dtype(k->t) == CA_I64) {
        int64_t v = in[0];
        memcpy(out, &v, sizeof v);
        return;
    }
    float *o = (float *)(void *)out;
    for (size_t i = 0; i < k->in_row; i++) o[i] = (float)in[i] * k->scale;
}

static int64_t dest_row(const idx_sink *k, int64_t j) { return k->dest ? k->dest[j] : j; }

/* Rows [j0, j0 + rows) of the file, read into buf, into their tensor rows: written in place on a host
 * device; elsewhere converted into the stage and copied in runs of consecutive tensor rows. */
static ca_status sink_rows(idx_sink *k, int64_t j0, int64_t rows, const unsigned char *buf) {
    if (!k->stage) {
        for (int64_t j = 0; j < rows; j++)
            convert_row(k, buf + (size_t)j * k->in_row, k->base + (size_t)dest_row(k, j0 + j) * k->out_row);
        return CA_OK;
    }
    for (int64_t j = 0; j < rows; j++) convert_row(k, buf + (size_t)j * k->in_row, k->stage + (size_t)j * k->out_row);
    for (int64_t j = 0; j < rows;) {
        int64_t run = 1, r = dest_row(k, j0 + j);
        while (j + run < rows && dest_row(k, j0 + j + run) == r + run) run++;
        ca_status s = ca_device_copy_from_host(k->dev, k->base + (size_t)r * k->out_row,
                                               k->stage + (size_t)j * k->out_row, (size_t)run * k->out_row);
        if (s != CA_OK) return s;
        j += run;
    }
    return CA_OK;
}

/* Streams the data of an opened IDX file (n rows of in_row bytes) into the sink, one chunk at a time. */
static ca_status sink_stream(gzFile f, const char *path, const idx_file *hdr, int ndims, uint64_t payload,
                             idx_sink *k) {
    int64_t n = hdr->dims[0];
    int64_t chunk = (int64_t)(IDX_LOAD_CHUNK / k->out_row);
    if (chunk < 1) chunk = 1;
    if (chunk > n) chunk = n ? n : 1;
    unsigned char *buf = malloc((size_t)chunk * k->in_row);
    if (!buf) return ca_error(CA_ERR_NOMEM, "reading '%s': cannot allocate its staging chunk", path);
    if (!ca_device_is_host(k->dev)) {
        k->stage = malloc((size_t)chunk * k->out_row);
        if (!k->stage) {
            free(buf);
            return ca_error(CA_ERR_NOMEM, "reading '%s': cannot allocate its staging chunk", path);
        }
    }
    ca_status st = CA_OK;
    size_t have = 0, hdr_len = 4 + 4 * (size_t)ndims;
    for (int64_t j = 0; j < n && st == CA_OK; j += chunk) {
        int64_t rows = n - j < chunk ? n - j : chunk;
        int64_t got = gz_read_all(f, buf, (size_t)rows * k->in_row);
        if (got < 0) st = corrupt(f, path);
        else if ((size_t)got < (size_t)rows * k->in_row)
            st = truncated_data(f, path, hdr, ndims, payload, have + (size_t)got, hdr_len);
        else st = sink_rows(k, j, rows, buf);
        if (got > 0) have += (size_t)got;
    }
    if (st == CA_OK) st = check_end(f, path, payload + hdr_len);
    free(buf);
    free(k->stage);
    k->stage = NULL;
    return st;
}

/* One IDX file into a new persistent tensor [n, in_row] (f32 * scale) or [n] (i64); *n_out is its
 * sample count, which must equal want_n unless want_n is -1. */
static ca_status idx_load_one(ca_device *dev, const char *path, uint32_t magic, int ndims, float scale,
                              int64_t want_n, const int64_t *dest, const char *other, ca_tensor **out,
                              int64_t *n_out) {
    idx_file hdr;
    gzFile f;
    uint64_t payload = 0;
    ca_status st = idx_open(path, magic, ndims, &hdr, &f, &payload);
    if (st != CA_OK) return st;
    int64_t n = hdr.dims[0];
    if (want_n >= 0 && n != want_n) {
        gzclose(f);
        return ca_error(CA_ERR_IO, "IDX sample counts differ: '%s' has %lld images, '%s' has %lld labels", path,
                        (long long)n, other, (long long)want_n);
    }
    idx_sink k = {.dev = dev, .scale = scale, .dest = dest};
    if (ndims == 3) {
        k.in_row = (size_t)hdr.dims[1] * hdr.dims[2];
        k.out_row = k.in_row * sizeof(float);
        k.t = ca_tensor_keep(ca_empty(dev, CA_F32, CA_SHAPE(n, (int64_t)k.in_row)));
    } else {
        k.in_row = 1;
        k.out_row = sizeof(int64_t);
        k.t = ca_tensor_keep(ca_empty(dev, CA_I64, CA_SHAPE(n)));
    }
    k.base = k.t && n ? ca_tensor_data(k.t) : NULL;
    if (!k.t || (n && !k.base)) st = ca_last_status() ? ca_last_status() : ca_error(CA_ERR_NOMEM, "'%s': no tensor", path);
    if (st == CA_OK) st = sink_stream(f, path, &hdr, ndims, payload, &k);
    gzclose(f);
    if (st != CA_OK) {
        ca_tensor_free(k.t);
        return st;
    }
    *out = k.t;
    *n_out = n;
    return CA_OK;
}

/* dest[j] = i where order(i) = j: the inverse of a permutation of 0..n-1, checked. */
static ca_status invert_order(const ca_idx_load_opts *o, int64_t n, int64_t **dest) {
    *dest = NULL;
    if (!o->order) return CA_OK;
    int64_t *d = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (!d) return ca_error(CA_ERR_NOMEM, "ca_idx_load_tensors: cannot allocate the order's inverse");
    for (int64_t j = 0; j < n; j++) d[j] = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t j = o->order(i, n, o->order_ctx);
        ca_status s = CA_OK;
        if (j < 0 || j >= n)
            s = ca_error(CA_ERR_INVALID, "ca_idx_load_tensors: order(%lld) = %lld is outside 0..%lld", (long long)i,
                         (long long)j, (long long)(n - 1));
        else if (d[j] >= 0)
            s = ca_error(CA_ERR_INVALID, "ca_idx_load_tensors: order is not a permutation: sample %lld is at rows "
                         "%lld and %lld", (long long)j, (long long)d[j], (long long)i);
        if (s != CA_OK) {
            free(d);
            return s;
        }
        d[j] = i;
    }
    *dest = d;
    return CA_OK;
}

/* The labels' header alone: the sample count, to check the order before any tensor is made. */
static ca_status idx_count(const char *path, uint32_t magic, int ndims, int64_t *n) {
    idx_file hdr;
    gzFile f;
    uint64_t payload;
    ca_status st = idx_open(path, magic, ndims, &hdr, &f, &payload);
    if (st != CA_OK) return st;
    gzclose(f);
    *n = hdr.dims[0];
    return CA_OK;
}

ca_status ca_idx_load_tensors(ca_device *dev, const char *images_path, const char *labels_path,
                              const ca_idx_load_opts *opts, ca_tensor **x, ca_tensor **y) {
    if (!x || !y) return ca_error(CA_ERR_INVALID, "ca_idx_load_tensors: x or y is NULL");
    *x = *y = NULL;
    if (!dev) return ca_error(CA_ERR_INVALID, "ca_idx_load_tensors: device is NULL");
    if (!images_path || !labels_path) return ca_error(CA_ERR_INVALID, "ca_idx_load_tensors: a path is NULL");
    ca_idx_load_opts o = opts ? *opts : (ca_idx_load_opts){0};
    float scale = o.x_scale != 0 ? o.x_scale : 1.0f;
    int64_t n = 0, got = 0, *dest = NULL;
    ca_status st = idx_count(labels_path, IDX_MAGIC_LABELS, 1, &n);
    if (st == CA_OK) st = invert_order(&o, n, &dest);
    if (st == CA_OK) st = idx_load_one(dev, labels_path, IDX_MAGIC_LABELS, 1, 1.0f, -1, dest, NULL, y, &got);
    if (st == CA_OK && got != n)
        st = ca_error(CA_ERR_IO, "IDX file '%s' changed while it was read", labels_path);
    if (st == CA_OK) st = idx_load_one(dev, images_path, IDX_MAGIC_IMAGES, 3, scale, n, dest, labels_path, x, &got);
    free(dest);
    if (st != CA_OK) {
        ca_tensor_free(*y);
        ca_tensor_free(*x);
        *x = *y = NULL;
    }
    return st;
}
