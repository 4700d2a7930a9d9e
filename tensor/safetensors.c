/* tensor/safetensors.c: the safetensors format (an 8-byte little-endian header length, a JSON
 * header, then the raw little-endian data), read and written as the reference implementation
 * does, with json-c for the header. Every malformed file fails with the file and tensor named. */
#include "tensor/safetensors_impl.h"
#include "core/json_impl.h"
#include "base/base_impl.h"
#include "base/file_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <zlib.h>

/* The reference reader refuses headers over 100 MB; so do we (a corrupt length is caught early). */
#define CA_ST_MAX_HEADER (100u * 1000u * 1000u)

/* No size given: a dtype appended to CA_DTYPE_LIST without its name here fails to compile. */
static const char *const st_names[] = {
    [CA_F32] = "F32", [CA_F16] = "F16", [CA_BF16] = "BF16",
    [CA_I32] = "I32", [CA_I64] = "I64", [CA_U8] = "U8",
};
CA_TABLE_COVERS(st_names, CA_DTYPE_COUNT);

const char *ca_st_dtype_name(ca_dtype dt) {
    return (unsigned)dt < CA_DTYPE_COUNT ? st_names[dt] : "?";
}

static int st_dtype_parse(const char *s) {
    for (int i = 0; i < CA_DTYPE_COUNT; i++)
        if (strcmp(s, st_names[i]) == 0) return i;
    return -1;
}

/* ------------------------------------------------------------- reading */

/* The whole file read into memory, from the descriptor ca_file_open checked. */
static ca_status st_read_fd(int fd, const char *path, uint64_t size, ca_st_file *f) {
    uint8_t *b = size < SIZE_MAX ? malloc((size_t)size + 1) : NULL;
    if (!b)
        return ca_error(CA_ERR_NOMEM, "%s: cannot allocate %llu bytes for the file", path, (unsigned long long)size);
    int64_t got = ca_file_read_fd(fd, b, (size_t)size);
    ca_status s = CA_OK;
    if (got < 0)
        s = ca_error(CA_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    else if ((uint64_t)got != size)
        s = ca_error(CA_ERR_IO, "%s: read %lld of %llu bytes (the file shrank while it was read)", path,
                     (long long)got, (unsigned long long)size);
    if (s != CA_OK) {
        free(b);
        return s;
    }
    f->buf = b;
    return CA_OK;
}

/* The file, a regular one of at most CA_FILE_MAX_SAFETENSORS bytes, mapped read-only and private:
 * nothing is copied, and only the pages a reader touches are read from disk. The mapping shares
 * the page cache, so a file loaded by every rank of a machine is held in memory once. Read instead
 * where mapping fails (a file system without mmap answers ENODEV; a file under 8 bytes gets the
 * reader's "truncated" message, and mmap refuses 0 bytes) or CACCEL_TEST_ST_NO_MMAP=1 asks it, so
 * that that path is tested too. */
static ca_status st_load(const char *path, ca_st_file *f) {
    int fd;
    uint64_t size;
    ca_status s = ca_file_open(path, CA_FILE_SAFETENSORS, &fd, &size);
    if (s != CA_OK) return s;
    f->size = (size_t)size;
    const char *no = getenv("CACCEL_TEST_ST_NO_MMAP");
    void *p = MAP_FAILED;
    if (size >= 8 && size <= SIZE_MAX && !(no && strcmp(no, "1") == 0))
        p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
        f->buf = p;
        f->mapped = true;
        f->fd = fd;
        return CA_OK;
    }
    s = st_read_fd(fd, path, size, f);
    close(fd);
    return s;
}

/* A file truncated under its mapping raises SIGBUS where its lost pages are touched. Checkpoint
 * files are not changed once published, but a file can still be cut short by another program:
 * the size is checked (one fstat) before the bytes are used, so that case is an error instead of
 * a crash, except in the short window between this check and the use. */
static ca_status st_still_whole(const ca_st_file *f) {
    struct stat st;
    if (!f->mapped) return CA_OK;
    if (fstat(f->fd, &st) != 0) return ca_error(CA_ERR_IO, "%s: cannot stat: %s", f->path, strerror(errno));
    if ((uint64_t)st.st_size < f->size)
        return ca_error(CA_ERR_IO, "%s: the file shrank to %lld bytes after it was opened with %zu (a file must not "
                        "change while it is read)", f->path, (long long)st.st_size, f->size);
    return CA_OK;
}

