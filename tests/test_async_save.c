/* Asynchronous save_state (ca_save_state_ex with async, ca_wait_for_save): the checkpoint equals a
 * synchronous one byte for byte; the call returns with the state copied, so that training goes on
 * while the background thread is held (CACCEL_TEST_SAVE_HOLD) and the checkpoint is still the state
 * at the call; a background failure is returned by the next call, naming the directory, once; a
 * second save while one is in flight waits, or is refused with refuse_if_busy; kill -9 while the
 * background thread writes or publishes leaves the previous checkpoint loadable and no partial one.
 * With arguments it is the C side of tests/test_async_save_ranks.sh and of its own kill test:
 *   test_async_save --ranks DIR [--tpu]  (every rank) a synchronous and an asynchronous save of the
 *                                        same state, steps while the second is written (--tpu: on
 *                                        the lazy xla device instead of the CPU)
 *   test_async_save --kill-child DIR     a save, then an asynchronous one the stall hook holds
 *   test_async_save --resume DIR MODE [--tpu]  (every rank) an asynchronous save resumed, or killed
 *                                        while it is written (resume_main) */
#include "test_ckpt_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

extern char **environ;
static const char *g_argv0;
static char *argv_cpu[] = {"test", "--cpu", NULL};
static char **g_run_argv = argv_cpu;   /* --ranks DIR --tpu: {"test", "--tpu"} */
static char g_dir[256];
static const ca_save_state_options k_async = {.async = true};
/* The hold pipes' read ends stay open until the test's end: a writer not yet past the hook reads
 * the byte from it (a closed descriptor's number could be another file's by then). */
static int g_reads[16], g_nreads;

static int setup(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/caccel-async-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ca_scope_release_all();
    t_rm_tree(g_dir);
    while (g_nreads > 0) close(g_reads[--g_nreads]);
    return 0;
}

static const char *in_dir(const char *name) { return t_path_in(g_dir, name); }

static bool exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* ------------------------------------------------------------------ a small run */

static ca_status m_save(void *ctx, void **data, size_t *len) {
    *data = malloc(sizeof(int64_t));
    memcpy(*data, ctx, sizeof(int64_t));
    *len = sizeof(int64_t);
    return CA_OK;
}

static ca_status m_load(void *ctx, const void *data, size_t len, bool apply) {
    if (len != sizeof(int64_t)) return ca_error(CA_ERR_INVALID, "steps: %zu bytes", len);
    if (apply) memcpy(ctx, data, sizeof(int64_t));
    return CA_OK;
}

typedef struct run {
    ca_accelerator *acc;
    ca_dataset *ds;
    ca_dataloader *dl;
    ca_module *m;
    ca_optimizer *opt;
    int64_t steps;
} run;

static void run_open(run *r) {
    memset(r, 0, sizeof *r);
    T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = g_run_argv}, &r->acc));
    T_OK(ca_set_seed(r->acc, 5));
    enum { N = 64, IN = 6 };
    float x[N * IN];
    int64_t y[N];
    uint64_t s = 3;
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < IN; j++) x[i * IN + j] = t_randf(&s, -1, 1);
        y[i] = (int64_t)(t_rand_u64(&s) % 3);
    }
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {IN}}, ys = {.dtype = CA_I64, .ndim = 0};
    T_OK(ca_dataset_from_memory(&xs, x, &ys, y, N, &r->ds));
    T_OK(ca_dataloader_create(r->ds, &(ca_loader_opts){.batch_size = 4, .shuffle = true}, &r->dl));
    ca_module *l;
    T_OK(ca_sequential_create(&r->m));
    T_OK(ca_linear_create(IN, 32, true, &l));  T_OK(ca_module_add(r->m, "fc1", l));
    T_OK(ca_relu_create(&l));                  T_OK(ca_module_add(r->m, "act", l));
    T_OK(ca_linear_create(32, 3, true, &l));   T_OK(ca_module_add(r->m, "fc2", l));
    T_OK(ca_adamw_create(r->m, &(ca_adamw_opts){.lr = 0.01}, &r->opt));
    T_OK(ca_prepare(r->acc, r->m, r->opt, r->dl));
    T_OK(ca_register_for_checkpointing(r->acc, &(ca_checkpointable){.name = "steps", .save = m_save,
                                                                    .load = m_load, .ctx = &r->steps}));
}

