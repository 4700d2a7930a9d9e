/* Parameters without storage (torch's device="meta", Accelerate's init_empty_weights): under
 * ca_init_empty_weights a new parameter has its shape, dtype and device but no memory. Its
 * initialisation (ca_tensor_init_uniform_/normal_/fill_) takes its RNG counters from the process
 * generator exactly as an eager build does, and records them instead of running the kernel; the
 * owner (ca_prepare, ca_module_materialize) replays the record later, whole or one parameter at a
 * time into a scratch buffer, and gets the values an eager build would have had, bit for bit. */
#include "tensor/tensor_impl.h"
#include "tensor/safetensors_impl.h"
#include "base/half_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A file whose bytes give meta parameters their values (a load deferred to ca_prepare): its
 * descriptor, kept open so that the bytes read later are those of the file checked at the load
 * even where a new file has been renamed over its name; shared by the parameters it fills. */
struct ca_meta_src {
    _Atomic int refs;
    int fd;
    uint64_t size;
    _Atomic uint64_t read;   /* bytes read from it (CACCEL_TEST_ST_REPORT) */
    void (*tap)(void *ctx, uint64_t off, const void *bytes, size_t len);   /* ca_meta_src_set_tap */
    void *tap_ctx;
    char path[];
};

typedef struct meta_op {
    bool rng;                    /* a draw from the generator; else a constant over [start, start + n) */
    ca_rng_kind kind;
    uint64_t seed, offset;
    float a, b;
    double value;
    int64_t start, n;
    struct ca_meta_src *src;     /* non-NULL: the whole tensor from src's bytes at foff, of dtype fdt */
    uint64_t foff;
    ca_dtype fdt;
} meta_op;

struct ca_meta_init {
    int n, cap;
    meta_op *ops;
};

static _Thread_local bool tl_empty;
static atomic_int live;

static const char meta_why[] =
    "has no storage: it was created under ca_init_empty_weights (the meta device) and gets its values "
    "at ca_prepare or ca_module_materialize, or the file's from ca_load_model, ca_bert_load_pretrained or "
    "ca_causal_lm_load_pretrained";

ca_status ca_init_empty_weights(bool on) {
    tl_empty = on;
    return CA_OK;
}

bool ca_init_empty_weights_enabled(void) { return tl_empty; }

int ca_meta_live(void) { return atomic_load(&live); }

bool ca_tensor_is_meta(const ca_tensor *t) { return t && t->storage && t->storage->meta && !t->storage->ptr; }

void ca_meta_src_unref(ca_meta_src *src) {
    if (!src || atomic_fetch_sub(&src->refs, 1) != 1) return;
    if (getenv("CACCEL_TEST_ST_REPORT"))   /* the tests' measure of what a deferred load read */
        fprintf(stderr, "meta: %s: %" PRIu64 " of %" PRIu64 " bytes read\n", src->path, atomic_load(&src->read),
                src->size);
    close(src->fd);
    free(src);
}

static void drop_ops(struct ca_meta_init *mi, int from) {
    for (int i = from; i < mi->n; i++) ca_meta_src_unref(mi->ops[i].src);
    mi->n = from;
}

void ca_meta_init_free(struct ca_meta_init *mi) {
    if (!mi) return;
    atomic_fetch_sub(&live, 1);
    drop_ops(mi, 0);
    free(mi->ops);
    free(mi);
}

ca_status ca_meta_storage(ca_storage *st) {
    st->meta = calloc(1, sizeof *st->meta);
    if (!st->meta) return ca_error(CA_ERR_NOMEM, "out of host memory for a meta parameter");
    st->absent = meta_why;
    atomic_fetch_add(&live, 1);
    return CA_OK;
}

/* An op covering the whole tensor makes the earlier ones moot (ca_nn_add_linear redraws a Linear's
 * default weight): only the last such op and those after it are replayed. */
