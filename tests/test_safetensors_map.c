/* The safetensors reader's mapping and verification (tensor/safetensors_impl.h): ca_st_open_checked
 * and ca_st_verify_range against chunk sums and a whole-file CRC, a file cut short under its mapping,
 * the read path where mapping is not used, and the writer's fill (test_fill). Linked with the
 * library's objects: these functions are not exported. */
#include "test_util.h"
#include "tensor/safetensors_impl.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/caccel-stmap-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    DIR *d = opendir(g_dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name), unlink(p);
    if (d) closedir(d);
    rmdir(g_dir);
    return 0;
}

static const char *path_in(const char *name) {
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    return p;
}

static void assert_error(ca_status got, ca_status want, const char *a, const char *b) {
    assert_int_equal(got, want);
    if (a && !strstr(ca_last_error(), a)) fail_msg("'%s' not in: %s", a, ca_last_error());
    if (b && !strstr(ca_last_error(), b)) fail_msg("'%s' not in: %s", b, ca_last_error());
}

/* CRC-32 (zlib's polynomial), bit by bit: an implementation independent of the library's. */
static uint32_t crc_of(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c >> 1 ^ (0xedb88320u & (0u - (c & 1)));
    }
    return ~c;
}

static uint8_t *read_all(const char *p, size_t *n) {
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    uint8_t *b = malloc((size_t)st.st_size + 1);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    *n = fread(b, 1, (size_t)st.st_size, f);
    fclose(f);
    return b;
}

