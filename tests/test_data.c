/* Tests of data/ datasets: in-memory and custom datasets, the IDX reader, Fashion-MNIST. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <caccel/caccel.h>

#include <dirent.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* ------------------------------------------------------------- helpers */

static char g_tmp[4096];

static int make_tmpdir(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/caccel-test-data-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(g_tmp) ? 0 : -1;
}

static void rm_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[4096 + 256];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        rm_tree(p);
    }
    closedir(d);
    rmdir(path);
}

static int remove_tmpdir(void **state) {
    (void)state;
    rm_tree(g_tmp);
    return 0;
}

static const char *tmp_path(char *buf, size_t len, const char *name) {
    snprintf(buf, len, "%s/%s", g_tmp, name);
    return buf;
}

static void write_file(const char *path, const void *data, size_t len, bool gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        if (len) assert_int_equal(gzwrite(f, data, (unsigned)len), (int)len);
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        if (len) assert_int_equal(fwrite(data, 1, len, f), len);
        assert_int_equal(fclose(f), 0);
    }
}

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static unsigned char pixel(uint32_t i, uint32_t k) { return (unsigned char)(i * 31u + k * 7u + 3u); }
static unsigned char label_of(uint32_t i) { return (unsigned char)(i % 10u); }

/* An IDX image file of n samples rows x cols, `drop` bytes short, `extra` bytes long. */
static void write_images(const char *path, uint32_t n, uint32_t rows, uint32_t cols, bool gz,
                         size_t drop, size_t extra) {
    size_t len = 16 + (size_t)n * rows * cols + extra;
    unsigned char *b = calloc(1, len);
    assert_non_null(b);
    put_be32(b, 0x00000803u);
    put_be32(b + 4, n);
    put_be32(b + 8, rows);
    put_be32(b + 12, cols);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < rows * cols; k++) b[16 + (size_t)i * rows * cols + k] = pixel(i, k);
    write_file(path, b, len - drop, gz);
    free(b);
}

static void write_labels(const char *path, uint32_t n, bool gz, size_t drop) {
    size_t len = 8 + n;
    unsigned char *b = calloc(1, len);
    assert_non_null(b);
    put_be32(b, 0x00000801u);
    put_be32(b + 4, n);
    for (uint32_t i = 0; i < n; i++) b[8 + i] = label_of(i);
    write_file(path, b, len - drop, gz);
    free(b);
}

static void assert_contains(const char *hay, const char *needle) {
    if (!strstr(hay, needle)) fail_msg("'%s' does not contain '%s'", hay, needle);
}

/* ------------------------------------------------------------- IDX */

static void check_idx_roundtrip(bool gz) {
    char ip[4200], lp[4200];
    tmp_path(ip, sizeof ip, gz ? "rt-images.gz" : "rt-images");
    tmp_path(lp, sizeof lp, gz ? "rt-labels.gz" : "rt-labels");
    const uint32_t n = 7, rows = 3, cols = 5;
    write_images(ip, n, rows, cols, gz, 0, 0);
    write_labels(lp, n, gz, 0);

    ca_dataset *ds = NULL;
    assert_int_equal(ca_idx_dataset_open(ip, lp, &ds), CA_OK);
    assert_int_equal(ca_dataset_length(ds), n);
    const ca_sample_spec *xs = ca_dataset_x_spec(ds), *ys = ca_dataset_y_spec(ds);
    assert_int_equal(xs->dtype, CA_U8);
    assert_int_equal(xs->ndim, 2);
    assert_int_equal(xs->shape[0], rows);
    assert_int_equal(xs->shape[1], cols);
    assert_int_equal(ys->dtype, CA_I64);
    assert_int_equal(ys->ndim, 0);
    for (uint32_t i = 0; i < n; i++) {
        unsigned char x[15];
        int64_t y = -1;
        assert_int_equal(ca_dataset_get(ds, i, x, &y), CA_OK);
        for (uint32_t k = 0; k < rows * cols; k++) assert_int_equal(x[k], pixel(i, k));
        assert_int_equal(y, label_of(i));
    }
    unsigned char x[15];
    int64_t y;
    assert_int_equal(ca_dataset_get(ds, n, x, &y), CA_ERR_INVALID);
    assert_int_equal(ca_dataset_get(ds, -1, x, &y), CA_ERR_INVALID);
    ca_dataset_destroy(ds);
}