static ca_status st_parse_shape(const char *path, const char *name, json_object *js,
                                ca_st_entry *e) {
    if (!js || !json_object_is_type(js, json_type_array))
        return ca_error(CA_ERR_IO, "%s: tensor '%s': \"shape\" is missing or not an array", path,
                        name);
    size_t nd = json_object_array_length(js);
    if (nd > CA_MAX_DIMS)
        return ca_error(CA_ERR_IO, "%s: tensor '%s': %zu dimensions (at most %d)", path, name, nd,
                        CA_MAX_DIMS);
    e->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        char t[48];
        if (!ca_json_get_u64(json_object_array_get_idx(js, i), &d))
            return ca_error(CA_ERR_IO, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                            path, name, i);
        if (d > INT64_MAX)
            return ca_error(CA_ERR_IO, "%s: tensor '%s': shape[%zu] is %s, above 2^63 - 1", path, name, i,
                            ca_json_u64_text(d, t, sizeof t));
        e->shape[i] = (int64_t)d;
    }
    return CA_OK;
}

static ca_status st_parse_offsets(const char *path, const char *name, json_object *jo,
                                  ca_st_entry *e) {
    if (!jo || !json_object_is_type(jo, json_type_array) || json_object_array_length(jo) != 2)
        return ca_error(CA_ERR_IO, "%s: tensor '%s': \"data_offsets\" is not [begin, end]", path,
                        name);
    /* as uint64: json_object_get_int64 would saturate offsets above 2^63 - 1 and misquote them */
    if (!ca_json_get_u64(json_object_array_get_idx(jo, 0), &e->begin) ||
        !ca_json_get_u64(json_object_array_get_idx(jo, 1), &e->end) || e->end < e->begin)
        return ca_error(CA_ERR_IO, "%s: tensor '%s': data_offsets must be integers 0 <= begin <= end",
                        path, name);
    return CA_OK;
}

/* The byte size of the shape, or UINT64_MAX when it overflows. */
static uint64_t st_shape_bytes(const ca_st_entry *e) {
    uint64_t n = ca_dtype_size(e->dtype);
    for (int i = 0; i < e->ndim; i++) {
        uint64_t d = (uint64_t)e->shape[i];
        if (d && n > UINT64_MAX / d) return UINT64_MAX;
        n *= d;
    }
    return n;
}

static ca_status st_parse_entry(const ca_st_file *f, const char *name, json_object *v,
                                ca_st_entry *e) {
    const char *path = f->path;
    if (!json_object_is_type(v, json_type_object))
        return ca_error(CA_ERR_IO, "%s: tensor '%s': entry is not an object", path, name);
    json_object *jd = NULL, *js = NULL, *jo = NULL;
    json_object_object_get_ex(v, "dtype", &jd);
    json_object_object_get_ex(v, "shape", &js);
    json_object_object_get_ex(v, "data_offsets", &jo);
    if (!jd || !json_object_is_type(jd, json_type_string))
        return ca_error(CA_ERR_IO, "%s: tensor '%s': \"dtype\" is missing or not a string", path,
                        name);
    int dt = st_dtype_parse(json_object_get_string(jd));
    if (dt < 0)
        return ca_error(CA_ERR_IO, "%s: tensor '%s': unknown dtype '%s' (known: F32 F16 BF16 I32 "
                        "I64 U8)", path, name, json_object_get_string(jd));
    e->dtype = (ca_dtype)dt;
    ca_status s = st_parse_shape(path, name, js, e);
    if (s == CA_OK) s = st_parse_offsets(path, name, jo, e);
    if (s != CA_OK) return s;
    uint64_t data_size = f->size - f->data_start, want = st_shape_bytes(e);
    char tb[48], te[48];
    if (e->end > data_size)
        return ca_error(CA_ERR_IO, "%s: tensor '%s': data_offsets [%s, %s] beyond the %" PRIu64 " data bytes "
                        "of the file", path, name, ca_json_u64_text(e->begin, tb, sizeof tb),
                        ca_json_u64_text(e->end, te, sizeof te), data_size);
    if (want != e->end - e->begin)
        return ca_error(CA_ERR_IO, "%s: tensor '%s': shape and dtype %s give %s bytes, data_offsets span %" PRIu64,
                        path, name, st_names[e->dtype], ca_json_u64_text(want, tb, sizeof tb), e->end - e->begin);
    e->name = strdup(name);
    return e->name ? CA_OK : ca_error(CA_ERR_NOMEM, "%s: out of memory", path);
}