static void run_close(run *r) {
    ca_dataloader_destroy(r->dl);
    ca_optimizer_destroy(r->opt);
    ca_module_destroy(r->m);
    ca_dataset_destroy(r->ds);
    ca_accelerator_destroy(r->acc);
}

/* n optimizer steps (across epochs). */
static void train(run *r, int n) {
    ca_batch b;
    for (int i = 0; i < n; i++) {
        if (!ca_dataloader_next(r->dl, &b)) {
            T_OK(ca_dataloader_status(r->dl));
            assert_true(ca_dataloader_next(r->dl, &b));
        }
        CA_SCOPE {
            ca_tensor *loss = ca_cross_entropy(ca_module_forward(r->m, b.x), b.y);
            T_OK(ca_backward(r->acc, loss));
            T_OK(ca_optimizer_step(r->opt));
            ca_optimizer_zero_grad(r->opt);
        }
        r->steps++;
    }
}

/* ------------------------------------------------------------------ one process */

static void test_equals_sync(void **state) {
    (void)state;
    run r;
    run_open(&r);
    train(&r, 5);
    T_OK(ca_save_state(r.acc, in_dir("sync")));
    T_OK(ca_save_state_ex(r.acc, in_dir("async"), &k_async));
    T_OK(ca_wait_for_save(r.acc));
    t_assert_same_checkpoint(in_dir("sync"), in_dir("async"));
    assert_false(exists(in_dir("async.tmp")));
    T_OK(ca_wait_for_save(r.acc));   /* nothing in flight: CA_OK */
    train(&r, 2);                    /* again, into the host buffers the first save left */
    T_OK(ca_save_state(r.acc, in_dir("sync")));
    T_OK(ca_save_state_ex(r.acc, in_dir("async"), &k_async));
    T_OK(ca_wait_for_save(r.acc));
    t_assert_same_checkpoint(in_dir("sync"), in_dir("async"));
    run_close(&r);
}

/* A background writer held on a pipe: the call has returned, the run steps on, and the checkpoint
 * written afterwards is the state at the call (the host copy is a snapshot), byte for byte. */
static int hold_begin(void) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    char v[16];
    snprintf(v, sizeof v, "%d", p[0]);
    setenv("CACCEL_TEST_SAVE_HOLD", v, 1);
    return p[0] * 1000 + p[1];
}

static void hold_release(int h) {
    assert_int_equal(write(h % 1000, "x", 1), 1);
}

static void hold_end(int h) {
    unsetenv("CACCEL_TEST_SAVE_HOLD");
    close(h % 1000);
    g_reads[g_nreads++] = h / 1000;
}

/* Chunks of 100 bytes: the background writer's CRC-32s, combined from the chunk sums it records,
 * equal the synchronous save's read back from the files (complete.json byte for byte). */
static void test_equals_sync_small_chunks(void **state) {
    setenv("CACCEL_TEST_ST_CHUNK", "100", 1);
    test_equals_sync(state);
    unsetenv("CACCEL_TEST_ST_CHUNK");
}

static void test_steps_while_held(void **state) {
    (void)state;
    run r;
    run_open(&r);
    train(&r, 3);
    T_OK(ca_save_state(r.acc, in_dir("ref")));
    int h = hold_begin();
    T_OK(ca_save_state_ex(r.acc, in_dir("ck"), &k_async));
    train(&r, 4);                                    /* the writer is still held: nothing published */
    assert_false(exists(in_dir("ck")));
    assert_true(exists(in_dir("ck.tmp")));
    hold_release(h);
    T_OK(ca_wait_for_save(r.acc));
    hold_end(h);
    t_assert_same_checkpoint(in_dir("ref"), in_dir("ck"));
    run_close(&r);

    run_open(&r);                                    /* and it loads: the state at the call */
    T_OK(ca_load_state(r.acc, in_dir("ck")));
    assert_int_equal(r.steps, 3);
    run_close(&r);
}

/* The background write fails (its directory replaced by a file while it is held): the next save
 * returns the failure, naming the directory, once; the one after it works. The same failure is
 * returned by ca_load_state and by ca_wait_for_save. */