static ca_status record(ca_tensor *t, meta_op op) {
    struct ca_meta_init *mi = t->storage->meta;
    if (op.start == 0 && op.n == t->numel) drop_ops(mi, 0);
    if (mi->n == mi->cap) {
        int cap = mi->cap ? 2 * mi->cap : 2;
        meta_op *no = realloc(mi->ops, (size_t)cap * sizeof *no);
        if (!no) return ca_error(CA_ERR_NOMEM, "out of host memory recording an initialisation");
        mi->ops = no;
        mi->cap = cap;
    }
    mi->ops[mi->n++] = op;
    return CA_OK;
}

void *ca_meta_record(const ca_tensor *t, size_t *bytes, int64_t *count) {
    const struct ca_meta_init *mi = t->storage->meta;
    *count = mi ? mi->n : 0;
    *bytes = (size_t)*count * sizeof(meta_op);
    return *count ? mi->ops : NULL;
}

ca_status ca_meta_record_resize(ca_tensor *t, int64_t count) {
    struct ca_meta_init *mi = t->storage->meta;
    if (!mi || count < 0 || count > 1 << 20) return ca_error(CA_ERR_INVALID, "a meta record of %lld ops", (long long)count);
    if (ca_meta_from_file(t))
        return ca_error(CA_ERR_INTERNAL, "'%s': a record of a file's values is this process's own (not received)",
                        t->name ? t->name : "");
    if (count > mi->cap) {
        meta_op *no = realloc(mi->ops, (size_t)count * sizeof *no);
        if (!no) return ca_error(CA_ERR_NOMEM, "out of host memory for a meta record");
        mi->ops = no;
        mi->cap = (int)count;
    }
    mi->n = (int)count;
    return CA_OK;
}

static ca_status read_op(const meta_op *op, ca_dtype dt, int64_t start, int64_t n, void *dst);

static ca_status run_op(const meta_op *op, ca_device *dev, ca_dtype dt, void *dst) {
    void *y = (char *)dst + (size_t)op->start * ca_dtype_size(dt);
    if (op->src) {
        if (dev != ca_cpu_device())
            return ca_error(CA_ERR_INTERNAL, "a file's values are read into host memory, not %s", ca_device_name(dev));
        return read_op(op, dt, 0, op->n, y);
    }
    if (op->rng)
        return CA_KCALL(dev, rng, .kind = op->kind, .dt = dt, .n = op->n, .seed = op->seed, .offset = op->offset,
                        .a = op->a, .b = op->b, .y = y);
    return CA_KCALL(dev, fill, .dt = dt, .n = op->n, .value = op->value, .y = y);
}

/* Draws from the process generator into t (or records the draw): the same counters either way. */
static ca_status init_rng(ca_tensor *t, ca_rng_kind kind, float a, float b) {
    if (!t) return ca_error(CA_ERR_INVALID, "initialising a NULL tensor");
    if (!t->numel) return CA_OK;
    if (!ca_tensor_is_contiguous(t))
        return ca_error(CA_ERR_INVALID, "initialising '%s': only contiguous tensors", t->name ? t->name : "");
    uint64_t seed, unused;
    ca_rng_get_state(&seed, &unused);
    meta_op op = {.rng = true, .kind = kind, .seed = seed, .a = a, .b = b, .n = t->numel};
    op.offset = ca_rng_reserve(ca_rng_counters(kind, t->numel));
    if (ca_tensor_is_meta(t)) return record(t, op);
    ca_status s = ca_tensor_check_present(t, "initialising");
    return s == CA_OK ? run_op(&op, ca_tdev(t), t->dtype, ca_tptr(t)) : s;
}

ca_status ca_tensor_init_uniform_(ca_tensor *t, float lo, float hi) { return init_rng(t, CA_RNG_UNIFORM, lo, hi); }

ca_status ca_tensor_init_normal_(ca_tensor *t, float mean, float std) { return init_rng(t, CA_RNG_NORMAL, mean, std); }

ca_status ca_tensor_init_fill_(ca_tensor *t, int64_t start, int64_t n, double value) {
    if (!t) return ca_error(CA_ERR_INVALID, "ca_tensor_init_fill_: tensor is NULL");
    if (start < 0 || n < 0 || start + n > t->numel || !ca_tensor_is_contiguous(t))
        return ca_error(CA_ERR_INVALID, "ca_tensor_init_fill_ of '%s': [%lld, %lld) is outside its %lld elements "
                        "(or it is not contiguous)", t->name ? t->name : "", (long long)start,
                        (long long)(start + n), (long long)t->numel);
    if (!n) return CA_OK;
    meta_op op = {.value = value, .start = start, .n = n};
    if (ca_tensor_is_meta(t)) return record(t, op);
    ca_status s = ca_tensor_check_present(t, "initialising");
    return s == CA_OK ? run_op(&op, ca_tdev(t), t->dtype, ca_tptr(t)) : s;
}