static int st_cmp_begin(const void *a, const void *b) {
    const ca_st_entry *x = *(const ca_st_entry *const *)a, *y = *(const ca_st_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Two tensors may not share bytes (empty tensors take none). */
static ca_status st_check_overlap(const ca_st_file *f) {
    const ca_st_entry **p = malloc((size_t)(f->n ? f->n : 1) * sizeof *p);
    if (!p) return ca_error(CA_ERR_NOMEM, "%s: out of memory", f->path);
    for (int i = 0; i < f->n; i++) p[i] = &f->entries[i];
    qsort(p, (size_t)f->n, sizeof *p, st_cmp_begin);
    ca_status s = CA_OK;
    const ca_st_entry *last = NULL;
    for (int i = 0; i < f->n && s == CA_OK; i++) {
        if (p[i]->begin == p[i]->end) continue;
        if (last && p[i]->begin < last->end)
            s = ca_error(CA_ERR_IO, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] "
                         "overlap those of tensor '%s' [%" PRIu64 ", %" PRIu64 "]", f->path,
                         p[i]->name, p[i]->begin, p[i]->end, last->name, last->begin, last->end);
        last = p[i];
    }
    free(p);
    return s;
}

static ca_status st_parse_header(ca_st_file *f, json_object *root) {
    if (!json_object_is_type(root, json_type_object))
        return ca_error(CA_ERR_IO, "%s: the header is not a JSON object", f->path);
    int cap = json_object_object_length(root);
    f->entries = calloc((size_t)(cap ? cap : 1), sizeof *f->entries);
    if (!f->entries) return ca_error(CA_ERR_NOMEM, "%s: out of memory", f->path);
    json_object_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        ca_status s = st_parse_entry(f, key, val, &f->entries[f->n]);
        if (s != CA_OK) return s;
        f->n++;
    }
    return st_check_overlap(f);
}

static ca_status st_parse(ca_st_file *f) {
    if (f->size < 8)
        return ca_error(CA_ERR_IO, "%s: truncated: %zu bytes, not even the 8-byte header length",
                        f->path, f->size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | f->buf[i];
    if (hl > f->size - 8 || hl > CA_ST_MAX_HEADER)
        return ca_error(CA_ERR_IO, "%s: header length %" PRIu64 " exceeds the %zu bytes that follow "
                        "it (truncated or not a safetensors file)", f->path, hl, f->size - 8);
    f->data_start = 8 + (size_t)hl;
    const char *why;
    size_t where;   /* the header may be padded with spaces: ca_json_parse allows whitespace after it */
    json_object *root = ca_json_parse((const char *)f->buf + 8, (size_t)hl, &why, &where);
    ca_status s = root ? st_parse_header(f, root)
                       : ca_error(CA_ERR_IO, "%s: the JSON header is invalid: %s at byte %zu of the header",
                                  f->path, why, where);
    json_object_put(root);
    return s;
}

/* ------------------------------------------------------------- verifying */

static uint32_t st_crc(const uint8_t *p, uint64_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}

static ca_status st_verify_whole(ca_st_file *f) {
    if (f->all_ok) return CA_OK;
    uint32_t got = st_crc(f->buf, f->size);
    f->verified += f->size;
    if (got != f->sums.crc32)
        return ca_error(CA_ERR_IO, "%s: corrupt: CRC-32 %08" PRIx32 ", the checkpoint recorded %08" PRIx32, f->path,
                        got, f->sums.crc32);
    f->all_ok = true;
    return CA_OK;
}

/* Chunk c verified from `bytes`, its bytes (of the mapping, or read): each chunk once. */
static ca_status st_check_chunk(ca_st_file *f, size_t c, const uint8_t *bytes) {
    uint64_t b = (uint64_t)c * f->sums.chunk_size, e = b + f->sums.chunk_size;
    if (e > f->size) e = f->size;
    uint32_t got = st_crc(bytes, e - b);
    f->verified += e - b;
    if (got != f->sums.chunk_crc[c])
        return ca_error(CA_ERR_IO, "%s: corrupt: CRC-32 %08" PRIx32 " in chunk %zu of %zu (bytes %" PRIu64 " to %"
                        PRIu64 "), the checkpoint recorded %08" PRIx32, f->path, got, c, f->sums.nchunks, b, e,
                        f->sums.chunk_crc[c]);
    f->chunk_ok[c] = 1;
    return CA_OK;
}

static ca_status st_verify_chunk(ca_st_file *f, size_t c) {
    return f->chunk_ok[c] ? CA_OK : st_check_chunk(f, c, f->buf + (uint64_t)c * f->sums.chunk_size);
}

ca_status ca_st_pread(int fd, const char *path, void *dst, size_t len, uint64_t off) {
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, (char *)dst + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return ca_error(CA_ERR_IO, "%s: reading %zu bytes at offset %" PRIu64 ": %s", path, len, off,
                            r < 0 ? strerror(errno) : "the file is shorter than when it was checked");
        done += (size_t)r;
    }
    return CA_OK;
}

static ca_status st_pread(ca_st_file *f, void *dst, uint64_t len, uint64_t off) {
    f->read += len;
    return ca_st_pread(f->fd, f->path, dst, (size_t)len, off);
}

/* Chunk c's part [lo, hi) into dst: read with the rest of the chunk into bounce and verified, the
 * first time; by itself once the chunk is verified. */
