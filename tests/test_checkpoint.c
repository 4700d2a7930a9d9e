/* Model files (safetensors): round trip, sharding with the index, corrupt files, mismatched models.
 * With arguments it is the C side of tests/test_safetensors_interop.sh:
 *   test_checkpoint --save DIR     saves the interop model (seed 7) into DIR
 *   test_checkpoint --dump PATH    loads PATH into the interop model, prints "name dtype shape hex"
 * and of tests/test_checkpoint_ranks.sh (under caccel launch):
 *   test_checkpoint --ranks DIR    every rank saves, then loads the file back and compares */
#include "test_util.h"

#include <dirent.h>
#include <sys/stat.h>

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/caccel-ckpt-XXXXXX", base && *base ? base : "/tmp");
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

/* Linear(4, hidden), ReLU, Linear(hidden, 3): 0.weight, 0.bias, 2.weight, 2.bias. */
static ca_module *mlp(uint64_t seed, int hidden) {
    ca_module *m;
    ca_manual_seed(seed);
    T_OK(ca_sequential_create(&m));
    ca_module *l1, *r, *l2;
    T_OK(ca_linear_create(4, hidden, true, &l1));
    T_OK(ca_module_add(m, NULL, l1));
    T_OK(ca_relu_create(&r));
    T_OK(ca_module_add(m, NULL, r));
    T_OK(ca_linear_create(hidden, 3, true, &l2));
    T_OK(ca_module_add(m, NULL, l2));
    return m;
}

/* All parameter bytes, concatenated (caller frees). */
static uint8_t *snapshot(ca_module *m, size_t *len) {
    size_t total = 0, off = 0;
    for (int i = 0; i < ca_module_num_params(m); i++) total += ca_tensor_nbytes(ca_module_param_at(m, i));
    uint8_t *b = malloc(total);
    for (int i = 0; i < ca_module_num_params(m); i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        T_OK(ca_tensor_to_host(p, b + off, ca_tensor_nbytes(p)));
        off += ca_tensor_nbytes(p);
    }
    *len = total;
    return b;
}

static void assert_same_params(ca_module *a, ca_module *b, bool same) {
    size_t la, lb;
    uint8_t *x = snapshot(a, &la), *y = snapshot(b, &lb);
    assert_int_equal(la, lb);
    assert_int_equal(memcmp(x, y, la) == 0, same);
    free(x);
    free(y);
}

static void assert_error(ca_status got, ca_status want, const char *a, const char *b) {
    assert_int_equal(got, want);
    if (a && !strstr(ca_last_error(), a)) fail_msg("'%s' not in: %s", a, ca_last_error());
    if (b && !strstr(ca_last_error(), b)) fail_msg("'%s' not in: %s", b, ca_last_error());
}

static int count_files(const char *suffix) {
    DIR *d = opendir(g_dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name), s = strlen(suffix);
        n += l >= s && strcmp(e->d_name + l - s, suffix) == 0;
    }
    closedir(d);
    return n;
}

static void test_round_trip(void **state) {
    (void)state;
    ca_accelerator *acc;
    char *argv[] = {"test", "--cpu", NULL};
    T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv}, &acc));
    ca_module *a = mlp(1, 8), *b = mlp(2, 8);
    assert_same_params(a, b, false);
    T_OK(ca_save_model(acc, a, g_dir, 0));
    assert_int_equal(count_files(".safetensors"), 1);
    assert_int_equal(count_files(".tmp"), 0);
    T_OK(ca_load_model(acc, b, g_dir));
    assert_same_params(a, b, true);
    /* the file itself works too */
    ca_module *c = mlp(3, 8);
    T_OK(ca_load_model(NULL, c, path_in("model.safetensors")));
    assert_same_params(a, c, true);
    ca_module_destroy(a);
    ca_module_destroy(b);
    ca_module_destroy(c);
    ca_accelerator_destroy(acc);
}

static char *read_text(const char *path) {
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    static char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    buf[n] = '\0';
    fclose(fp);
    return buf;
}

/* 0.weight 128 B, 0.bias 32, 2.weight 96, 2.bias 12; at most 130 per file gives
 * {0.weight} {0.bias, 2.weight} {2.bias}, as huggingface_hub splits. */