ca_status ca_meta_fill(const ca_tensor *t, ca_device *dev, void *dst) {
    const struct ca_meta_init *mi = t->storage->meta;
    if (!mi) return ca_error(CA_ERR_INTERNAL, "ca_meta_fill: '%s' is not a meta tensor", t->name ? t->name : "");
    /* never initialised: zeros rather than whatever the allocator hands out, on every rank alike */
    if (!mi->n || mi->ops[0].start != 0 || mi->ops[0].n != t->numel) {
        ca_status s = CA_KCALL(dev, fill, .dt = t->dtype, .n = t->numel, .value = 0.0, .y = dst);
        if (s != CA_OK) return s;
    }
    for (int i = 0; i < mi->n; i++) {
        ca_status s = run_op(&mi->ops[i], dev, t->dtype, dst);
        if (s != CA_OK) return s;
    }
    return CA_OK;
}

/* The values are made by the CPU's kernels, where the layers build eagerly (their RNG is then the
 * eager build's to the bit on any device), and copied to the parameter's device. */
static ca_status fill_on(const ca_tensor *t, ca_device *dev, void *p) {
    ca_device *cpu = ca_cpu_device();
    if (!cpu) return ca_last_status();
    if (dev == cpu) return ca_meta_fill(t, cpu, p);
    void *h = NULL;
    ca_status s = ca_device_alloc(cpu, t->storage->bytes, &h);
    if (s == CA_OK) s = ca_meta_fill(t, cpu, h);
    if (s == CA_OK) s = ca_device_copy_from_host(dev, p, h, t->storage->bytes);
    ca_device_free(cpu, h);
    return s;
}

static ca_status materialize(ca_tensor *t, bool fill) {
    ca_storage *st = t->storage;
    void *p = NULL;
    ca_status s = ca_device_alloc(st->dev, st->bytes, &p);
    if (s == CA_OK && fill) s = fill_on(t, st->dev, p);
    if (s != CA_OK) {
        ca_device_free(st->dev, p);
        return ca_error_context("materialising '%s' (%zu bytes)", t->name ? t->name : "", st->bytes);
    }
    st->ptr = p;
    st->absent = NULL;
    ca_meta_init_free(st->meta);
    st->meta = NULL;
    t->version++;
    return CA_OK;
}

ca_status ca_tensor_materialize_(ca_tensor *t) {
    if (!t) return ca_error(CA_ERR_INVALID, "ca_tensor_materialize_: tensor is NULL");
    return ca_tensor_is_meta(t) ? materialize(t, true) : CA_OK;
}

ca_status ca_meta_allocate(ca_tensor *t) { return ca_tensor_is_meta(t) ? materialize(t, false) : CA_OK; }

struct ca_meta_init *ca_meta_mark(const ca_tensor *t, ca_status *s) {
    *s = CA_OK;
    if (!ca_tensor_is_meta(t)) return NULL;
    const struct ca_meta_init *mi = t->storage->meta;
    struct ca_meta_init *c = calloc(1, sizeof *c);
    if (c && mi->n && !(c->ops = malloc((size_t)mi->n * sizeof *c->ops))) {
        free(c);
        c = NULL;
    }
    if (!c) {
        *s = ca_error(CA_ERR_NOMEM, "out of host memory keeping the record of meta parameter '%s'",
                      t->name ? t->name : "");
        return NULL;
    }
    if (mi->n) memcpy(c->ops, mi->ops, (size_t)mi->n * sizeof *c->ops);
    c->n = c->cap = mi->n;
    for (int i = 0; i < c->n; i++)
        if (c->ops[i].src) atomic_fetch_add(&c->ops[i].src->refs, 1);
    atomic_fetch_add(&live, 1);   /* a record, as ca_meta_storage counts them; ca_meta_init_free uncounts */
    return c;
}