static void test_idx_plain(void **state) {
    (void)state;
    check_idx_roundtrip(false);
}

static void test_idx_gzip(void **state) {
    (void)state;
    check_idx_roundtrip(true);
}

static void check_truncated(bool gz) {
    char ip[4200], lp[4200];
    tmp_path(ip, sizeof ip, gz ? "tr-images.gz" : "tr-images");
    tmp_path(lp, sizeof lp, gz ? "tr-labels.gz" : "tr-labels");
    /* 4 images of 2x3: 16 + 24 = 40 bytes expected; 5 missing. */
    write_images(ip, 4, 2, 3, gz, 5, 0);
    write_labels(lp, 4, gz, 0);
    ca_dataset *ds = (ca_dataset *)1;
    assert_int_equal(ca_idx_dataset_open(ip, lp, &ds), CA_ERR_IO);
    assert_null(ds);
    assert_int_equal(ca_last_status(), CA_ERR_IO);
    assert_contains(ca_last_error(), ip);
    assert_contains(ca_last_error(), "truncated");
    assert_contains(ca_last_error(), "40");
    assert_contains(ca_last_error(), "35");

    /* Labels truncated too: 8 + 4 expected, 2 missing. */
    write_images(ip, 4, 2, 3, gz, 0, 0);
    write_labels(lp, 4, gz, 2);
    assert_int_equal(ca_idx_dataset_open(ip, lp, &ds), CA_ERR_IO);
    assert_contains(ca_last_error(), lp);
    assert_contains(ca_last_error(), "12");
    assert_contains(ca_last_error(), "10");

    if (gz) {
        /* A gzip stream cut in the middle. */
        char whole[4200];
        write_images(tmp_path(whole, sizeof whole, "tr-whole.gz"), 200, 16, 16, true, 0, 0);
        FILE *f = fopen(whole, "rb");
        assert_non_null(f);
        static unsigned char buf[1 << 16];
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        assert_true(len > 64 && len < sizeof buf);
        write_file(ip, buf, len / 2, false);
        assert_int_equal(ca_idx_dataset_open(ip, lp, &ds), CA_ERR_IO);
        assert_contains(ca_last_error(), ip);
        assert_contains(ca_last_error(), "truncated");
        assert_contains(ca_last_error(), "51216");   /* 16 + 200 * 256 */
    }

    /* Cut inside the header. */
    write_images(ip, 4, 2, 3, gz, 40 - 10, 0);
    assert_int_equal(ca_idx_dataset_open(ip, lp, &ds), CA_ERR_IO);
    assert_contains(ca_last_error(), ip);
    assert_contains(ca_last_error(), "truncated");
}

static void test_idx_truncated_plain(void **state) {
    (void)state;
    check_truncated(false);
}

static void test_idx_truncated_gzip(void **state) {
    (void)state;
    check_truncated(true);
}

static void test_idx_too_long(void **state) {
    (void)state;
    char ip[4200], lp[4200];
    write_images(tmp_path(ip, sizeof ip, "long-images.gz"), 3, 2, 2, true, 0, 9);
    write_labels(tmp_path(lp, sizeof lp, "long-labels.gz"), 3, true, 0);
    ca_dataset *ds = NULL;
    assert_int_equal(ca_idx_dataset_open(ip, lp, &ds), CA_ERR_IO);
    assert_null(ds);
    assert_contains(ca_last_error(), ip);
    assert_contains(ca_last_error(), "28");   /* 16 + 12 expected */
    assert_contains(ca_last_error(), "37");
}

static void test_idx_bad_magic(void **state) {
    (void)state;
    char ip[4200], lp[4200];
    tmp_path(ip, sizeof ip, "bm-images");
    tmp_path(lp, sizeof lp, "bm-labels");
    write_labels(lp, 3, false, 0);
    unsigned char junk[64];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(0x41 + i % 26);
    write_file(ip, junk, sizeof junk, false);
    ca_dataset *ds = NULL;
    assert_int_equal(ca_idx_dataset_open(ip, lp, &ds), CA_ERR_IO);
    assert_null(ds);
    assert_contains(ca_last_error(), ip);
    assert_contains(ca_last_error(), "magic");

    /* Images and labels swapped: the message says what each file is. */
    write_images(ip, 3, 2, 2, false, 0, 0);
    assert_int_equal(ca_idx_dataset_open(lp, ip, &ds), CA_ERR_IO);
    assert_contains(ca_last_error(), lp);
    assert_contains(ca_last_error(), "0x00000801");
    assert_contains(ca_last_error(), "labels");
}