static ca_status st_read_chunk_part(ca_st_file *f, size_t c, uint64_t lo, uint64_t hi, uint8_t *bounce, uint8_t *dst) {
    if (f->chunk_ok[c]) return st_pread(f, dst, hi - lo, lo);
    uint64_t b = (uint64_t)c * f->sums.chunk_size, e = b + f->sums.chunk_size < f->size ? b + f->sums.chunk_size : f->size;
    ca_status s = st_pread(f, bounce, e - b, b);
    if (s == CA_OK) s = st_check_chunk(f, c, bounce);
    if (s == CA_OK) memcpy(dst, bounce + (lo - b), hi - lo);
    return s;
}

ca_status ca_st_read_range(ca_st_file *f, uint64_t off, uint64_t len, void *dst) {
    bool chunked = f->has_sums && f->sums.chunk_size && f->sums.nchunks;
    if (!f->mapped || (f->has_sums && !chunked)) {   /* in memory already; or verified whole (an older checkpoint) */
        ca_status s = ca_st_verify_range(f, off, len);
        if (s != CA_OK || len == 0) return s;
        if (f->mapped) return st_pread(f, dst, len, off);
        memcpy(dst, f->buf + off, (size_t)len);
        return CA_OK;
    }
    if (off > f->size || len > f->size - off)
        return ca_error(CA_ERR_INVALID, "%s: bytes %" PRIu64 " to %" PRIu64 " lie outside its %zu bytes", f->path, off,
                        off + len, f->size);
    if (len == 0) return st_still_whole(f);
    if (!chunked) return st_pread(f, dst, len, off);
    uint64_t cs = f->sums.chunk_size;
    uint8_t *bounce = malloc((size_t)cs);
    ca_status s = bounce ? CA_OK : ca_error(CA_ERR_NOMEM, "%s: out of memory", f->path);
    for (uint64_t c = off / cs; s == CA_OK && c <= (off + len - 1) / cs; c++) {
        uint64_t lo = c * cs > off ? c * cs : off, hi = (c + 1) * cs < off + len ? (c + 1) * cs : off + len;
        s = st_read_chunk_part(f, (size_t)c, lo, hi, bounce, (uint8_t *)dst + (lo - off));
    }
    free(bounce);
    return s;
}

ca_status ca_st_verify_range(ca_st_file *f, uint64_t off, uint64_t len) {
    if (off > f->size || len > f->size - off)
        return ca_error(CA_ERR_INVALID, "%s: bytes %" PRIu64 " to %" PRIu64 " lie outside its %zu bytes", f->path, off,
                        off + len, f->size);
    ca_status s = st_still_whole(f);
    if (s != CA_OK || !f->has_sums || len == 0) return s;
    if (!f->sums.chunk_size) return st_verify_whole(f);
    for (uint64_t c = off / f->sums.chunk_size; s == CA_OK && c <= (off + len - 1) / f->sums.chunk_size; c++)
        s = st_verify_chunk(f, (size_t)c);
    return s;
}

/* Takes a copy of the sums; a file of another size than they record is refused. */
static ca_status st_set_sums(ca_st_file *f, const ca_st_sums *sums) {
    if (f->size != sums->size)
        return ca_error(CA_ERR_IO, "%s: %s: %zu bytes, the checkpoint recorded %" PRIu64, f->path,
                        f->size < sums->size ? "truncated" : "size differs", f->size, sums->size);
    uint64_t cs = sums->chunk_size;
    if (cs && sums->nchunks != (sums->size + cs - 1) / cs)
        return ca_error(CA_ERR_INVALID, "%s: %zu chunk sums for %" PRIu64 " bytes in chunks of %" PRIu64, f->path,
                        sums->nchunks, sums->size, cs);
    f->sums = *sums;
    f->sums.chunk_crc = NULL;
    f->has_sums = true;
    if (!cs || !sums->nchunks) return CA_OK;
    uint32_t *crc = malloc(sums->nchunks * sizeof *crc);
    f->chunk_ok = calloc(sums->nchunks, 1);
    if (crc) memcpy(crc, sums->chunk_crc, sums->nchunks * sizeof *crc);
    f->sums.chunk_crc = crc;
    return crc && f->chunk_ok ? CA_OK : ca_error(CA_ERR_NOMEM, "%s: out of memory", f->path);
}

/* The chunks that hold the 8-byte length and the header it announces (as far as the file goes). */
static ca_status st_verify_header(ca_st_file *f) {
    if (f->size < 8) return ca_st_verify_range(f, 0, f->size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | f->buf[i];
    return ca_st_verify_range(f, 0, 8 + (hl < f->size - 8 ? hl : f->size - 8));
}

/* What an open verifies against the sums it is given: the whole file, its header's chunks, nothing. */
typedef enum { ST_VERIFY_WHOLE, ST_VERIFY_HEADER, ST_VERIFY_NONE } st_verify;

static ca_status st_open(const char *path, const ca_st_sums *sums, st_verify v, ca_st_file *f) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return ca_error(CA_ERR_NOMEM, "%s: out of memory", path);
    ca_status s = st_load(path, f);
    if (s == CA_OK && sums) s = st_set_sums(f, sums);
    if (s == CA_OK && sums && v != ST_VERIFY_NONE)
        s = v == ST_VERIFY_WHOLE ? ca_st_verify_range(f, 0, f->size) : st_verify_header(f);
    if (s == CA_OK) s = st_still_whole(f);
    if (s == CA_OK) s = st_parse(f);
    if (s != CA_OK) ca_st_close(f);
    return s;
}