static void fail_in_background(run *r, const char *name) {
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", name);
    int h = hold_begin();
    T_OK(ca_save_state_ex(r->acc, name, &k_async));
    t_rm_tree(tmp);
    FILE *f = fopen(tmp, "w");
    fclose(f);
    hold_release(h);
    hold_end(h);
}

static void assert_reported(ca_status got, const char *name) {
    if (got != CA_ERR_IO) fail_msg("status %s, expected CA_ERR_IO: %s", ca_status_name(got), ca_last_error());
    char want[700];
    snprintf(want, sizeof want, "the asynchronous save into %s failed", name);
    if (!strstr(ca_last_error(), want)) fail_msg("'%s' not in: %s", want, ca_last_error());
}

static void test_failure_reported(void **state) {
    (void)state;
    run r;
    run_open(&r);
    train(&r, 2);
    fail_in_background(&r, in_dir("bad1"));
    assert_reported(ca_save_state_ex(r.acc, in_dir("next"), &k_async), in_dir("bad1"));
    assert_false(exists(in_dir("next.tmp")));        /* the failure was returned instead of saving */
    T_OK(ca_save_state_ex(r.acc, in_dir("next"), &k_async));   /* returned once */
    T_OK(ca_wait_for_save(r.acc));
    assert_false(exists(in_dir("bad1/complete.json")));

    fail_in_background(&r, in_dir("bad2"));
    assert_reported(ca_load_state(r.acc, in_dir("next")), in_dir("bad2"));
    T_OK(ca_load_state(r.acc, in_dir("next")));

    fail_in_background(&r, in_dir("bad3"));
    assert_reported(ca_wait_for_save(r.acc), in_dir("bad3"));
    T_OK(ca_wait_for_save(r.acc));
    run_close(&r);
}

/* One save in flight: refuse_if_busy refuses a second one at once (nothing made for it); without
 * it the second waits for the first; both end complete. */
static void test_second_save(void **state) {
    (void)state;
    run r;
    run_open(&r);
    train(&r, 2);
    int h = hold_begin();
    T_OK(ca_save_state_ex(r.acc, in_dir("a"), &k_async));
    ca_status s = ca_save_state_ex(r.acc, in_dir("b"), &(ca_save_state_options){.async = true, .refuse_if_busy = true});
    if (s != CA_ERR_STATE || !strstr(ca_last_error(), "is still being written (refuse_if_busy)"))
        fail_msg("status %s: %s", ca_status_name(s), ca_last_error());
    assert_false(exists(in_dir("b.tmp")));
    hold_release(h);   /* one byte: the first save's writer; the second's finds the pipe closed */
    hold_end(h);
    T_OK(ca_save_state_ex(r.acc, in_dir("b"), &k_async));   /* waits for "a" first */
    assert_true(exists(in_dir("a/complete.json")));
    T_OK(ca_wait_for_save(r.acc));
    assert_true(exists(in_dir("b/complete.json")));
    run_close(&r);
}

/* ------------------------------------------------------------------ kill -9 */

/* The child: a synchronous save after 3 steps, an asynchronous one after 6, held by the stall hook
 * (CACCEL_TEST_SAVE_STALL, on the background thread); it steps on and says so, then waits. */
static int kill_child_main(const char *dir) {
    run r;
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    run_open(&r);
    train(&r, 3);
    T_OK(ca_save_state(r.acc, ck));
    train(&r, 3);
    T_OK(ca_save_state_ex(r.acc, ck, &k_async));
    train(&r, 2);
    fprintf(stderr, "stepped to %lld while the save is in flight\n", (long long)r.steps);
    fflush(stderr);
    T_OK(ca_wait_for_save(r.acc));
    run_close(&r);
    return 0;
}