static void test_idx_count_mismatch(void **state) {
    (void)state;
    char ip[4200], lp[4200];
    write_images(tmp_path(ip, sizeof ip, "cm-images.gz"), 6, 2, 2, true, 0, 0);
    write_labels(tmp_path(lp, sizeof lp, "cm-labels.gz"), 5, true, 0);
    ca_dataset *ds = NULL;
    assert_int_equal(ca_idx_dataset_open(ip, lp, &ds), CA_ERR_IO);
    assert_null(ds);
    assert_contains(ca_last_error(), ip);
    assert_contains(ca_last_error(), lp);
    assert_contains(ca_last_error(), "6 images");
    assert_contains(ca_last_error(), "5 labels");
}

static void test_idx_corrupt_gzip(void **state) {
    (void)state;
    char ip[4200], lp[4200];
    tmp_path(ip, sizeof ip, "cg-images.gz");
    write_labels(tmp_path(lp, sizeof lp, "cg-labels.gz"), 3, true, 0);
    /* A gzip header followed by garbage. */
    unsigned char junk[200] = {0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0x00, 0x03};
    for (size_t i = 10; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 37u + 11u);
    write_file(ip, junk, sizeof junk, false);
    ca_dataset *ds = NULL;
    assert_int_equal(ca_idx_dataset_open(ip, lp, &ds), CA_ERR_IO);
    assert_null(ds);
    assert_contains(ca_last_error(), ip);
    assert_contains(ca_last_error(), "gzip");

    /* A valid gzip stream with a damaged CRC trailer. */
    char good[4200];
    write_images(tmp_path(good, sizeof good, "cg-good.gz"), 3, 2, 2, true, 0, 0);
    FILE *f = fopen(good, "rb");
    assert_non_null(f);
    unsigned char buf[512];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_true(len > 8 && len < sizeof buf);
    buf[len - 8] ^= 0xff;
    write_file(ip, buf, len, false);
    assert_int_equal(ca_idx_dataset_open(ip, lp, &ds), CA_ERR_IO);
    assert_contains(ca_last_error(), ip);
    assert_contains(ca_last_error(), "gzip");
}

static void test_idx_missing(void **state) {
    (void)state;
    char ip[4200], lp[4200];
    tmp_path(ip, sizeof ip, "no-such-images.gz");
    write_labels(tmp_path(lp, sizeof lp, "ms-labels.gz"), 3, true, 0);
    ca_dataset *ds = NULL;
    assert_int_equal(ca_idx_dataset_open(ip, lp, &ds), CA_ERR_IO);
    assert_null(ds);
    assert_contains(ca_last_error(), ip);
    assert_contains(ca_last_error(), "No such file");
}

static void test_idx_zero_dim(void **state) {
    (void)state;
    char ip[4200], lp[4200];
    write_images(tmp_path(ip, sizeof ip, "zd-images"), 2, 0, 4, false, 0, 0);
    write_labels(tmp_path(lp, sizeof lp, "zd-labels"), 2, false, 0);
    ca_dataset *ds = NULL;
    assert_int_equal(ca_idx_dataset_open(ip, lp, &ds), CA_ERR_IO);
    assert_contains(ca_last_error(), ip);
    assert_contains(ca_last_error(), "dimension 1 is 0");
}

/* ------------------------------------------------------------- IDX straight into tensors */

/* A device of the CPU's kernels whose memory counts as not host memory, so ca_idx_load_tensors
 * stages through a chunk: its host-to-device copies are counted (the largest, and all bytes). */
static ca_device_ops g_staged_ops;
static const ca_device_ops *g_cpu_ops;
static size_t g_h2d_max, g_h2d_total;