ca_status ca_st_open_checked(const char *path, const ca_st_sums *sums, bool whole, ca_st_file *f) {
    return st_open(path, sums, whole ? ST_VERIFY_WHOLE : ST_VERIFY_HEADER, f);
}

ca_status ca_st_open_unverified(const char *path, const ca_st_sums *sums, ca_st_file *f) {
    return st_open(path, sums, ST_VERIFY_NONE, f);
}

ca_status ca_st_open(const char *path, ca_st_file *f) { return ca_st_open_checked(path, NULL, true, f); }

/* The resident bytes of the mapping at `addr` (/proc/self/smaps "Rss"), or -1. */
static long long st_resident(const void *addr) {
    FILE *in = fopen("/proc/self/smaps", "r");
    if (!in) return -1;
    char line[512];
    bool here = false;
    long long kb = -1;
    while (kb < 0 && fgets(line, sizeof line, in)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) here = lo == (unsigned long)(uintptr_t)addr;
        else if (here && sscanf(line, "Rss: %lld kB", &kb) == 1) break;
    }
    fclose(in);
    return kb < 0 ? -1 : kb * 1024;
}

void ca_st_close(ca_st_file *f) {
    if (!f) return;
    if (f->path && f->buf && getenv("CACCEL_TEST_ST_REPORT"))
        fprintf(stderr, "safetensors: %s: %" PRIu64 " of %zu bytes verified, %lld resident, %" PRIu64 " read\n",
                f->path, f->verified, f->size, f->mapped ? st_resident(f->buf) : -1, f->read);
    for (int i = 0; i < f->n; i++) free(f->entries[i].name);
    free(f->entries);
    if (f->mapped) {
        munmap(f->buf, f->size);
        close(f->fd);
    } else {
        free(f->buf);
    }
    free((void *)f->sums.chunk_crc);
    free(f->chunk_ok);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const ca_st_entry *ca_st_find(const ca_st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->entries[i].name, name) == 0) return &f->entries[i];
    return NULL;
}

/* ------------------------------------------------------------- writing */

