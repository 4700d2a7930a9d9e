/* tensor/st_parts.c: verifying a checkpoint file's chunks when several processes each read a part of
 * every chunk (the tp ranks' slices of a tensor: a rowwise layer's column block is a piece of every
 * row), so that none of them reads a chunk whole. CRC-32 is affine over GF(2) for a fixed length:
 * crc(a ^ b) = crc(a) ^ crc(b) ^ crc(0^n). Each process hashes its bytes of a chunk with every other
 * byte taken as zero; when the k processes' bytes partition the chunk, the XOR of their k sums, with
 * crc(0^n) once more where k is even, is the chunk's CRC-32. */
#include "tensor/safetensors_impl.h"
#include "base/base_impl.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef struct st_part {
    uint64_t off, len;
    uint32_t crc;
} st_part;

struct ca_st_parts {
    uint64_t chunk, size;
    size_t nchunks;
    st_part *p;
    size_t n, cap;
    bool oom;                  /* an add that could not grow the list: reported by ca_st_parts_sums */
    uint64_t zn;               /* the last run of zeros hashed, and its CRC-32 (the gaps repeat) */
    uint32_t zcrc;
};

/* The CRC-32 of n zero bytes, by doubling: O(log n) combines. */
static uint32_t st_zeros_crc(uint64_t n) {
    static const unsigned char zero[1] = {0};
    uLong acc = 0, pow = crc32(0L, zero, 1);
    for (uint64_t len = 1; n; n >>= 1, len <<= 1) {
        if (n & 1) acc = crc32_combine(acc, pow, (z_off_t)len);
        if (n > 1) pow = crc32_combine(pow, pow, (z_off_t)len);
    }
    return (uint32_t)acc;
}

static uint32_t st_zeros(ca_st_parts *ps, uint64_t n) {
    if (n != ps->zn) {
        ps->zn = n;
        ps->zcrc = st_zeros_crc(n);
    }
    return ps->zcrc;
}

bool ca_st_parts_apply(const ca_st_file *f) {
    return f->has_sums && f->sums.chunk_size && f->sums.nchunks && f->sums.chunk_size <= UINT32_MAX;
}

ca_status ca_st_parts_new(const ca_st_file *f, ca_st_parts **out) {
    *out = NULL;
    if (!ca_st_parts_apply(f)) return CA_OK;
    ca_st_parts *ps = calloc(1, sizeof *ps);
    if (!ps) return ca_error(CA_ERR_NOMEM, "%s: out of memory", f->path);
    *ps = (ca_st_parts){.chunk = f->sums.chunk_size, .size = f->size, .nchunks = f->sums.nchunks, .zn = 0, .zcrc = 0};
    *out = ps;
    return CA_OK;
}

void ca_st_parts_add(void *ctx, uint64_t off, const void *bytes, size_t len) {
    ca_st_parts *ps = ctx;
    const unsigned char *b = bytes;
    while (len > 0 && !ps->oom) {   /* one entry per chunk it touches */
        uint64_t end = (off / ps->chunk + 1) * ps->chunk, k = end - off < len ? end - off : len;
        if (ps->n == ps->cap) {
            size_t cap = ps->cap ? 2 * ps->cap : 256;
            st_part *p = realloc(ps->p, cap * sizeof *p);
            if (!p) {
                ps->oom = true;
                return;
            }
            ps->p = p;
            ps->cap = cap;
        }
        ps->p[ps->n++] = (st_part){off, k, (uint32_t)crc32(0L, b, (uInt)k)};
        off += k, b += k, len -= (size_t)k;
    }
}