void ca_meta_revert(ca_tensor *t, struct ca_meta_init *mark) {
    ca_storage *st = t->storage;
    if (st->ptr) ca_device_free(st->dev, st->ptr);   /* memory a load gave it: no view holds it yet */
    st->ptr = NULL;
    ca_meta_init_free(st->meta);   /* a record the load made (a deferred read), if any */
    st->meta = mark;
    st->absent = meta_why;
    t->version++;
}

/* ------------------------------------------------------------ values from a file (deferred loads) */

static ca_status src_open(const ca_st_file *f, ca_meta_src **out) {
    size_t len = strlen(f->path);
    ca_meta_src *src = calloc(1, sizeof *src + len + 1);
    if (!src) return ca_error(CA_ERR_NOMEM, "out of host memory deferring the read of %s", f->path);
    memcpy(src->path, f->path, len + 1);
    /* the mapping's own descriptor where there is one: the very file that was checked */
    src->fd = f->mapped ? fcntl(f->fd, F_DUPFD_CLOEXEC, 0) : open(f->path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (src->fd < 0 || fstat(src->fd, &sb) != 0) {
        int e = errno;
        if (src->fd >= 0) close(src->fd);
        free(src);
        return ca_error(CA_ERR_IO, "%s: cannot keep the file open for the deferred read: %s", f->path, strerror(e));
    }
    if ((uint64_t)sb.st_size != f->size) {
        close(src->fd);
        free(src);
        return ca_error(CA_ERR_IO, "%s: the file changed size (%lld bytes, %zu when it was checked)", f->path,
                        (long long)sb.st_size, f->size);
    }
    src->size = f->size;
    atomic_init(&src->refs, 1);
    *out = src;
    return CA_OK;
}

ca_status ca_meta_record_file(ca_tensor *t, const ca_st_file *f, const ca_st_entry *e, ca_meta_src **src) {
    if (!ca_tensor_is_meta(t)) return ca_error(CA_ERR_INTERNAL, "deferring '%s': not a meta tensor", e->name);
    bool same = e->dtype == t->dtype, half = t->dtype == CA_F32 && (e->dtype == CA_F16 || e->dtype == CA_BF16);
    if ((!same && !half) || e->end - e->begin != (uint64_t)t->numel * ca_dtype_size(e->dtype))
        return ca_error(CA_ERR_INVALID, "%s: tensor '%s' (%s) cannot give the values of a %s parameter of %lld elements",
                        f->path, e->name, ca_st_dtype_name(e->dtype), ca_st_dtype_name(t->dtype), (long long)t->numel);
    ca_status s = *src ? CA_OK : src_open(f, src);
    if (s != CA_OK) return s;
    meta_op op = {.src = *src, .foff = f->data_start + e->begin, .fdt = e->dtype, .n = t->numel};
    atomic_fetch_add(&(*src)->refs, 1);
    s = record(t, op);
    if (s != CA_OK) ca_meta_src_unref(*src);
    return s;
}

bool ca_meta_from_file(const ca_tensor *t) {
    const struct ca_meta_init *mi = ca_tensor_is_meta(t) ? t->storage->meta : NULL;
    for (int i = 0; mi && i < mi->n; i++)
        if (mi->ops[i].src) return true;
    return false;
}

static ca_status pread_all(ca_meta_src *src, void *dst, size_t len, uint64_t off) {
    ca_status s = ca_st_pread(src->fd, src->path, dst, len, off);
    if (s == CA_OK) atomic_fetch_add(&src->read, (uint64_t)len);
    if (s == CA_OK && src->tap) src->tap(src->tap_ctx, off, dst, len);
    return s;
}

/* Elements [start, start + n) of the file's tensor at foff (of dtype fdt) into dst (host memory of dtype
 * dt): read as they are, or as f16/bf16 through a bounded buffer and widened to f32. */
static ca_status read_elems(ca_meta_src *src, uint64_t foff, ca_dtype fdt, ca_dtype dt, int64_t start, int64_t n,
                            void *dst) {
    size_t fes = ca_dtype_size(fdt);
    uint64_t off = foff + (uint64_t)start * fes;
    if (fdt == dt) return pread_all(src, dst, (size_t)n * fes, off);
    enum { CHUNK = 1 << 16 };
    uint16_t *h = malloc(CHUNK * sizeof *h);
    if (!h) return ca_error(CA_ERR_NOMEM, "out of host memory reading %s", src->path);
    ca_status s = CA_OK;
    float *y = dst;
    for (int64_t i = 0; s == CA_OK && i < n; i += CHUNK) {
        size_t k = (size_t)(n - i < CHUNK ? n - i : CHUNK);
        s = pread_all(src, h, k * fes, off + (uint64_t)i * fes);
        for (size_t j = 0; s == CA_OK && j < k; j++)   /* safetensors is little-endian, as the host */
            y[i + (int64_t)j] = fdt == CA_F16 ? ca_f16_to_f32(h[j]) : ca_bf16_to_f32(h[j]);
    }
    free(h);
    return s;
}

static ca_status read_op(const meta_op *op, ca_dtype dt, int64_t start, int64_t n, void *dst) {
    return read_elems(op->src, op->foff, op->fdt, dt, start, n, dst);
}

ca_status ca_meta_src_read_slice_range(ca_meta_src *src, uint64_t foff, ca_dtype fdt, ca_dtype dt, int ndim,
                                       const int64_t *shape, const ca_slice *sl, int64_t start, int64_t count,
                                       void *dst) {
    int64_t outer = 1, inner = 1, block = shape[sl->dim] / sl->parts;
    for (int d = 0; d < sl->dim; d++) outer *= shape[d];
    for (int d = sl->dim + 1; d < ndim; d++) inner *= shape[d];
    int64_t run = sl->len * inner, at = 0, n = 0;   /* the pending run of adjacent elements: [at, at + n) */
    int64_t nruns = outer * sl->parts, first = run ? start / run : 0, last = run && count ? (start + count - 1) / run : -1;
    char *out = dst;
    ca_status s = CA_OK;
    /* the slice's runs (one per outer index and part, `run` elements each, in the slice's order) that
     * meet [start, start + count), each cut to it; adjacent ones read as one */
    for (int64_t q = first; s == CA_OK && q <= last + 1 && q <= nruns; q++) {
        int64_t o = q / sl->parts, k = q % sl->parts, lo = q * run, hi = lo + run;
        if (lo < start) lo = start;
        if (hi > start + count) hi = start + count;
        int64_t e = (o * shape[sl->dim] + k * block + sl->start) * inner + (lo - q * run);
        bool more = q <= last && q < nruns;
        if (more && n && e == at + n) {   /* adjacent (dimension 0, one block): one read */
            n += hi - lo;
            continue;
        }
        if (n) s = read_elems(src, foff, fdt, dt, at, n, out);
        out += (size_t)n * ca_dtype_size(dt);
        at = e, n = more ? hi - lo : 0;
    }
    return s;
}

ca_status ca_meta_src_read_slice(ca_meta_src *src, uint64_t foff, ca_dtype fdt, ca_dtype dt, int ndim,
                                 const int64_t *shape, const ca_slice *sl, void *dst) {
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < sl->dim; d++) outer *= shape[d];
    for (int d = sl->dim + 1; d < ndim; d++) inner *= shape[d];
    return ca_meta_src_read_slice_range(src, foff, fdt, dt, ndim, shape, sl, 0, outer * sl->parts * sl->len * inner, dst);
}