static ca_status st_write_parts(int fd, const char *tmp, const void *const *parts,
                                const size_t *lens, int nparts) {
    for (int i = 0; i < nparts; i++) {
        const char *p = parts[i];
        size_t left = lens[i];
        while (left > 0) {
            ssize_t w = write(fd, p, left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return ca_error(CA_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
            p += w;
            left -= (size_t)w;
        }
    }
    if (fsync(fd) != 0) return ca_error(CA_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    return CA_OK;
}

/* Makes the rename durable: fsync the directory holding path. */
static ca_status st_sync_dir(const char *path) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = '\0';
    else if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return ca_error(CA_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? CA_OK : ca_error(CA_ERR_IO, "%s: fsync failed: %s", dir, strerror(errno));
}

static _Thread_local ca_st_capture *tl_capture;

ca_st_capture *ca_st_capture_set(ca_st_capture *c) {
    ca_st_capture *prev = tl_capture;
    tl_capture = c;
    return prev;
}

/* A file buffer from the capture's allocator (pinned host memory), else malloc; *hooked says which. */
static void *st_capture_alloc(const ca_st_capture *c, size_t size, bool *hooked) {
    void *p = c->alloc ? c->alloc(c->alloc_ctx, size) : NULL;
    *hooked = p != NULL;
    return p ? p : malloc(size);
}

static void st_capture_release(const ca_st_capture *c, void *p, bool hooked) {
    if (hooked) c->free(c->alloc_ctx, p);
    else free(p);
}

/* The parts of one file, concatenated into a new buffer of the capture; a part whose fills entry is
 * non-NULL (fills itself may be NULL) is that tensor's fill, written in place. */
static ca_status st_capture_add(ca_st_capture *c, const char *path, const void *const *parts, const size_t *lens,
                                int nparts, const ca_st_tensor *const *fills) {
    size_t len = 0;
    for (int i = 0; i < nparts; i++) len += lens[i];
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        ca_st_held *f = realloc(c->files, (size_t)cap * sizeof *f);
        if (!f) return ca_error(CA_ERR_NOMEM, "%s: out of memory for the host copy", path);
        c->files = f;
        c->cap = cap;
    }
    size_t size = len ? len : 1;
    ca_st_held *slot = c->n < c->kept ? &c->files[c->n] : NULL;   /* the previous capture's buffer */
    bool hooked = false;
    if (slot && slot->size < len) {
        st_capture_release(c, slot->data, slot->hooked);
        slot->data = st_capture_alloc(c, size, &slot->hooked);
        slot->size = slot->data ? size : 0;
    }
    ca_st_held h = {strdup(path), slot ? slot->data : st_capture_alloc(c, size, &hooked), len,
                    slot ? slot->size : size, NULL, 0, slot ? slot->hooked : hooked};
    if (!h.path || !h.data) {
        free(h.path);
        if (!slot) st_capture_release(c, h.data, h.hooked);
        return ca_error(CA_ERR_NOMEM, "%s: out of memory for the host copy (%zu bytes)", path, len);
    }
    size_t off = 0;
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < nparts; i++) {
        if (fills && fills[i]) s = fills[i]->fill(fills[i]->ctx, h.data + off, lens[i]);
        else if (lens[i]) memcpy(h.data + off, parts[i], lens[i]);
        off += lens[i];
    }
    if (s != CA_OK) {   /* the buffer stays the kept slot's, or goes */
        free(h.path);
        if (!slot) st_capture_release(c, h.data, h.hooked);
        return ca_error_context("%s: the host copy", path);
    }
    c->files[c->n++] = h;
    c->bytes += len;
    return CA_OK;
}

/* Writes file i to its .tmp (not yet fsync'd) and asks the kernel to start writing it back, so that
 * the disk works while the caller computes the CRC-32s. *fd: the open .tmp. */
static ca_status st_capture_write_one(const ca_st_held *f, int *fd) {
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", f->path) >= sizeof tmp)
        return ca_error(CA_ERR_INVALID, "%s: path too long", f->path);
    *fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (*fd < 0) return ca_error(CA_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    const unsigned char *p = f->data;
    for (size_t left = f->len; left > 0;) {
        ssize_t w = write(*fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return ca_error(CA_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
        p += w;
        left -= (size_t)w;
    }
#if defined(SYNC_FILE_RANGE_WRITE)
    (void)sync_file_range(*fd, 0, 0, SYNC_FILE_RANGE_WRITE);   /* a hint: fsync below is what counts */
#endif
    return CA_OK;
}

/* The .tmp of file i made durable and put in place, as ca_st_write_atomic does, but for the fsync of
 * the directory: ca_st_capture_write does that once per directory, after the last rename into it. */
static ca_status st_capture_finish_one(const ca_st_held *f, int fd) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", f->path);
    ca_status s = fsync(fd) == 0 ? CA_OK : ca_error(CA_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(fd) != 0 && s == CA_OK) s = ca_error(CA_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (s == CA_OK && rename(tmp, f->path) != 0)
        s = ca_error(CA_ERR_IO, "%s: cannot rename to %s: %s", tmp, f->path, strerror(errno));
    return s;
}

/* Whether a and b lie in the same directory (the same text before the last '/'). */
static bool st_same_dir(const char *a, const char *b) {
    const char *sa = strrchr(a, '/'), *sb = strrchr(b, '/');
    size_t la = sa ? (size_t)(sa - a) : 0, lb = sb ? (size_t)(sb - b) : 0;
    return la == lb && strncmp(a, b, la) == 0;
}

/* File f's CRC-32 from memory; chunk > 0: from the CRC-32s of its chunks, kept in f->sums (the
 * manifest records them too), so that memory is read once. */
static ca_status st_capture_crc(ca_st_held *f, uint64_t chunk, uint32_t *crc) {
    uLong whole = crc32(0L, Z_NULL, 0);
    uint64_t step = chunk ? chunk : (1u << 30);
    size_t n = f->len ? (size_t)((f->len - 1) / step + 1) : 0;
    free(f->sums);
    f->sums = NULL;
    f->nsums = 0;
    if (chunk && !(f->sums = malloc((n ? n : 1) * sizeof *f->sums)))
        return ca_error(CA_ERR_NOMEM, "%s: out of memory for its chunk sums", f->path);
    for (size_t k = 0; k < n; k++) {
        size_t at = (size_t)(k * step), len = f->len - at < step ? f->len - at : (size_t)step;
        if (!chunk) {
            whole = crc32(whole, f->data + at, (uInt)len);
            continue;
        }
        uLong s = crc32(crc32(0L, Z_NULL, 0), f->data + at, (uInt)len);
        f->sums[k] = (uint32_t)s;
        whole = crc32_combine(whole, s, (z_off_t)len);
    }
    f->nsums = chunk ? n : 0;
    *crc = (uint32_t)whole;
    return CA_OK;
}

ca_status ca_st_capture_write(ca_st_capture *c, uint32_t *crcs, uint64_t chunk) {
    int *fds = malloc((size_t)(c->n ? c->n : 1) * sizeof *fds);
    if (!fds) return ca_error(CA_ERR_NOMEM, "writing the host copy: out of memory");
    for (int i = 0; i < c->n; i++) fds[i] = -1;
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < c->n; i++) s = st_capture_write_one(&c->files[i], &fds[i]);
    if (chunk > UINT32_MAX) chunk = 0;   /* a chunk crc32 cannot take in one call: no sums */
    for (int i = 0; s == CA_OK && crcs && i < c->n; i++)   /* while the disk writes */
        s = st_capture_crc(&c->files[i], chunk, &crcs[i]);
    int done = 0;
    for (; s == CA_OK && done < c->n; done++) {
        s = st_capture_finish_one(&c->files[done], fds[done]);
        fds[done] = -1;
        /* the renames are durable once their directory is fsync'd: once, after its last file */
        if (s == CA_OK && (done + 1 == c->n || !st_same_dir(c->files[done].path, c->files[done + 1].path)))
            s = st_sync_dir(c->files[done].path);
    }
    for (int i = 0; s != CA_OK && i < c->n; i++) {   /* a failure leaves no .tmp behind */
        char tmp[PATH_MAX];
        if (fds[i] >= 0) close(fds[i]);
        if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", c->files[i].path) < sizeof tmp) unlink(tmp);
    }
    free(fds);
    return s;
}

void ca_st_capture_reset(ca_st_capture *c) {
    for (int i = 0; i < c->n; i++) {
        free(c->files[i].path);
        c->files[i].path = NULL;
        free(c->files[i].sums);
        c->files[i].sums = NULL;
        c->files[i].nsums = 0;
    }
    if (c->n > c->kept) c->kept = c->n;
    c->n = 0;
    c->bytes = 0;
}

void ca_st_capture_free(ca_st_capture *c) {
    if (c) ca_st_capture_reset(c);
    for (int i = 0; c && i < c->kept; i++) st_capture_release(c, c->files[i].data, c->files[i].hooked);
    if (c) c->kept = 0;
    for (int i = 0; c && i < c->n; i++) {
        free(c->files[i].path);
        st_capture_release(c, c->files[i].data, c->files[i].hooked);
    }
    if (c) {   /* empty, its allocator kept */
        free(c->files);
        *c = (ca_st_capture){.alloc = c->alloc, .free = c->free, .alloc_ctx = c->alloc_ctx};
    }
}

ca_status ca_st_write_atomic(const char *path, const void *const *parts, const size_t *lens,
                             int nparts) {
    if (tl_capture) return st_capture_add(tl_capture, path, parts, lens, nparts, NULL);
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return ca_error(CA_ERR_INVALID, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ca_error(CA_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    ca_status s = st_write_parts(fd, tmp, parts, lens, nparts);
    if (close(fd) != 0 && s == CA_OK)
        s = ca_error(CA_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (s == CA_OK && rename(tmp, path) != 0)
        s = ca_error(CA_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (s != CA_OK) {
        unlink(tmp);
        return s;
    }
    return st_sync_dir(path);
}

static int st_cmp_name(const void *a, const void *b) {
    const ca_st_tensor *x = *(const ca_st_tensor *const *)a, *y = *(const ca_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* Checked by st_check_tensors first: no dimension is negative and the product fits. */
static uint64_t st_tensor_bytes(const ca_st_tensor *t) {
    uint64_t n = ca_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

static json_object *st_entry_json(const ca_st_tensor *t, uint64_t begin, uint64_t end) {
    json_object *e = json_object_new_object(), *shape = json_object_new_array();
    json_object *off = json_object_new_array();
    json_object_object_add(e, "dtype", json_object_new_string(st_names[t->dtype]));
    for (int i = 0; i < t->ndim; i++)
        json_object_array_add(shape, json_object_new_int64(t->shape[i]));
    json_object_object_add(e, "shape", shape);
    json_object_array_add(off, json_object_new_int64((int64_t)begin));
    json_object_array_add(off, json_object_new_int64((int64_t)end));
    json_object_object_add(e, "data_offsets", off);
    return e;
}

/* The header object for tensors in the order of `order`; *data_size gets the data section size. */
static json_object *st_header_json(const ca_st_tensor *const *order, int n, uint64_t *data_size) {
    json_object *root = json_object_new_object(), *meta = json_object_new_object();
    json_object_object_add(meta, "format", json_object_new_string("pt"));
    json_object_object_add(root, "__metadata__", meta);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t nb = st_tensor_bytes(order[i]);
        json_object_object_add(root, order[i]->name, st_entry_json(order[i], off, off + nb));
        off += nb;
    }
    *data_size = off;
    return root;
}

/* Names, dtypes and shapes (no negative dimension, a byte size that fits, as the reader demands);
 * names given twice are found once sorted. */
static ca_status st_check_tensors(const char *path, const ca_st_tensor *t, int n) {
    for (int i = 0; i < n; i++) {
        if (!t[i].name || !t[i].name[0] || strcmp(t[i].name, "__metadata__") == 0)
            return ca_error(CA_ERR_INVALID, "%s: tensor %d has no usable name", path, i);
        if ((unsigned)t[i].dtype >= CA_DTYPE_COUNT || t[i].ndim < 0 || t[i].ndim > CA_MAX_DIMS)
            return ca_error(CA_ERR_INVALID, "%s: tensor '%s': bad dtype or rank", path, t[i].name);
        ca_st_entry e = {.dtype = t[i].dtype, .ndim = t[i].ndim};
        for (int d = 0; d < t[i].ndim; d++)
            if ((e.shape[d] = t[i].shape[d]) < 0)
                return ca_error(CA_ERR_INVALID, "%s: tensor '%s': dimension %d is %" PRId64, path, t[i].name, d,
                                t[i].shape[d]);
        if (st_shape_bytes(&e) > (uint64_t)INT64_MAX)
            return ca_error(CA_ERR_INVALID, "%s: tensor '%s': its byte size overflows", path, t[i].name);
        if (!t[i].data && !t[i].fill && st_shape_bytes(&e) > 0)
            return ca_error(CA_ERR_INVALID, "%s: tensor '%s': neither data nor a fill", path, t[i].name);
    }
    return CA_OK;
}

/* ca_st_write_atomic of the header and the tensors (parts[i + 1] is order[i]'s data), filling those
 * without data: in place under a capture, else each into a buffer of its own first. */
static ca_status st_write_filled(const char *path, const ca_st_tensor **order, int n, const void **parts,
                                 const size_t *lens) {
    const ca_st_tensor **fills = calloc((size_t)n + 1, sizeof *fills);
    if (!fills) return ca_error(CA_ERR_NOMEM, "%s: out of memory", path);
    bool any = false;
    for (int i = 0; i < n; i++) any |= (fills[i + 1] = !order[i]->data && order[i]->fill ? order[i] : NULL) != NULL;
    ca_status s = CA_OK;
    if (tl_capture) {
        s = st_capture_add(tl_capture, path, parts, lens, n + 1, any ? fills : NULL);
    } else {
        for (int i = 1; s == CA_OK && any && i <= n; i++) {
            if (!fills[i]) continue;
            void *b = malloc(lens[i] ? lens[i] : 1);
            s = !b ? ca_error(CA_ERR_NOMEM, "%s: tensor '%s': cannot allocate %zu bytes", path, fills[i]->name, lens[i])
                   : fills[i]->fill(fills[i]->ctx, b, lens[i]);
            parts[i] = b;
        }
        if (s == CA_OK) s = ca_st_write_atomic(path, parts, lens, n + 1);
        for (int i = 1; any && i <= n; i++)
            if (fills[i]) free((void *)parts[i]);
    }
    free(fills);
    return s;
}

static ca_status st_write_sorted(const char *path, const ca_st_tensor **order, int n) {
    uint64_t data_size = 0;
    json_object *root = st_header_json(order, n, &data_size);
    size_t jl = 0;
    const char *js = json_object_to_json_string_length(
        root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &jl);
    size_t hl = (jl + 7) / 8 * 8;
    char *hdr = malloc(8 + hl);
    const void **parts = malloc((size_t)(n + 1) * sizeof *parts);
    size_t *lens = malloc((size_t)(n + 1) * sizeof *lens);
    ca_status s = CA_OK;
    if (!hdr || !parts || !lens) {
        s = ca_error(CA_ERR_NOMEM, "%s: out of memory", path);
    } else {
        for (int i = 0; i < 8; i++) hdr[i] = (char)((uint64_t)hl >> (8 * i) & 0xff);
        memcpy(hdr + 8, js, jl);
        memset(hdr + 8 + jl, ' ', hl - jl);
        parts[0] = hdr;
        lens[0] = 8 + hl;
        for (int i = 0; i < n; i++) {
            parts[i + 1] = order[i]->data;
            lens[i + 1] = (size_t)st_tensor_bytes(order[i]);
        }
        s = st_write_filled(path, order, n, parts, lens);
    }
    json_object_put(root);
    free(hdr);
    free(parts);
    free(lens);
    return s;
}

ca_status ca_st_write(const char *path, const ca_st_tensor *t, int n) {
    if (n < 0) return ca_error(CA_ERR_INVALID, "%s: %d tensors", path, n);
    ca_status s = st_check_tensors(path, t, n);
    if (s != CA_OK) return s;
    const ca_st_tensor **order = malloc((size_t)(n ? n : 1) * sizeof *order);
    if (!order) return ca_error(CA_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n; i++) order[i] = &t[i];
    qsort(order, (size_t)n, sizeof *order, st_cmp_name);
    for (int i = 1; s == CA_OK && i < n; i++)
        if (strcmp(order[i]->name, order[i - 1]->name) == 0)
            s = ca_error(CA_ERR_INVALID, "%s: tensor '%s' given twice", path, order[i]->name);
    if (s == CA_OK) s = st_write_sorted(path, order, n);
    free(order);
    return s;
}