static bool kill_child_at(const char *dir, const char *stage) {
    int n = 0, p[2];
    char env[64];
    snprintf(env, sizeof env, "CACCEL_TEST_SAVE_STALL=%s:2", stage);
    while (environ[n]) n++;
    char **envp = calloc((size_t)n + 2, sizeof *envp);
    memcpy(envp, environ, (size_t)n * sizeof *envp);
    envp[n] = env;
    char *argv[] = {(char *)g_argv0, "--kill-child", (char *)dir, NULL};
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        execve(g_argv0, argv, envp);
        _exit(127);
    }
    free(envp);
    close(p[1]);
    static char out[1 << 16];
    size_t len = 0;
    ssize_t k;
    bool both = false;
    out[0] = '\0';
    while (!both && len < sizeof out - 1 && (k = read(p[0], out + len, sizeof out - 1 - len)) > 0) {
        out[len += (size_t)k] = '\0';
        both = strstr(out, "stalled at") && strstr(out, "stepped to 8 while the save is in flight");
    }
    if (both) kill(pid, SIGKILL);
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!both) fprintf(stderr, "the child ended (status %d) without stalling and stepping:\n%s\n", st, out);
    return both;
}

static void test_kill_in_background(void **state) {
    (void)state;
    static const struct { const char *stage; int64_t steps; } cases[] = {
        {"files", 3}, {"manifest", 3}, {"renamed", 6}, {"removing", 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[600], ck[700];
        snprintf(dir, sizeof dir, "%s/k%zu", g_dir, i);
        snprintf(ck, sizeof ck, "%s/ck", dir);
        assert_int_equal(mkdir(dir, 0755), 0);
        if (!kill_child_at(dir, cases[i].stage)) fail_msg("%s: no stall", cases[i].stage);
        run r;
        run_open(&r);
        T_OK(ca_load_state(r.acc, ck));
        if (r.steps != cases[i].steps)
            fail_msg("killed at %s: loaded the checkpoint of step %lld, expected %lld", cases[i].stage,
                     (long long)r.steps, (long long)cases[i].steps);
        T_OK(ca_save_state_ex(r.acc, ck, &k_async));   /* the next save cleans up after the killed one */
        T_OK(ca_wait_for_save(r.acc));
        char p[800];
        snprintf(p, sizeof p, "%s.tmp", ck);
        if (exists(p)) fail_msg("%s: %s left after the next save", cases[i].stage, p);
        run_close(&r);
    }
}

/* ------------------------------------------------------------------ several ranks */

static int ranks_main(const char *dir) {
    run r;
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/sync", dir);
    snprintf(b, sizeof b, "%s/async", dir);
    run_open(&r);
    int rank = ca_process_index(r.acc);
    train(&r, 4);
    T_OK(ca_save_state(r.acc, a));
    int h = hold_begin();   /* the writer, if there is one, waits for a byte until the steps are done */
    T_OK(ca_save_state_ex(r.acc, b, &k_async));
    train(&r, 3);
    printf("rank %d: stepped to %lld after the asynchronous save returned\n", rank, (long long)r.steps);
    hold_release(h);
    T_OK(ca_wait_for_save(r.acc));
    /* the byte is gone when a background writer read it; a synchronous save never reads it */
    char c;
    int fd = h / 1000;
    fcntl(fd, F_SETFL, O_NONBLOCK);
    bool background = read(fd, &c, 1) < 0;
    hold_end(h);
    printf("rank %d: the save was written %s\n", rank, background ? "in the background" : "on the calling thread");
    if (rank == 0) {
        /* every rank's files, compared on rank 0 (the directory is shared) */
        ca_status s = CA_OK;
        DIR *d = opendir(a);
        struct dirent *e;
        while (d && (e = readdir(d)))
            if (e->d_name[0] != '.') {
                char pa[1300], pb[1300];
                snprintf(pa, sizeof pa, "%s/%s", a, e->d_name);
                snprintf(pb, sizeof pb, "%s/%s", b, e->d_name);
                size_t la, lb;
                unsigned char *x = t_slurp(pa, &la), *y = t_slurp(pb, &lb);
                if (la != lb || memcmp(x, y, la) != 0) s = CA_ERR_IO, printf("rank 0: %s differs\n", pb);
                free(x);
                free(y);
            }
        if (d) closedir(d);
        printf("rank 0: %s\n", s == CA_OK ? "the asynchronous checkpoint equals the synchronous one" : "DIFFER");
    }
    run_close(&r);
    ca_shutdown();
    return 0;
}

/* ------------------------------------------------------------------ several ranks: resume and kill */

/* A digest of every parameter's bytes (FNV-1a), read to the host (on the lazy device: the graph runs). */
static uint64_t params_digest(run *r) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < ca_module_num_params(r->m); i++) {
        ca_tensor *p = ca_module_param_at(r->m, i);
        size_t n = ca_tensor_nbytes(p);
        unsigned char *b = malloc(n);
        T_OK(ca_tensor_to_host(p, b, n));
        for (size_t k = 0; k < n; k++) h = (h ^ b[k]) * 1099511628211ull;
        free(b);
    }
    return h;
}