ca_status ca_meta_fill_range(const ca_tensor *t, int64_t start, int64_t n, void *dst) {
    const struct ca_meta_init *mi = t->storage->meta;
    if (!mi || start < 0 || n < 0 || start + n > t->numel)
        return ca_error(CA_ERR_INTERNAL, "ca_meta_fill_range: '%s' [%lld, +%lld)", t->name ? t->name : "",
                        (long long)start, (long long)n);
    if (mi->n == 1 && mi->ops[0].src) return read_op(&mi->ops[0], t->dtype, start, n, dst);   /* those bytes alone */
    ca_device *cpu = ca_cpu_device();
    void *tmp = NULL;
    ca_status s = cpu ? ca_device_alloc(cpu, t->storage->bytes, &tmp) : ca_last_status();
    if (s == CA_OK) s = ca_meta_fill(t, cpu, tmp);
    if (s == CA_OK) memcpy(dst, (char *)tmp + (size_t)start * ca_dtype_size(t->dtype), (size_t)n * ca_dtype_size(t->dtype));
    if (tmp) ca_device_free(cpu, tmp);
    return s;
}

ca_status ca_meta_materialize_slice_(ca_tensor *t, const ca_slice *sl) {
    const struct ca_meta_init *mi = ca_tensor_is_meta(t) ? t->storage->meta : NULL;
    bool whole_file = mi && mi->n == 1 && mi->ops[0].src && mi->ops[0].start == 0 && mi->ops[0].n == t->numel;
    if (!whole_file) {   /* made by its initialisation, or not meta: whole, then narrowed */
        ca_status s = ca_tensor_materialize_(t);
        return s == CA_OK ? ca_tensor_narrow_(t, sl->dim, sl->parts, sl->start, sl->len) : s;
    }
    ca_storage *st = t->storage;
    ca_device *cpu = ca_cpu_device();
    if (!cpu) return ca_last_status();
    size_t pbytes = st->bytes / (size_t)t->shape[sl->dim] * (size_t)(sl->len * sl->parts);
    void *p = NULL, *h = NULL;
    ca_status s = ca_device_alloc(st->dev, pbytes, &p);
    if (s == CA_OK && st->dev != cpu) s = ca_device_alloc(cpu, pbytes, &h);
    if (s == CA_OK) s = ca_meta_src_read_slice(mi->ops[0].src, mi->ops[0].foff, mi->ops[0].fdt, t->dtype, t->ndim,
                                               t->shape, sl, h ? h : p);
    if (s == CA_OK && h) s = ca_device_copy_from_host(st->dev, p, h, pbytes);
    if (h) ca_device_free(cpu, h);
    if (s != CA_OK) {
        if (p) ca_device_free(st->dev, p);
        return ca_error_context("reading this rank's slice of '%s' (%zu bytes)", t->name ? t->name : "", pbytes);
    }
    st->ptr = p;
    st->bytes = pbytes;
    st->absent = NULL;
    ca_meta_init_free(st->meta);
    st->meta = NULL;
    t->shape[sl->dim] = sl->len * sl->parts;
    ca_tensor_set_contiguous(t);
    t->version++;
    return CA_OK;
}