static ca_status counting_memcpy(void *dev, void *dst, const void *src, size_t bytes, ca_copy_kind kind,
                                 bool async) {
    if (kind == CA_COPY_H2D) {
        if (bytes > g_h2d_max) g_h2d_max = bytes;
        g_h2d_total += bytes;
    }
    return g_cpu_ops->memcpy(dev, dst, src, bytes, kind, async);
}

static ca_device *staged_device(void) {
    static ca_plugin p;
    static const ca_device_ops *devs[1];
    static ca_device *d;
    if (d) return d;
    g_cpu_ops = ca_device_ops_of(ca_cpu_device());
    g_staged_ops = *g_cpu_ops;
    g_staged_ops.name = "staged_data_test";
    g_staged_ops.host_memory = false;
    g_staged_ops.kind = CA_DEVICE_GPU;
    g_staged_ops.memcpy = counting_memcpy;
    devs[0] = &g_staged_ops;
    p = (ca_plugin){.struct_size = sizeof p, .abi_version = CA_ABI_VERSION, .name = "staged_data",
                    .version = "test", .num_devices = 1, .devices = devs};
    assert_int_equal(ca_register_plugin(&p, "test_data"), CA_OK);
    assert_int_equal(ca_device_open("staged_data_test", 0, NULL, &d), CA_OK);
    assert_false(ca_device_is_host(d));
    return d;
}

static int64_t reverse_order(int64_t i, int64_t n, void *ctx) { (void)ctx; return n - 1 - i; }
static int64_t stride_order(int64_t i, int64_t n, void *ctx) { return (i * *(int64_t *)ctx) % n; }
static int64_t twice_zero(int64_t i, int64_t n, void *ctx) { (void)ctx; return i < 2 ? 0 : i % n; }

/* Every row of x and y against the file: row i holds sample order(i), x = pixel * scale. */
static void check_loaded(ca_tensor *x, ca_tensor *y, uint32_t n, uint32_t px, const ca_idx_load_opts *o) {
    assert_int_equal(ca_tensor_dtype(x), CA_F32);
    assert_int_equal(ca_tensor_ndim(x), 2);
    assert_int_equal(ca_tensor_dim(x, 0), n);
    assert_int_equal(ca_tensor_dim(x, 1), px);
    assert_int_equal(ca_tensor_dtype(y), CA_I64);
    assert_int_equal(ca_tensor_ndim(y), 1);
    float *hx = malloc(ca_tensor_nbytes(x));
    int64_t *hy = malloc(ca_tensor_nbytes(y) + 1);
    assert_int_equal(ca_tensor_to_host(x, hx, ca_tensor_nbytes(x)), CA_OK);
    assert_int_equal(ca_tensor_to_host(y, hy, ca_tensor_nbytes(y)), CA_OK);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t j = o->order ? (uint32_t)o->order(i, n, o->order_ctx) : i;
        assert_int_equal(hy[i], label_of(j));
        for (uint32_t k = 0; k < px; k++)
            if (hx[(size_t)i * px + k] != (float)pixel(j, k) * o->x_scale)
                fail_msg("x[%u][%u] = %g, sample %u's pixel is %u", i, k, hx[(size_t)i * px + k], j, pixel(j, k));
    }
    free(hx);
    free(hy);
}

/* Values, in the files' order and permuted, gzip'd and plain, on the host and through staging: a
 * file of more rows than one chunk holds, so rows cross chunks and the staging copies runs. */
static void test_idx_load_tensors(void **state) {
    (void)state;
    char ip[4200], lp[4200];
    const uint32_t n = 1500, rows = 28, cols = 28;   /* 4.7 MB as f32: five chunks */
    int64_t stride = 7;                                /* coprime with 1500 */
    ca_idx_load_opts orders[] = {{.x_scale = 1.0f / 255.0f},
                                 {.x_scale = 0.5f, .order = reverse_order},
                                 {.x_scale = 1.0f / 255.0f, .order = stride_order, .order_ctx = &stride}};
    for (int gz = 0; gz < 2; gz++) {
        tmp_path(ip, sizeof ip, gz ? "lt-images.gz" : "lt-images");
        tmp_path(lp, sizeof lp, gz ? "lt-labels.gz" : "lt-labels");
        write_images(ip, n, rows, cols, gz, 0, 0);
        write_labels(lp, n, gz, 0);
        for (int dev = 0; dev < 2; dev++)
            for (size_t o = 0; o < sizeof orders / sizeof *orders; o++) {
                ca_device *d = dev ? staged_device() : ca_cpu_device();
                ca_tensor *x = NULL, *y = NULL;
                g_h2d_max = g_h2d_total = 0;
                assert_int_equal(ca_idx_load_tensors(d, ip, lp, &orders[o], &x, &y), CA_OK);
                assert_ptr_equal(ca_tensor_device(x), d);
                check_loaded(x, y, n, rows * cols, &orders[o]);
                if (dev) assert_int_equal(g_h2d_total, ca_tensor_nbytes(x) + ca_tensor_nbytes(y));
                ca_tensor_free(x);
                ca_tensor_free(y);
            }
    }
}