static void test_sharded(void **state) {
    (void)state;
    ca_module *a = mlp(1, 8), *b = mlp(2, 8);
    T_OK(ca_save_model(NULL, a, g_dir, 130));
    assert_int_equal(count_files(".safetensors"), 3);
    assert_int_equal(access(path_in("model.safetensors"), F_OK), -1);
    assert_string_equal(read_text(path_in("model.safetensors.index.json")),
                        "{\n  \"metadata\": {\n    \"total_size\": 268\n  },\n  \"weight_map\": {\n"
                        "    \"0.bias\": \"model-00002-of-00003.safetensors\",\n"
                        "    \"0.weight\": \"model-00001-of-00003.safetensors\",\n"
                        "    \"2.bias\": \"model-00003-of-00003.safetensors\",\n"
                        "    \"2.weight\": \"model-00002-of-00003.safetensors\"\n  }\n}\n");
    T_OK(ca_load_model(NULL, b, g_dir));
    assert_same_params(a, b, true);
    /* an unsharded save afterwards removes the index, so the directory loads the new file */
    ca_module *c = mlp(5, 8), *d = mlp(6, 8);
    T_OK(ca_save_model(NULL, c, g_dir, 0));
    assert_int_equal(access(path_in("model.safetensors.index.json"), F_OK), -1);
    T_OK(ca_load_model(NULL, d, g_dir));
    assert_same_params(c, d, true);
    ca_module_destroy(a);
    ca_module_destroy(b);
    ca_module_destroy(c);
    ca_module_destroy(d);
}

/* Writes a safetensors file by hand: header (padded), then `data` bytes. */
static const char *write_raw(const char *name, const char *header, uint64_t hl_claimed,
                             const void *data, size_t dl) {
    const char *p = path_in(name);
    FILE *fp = fopen(p, "wb");
    size_t hl = strlen(header);
    uint64_t hl_le = hl_claimed ? hl_claimed : hl;
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(hl_le >> (8 * i));
    fwrite(len, 1, 8, fp);
    fwrite(header, 1, hl, fp);
    if (dl) fwrite(data, 1, dl, fp);
    fclose(fp);
    return p;
}

static ca_status load_file(const char *p) {
    ca_module *m = mlp(1, 8);
    ca_status s = ca_load_model(NULL, m, p);
    ca_module_destroy(m);
    return s;
}