ca_status ca_st_parts_add_rest(ca_st_parts *ps, ca_st_file *f) {
    if (!ps) return CA_OK;
    ca_status s = ca_st_verify_range(f, 0, 0);   /* still its size: the mapping may be read */
    st_part *r = malloc((size_t)(f->n + 1) * sizeof *r);
    if (s == CA_OK && !r) s = ca_error(CA_ERR_NOMEM, "%s: out of memory", f->path);
    for (int i = 0; s == CA_OK && i < f->n; i++)
        r[i] = (st_part){f->data_start + f->entries[i].begin, f->entries[i].end - f->entries[i].begin, 0};
    for (int i = 1; s == CA_OK && i < f->n; i++)   /* by offset (few entries: insertion) */
        for (int j = i; j > 0 && r[j].off < r[j - 1].off; j--) {
            st_part t = r[j];
            r[j] = r[j - 1];
            r[j - 1] = t;
        }
    uint64_t at = 0;   /* the bytes before, between and after the entries: the header, any gap */
    for (int i = 0; s == CA_OK && i <= f->n; i++) {
        uint64_t to = i < f->n ? r[i].off : f->size;
        for (uint64_t c = at / ps->chunk; at < to; c++) {   /* only chunks not verified yet are read */
            uint64_t end = (c + 1) * ps->chunk < to ? (c + 1) * ps->chunk : to;
            if (!f->chunk_ok[c]) ca_st_parts_add(ps, at, f->buf + at, (size_t)(end - at));
            at = end;
        }
        if (i < f->n && r[i].off + r[i].len > at) at = r[i].off + r[i].len;
    }
    free(r);
    return s;
}

static int st_part_cmp(const void *a, const void *b) {
    const st_part *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

ca_status ca_st_parts_sums(ca_st_parts *ps, const char *path, uint32_t *out) {
    if (ps->oom) return ca_error(CA_ERR_NOMEM, "%s: out of memory for the sums of the bytes read", path);
    qsort(ps->p, ps->n, sizeof *ps->p, st_part_cmp);
    size_t k = 0;
    for (size_t c = 0; c < ps->nchunks; c++) {
        uint64_t b = c * ps->chunk, e = b + ps->chunk < ps->size ? b + ps->chunk : ps->size, at = b;
        uLong acc = 0;
        for (; k < ps->n && ps->p[k].off < e; k++) {
            const st_part *p = &ps->p[k];
            if (p->off < at)
                return ca_error(CA_ERR_INTERNAL, "%s: bytes %" PRIu64 " to %" PRIu64 " were read twice", path, p->off,
                                at);
            if (p->off > at) acc = crc32_combine(acc, st_zeros(ps, p->off - at), (z_off_t)(p->off - at));
            acc = crc32_combine(acc, p->crc, (z_off_t)p->len);
            at = p->off + p->len;
        }
        if (at < e) acc = crc32_combine(acc, st_zeros(ps, e - at), (z_off_t)(e - at));
        out[c] = (uint32_t)acc;
    }
    return CA_OK;
}

ca_status ca_st_parts_verify(ca_st_file *f, const uint32_t *sums, int rows, int k) {
    uint64_t cs = f->sums.chunk_size;
    ca_st_parts z = {.chunk = cs};
    for (size_t c = 0; c < f->sums.nchunks; c++) {
        if (f->chunk_ok[c]) continue;
        uint64_t b = (uint64_t)c * cs, e = b + cs < f->size ? b + cs : f->size;
        uint32_t got = (k - 1) % 2 ? st_zeros(&z, e - b) : 0;
        for (int r = 0; r < rows; r++) got ^= sums[(size_t)r * f->sums.nchunks + c];
        if (got != f->sums.chunk_crc[c])
            return ca_error(CA_ERR_IO, "%s: corrupt: CRC-32 %08" PRIx32 " in chunk %zu of %zu (bytes %" PRIu64 " to %"
                            PRIu64 ") from the %d processes' parts, the checkpoint recorded %08" PRIx32, f->path, got,
                            c, f->sums.nchunks, b, e, k, f->sums.chunk_crc[c]);
        f->chunk_ok[c] = 1;
        f->verified += e - b;
    }
    return CA_OK;
}

void ca_st_parts_free(ca_st_parts *ps) {
    if (!ps) return;
    free(ps->p);
    free(ps);
}