/* The file's errors as ca_idx_dataset_open words them, and a bad order, leave no tensors. */
static void test_idx_load_tensors_errors(void **state) {
    (void)state;
    char ip[4200], lp[4200], sp[4200];
    write_images(tmp_path(ip, sizeof ip, "le-images.gz"), 6, 2, 3, true, 0, 0);
    write_labels(tmp_path(lp, sizeof lp, "le-labels.gz"), 6, true, 0);
    write_labels(tmp_path(sp, sizeof sp, "le-labels-5"), 5, false, 0);
    ca_tensor *x = (ca_tensor *)1, *y = (ca_tensor *)1;
    assert_int_equal(ca_idx_load_tensors(ca_cpu_device(), ip, sp, NULL, &x, &y), CA_ERR_IO);
    assert_contains(ca_last_error(), "has 6 images");
    assert_contains(ca_last_error(), "has 5 labels");
    assert_null(x);
    assert_null(y);
    assert_int_equal(ca_idx_load_tensors(ca_cpu_device(), ip, lp, &(ca_idx_load_opts){.order = twice_zero}, &x, &y),
                     CA_ERR_INVALID);
    assert_contains(ca_last_error(), "sample 0 is at rows 0 and 1");
    assert_int_equal(ca_idx_load_tensors(ca_cpu_device(), ip, lp, &(ca_idx_load_opts){.order = stride_order,
                     .order_ctx = &(int64_t){-1}}, &x, &y), CA_ERR_INVALID);
    assert_contains(ca_last_error(), "is outside 0..5");
    write_images(tmp_path(ip, sizeof ip, "le-short.gz"), 6, 2, 3, true, 5, 0);
    assert_int_equal(ca_idx_load_tensors(ca_cpu_device(), ip, lp, NULL, &x, &y), CA_ERR_IO);
    assert_contains(ca_last_error(), "is truncated");
    write_images(tmp_path(ip, sizeof ip, "le-long"), 6, 2, 3, false, 0, 3);
    assert_int_equal(ca_idx_load_tensors(ca_cpu_device(), ip, lp, NULL, &x, &y), CA_ERR_IO);
    assert_contains(ca_last_error(), "longer than its header says");
    assert_null(x);
    assert_null(y);
}

/* This process's resident set (VmRSS) or its high-water mark (VmHWM), in KiB; -1 where unknown. */
static long proc_status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') v = atol(line + kl + 1);
    fclose(f);
    return v;
}

/* Resets the kernel's peak (VmHWM) to the current resident set, after giving the heap's free pages
 * back (so staging that reuses them counts); false where RSS means nothing (valgrind, ASan: their own
 * bookkeeping, shadow and quarantine) or /proc cannot reset it. */
static bool rss_peak_reset(void) {
#ifdef __SANITIZE_ADDRESS__
    return false;
#endif
    if (getenv("CACCEL_UNDER_VALGRIND")) return false;
    malloc_trim(0);
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    bool reset = fputs("5", f) >= 0;
    if (fclose(f) != 0 || !reset) return false;
    return proc_status_kib("VmRSS") >= 0 && proc_status_kib("VmHWM") >= 0;
}

/* The bound: loading holds one chunk beside the tensors, never the split. Through staging, no copy
 * is larger than a chunk (1 MiB and a row); on the host, the process's peak resident memory while
 * loading grows by the tensors and a few MiB, where the u8 split alone is 25 MiB (and an f32 host
 * copy 100 MiB more). The peak is the kernel's VmHWM, reset first through /proc/self/clear_refs. */