static void test_corrupt_files(void **state) {
    (void)state;
    static const uint8_t zeros[64];
    const char *p = write_raw("short.safetensors", "", 0, NULL, 0);
    assert_int_equal(truncate(p, 5), 0);
    assert_error(load_file(p), CA_ERR_IO, "short.safetensors", "truncated");
    p = write_raw("hl.safetensors", "{}", 4000, NULL, 0);
    assert_error(load_file(p), CA_ERR_IO, "hl.safetensors", "header length 4000");
    p = write_raw("json.safetensors", "{\"0.weight\": {\"dtype\": ", 0, NULL, 0);
    assert_error(load_file(p), CA_ERR_IO, "json.safetensors",
                 "JSON header is invalid: unexpected end of input at byte 23 of the header");
    p = write_raw("after.safetensors", "{} x", 0, NULL, 0);
    assert_error(load_file(p), CA_ERR_IO, "after.safetensors",
                 "JSON header is invalid: bytes after the value at byte 3 of the header");
    /* offsets above 2^63 - 1 are quoted as written (json_object_get_int64 gave 9223372036854775807) */
    p = write_raw("big.safetensors",
                  "{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,9223372036854775808]}}", 0,
                  zeros, 8);
    assert_error(load_file(p), CA_ERR_IO, "big.safetensors: tensor '0.bias'",
                 "data_offsets [0, 9223372036854775808] beyond the 8 data bytes of the file");
    p = write_raw("huge.safetensors",
                  "{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,99999999999999999999]}}", 0,
                  zeros, 8);
    assert_error(load_file(p), CA_ERR_IO, "huge.safetensors: tensor '0.bias'",
                 "data_offsets [0, 18446744073709551615 (2^64 - 1) or more] beyond");
    p = write_raw("dim.safetensors",
                  "{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[9223372036854775808],\"data_offsets\":[0,8]}}",
                  0, zeros, 8);
    assert_error(load_file(p), CA_ERR_IO, "dim.safetensors: tensor '0.bias'",
                 "shape[0] is 9223372036854775808, above 2^63 - 1");
    p = write_raw("range.safetensors",
                  "{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 0, zeros, 8);
    assert_error(load_file(p), CA_ERR_IO, "range.safetensors: tensor '0.bias'", "beyond");
    p = write_raw("overlap.safetensors",
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, zeros, 12);
    assert_error(load_file(p), CA_ERR_IO, "overlap.safetensors: tensor 'b'", "overlap those of tensor 'a'");
    p = write_raw("dtype.safetensors",
                  "{\"0.bias\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 0, zeros, 1);
    assert_error(load_file(p), CA_ERR_IO, "dtype.safetensors: tensor '0.bias'", "unknown dtype 'Q4'");
    p = write_raw("size.safetensors",
                  "{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, zeros, 8);
    assert_error(load_file(p), CA_ERR_IO, "size.safetensors: tensor '0.bias'", "give 12 bytes");
    /* a real file cut short: its last tensor's data is gone */
    ca_module *a = mlp(1, 8);
    T_OK(ca_save_model(NULL, a, g_dir, 0));
    struct stat st;
    assert_int_equal(stat(path_in("model.safetensors"), &st), 0);
    assert_int_equal(truncate(path_in("model.safetensors"), st.st_size - 20), 0);
    assert_error(load_file(path_in("model.safetensors")), CA_ERR_IO, "model.safetensors: tensor '2.weight'", "beyond");
    assert_error(load_file(path_in("nothing")), CA_ERR_NOT_FOUND, "nothing", NULL);
    ca_module_destroy(a);
}

static void test_mismatched_model(void **state) {
    (void)state;
    ca_module *a = mlp(1, 8);
    T_OK(ca_save_model(NULL, a, g_dir, 0));
    ca_module *other = mlp(2, 5), *other_ref = mlp(2, 5);
    assert_error(ca_load_model(NULL, other, g_dir), CA_ERR_INVALID,
                 "model.safetensors: tensor '0.bias'", "shape [8] in the file, [5] in the model");
    assert_same_params(other, other_ref, true);
    /* one layer more: 3.weight and 3.bias are missing; nothing is copied */
    ca_module *bigger = mlp(3, 8), *bigger_ref = mlp(3, 8), *l;
    ca_manual_seed(9);
    T_OK(ca_linear_create(3, 2, true, &l));
    T_OK(ca_module_add(bigger, NULL, l));
    ca_manual_seed(9);
    T_OK(ca_linear_create(3, 2, true, &l));
    T_OK(ca_module_add(bigger_ref, NULL, l));
    assert_error(ca_load_model(NULL, bigger, g_dir), CA_ERR_INVALID, "no tensor '3.weight'", g_dir);
    assert_same_params(bigger, bigger_ref, true);
    /* one layer less: 2.weight and 2.bias have no parameter */
    ca_module *smaller;
    T_OK(ca_sequential_create(&smaller));
    T_OK(ca_linear_create(4, 8, true, &l));
    T_OK(ca_module_add(smaller, NULL, l));
    assert_error(ca_load_model(NULL, smaller, g_dir), CA_ERR_INVALID, "tensor '2.bias' has no parameter",
                 "model.safetensors");
    ca_module_destroy(a);
    ca_module_destroy(other);
    ca_module_destroy(other_ref);
    ca_module_destroy(bigger);
    ca_module_destroy(bigger_ref);
    ca_module_destroy(smaller);
}

/* ------------------------------------------------------- interop mode */

/* The MLP plus an f16 parameter "scale" [3] (1, 0.5, -2). */
static ca_module *interop_model(void) {
    ca_module *m = mlp(7, 8);
    ca_tensor *s;
    T_OK(ca_parameter_create(ca_cpu_device(), CA_F16, 1, (int64_t[]){3}, &s));
    const uint16_t v[3] = {0x3c00, 0x3800, 0xc000};
    T_OK(ca_tensor_copy_from_host(s, v, sizeof v));
    T_OK(ca_module_add_param(m, "scale", s));
    return m;
}

static void dump(ca_module *m) {
    for (int i = 0; i < ca_module_num_params(m); i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        printf("%s %s [", ca_module_param_name(m, i), ca_dtype_name(ca_tensor_dtype(p)));
        for (int d = 0; d < ca_tensor_ndim(p); d++) printf("%s%lld", d ? ", " : "", (long long)ca_tensor_shape(p)[d]);
        printf("] ");
        size_t n = ca_tensor_nbytes(p);
        uint8_t *b = malloc(n);
        CA_CHECK(ca_tensor_to_host(p, b, n));
        for (size_t k = 0; k < n; k++) printf("%02x", b[k]);
        printf("\n");
        free(b);
    }
}

static int interop(const char *mode, const char *path) {
    ca_module *m = interop_model();
    if (strcmp(mode, "--save") == 0) {
        CA_CHECK(ca_save_model(NULL, m, path, 0));
    } else {
        CA_CHECK(ca_load_model(NULL, m, path));
    }
    dump(m);
    ca_module_destroy(m);
    ca_shutdown();
    return 0;
}

/* Every rank calls ca_save_model; once it returns, the file must be there for every rank. */
static int ranks(const char *dir) {
    ca_accelerator *acc;
    char *argv[] = {"test_checkpoint", NULL};
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = 1, .argv = argv}, &acc));
    ca_module *a = mlp(7, 8), *b = mlp(8, 8);
    ca_status s = ca_save_model(acc, a, dir, 0);
    if (s == CA_OK) s = ca_load_model(acc, b, dir);
    size_t la, lb;
    uint8_t *x = snapshot(a, &la), *y = snapshot(b, &lb);
    printf("rank %d: %s %s%s\n", ca_process_index(acc), ca_status_name(s),
           s == CA_OK && la == lb && memcmp(x, y, la) == 0 ? "same parameters" : "", s ? ca_last_error() : "");
    free(x);
    free(y);
    ca_module_destroy(a);
    ca_module_destroy(b);
    ca_accelerator_destroy(acc);
    ca_shutdown();
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--ranks") == 0) return ranks(argv[2]);
    if (argc == 3) return interop(argv[1], argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatched_model, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