ca_status ca_meta_src_open(const ca_st_file *f, ca_meta_src **out) { return src_open(f, out); }

void ca_meta_src_set_tap(ca_meta_src *src, void (*tap)(void *ctx, uint64_t off, const void *bytes, size_t len),
                         void *ctx) {
    src->tap = tap;
    src->tap_ctx = ctx;
}

ca_status ca_meta_load_entry(ca_tensor *t, const ca_st_file *f, const ca_st_entry *e, ca_meta_src **src) {
    if (ca_tensor_is_meta(t) && ca_init_empty_weights_enabled()) return ca_meta_record_file(t, f, e, src);
    const void *data = ca_st_data(f, e);
    size_t n = (size_t)t->numel;
    /* a model built under ca_init_empty_weights: memory for the file's values, no init run; the
     * parameters the file lacks stay meta and get their initialisation at ca_prepare */
    ca_status a = ca_meta_allocate(t);
    if (a != CA_OK) return a;
    if (e->dtype == t->dtype) return ca_tensor_copy_from_host(t, data, n * ca_dtype_size(t->dtype));
    float *buf = malloc((n ? n : 1) * sizeof *buf);
    if (!buf) return ca_error(CA_ERR_NOMEM, "out of host memory reading '%s'", e->name);
    const uint8_t *b = data;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = (uint16_t)(b[2 * i] | b[2 * i + 1] << 8);   /* safetensors is little-endian */
        buf[i] = e->dtype == CA_F16 ? ca_f16_to_f32(h) : ca_bf16_to_f32(h);
    }
    ca_status s = ca_tensor_copy_from_host(t, buf, n * sizeof *buf);
    free(buf);
    return s;
}