static void test_idx_load_tensors_bounded(void **state) {
    (void)state;
    char ip[4200], lp[4200];
    /* 100 MiB of f32 where the peak RSS is checked; valgrind and ASan check the staging alone, on less */
    const char *san = getenv("CACCEL_TEST_SANITIZED");
    bool small = getenv("CACCEL_UNDER_VALGRIND") || (san && !strcmp(san, "yes"));
    const uint32_t n = small ? 4096 : 32768, rows = 28, cols = 28;
    tmp_path(ip, sizeof ip, "bound-images");
    tmp_path(lp, sizeof lp, "bound-labels");
    write_images(ip, n, rows, cols, false, 0, 0);
    write_labels(lp, n, false, 0);
    const size_t chunk = (1u << 20) + rows * cols * sizeof(float);
    ca_tensor *x = NULL, *y = NULL;
    ca_idx_load_opts o = {.x_scale = 1.0f / 255.0f};
    long grown = -1, tensors = 0;
    bool rss = rss_peak_reset();
    if (rss) {
        long rss0 = proc_status_kib("VmRSS");
        assert_int_equal(ca_idx_load_tensors(ca_cpu_device(), ip, lp, &o, &x, &y), CA_OK);
        grown = proc_status_kib("VmHWM") - rss0;
        tensors = (long)((ca_tensor_nbytes(x) + ca_tensor_nbytes(y)) / 1024);
        check_loaded(x, y, n, rows * cols, &o);
        ca_tensor_free(x);
        ca_tensor_free(y);
    }
    g_h2d_max = g_h2d_total = 0;
    assert_int_equal(ca_idx_load_tensors(staged_device(), ip, lp, NULL, &x, &y), CA_OK);
    if (g_h2d_max > chunk) fail_msg("a staging copy of %zu bytes: more than a chunk (%zu)", g_h2d_max, chunk);
    assert_int_equal(g_h2d_total, ca_tensor_nbytes(x) + ca_tensor_nbytes(y));
    ca_tensor_free(x);
    ca_tensor_free(y);
    if (!rss) skip();
    if (grown > tensors + 16 * 1024)
        fail_msg("loading %ld KiB of tensors raised the peak by %ld KiB: staging of %ld KiB", tensors, grown,
                 grown - tensors);
}

/* ------------------------------------------------------------- Fashion-MNIST */

static void test_fashion_mnist_real(void **state) {
    (void)state;
    const char *dir = ca_fashion_mnist_default_dir();
    char probe[4200];
    if (!dir) {
        skip();
        return;
    }
    snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", dir);
    if (access(probe, R_OK) != 0) {
        skip();
        return;
    }
    /* Known first labels of the published files. */
    struct { bool train; int64_t n; int64_t first[4]; } splits[] = {
        {true, 60000, {9, 0, 0, 3}},
        {false, 10000, {9, 2, 1, 1}},
    };
    for (int s = 0; s < 2; s++) {
        ca_dataset *ds = NULL;
        assert_int_equal(ca_fashion_mnist_open(NULL, splits[s].train, &ds), CA_OK);
        assert_int_equal(ca_dataset_length(ds), splits[s].n);
        const ca_sample_spec *xs = ca_dataset_x_spec(ds);
        assert_int_equal(xs->dtype, CA_U8);
        assert_int_equal(xs->ndim, 2);
        assert_int_equal(xs->shape[0], 28);
        assert_int_equal(xs->shape[1], 28);
        int64_t counts[10] = {0};
        unsigned char x[784];
        int64_t y;
        for (int64_t i = 0; i < splits[s].n; i++) {
            assert_int_equal(ca_dataset_get(ds, i, x, &y), CA_OK);
            assert_true(y >= 0 && y <= 9);
            counts[y]++;
            if (i < 4) assert_int_equal(y, splits[s].first[i]);
        }
        /* Fashion-MNIST is balanced: every class has n / 10 samples. */
        for (int c = 0; c < 10; c++) assert_int_equal(counts[c], splits[s].n / 10);
        ca_dataset_destroy(ds);
    }
}

