/* Every reader handed what is not a file of its kind (docs/RELIABILITY.md, "File sizes"): a FIFO, a
 * link to /dev/zero and a sparse file one byte over the reader's bound each fail at once with an
 * error naming the file. Before, a FIFO blocked the reader for ever and /dev/zero was read until
 * memory ran out. Each test runs under alarm(): a reader that blocks ends the program (a failure,
 * not a hang). A load_state reads only the files its complete.json lists. */
#include "test_util.h"

#include "base/file_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <zlib.h>

#define T_ALARM_S 30   /* each reader answers in milliseconds; a blocked one is killed by SIGALRM */

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/caccel-files-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_dir)) return -1;
    alarm(T_ALARM_S);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    alarm(0);
    t_rm_tree(g_dir);
    return 0;
}

static const char *in_dir(const char *name) {
    static char p[4][600];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_dir, name);
    return p[k];
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* ------------------------------------------------------------------ the three impostors */

typedef enum impostor { FIFO, DEV_ZERO, OVERSIZED } impostor;
static const char *const impostor_names[] = {"a FIFO", "a link to /dev/zero", "a sparse file over the bound"};

/* path made the impostor; false when this file system cannot hold a sparse file that large. */
static bool make_impostor(const char *path, impostor k, uint64_t bound) {
    unlink(path);
    if (k == FIFO) {
        if (mkfifo(path, 0600) != 0) fail_msg("mkfifo %s: %s", path, strerror(errno));
        return true;
    }
    if (k == DEV_ZERO) {
        if (symlink("/dev/zero", path) != 0) fail_msg("symlink %s: %s", path, strerror(errno));
        return true;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) fail_msg("create %s: %s", path, strerror(errno));
    int rc = ftruncate(fd, (off_t)(bound + 1));   /* a hole: no disk is used */
    int e = errno;
    close(fd);
    if (rc != 0 && (e == EFBIG || e == EINVAL)) {
        unlink(path);
        print_message("  (this file system holds no file of %llu bytes: case skipped)\n", (unsigned long long)bound + 1);
        return false;
    }
    if (rc != 0) fail_msg("ftruncate %s: %s", path, strerror(e));
    return true;
}

/* The reader refused the impostor at `path` with an error naming it and what is wrong. */
static void expect_refused(ca_status got, const char *path, impostor k, uint64_t bound) {
    const char *msg = ca_last_error();
    if (got == CA_OK) fail_msg("%s as %s was read without an error", impostor_names[k], path);
    if (!strstr(msg, path)) fail_msg("the error does not name %s: %s", path, msg);
    char want[128];
    if (k == FIFO) snprintf(want, sizeof want, "not a regular file (a FIFO)");
    else if (k == DEV_ZERO) snprintf(want, sizeof want, "not a regular file (a character device)");
    else snprintf(want, sizeof want, "the file is larger than %llu bytes", (unsigned long long)bound);
    if (!strstr(msg, want)) fail_msg("%s as %s: '%s' not in: %s", impostor_names[k], path, want, msg);
}

/* ------------------------------------------------------------------ the readers */

typedef struct reader {
    const char *label;                      /* the test's name */
    const char *file;                       /* the name the reader is handed, in the test's directory */
    uint64_t bound;                         /* its kind's bound (base/file_impl.h) */
    ca_status (*read)(const char *path);    /* reads it as the program would */
} reader;

static ca_status read_config(const char *path) {
    ca_config *c = NULL;
    T_OK(ca_config_create(&c));
    ca_status s = ca_config_load_file(c, path);
    ca_config_destroy(c);
    return s;
}

static ca_status read_deepspeed(const char *path) {
    char ds[700];
    snprintf(ds, sizeof ds, "deepspeed_config.deepspeed_config_file=%s", path);
    const char *settings[] = {"use_cpu=true", "distributed_type=DEEPSPEED", ds, NULL};
    char *argv[] = {"test_files", NULL};
    ca_accelerator *acc = NULL;
    ca_status s = ca_accelerator_create(&(ca_options){.argc = 1, .argv = argv, .settings = settings}, &acc);
    ca_accelerator_destroy(acc);
    return s;
}

static ca_status read_bert_config(const char *path) {
    ca_bert_config c;
    return ca_bert_config_load(path, &c);
}

static ca_status read_tokenizer(const char *path) {
    ca_tokenizer *t = NULL;
    ca_status s = ca_tokenizer_load(path, &t);
    ca_tokenizer_destroy(t);
    return s;
}

static ca_status read_vocab(const char *path) {
    ca_tokenizer *t = NULL;
    ca_status s = ca_tokenizer_load_vocab(path, NULL, &t);
    ca_tokenizer_destroy(t);
    return s;
}

static ca_status read_model(const char *path) {
    ca_module *m = NULL;
    T_OK(ca_linear_create(2, 2, true, &m));
    ca_status s = ca_load_model(NULL, m, path);
    ca_module_destroy(m);
    return s;
}