/* --resume DIR MODE (every rank):
 *   run     3 steps, a synchronous save into DIR/ck, 3 more, an asynchronous one into DIR/ck, 4 more
 *           while it is written (the writer held until then, CACCEL_TEST_SAVE_HOLD on a pipe of its
 *           own), the parameters' digest at step 10;
 *   resume  DIR/ck loaded, 4 steps, the digest at step 10 (equal: the checkpoint is the state at the
 *           asynchronous call);
 *   kill    as run, the background writer held by CACCEL_TEST_SAVE_STALL (the test kills the job
 *           once every rank has said that it stepped on);
 *   load    DIR/ck loaded: which step it holds;
 *   fail    as run, a background write failing on the rank CACCEL_TEST_SAVE_ENOSPC names: each rank
 *           says what ca_wait_for_save returned, twice (the failure once, then CA_OK). */
static int resume_main(const char *dir, const char *mode) {
    run r;
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    run_open(&r);
    int rank = ca_process_index(r.acc);
    if (!strcmp(mode, "load") || !strcmp(mode, "resume")) {
        T_OK(ca_load_state(r.acc, ck));
        printf("rank %d: loaded the checkpoint of step %lld\n", rank, (long long)r.steps);
        if (!strcmp(mode, "resume")) {
            train(&r, 4);
            printf("rank %d: digest %016llx at step %lld\n", rank, (unsigned long long)params_digest(&r),
                   (long long)r.steps);
        }
    } else {
        bool kill = !strcmp(mode, "kill");
        train(&r, 3);
        T_OK(ca_save_state(r.acc, ck));
        train(&r, 3);
        int h = kill ? 0 : hold_begin();
        T_OK(ca_save_state_ex(r.acc, ck, &k_async));
        train(&r, kill ? 2 : 4);
        printf("rank %d: stepped to %lld while the save is in flight\n", rank, (long long)r.steps);
        fflush(stdout);
        if (!kill) {
            hold_release(h);
            hold_end(h);
        }
        if (!strcmp(mode, "fail")) {
            for (int k = 0; k < 2; k++) {
                ca_status s = ca_wait_for_save(r.acc);
                printf("rank %d: wait_for_save %d: %s: %s\n", rank, k + 1, ca_status_name(s), s == CA_OK ? "" : ca_last_error());
            }
        }
        T_OK(ca_wait_for_save(r.acc));   /* kill: held here until the test kills the job */
        printf("rank %d: digest %016llx at step %lld\n", rank, (unsigned long long)params_digest(&r),
               (long long)r.steps);
    }
    fflush(stdout);
    run_close(&r);
    ca_shutdown();
    return 0;
}

/* The device flag after the arguments (--tpu: the lazy xla device), else the CPU. */
static void device_arg(int argc, char **argv, int at) {
    static char *dev[] = {"test", NULL, NULL};
    if (argc <= at) return;
    dev[1] = argv[at];
    g_run_argv = dev;
}

int main(int argc, char **argv) {
    ca_log_set_level(CA_LOG_ERROR);
    if (argc == 3 && !strcmp(argv[1], "--ranks")) return ranks_main(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "--ranks")) {   /* e.g. --tpu: the lazy xla device */
        device_arg(argc, argv, 3);
        return ranks_main(argv[2]);
    }
    if ((argc == 4 || argc == 5) && !strcmp(argv[1], "--resume")) {
        device_arg(argc, argv, 4);
        return resume_main(argv[2], argv[3]);
    }
    if (argc == 3 && !strcmp(argv[1], "--kill-child")) return kill_child_main(argv[2]);
    g_argv0 = argv[0];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_equals_sync, setup, teardown),
        cmocka_unit_test_setup_teardown(test_equals_sync_small_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_steps_while_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_second_save, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_in_background, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_shutdown();
    return rc;
}