static void test_fashion_mnist_missing(void **state) {
    (void)state;
    char dir[4200];
    tmp_path(dir, sizeof dir, "empty-fmnist");
    assert_int_equal(mkdir(dir, 0700), 0);
    ca_dataset *ds = (ca_dataset *)1;
    assert_int_equal(ca_fashion_mnist_open(dir, true, &ds), CA_ERR_IO);
    assert_null(ds);
    assert_contains(ca_last_error(), dir);
    assert_contains(ca_last_error(), "train-images-idx3-ubyte.gz");
    assert_contains(ca_last_hint(), "dataset-fashion-mnist");
    assert_contains(ca_last_hint(), "--data");

    assert_int_equal(ca_fashion_mnist_open(dir, false, &ds), CA_ERR_IO);
    assert_contains(ca_last_error(), "t10k-images-idx3-ubyte.gz");
}

static void test_fashion_mnist_env_dir(void **state) {
    (void)state;
    char root[4200], dir[4300], p[4400];
    tmp_path(root, sizeof root, "data-root");
    assert_int_equal(mkdir(root, 0700), 0);
    snprintf(dir, sizeof dir, "%s/fashion-mnist", root);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte.gz", dir);
    write_images(p, 12, 28, 28, true, 0, 0);
    /* An unpacked labels file is accepted too. */
    snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte", dir);
    write_labels(p, 12, false, 0);

    char *old = getenv("CACCEL_DATA_DIR") ? strdup(getenv("CACCEL_DATA_DIR")) : NULL;
    assert_int_equal(setenv("CACCEL_DATA_DIR", root, 1), 0);
    assert_string_equal(ca_fashion_mnist_default_dir(), dir);
    ca_dataset *ds = NULL;
    assert_int_equal(ca_fashion_mnist_open(NULL, false, &ds), CA_OK);
    assert_int_equal(ca_dataset_length(ds), 12);
    unsigned char x[784];
    int64_t y;
    assert_int_equal(ca_dataset_get(ds, 11, x, &y), CA_OK);
    assert_int_equal(y, label_of(11));
    assert_int_equal(x[5], pixel(11, 5));
    ca_dataset_destroy(ds);

    /* The training split is not there: CA_ERR_IO naming the file, with the hint. */
    assert_int_equal(ca_fashion_mnist_open(NULL, true, &ds), CA_ERR_IO);
    assert_contains(ca_last_error(), dir);
    assert_contains(ca_last_hint(), "dataset-fashion-mnist");
    if (old) {
        setenv("CACCEL_DATA_DIR", old, 1);
        free(old);
    } else {
        unsetenv("CACCEL_DATA_DIR");
    }
}

/* ------------------------------------------------------------- in memory, custom */

static void test_from_memory(void **state) {
    (void)state;
    float x[6 * 2];
    int32_t y[6];
    for (int i = 0; i < 12; i++) x[i] = (float)i * 0.5f;
    for (int i = 0; i < 6; i++) y[i] = 100 + i;
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {2}};
    ca_sample_spec ys = {.dtype = CA_I32, .ndim = 0};
    ca_dataset *ds = NULL;
    assert_int_equal(ca_dataset_from_memory(&xs, x, &ys, y, 6, &ds), CA_OK);
    /* The data was copied. */
    x[8] = -1.0f;
    y[4] = -1;
    float gx[2];
    int32_t gy;
    assert_int_equal(ca_dataset_get(ds, 4, gx, &gy), CA_OK);
    assert_true(gx[0] == 4.0f && gx[1] == 4.5f);
    assert_int_equal(gy, 104);
    assert_int_equal(ca_dataset_length(ds), 6);
    ca_dataset_destroy(ds);
    ca_dataset_destroy(NULL);

    ca_sample_spec bad = {.dtype = CA_F32, .ndim = CA_MAX_DIMS, .shape = {1, 1, 1, 1, 1, 1, 1, 1}};
    assert_int_equal(ca_dataset_from_memory(&bad, x, &ys, y, 6, &ds), CA_ERR_INVALID);
    assert_null(ds);
    ca_sample_spec bad2 = {.dtype = CA_DTYPE_COUNT, .ndim = 0};
    assert_int_equal(ca_dataset_from_memory(&xs, x, &bad2, y, 6, &ds), CA_ERR_INVALID);
    ca_sample_spec bad3 = {.dtype = CA_F32, .ndim = 2, .shape = {3, 0}};
    assert_int_equal(ca_dataset_from_memory(&bad3, x, &ys, y, 6, &ds), CA_ERR_INVALID);
    assert_contains(ca_last_error(), "dimension 1");
    assert_int_equal(ca_dataset_from_memory(&xs, x, &ys, y, -1, &ds), CA_ERR_INVALID);
    /* Zero samples is a valid (empty) dataset. */
    assert_int_equal(ca_dataset_from_memory(&xs, NULL, &ys, NULL, 0, &ds), CA_OK);
    assert_int_equal(ca_dataset_length(ds), 0);
    ca_dataset_destroy(ds);
}