/* An IDX image file of one 2 x 2 image, uncompressed. */
static void write_idx_images(const char *path) {
    const uint8_t idx[] = {0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 1, 2, 3, 4};
    write_file(path, idx, sizeof idx);
}

static ca_status read_idx_images(const char *path) {
    ca_dataset *d = NULL;
    ca_status s = ca_idx_dataset_open(path, in_dir("labels-idx1-ubyte"), &d);
    ca_dataset_destroy(d);
    return s;
}

static ca_status read_idx_labels(const char *path) {
    write_idx_images(in_dir("images-idx3-ubyte"));
    ca_dataset *d = NULL;
    ca_status s = ca_idx_dataset_open(in_dir("images-idx3-ubyte"), path, &d);
    ca_dataset_destroy(d);
    return s;
}

static ca_status read_fortunes(const char *path) {
    char **e = NULL;
    int64_t n = 0;
    ca_status s = ca_fortunes_read(path, &e, &n);
    ca_fortunes_free(e, n);
    return s;
}

static ca_status read_zero_index(const char *path) {
    (void)path;   /* g_dir/zero_index.json; merge-weights reads it once complete.json's files check out */
    FILE *f = fopen(in_dir("complete.json"), "w");
    if (!f) fail_msg("create complete.json: %s", strerror(errno));
    fputs("{\"files\": {}}\n", f);
    fclose(f);
    return ca_merge_weights(g_dir, in_dir("merged"));
}

static ca_status load_state(const char *dir) {
    char *argv[] = {"test_files", "--cpu", NULL};
    ca_accelerator *acc = NULL;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv}, &acc));
    ca_status s = ca_load_state(acc, dir);
    ca_accelerator_destroy(acc);
    return s;
}

static ca_status read_marker(const char *path) {
    (void)path;   /* g_dir/complete.json */
    return load_state(g_dir);
}

/* caccel_state.json listed in complete.json with the size and CRC-32 it has (0 bytes for a FIFO or
 * /dev/zero, whose stat says 0), so that the load gets past the integrity check to the file. */
static ca_status read_state(const char *path) {
    struct stat st;
    uint64_t size = stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
    uLong crc = crc32(0L, Z_NULL, 0);
    static const uint8_t zeros[1 << 16];
    for (uint64_t left = size; left > 0;) {
        uInt k = left < sizeof zeros ? (uInt)left : (uInt)sizeof zeros;
        crc = crc32(crc, zeros, k);
        left -= k;
    }
    char marker[256];
    int n = snprintf(marker, sizeof marker, "{\"files\": {\"caccel_state.json\": {\"size\": %llu, \"crc32\": %lu}}}",
                     (unsigned long long)size, crc);
    write_file(in_dir("complete.json"), marker, (size_t)n);
    return load_state(g_dir);
}

static const reader readers[] = {
    {"Accelerate YAML config", "default_config.yaml", CA_FILE_MAX_CONFIG, read_config},
    {"Accelerate JSON config", "config.json", CA_FILE_MAX_CONFIG, read_config},
    {"DeepSpeed JSON", "ds_config.json", CA_FILE_MAX_CONFIG, read_deepspeed},
    {"BERT config.json", "config.json", 16 * CA_FILE_MIB, read_bert_config},
    {"tokenizer.json", "tokenizer.json", 256 * CA_FILE_MIB, read_tokenizer},
    {"vocab.txt", "vocab.txt", 256 * CA_FILE_MIB, read_vocab},
    {"model.safetensors", "model.safetensors", CA_FILE_MAX_SAFETENSORS, read_model},
    {"safetensors index", "model.safetensors.index.json", 64 * CA_FILE_MIB, read_model},
    {"IDX images", "train-images-idx3-ubyte.gz", ((uint64_t)1 << 40) + 16, read_idx_images},
    {"IDX labels", "train-labels-idx1-ubyte", ((uint64_t)1 << 40) + 16, read_idx_labels},
    {"fortunes", "startrek", 64 * CA_FILE_MIB, read_fortunes},
    {"merge-weights zero_index.json", "zero_index.json", 64 * CA_FILE_MIB, read_zero_index},
    {"load_state complete.json", "complete.json", 64 * CA_FILE_MIB, read_marker},
    {"load_state caccel_state.json", "caccel_state.json", 64 * CA_FILE_MIB, read_state},
};

/* One reader: each impostor in place of its file. */
static void test_reader(void **state) {
    const reader *r = *state;
    for (impostor k = FIFO; k <= OVERSIZED; k++) {
        const char *path = in_dir(r->file);
        if (!make_impostor(path, k, r->bound)) continue;
        ca_clear_error();
        expect_refused(r->read(path), path, k, r->bound);
        unlink(path);
    }
}

/* log_with mlflow looks for its experiment in every mlruns/<id>/meta.yaml: one that is a FIFO is
 * passed over (with a warning naming it) instead of blocking ca_init_trackers. */