static void flip_at(const char *p, long off) {
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

/* The file is mapped, not read; with chunk sums only the chunks of the ranges asked are hashed (each
 * once), a corrupt chunk is found where it is read and named, and not where it is not; a file with a
 * whole-file CRC only is verified whole; a file cut short under its mapping is an error, not SIGBUS;
 * without mmap (CACCEL_TEST_ST_NO_MMAP) the same bytes are read. */
static void test_mapped_ranges(void **state) {
    (void)state;
    enum { N = 4096, CS = 4096 };
    float *x = malloc(N * sizeof *x);
    for (int i = 0; i < N; i++) x[i] = (float)i;
    int64_t shape[1] = {N};
    ca_st_tensor t = {.name = "a", .dtype = CA_F32, .ndim = 1, .shape = shape, .data = x};
    const char *p = path_in("r.safetensors");
    T_OK(ca_st_write(p, &t, 1));
    size_t size;
    uint8_t *bytes = read_all(p, &size);
    size_t nch = (size + CS - 1) / CS;
    uint32_t *ch = malloc(nch * sizeof *ch);
    for (size_t c = 0; c < nch; c++) ch[c] = crc_of(bytes + c * CS, c + 1 < nch ? CS : size - c * CS);
    ca_st_sums sums = {.size = size, .crc32 = crc_of(bytes, size), .chunk_size = CS, .nchunks = nch, .chunk_crc = ch};
    ca_st_file f;
    T_OK(ca_st_open_checked(p, &sums, false, &f));
    assert_true(f.mapped);
    assert_int_equal(f.verified, CS);                      /* the header's chunk only */
    const ca_st_entry *e = ca_st_find(&f, "a");
    assert_non_null(e);
    assert_memory_equal(ca_st_data(&f, e), x, N * sizeof *x);
    T_OK(ca_st_verify_range(&f, CS + 10, 20));
    T_OK(ca_st_verify_range(&f, CS, CS));                  /* chunk 1 again: not hashed twice */
    assert_int_equal(f.verified, 2 * CS);
    ca_st_close(&f);

    /* a byte of the last chunk corrupt: not seen by a reader of chunk 1, named for a reader of it */
    flip_at(p, (long)size - 3);
    T_OK(ca_st_open_checked(p, &sums, false, &f));
    T_OK(ca_st_verify_range(&f, CS, 100));
    char last[64];
    snprintf(last, sizeof last, "in chunk %zu of %zu (bytes %zu to %zu)", nch - 1, nch, (nch - 1) * CS, size);
    assert_error(ca_st_verify_range(&f, size - 8, 8), CA_ERR_IO, "r.safetensors: corrupt: CRC-32", last);
    ca_st_close(&f);
    assert_error(ca_st_open_checked(p, &sums, true, &f), CA_ERR_IO, "r.safetensors: corrupt: CRC-32", last);
    /* without chunk sums (an older checkpoint): the whole file is verified, at the open already */
    ca_st_sums whole = {.size = size, .crc32 = sums.crc32};
    char rec[64];
    snprintf(rec, sizeof rec, "the checkpoint recorded %08x", (unsigned)sums.crc32);
    assert_error(ca_st_open_checked(p, &whole, false, &f), CA_ERR_IO, "r.safetensors: corrupt: CRC-32", rec);
    flip_at(p, (long)size - 3);                            /* restored */
    T_OK(ca_st_open_checked(p, &whole, false, &f));
    T_OK(ca_st_verify_range(&f, CS, 4));
    assert_int_equal(f.verified, size);
    ca_st_close(&f);
    whole.size = size + 1;
    assert_error(ca_st_open_checked(p, &whole, false, &f), CA_ERR_IO, "r.safetensors: truncated", NULL);

    /* cut short under the mapping: an error, where touching the lost pages would raise SIGBUS */
    T_OK(ca_st_open_checked(p, &sums, false, &f));
    assert_int_equal(truncate(p, 100), 0);
    assert_error(ca_st_verify_range(&f, CS, 4), CA_ERR_IO, "r.safetensors: the file shrank to 100 bytes", NULL);
    ca_st_close(&f);
    assert_error(ca_st_open_checked(p, &sums, false, &f), CA_ERR_IO, "r.safetensors: truncated: 100 bytes", NULL);

    /* no mapping: read, the same bytes */
    T_OK(ca_st_write(p, &t, 1));
    setenv("CACCEL_TEST_ST_NO_MMAP", "1", 1);
    T_OK(ca_st_open_checked(p, &sums, false, &f));
    unsetenv("CACCEL_TEST_ST_NO_MMAP");
    assert_false(f.mapped);
    T_OK(ca_st_verify_range(&f, 0, size));
    assert_memory_equal(ca_st_data(&f, ca_st_find(&f, "a")), x, N * sizeof *x);
    ca_st_close(&f);
    free(ch);
    free(bytes);
    free(x);
}

/* A tensor given by a fill (a device tensor, copied off the device when the file is made) is written
 * as its data would be, byte for byte: to the disk through a buffer of the writer's, and under a
 * capture (an asynchronous save's host copy) straight into the captured file's buffer, each fill run
 * once; a fill that fails fails the write, and nothing is written. */
static int g_fills;

static ca_status fill_from(void *ctx, void *dst, size_t len) {
    g_fills++;
    memcpy(dst, ctx, len);
    return CA_OK;
}

static ca_status fill_fails(void *ctx, void *dst, size_t len) {
    (void)ctx, (void)dst, (void)len;
    return ca_error(CA_ERR_BACKEND, "the device copy failed");
}

static void test_fill(void **state) {
    (void)state;
    float x[300], y[7];
    for (int i = 0; i < 300; i++) x[i] = (float)i * 0.5f;
    for (int i = 0; i < 7; i++) y[i] = (float)-i;
    int64_t sx[1] = {300}, sy[1] = {7};
    ca_st_tensor plain[2] = {{.name = "a", .dtype = CA_F32, .ndim = 1, .shape = sx, .data = x},
                             {.name = "b", .dtype = CA_F32, .ndim = 1, .shape = sy, .data = y}};
    ca_st_tensor filled[2] = {{.name = "a", .dtype = CA_F32, .ndim = 1, .shape = sx, .fill = fill_from, .ctx = x},
                              {.name = "b", .dtype = CA_F32, .ndim = 1, .shape = sy, .data = y}};
    char a[600], b[600];
    snprintf(a, sizeof a, "%s", path_in("plain.safetensors"));
    snprintf(b, sizeof b, "%s", path_in("filled.safetensors"));
    T_OK(ca_st_write(a, plain, 2));
    g_fills = 0;
    T_OK(ca_st_write(b, filled, 2));
    assert_int_equal(g_fills, 1);
    size_t na, nb;
    uint8_t *ba = read_all(a, &na), *bb = read_all(b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(ba, bb, na);
    ca_st_capture c = {0};
    ca_st_capture *prev = ca_st_capture_set(&c);
    g_fills = 0;
    ca_status s = ca_st_write(b, filled, 2);
    ca_st_capture_set(prev);
    T_OK(s);
    assert_int_equal(g_fills, 1);
    assert_int_equal(c.n, 1);
    assert_int_equal(c.files[0].len, na);
    assert_memory_equal(c.files[0].data, ba, na);
    ca_st_capture_free(&c);
    unlink(b);
    filled[0].fill = fill_fails;
    s = ca_st_write(b, filled, 2);
    assert_int_equal(s, CA_ERR_BACKEND);
    assert_non_null(strstr(ca_last_error(), "the device copy failed"));
    assert_int_equal(access(b, F_OK), -1);
    free(ba);
    free(bb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mapped_ranges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fill, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_shutdown();
    return rc;
}