typedef struct custom_ctx {
    int64_t n;
    int *destroyed;
} custom_ctx;

static int64_t custom_length(void *ctx) { return ((custom_ctx *)ctx)->n; }

static ca_status custom_get(void *ctx, int64_t i, void *x, void *y) {
    (void)ctx;
    if (i == 3) return ca_error(CA_ERR_IO, "custom: sample 3 is unreadable");
    if (i == 4) return CA_ERR_BACKEND;   /* fails without a message */
    ((float *)x)[0] = (float)i;
    *(int64_t *)y = i * 2;
    return CA_OK;
}

static void custom_destroy(void *ctx) {
    custom_ctx *c = ctx;
    (*c->destroyed)++;
    free(c);
}

static void test_custom(void **state) {
    (void)state;
    int destroyed = 0;
    custom_ctx *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->n = 9;
    c->destroyed = &destroyed;
    ca_dataset_ops ops = {.struct_size = sizeof ops,
                          .length = custom_length,
                          .get = custom_get,
                          .destroy = custom_destroy};
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {1}};
    ca_sample_spec ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds = NULL;

    ca_dataset_ops old = ops;
    old.struct_size = sizeof(size_t);
    assert_int_equal(ca_dataset_create(&old, c, &xs, &ys, &ds), CA_ERR_INVALID);
    assert_contains(ca_last_error(), "struct_size");
    ca_dataset_ops noget = ops;
    noget.get = NULL;
    assert_int_equal(ca_dataset_create(&noget, c, &xs, &ys, &ds), CA_ERR_INVALID);
    assert_int_equal(destroyed, 0);   /* a failed create does not take ctx */

    assert_int_equal(ca_dataset_create(&ops, c, &xs, &ys, &ds), CA_OK);
    assert_int_equal(ca_dataset_length(ds), 9);
    float x;
    int64_t y;
    assert_int_equal(ca_dataset_get(ds, 7, &x, &y), CA_OK);
    assert_true(x == 7.0f);
    assert_int_equal(y, 14);
    assert_int_equal(ca_dataset_get(ds, 3, &x, &y), CA_ERR_IO);
    assert_contains(ca_last_error(), "sample 3 is unreadable");
    ca_clear_error();
    assert_int_equal(ca_dataset_get(ds, 4, &x, &y), CA_ERR_BACKEND);
    assert_contains(ca_last_error(), "sample 4");
    ca_dataset_destroy(ds);
    assert_int_equal(destroyed, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idx_plain),
        cmocka_unit_test(test_idx_gzip),
        cmocka_unit_test(test_idx_truncated_plain),
        cmocka_unit_test(test_idx_truncated_gzip),
        cmocka_unit_test(test_idx_too_long),
        cmocka_unit_test(test_idx_bad_magic),
        cmocka_unit_test(test_idx_count_mismatch),
        cmocka_unit_test(test_idx_corrupt_gzip),
        cmocka_unit_test(test_idx_missing),
        cmocka_unit_test(test_idx_zero_dim),
        cmocka_unit_test(test_idx_load_tensors),
        cmocka_unit_test(test_idx_load_tensors_errors),
        cmocka_unit_test(test_idx_load_tensors_bounded),
        cmocka_unit_test(test_fashion_mnist_real),
        cmocka_unit_test(test_fashion_mnist_missing),
        cmocka_unit_test(test_fashion_mnist_env_dir),
        cmocka_unit_test(test_from_memory),
        cmocka_unit_test(test_custom),
    };
    return cmocka_run_group_tests_name("data", tests, make_tmpdir, remove_tmpdir);
}