static void test_mlflow_meta(void **state) {
    (void)state;
    char ld[300];
    snprintf(ld, sizeof ld, "logging_dir=%s", g_dir);
    assert_int_equal(mkdir(in_dir("mlruns"), 0755), 0);
    assert_int_equal(mkdir(in_dir("mlruns/7"), 0755), 0);
    assert_int_equal(mkfifo(in_dir("mlruns/7/meta.yaml"), 0600), 0);
    const char *settings[] = {"use_cpu=true", ld, "log_with=mlflow", NULL};
    char *argv[] = {"test_files", NULL};
    ca_accelerator *acc = NULL;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 1, .argv = argv, .settings = settings}, &acc));
    T_OK(ca_init_trackers(acc, "run1", NULL));
    T_OK(ca_end_training(acc));
    ca_accelerator_destroy(acc);
}

/* ------------------------------------------------------------------ the helper itself */

/* A regular file is read whole, through the bound's edge; a directory is refused by name. */
static void test_read_whole(void **state) {
    (void)state;
    const char *p = in_dir("f.txt");
    write_file(p, "hello", 5);
    char *buf = NULL;
    size_t len = 0;
    T_OK(ca_file_read(p, CA_FILE_KIND("a test file", 5, CA_ERR_IO, CA_ERR_IO), &buf, &len));
    assert_int_equal(len, 5);
    assert_string_equal(buf, "hello");   /* NUL-terminated */
    free(buf);
    assert_int_equal(ca_file_read(p, CA_FILE_KIND("a test file", 4, CA_ERR_IO, CA_ERR_INVALID), &buf, &len),
                     CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "the file is larger than 4 bytes, the limit for a test file (it has 5 bytes)"));
    assert_null(buf);
    assert_int_equal(ca_file_read(g_dir, CA_FILE_CONFIG, &buf, &len), CA_ERR_IO);
    assert_non_null(strstr(ca_last_error(), "not a regular file (a directory); a config file must be one"));
    assert_int_equal(ca_file_read(in_dir("none"), CA_FILE_KIND("a test file", 4, CA_ERR_NOT_FOUND, CA_ERR_IO), &buf,
                                  &len), CA_ERR_NOT_FOUND);
    assert_non_null(strstr(ca_last_error(), "cannot open: No such file"));
}

/* The descriptor handed on blocks again (O_NONBLOCK cleared) and closes on exec. */
static void test_open_flags(void **state) {
    (void)state;
    const char *p = in_dir("g.txt");
    write_file(p, "abc", 3);
    int fd;
    uint64_t size;
    T_OK(ca_file_open(p, CA_FILE_CONFIG, &fd, &size));
    assert_int_equal(size, 3);
    assert_int_equal(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    char b[8];
    assert_int_equal(ca_file_read_fd(fd, b, sizeof b), 3);
    close(fd);
}

/* A kernel file says it is regular, with a size of 0 whatever it holds: /proc/self/mem as a config
 * file was read as an empty file ("a distributed_type must be specified"), /proc/self/status as one
 * with nothing in it. Both are refused, naming the file and why. */
static void test_kernel_files(void **state) {
    (void)state;
    const char *paths[] = {"/proc/self/mem", "/proc/self/status", "/sys/kernel/mm/transparent_hugepage/enabled"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0) continue;   /* a container without /sys */
        char *buf = NULL;
        size_t len = 0;
        assert_int_equal(ca_file_read(paths[i], CA_FILE_CONFIG, &buf, &len), CA_ERR_IO);
        assert_null(buf);
        if (!strstr(ca_last_error(), paths[i]) || !strstr(ca_last_error(), "a file of the kernel's /proc or /sys"))
            fail_msg("%s: %s", paths[i], ca_last_error());
    }
}

/* With an argument, only the tests whose name holds it (one reader at a time, to see each fail). */
int main(int argc, char **argv) {
    ca_log_set_level(CA_LOG_ERROR);
    signal(SIGALRM, SIG_DFL);
    enum { NR = sizeof readers / sizeof *readers };
    struct CMUnitTest tests[NR + 4];
    for (int i = 0; i < NR; i++)
        tests[i] = (struct CMUnitTest){readers[i].label, test_reader, setup, teardown, (void *)&readers[i]};
    tests[NR] = (struct CMUnitTest)cmocka_unit_test_setup_teardown(test_read_whole, setup, teardown);
    tests[NR + 1] = (struct CMUnitTest)cmocka_unit_test_setup_teardown(test_open_flags, setup, teardown);
    tests[NR + 2] = (struct CMUnitTest)cmocka_unit_test_setup_teardown(test_mlflow_meta, setup, teardown);
    tests[NR + 3] = (struct CMUnitTest)cmocka_unit_test_setup_teardown(test_kernel_files, setup, teardown);
    static char filter[128];
    if (argc > 1) {
        snprintf(filter, sizeof filter, "*%s*", argv[1]);
        cmocka_set_test_filter(filter);
    }
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_shutdown();
    return rc;
}
