/* save_state / load_state (one process): exact resume, automatic naming with total_limit and the
 * fall-back past incomplete checkpoints, and named errors for incomplete, truncated, corrupt and
 * mismatched checkpoints that leave the run unchanged.
 * With arguments it is the C side of tests/test_state_ranks.sh (under caccel launch, 2 ranks):
 *   test_state --ranks DIR   a save where rank 1 fails, then a load that rank 1 refuses
 * and of tests/test_full_disk.sh:
 *   test_state --full-disk DIR   DIR is on a small file system: a save, the disk filled, a second
 *                                save that must fail, and the first checkpoint loaded again; then
 *                                saves over a checkpoint with a page more free space each time
 * and, run by test_kill_every_stage itself (CACCEL_TEST_SAVE_STALL holds its second save):
 *   test_state --kill-child DIR named|auto */
#include "test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

extern char **environ;
static const char *g_argv0;

static char *argv_cpu[] = {"test", "--cpu", NULL};
static char g_dir[256];

static int setup(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/caccel-state-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ca_scope_release_all();   /* every run is closed by now (another run's loader may hold a scope before) */
    t_rm_tree(g_dir);
    return 0;
}

static const char *in_dir(const char *name) {
    static char p[2][512];
    static int k;
    k ^= 1;
    snprintf(p[k], sizeof p[k], "%s/%s", g_dir, name);
    return p[k];
}

static void assert_error(ca_status got, ca_status want, const char *a, const char *b) {
    if (got != want) fail_msg("status %s, expected %s: %s", ca_status_name(got), ca_status_name(want), ca_last_error());
    if (a && !strstr(ca_last_error(), a)) fail_msg("'%s' not in: %s", a, ca_last_error());
    if (b && !strstr(ca_last_error(), b)) fail_msg("'%s' not in: %s", b, ca_last_error());
}

/* ------------------------------------------------------------------ a small run */

/* User state: steps seen and a loss sum, as a training loop keeps for its metrics. */
typedef struct metrics {
    int64_t steps;
    double loss_sum;
} metrics;

static ca_status m_save(void *ctx, void **data, size_t *len) {
    *data = malloc(sizeof(metrics));
    memcpy(*data, ctx, sizeof(metrics));
    *len = sizeof(metrics);
    return CA_OK;
}

static ca_status m_load(void *ctx, const void *data, size_t len, bool apply) {
    if (len != sizeof(metrics)) return ca_error(CA_ERR_INVALID, "metrics: %zu bytes, expected %zu", len, sizeof(metrics));
    if (apply) memcpy(ctx, data, sizeof(metrics));
    return CA_OK;
}

static int64_t g_batch = 8;

typedef struct run {
    ca_accelerator *acc;
    ca_dataset *ds;
    ca_dataloader *dl;
    ca_module *m;
    ca_optimizer *opt;
    metrics met;
} run;

static void run_open(run *r, int hidden, bool sgd, const char *const *settings) {
    memset(r, 0, sizeof *r);
    T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv_cpu, .settings = settings}, &r->acc));
    T_OK(ca_set_seed(r->acc, 5));
    enum { N = 90, IN = 6 };
    float x[N * IN];
    int64_t y[N];
    uint64_t s = 3;
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < IN; j++) x[i * IN + j] = t_randf(&s, -1, 1);
        y[i] = (int64_t)(t_rand_u64(&s) % 3);
    }
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {IN}}, ys = {.dtype = CA_I64, .ndim = 0};
    T_OK(ca_dataset_from_memory(&xs, x, &ys, y, N, &r->ds));
    T_OK(ca_dataloader_create(r->ds, &(ca_loader_opts){.batch_size = g_batch, .shuffle = true}, &r->dl));
    ca_module *l;
    T_OK(ca_sequential_create(&r->m));
    T_OK(ca_linear_create(IN, hidden, true, &l));  T_OK(ca_module_add(r->m, "fc1", l));
    T_OK(ca_relu_create(&l));                      T_OK(ca_module_add(r->m, "act", l));
    T_OK(ca_dropout_create(0.2, &l));              T_OK(ca_module_add(r->m, "drop", l));
    T_OK(ca_linear_create(hidden, 3, true, &l));   T_OK(ca_module_add(r->m, "fc2", l));
    if (sgd) T_OK(ca_sgd_create(r->m, &(ca_sgd_opts){.lr = 0.1, .momentum = 0.9}, &r->opt));
    else T_OK(ca_adamw_create(r->m, &(ca_adamw_opts){.lr = 0.01}, &r->opt));
    T_OK(ca_optimizer_set_schedule(r->opt, &(ca_lr_schedule){.kind = CA_SCHED_COSINE, .warmup_steps = 3,
                                                             .total_steps = 40}));
    T_OK(ca_prepare(r->acc, r->m, r->opt, r->dl));
    T_OK(ca_register_for_checkpointing(r->acc, &(ca_checkpointable){.name = "metrics", .save = m_save,
                                                                    .load = m_load, .ctx = &r->met}));
}

static void run_close(run *r) {
    ca_dataloader_destroy(r->dl);
    ca_optimizer_destroy(r->opt);
    ca_module_destroy(r->m);
    ca_dataset_destroy(r->ds);
    ca_accelerator_destroy(r->acc);
}

/* Trains until `epochs` are done or, with stop > 0, until micro-step `stop` (then returns false).
 * losses[i] gets micro-step i's loss. */
static bool train(run *r, int epochs, int64_t stop, float *losses) {
    ca_batch b;
    while (ca_dataloader_epoch(r->dl) < epochs) {
        while (ca_dataloader_next(r->dl, &b)) {
            CA_ACCUMULATE(r->acc, r->m) {
                ca_tensor *loss = ca_cross_entropy(ca_module_forward(r->m, b.x), b.y);
                T_OK(ca_backward(r->acc, loss));
                T_OK(ca_optimizer_step(r->opt));
                ca_optimizer_zero_grad(r->opt);
                losses[r->met.steps] = ca_item(loss);
                r->met.loss_sum += losses[r->met.steps];
            }
            r->met.steps++;
            if (stop > 0 && r->met.steps == stop) return false;
        }
        T_OK(ca_dataloader_status(r->dl));
    }
    return true;
}

static uint8_t *params(ca_module *m, size_t *len) {
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

/* Saved after micro-step 16 (epoch 1, 12 batches per epoch, accumulation 2), trained on (lost),
 * rebuilt from scratch and loaded: the loss curve and the parameters of the rest equal the
 * uninterrupted run's, bit for bit (dropout, shuffle, cosine schedule and AdamW included). */
static void test_exact_resume(void **state) {
    (void)state;
    const char *const settings[] = {"gradient_accumulation_steps=2", NULL};
    enum { EPOCHS = 3, STEPS = 36 };   /* 12 batches per epoch */
    float full[STEPS] = {0}, resumed[STEPS] = {0};
    run a, b;
    run_open(&a, 16, false, settings);
    assert_true(train(&a, EPOCHS, 0, full));
    assert_int_equal(a.met.steps, STEPS);
    size_t la, lb;
    uint8_t *pa = params(a.m, &la);

    run_open(&b, 16, false, settings);
    assert_false(train(&b, EPOCHS, 16, resumed));
    T_OK(ca_save_state(b.acc, in_dir("ck")));
    double sum_at_save = b.met.loss_sum;
    assert_false(train(&b, EPOCHS, 21, resumed));   /* work after the save: lost */
    run_close(&b);

    run_open(&b, 16, false, settings);
    T_OK(ca_load_state(b.acc, in_dir("ck")));
    assert_int_equal(b.met.steps, 16);
    assert_true(b.met.loss_sum == sum_at_save);
    assert_int_equal(ca_optimizer_steps(b.opt), 8);
    assert_true(train(&b, EPOCHS, 0, resumed));
    assert_int_equal(b.met.steps, STEPS);
    assert_memory_equal(full, resumed, sizeof full);
    assert_true(a.met.loss_sum == b.met.loss_sum);
    uint8_t *pb = params(b.m, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(pa, pb, la);
    free(pa);
    free(pb);
    run_close(&a);
    run_close(&b);
}

/* The files of a checkpoint, and the configuration with its origins beside them. */
static void test_files(void **state) {
    (void)state;
    run r;
    float l[64];
    run_open(&r, 8, false, NULL);
    assert_false(train(&r, 1, 4, l));
    T_OK(ca_grad_scaler_set(r.acc, &(ca_grad_scaler_state){.scale = 1024.5, .growth_tracker = 7}));
    T_OK(ca_save_state(r.acc, in_dir("ck")));
    T_OK(ca_grad_scaler_set(r.acc, &(ca_grad_scaler_state){.scale = 2, .growth_tracker = 1}));
    T_OK(ca_load_state(r.acc, in_dir("ck")));
    ca_grad_scaler_state gs;
    T_OK(ca_grad_scaler_get(r.acc, &gs));
    assert_true(gs.scale == 1024.5 && gs.growth_tracker == 7);
    const char *files[] = {"model.safetensors", "optimizer.safetensors", "caccel_state.json", "random_states_0.json",
                           "custom_checkpoint_0.bin", "caccel_config.json", "complete.json"};
    char p[600];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", in_dir("ck"), files[i]);
        if (access(p, F_OK) != 0) fail_msg("%s missing", p);
    }
    assert_int_not_equal(access(in_dir("ck.tmp"), F_OK), 0);
    snprintf(p, sizeof p, "%s/caccel_config.json", in_dir("ck"));
    FILE *f = fopen(p, "r");
    char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    assert_non_null(strstr(text, "\"use_cpu\""));
    assert_non_null(strstr(text, "--cpu"));
    /* the optimizer's tensors carry PyTorch's state names (in the header, at the start) */
    snprintf(p, sizeof p, "%s/optimizer.safetensors", in_dir("ck"));
    f = fopen(p, "rb");
    n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    text[n < 4096 ? n : 4095] = '\0';
    assert_non_null(strstr(text + 8, "\"state.0.exp_avg_sq\""));
    /* saving over it replaces it */
    T_OK(ca_save_state(r.acc, in_dir("ck")));
    assert_int_not_equal(access(in_dir("ck.old"), F_OK), 0);
    T_OK(ca_load_state(r.acc, in_dir("ck")));
    run_close(&r);
}

/* Automatic naming, total_limit (complete ones only), the latest complete one, the iteration. */
static void test_project(void **state) {
    (void)state;
    char pd[300];
    snprintf(pd, sizeof pd, "project_dir=%s", g_dir);
    const char *const settings[] = {pd, "automatic_checkpoint_naming=true", "total_limit=2", NULL};
    run r;
    float l[64];
    run_open(&r, 8, false, settings);
    for (int i = 0; i < 3; i++) {
        assert_false(train(&r, 2, 2 * (i + 1), l));
        T_OK(ca_save_state(r.acc, NULL));
    }
    assert_int_not_equal(access(in_dir("checkpoints/checkpoint_0"), F_OK), 0);   /* beyond the limit */
    assert_int_equal(access(in_dir("checkpoints/checkpoint_1/complete.json"), F_OK), 0);
    assert_int_equal(access(in_dir("checkpoints/checkpoint_2/complete.json"), F_OK), 0);
    /* checkpoint_2 loses its marker (as if the save had died before it) */
    T_OK(unlink(in_dir("checkpoints/checkpoint_2/complete.json")) == 0 ? CA_OK : CA_ERR_IO);
    assert_error(ca_load_state(r.acc, in_dir("checkpoints/checkpoint_2")), CA_ERR_NOT_FOUND,
                 "checkpoint_2 is not a complete checkpoint", "complete.json");
    r.met.steps = 99;
    T_OK(ca_load_state(r.acc, NULL));           /* falls back to checkpoint_1 */
    assert_int_equal(r.met.steps, 4);
    /* the next save continues after the one loaded, replacing the incomplete checkpoint_2 */
    T_OK(ca_save_state(r.acc, NULL));
    assert_int_equal(access(in_dir("checkpoints/checkpoint_2/complete.json"), F_OK), 0);
    run_close(&r);

    /* a fresh run told to start at iteration 1 refuses to overwrite the complete checkpoint_1 */
    const char *const again[] = {pd, "automatic_checkpoint_naming=true", "iteration=1", NULL};
    run_open(&r, 8, false, again);
    assert_error(ca_save_state(r.acc, NULL), CA_ERR_STATE, "checkpoint_1 already exists", NULL);
    run_close(&r);
}

/* ------------------------------------------------------------------ errors */

static void flip_byte(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}

static void copy_tree(const char *from, const char *to) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
    assert_int_equal(system(cmd), 0);
}

/* A failed load leaves the run as it was: parameters, optimizer steps, metrics. */
static void assert_unchanged(run *r, const uint8_t *p0, size_t len, int64_t steps) {
    size_t n;
    uint8_t *p = params(r->m, &n);
    assert_int_equal(n, len);
    assert_memory_equal(p, p0, len);
    free(p);
    assert_int_equal(ca_optimizer_steps(r->opt), steps);
    assert_int_equal(r->met.steps, 7);
}

static void test_errors(void **state) {
    (void)state;
    run r, other;
    float l[64];
    run_open(&r, 8, false, NULL);
    assert_false(train(&r, 1, 3, l));
    T_OK(ca_save_state(r.acc, in_dir("good")));
    assert_false(train(&r, 1, 7, l));
    size_t len;
    uint8_t *p0 = params(r.m, &len);
    int64_t steps = ca_optimizer_steps(r.opt);
    char p[700];

    assert_error(ca_load_state(r.acc, in_dir("none")), CA_ERR_NOT_FOUND, "none: no such directory", NULL);
    copy_tree(in_dir("good"), in_dir("bad"));
    snprintf(p, sizeof p, "%s/complete.json", in_dir("bad"));
    unlink(p);
    assert_error(ca_load_state(r.acc, in_dir("bad")), CA_ERR_NOT_FOUND, "bad is not a complete checkpoint",
                 "no complete.json");
    assert_unchanged(&r, p0, len, steps);

    copy_tree(in_dir("good"), in_dir("bad"));
    snprintf(p, sizeof p, "%s/optimizer.safetensors", in_dir("bad"));
    assert_int_equal(truncate(p, 100), 0);
    assert_error(ca_load_state(r.acc, in_dir("bad")), CA_ERR_IO, "optimizer.safetensors: truncated: 100 bytes", NULL);
    assert_unchanged(&r, p0, len, steps);

    copy_tree(in_dir("good"), in_dir("bad"));
    snprintf(p, sizeof p, "%s/model.safetensors", in_dir("bad"));
    flip_byte(p, 200);
    assert_error(ca_load_state(r.acc, in_dir("bad")), CA_ERR_IO, "model.safetensors: corrupt: CRC-32", NULL);
    assert_unchanged(&r, p0, len, steps);

    /* another model: the tensor and the shapes are named */
    run_open(&other, 5, false, NULL);
    assert_error(ca_load_state(other.acc, in_dir("good")), CA_ERR_INVALID, "tensor 'fc1.bias'", "shape [8] in the file, [5]");
    run_close(&other);
    /* another optimizer */
    run_open(&other, 8, true, NULL);
    assert_error(ca_load_state(other.acc, in_dir("good")), CA_ERR_INVALID, "optimizers[0]: kind adamw in the file, sgd",
                 "caccel_state.json");
    run_close(&other);

    /* a truncated custom object: nothing is applied */
    copy_tree(in_dir("good"), in_dir("bad"));
    snprintf(p, sizeof p, "%s/custom_checkpoint_0.bin", in_dir("bad"));
    assert_int_equal(truncate(p, 3), 0);
    assert_error(ca_load_state(r.acc, in_dir("bad")), CA_ERR_IO, "custom_checkpoint_0.bin: truncated", NULL);
    assert_unchanged(&r, p0, len, steps);

    /* registration errors */
    assert_error(ca_register_for_checkpointing(r.acc, &(ca_checkpointable){.name = "metrics", .save = m_save,
                                                                           .load = m_load}),
                 CA_ERR_INVALID, "'metrics' is registered already", NULL);
    assert_error(ca_save_state(r.acc, NULL), CA_ERR_INVALID, "automatic_checkpoint_naming is off", NULL);
    /* a directory of the user's is not replaced */
    assert_int_equal(mkdir(in_dir("mine"), 0755), 0);
    FILE *f = fopen(in_dir("mine/notes.txt"), "w");
    fclose(f);
    assert_error(ca_save_state(r.acc, in_dir("mine")), CA_ERR_STATE, "mine exists and is not a checkpoint", NULL);
    assert_int_equal(access(in_dir("mine/notes.txt"), F_OK), 0);
    T_OK(ca_load_state(r.acc, in_dir("good")));
    assert_int_equal(r.met.steps, 3);
    free(p0);
    run_close(&r);
}

/* ------------------------------------------------------------------ no re-reading */

typedef struct counting {
    int64_t n, reads;
} counting;

static int64_t c_len(void *ctx) { return ((counting *)ctx)->n; }

static ca_status c_get(void *ctx, int64_t i, void *x, void *y) {
    counting *c = ctx;
    c->reads++;
    *(float *)x = (float)i;
    *(int64_t *)y = i;
    return CA_OK;
}

/* A resumed loader reads only the samples it delivers: skipping 7 of 10 batches of 4 reads 12
 * samples (the last 3 batches), not 40. */
static void test_skip_reads_nothing(void **state) {
    (void)state;
    counting c = {.n = 40};
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 0}, ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds;
    T_OK(ca_dataset_create(&(ca_dataset_ops){.struct_size = sizeof(ca_dataset_ops), .length = c_len,
                                             .get = c_get}, &c, &xs, &ys, &ds));
    ca_dataloader *dl;
    T_OK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = 4, .shuffle = true, .seed = 3}, &dl));
    T_OK(ca_dataloader_skip_batches(dl, 7));
    ca_batch b;
    int batches = 0;
    while (ca_dataloader_next(dl, &b)) assert_int_equal(b.index, 7 + batches++);
    T_OK(ca_dataloader_status(dl));
    assert_int_equal(batches, 3);
    assert_int_equal(c.reads, 12);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_scope_release_all();
}

/* ------------------------------------------------------------------ 2 ranks */

static int g_rank;

/* Fails on rank 1 only: its save cannot write, its load refuses the bytes. */
static ca_status flaky_save(void *ctx, void **data, size_t *len) {
    (void)ctx;
    if (g_rank == 1) return ca_error(CA_ERR_IO, "flaky: rank 1 cannot serialise");
    *data = strdup("ok");
    *len = 2;
    return CA_OK;
}

static ca_status flaky_load(void *ctx, const void *data, size_t len, bool apply) {
    (void)data, (void)len, (void)apply;
    if (g_rank == 1 && *(bool *)ctx) return ca_error(CA_ERR_INVALID, "flaky: rank 1 refuses its bytes");
    return CA_OK;
}

static int ranks_main(const char *dir) {
    run r;
    float l[64];
    bool refuse = false;
    run_open(&r, 8, false, NULL);
    g_rank = ca_process_index(r.acc);
    T_OK(ca_register_for_checkpointing(r.acc, &(ca_checkpointable){.name = "flaky", .save = flaky_save,
                                                                    .load = flaky_load, .ctx = &refuse,
                                                                    .per_rank = true}));
    assert_false(train(&r, 1, 2, l));
    char good[600], bad[600];
    snprintf(good, sizeof good, "%s/good", dir);
    snprintf(bad, sizeof bad, "%s/bad", dir);
    ca_status s = ca_save_state(r.acc, bad);
    printf("rank %d: save %s %s\n", g_rank, ca_status_name(s), ca_last_error());
    g_rank = -1;                                  /* now every rank can save */
    T_OK(ca_save_state(r.acc, good));
    T_OK(ca_save_state(r.acc, good));             /* over a complete checkpoint: swapped in place */
    g_rank = ca_process_index(r.acc);
    refuse = true;
    size_t len;
    uint8_t *p0 = params(r.m, &len);
    int64_t steps_before = r.met.steps;
    assert_false(train(&r, 1, 4, l));
    uint8_t *p1 = params(r.m, &len);
    s = ca_load_state(r.acc, good);
    uint8_t *p2 = params(r.m, &len);
    printf("rank %d: load %s %s\n", g_rank, ca_status_name(s), ca_last_error());
    printf("rank %d: %s\n", g_rank, memcmp(p1, p2, len) == 0 && r.met.steps == 4 ? "unchanged" : "CHANGED");
    refuse = false;
    s = ca_load_state(r.acc, good);
    uint8_t *p3 = params(r.m, &len);
    printf("rank %d: reload %s %s\n", g_rank, ca_status_name(s),
           memcmp(p0, p3, len) == 0 && r.met.steps == steps_before ? "restored" : "NOT RESTORED");
    fflush(stdout);
    free(p0), free(p1), free(p2), free(p3);
    run_close(&r);
    ca_scope_release_all();
    ca_shutdown();
    return 0;
}

/* ------------------------------------------------------------------ consistent but wrong files */

static uint32_t crc32_of(const uint8_t *p, size_t n) {   /* zlib's CRC-32 (reflected 0xEDB88320) */
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

/* One entry of complete.json for dir/name, with its true size and CRC-32. */
static void seal_entry(FILE *out, const char *dir, const char *name, int *n) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    static uint8_t buf[1 << 22];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    fprintf(out, "%s\"%s\": {\"size\": %zu, \"crc32\": %u}", (*n)++ ? ", " : "", name, len, crc32_of(buf, len));
}

/* Rewrites dir/complete.json for the files as they are now (a checkpoint edited after the save),
 * leaving out `skip` and adding `extra` (a name relative to dir) when they are not NULL. */
static void reseal_list(const char *dir, const char *skip, const char *extra) {
    char p[700];
    snprintf(p, sizeof p, "%s/complete.json", dir);
    FILE *out = fopen(p, "w");
    assert_non_null(out);
    fputs("{\"files\": {", out);
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "complete.json") || (skip && !strcmp(e->d_name, skip)))
            continue;
        seal_entry(out, dir, e->d_name, &n);
    }
    closedir(d);
    if (extra) seal_entry(out, dir, extra, &n);
    fputs("}}\n", out);
    fclose(out);
}

static void reseal(const char *dir) { reseal_list(dir, NULL, NULL); }

/* Replaces the first `from` in dir/name by `to` (binary files too: then of the same length), then
 * reseals. */
static void edit(const char *dir, const char *name, const char *from, const char *to) {
    char p[700];
    static uint8_t buf[1 << 22];
    size_t m = strlen(from), at = 0;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    while (at + m <= n && memcmp(buf + at, from, m) != 0) at++;
    if (at + m > n) fail_msg("'%s' not in %s", from, p);
    f = fopen(p, "wb");
    fwrite(buf, 1, at, f);
    fputs(to, f);
    fwrite(buf + at + m, 1, n - at - m, f);
    fclose(f);
    reseal(dir);
}

/* Replaces dir/name by `text`, then reseals. */
static void rewrite(const char *dir, const char *name, const char *text) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    reseal(dir);
}

/* ca_load_state(acc, dir) with warnings on and stderr (the log) captured into *log (malloc'd). */
static ca_status load_logged(ca_accelerator *acc, const char *dir, char **log) {
    char p[700];
    snprintf(p, sizeof p, "%s/stderr.txt", in_dir(""));
    fflush(stderr);
    int saved = dup(2), fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    ca_log_set_level(CA_LOG_WARNING);
    ca_status s = ca_load_state(acc, dir);
    ca_log_set_level(CA_LOG_ERROR);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(p, "r");
    *log = calloc(1, 65536);
    assert_true(f && *log);
    size_t n = fread(*log, 1, 65535, f);
    (void)n;
    fclose(f);
    return s;
}

/* Files that pass the size and CRC check but say the wrong thing: the key, the file and what differs
 * are named, and the run is unchanged. */
static void test_wrong_contents(void **state) {
    (void)state;
    run r, other;
    float l[64];
    run_open(&r, 8, false, NULL);
    assert_false(train(&r, 1, 3, l));
    T_OK(ca_save_state(r.acc, in_dir("good")));
    assert_false(train(&r, 1, 7, l));
    size_t len;
    uint8_t *p0 = params(r.m, &len);
    int64_t steps = ca_optimizer_steps(r.opt);
    char bad[600];
    snprintf(bad, sizeof bad, "%s", in_dir("bad"));

    copy_tree(in_dir("good"), bad);
    reseal(bad);                                       /* the test's manifest is a valid one */
    T_OK(ca_load_state(r.acc, bad));
    assert_int_equal(r.met.steps, 3);
    run_close(&r);
    run_open(&r, 8, false, NULL);
    assert_false(train(&r, 1, 7, l));
    free(p0);
    p0 = params(r.m, &len);

    copy_tree(in_dir("good"), bad);
    edit(bad, "caccel_state.json", "\"steps\"", "\"stepz\"");
    assert_error(ca_load_state(r.acc, bad), CA_ERR_IO, "caccel_state.json: key \"steps\" is missing or not an int", NULL);
    assert_unchanged(&r, p0, len, steps);

    copy_tree(in_dir("good"), bad);
    edit(bad, "random_states_0.json", "\"offset\":", "\"offsex\":");
    assert_error(ca_load_state(r.acc, bad), CA_ERR_IO, "random_states_0.json: key \"offset\"", NULL);
    assert_unchanged(&r, p0, len, steps);

    /* rank 0's own random states missing (and not in the manifest): the load says the manifest does not
     * list it, and no warning claims to use the very file it found missing */
    copy_tree(in_dir("good"), bad);
    char rs[700];
    snprintf(rs, sizeof rs, "%s/random_states_0.json", bad);
    assert_int_equal(unlink(rs), 0);
    reseal(bad);
    char *log;
    assert_error(load_logged(r.acc, bad, &log), CA_ERR_IO,
                 "complete.json does not list random_states_0.json", NULL);
    if (strstr(log, "using random_states_0.json")) fail_msg("a warning uses the missing file: %s", log);
    free(log);
    assert_unchanged(&r, p0, len, steps);

    /* JSON that stops early, or is not an object: said in words (json-c's were "continue" and NULL) */
    copy_tree(in_dir("good"), bad);
    rewrite(bad, "random_states_0.json", "{\"seed\": 1, ");
    assert_error(ca_load_state(r.acc, bad), CA_ERR_IO,
                 "random_states_0.json: cannot read the JSON: unexpected end of input at byte 12", NULL);
    assert_unchanged(&r, p0, len, steps);
    copy_tree(in_dir("good"), bad);
    rewrite(bad, "random_states_0.json", "[1, 2]");
    assert_error(ca_load_state(r.acc, bad), CA_ERR_IO, "random_states_0.json: cannot read the JSON: a JSON array, "
                 "not an object", NULL);
    assert_unchanged(&r, p0, len, steps);

    copy_tree(in_dir("good"), bad);
    edit(bad, "model.safetensors", "fc2.bias", "fc2.bian");
    assert_error(ca_load_state(r.acc, bad), CA_ERR_INVALID, "model.safetensors: tensor 'fc2.bian' has no parameter", NULL);
    assert_unchanged(&r, p0, len, steps);

    copy_tree(in_dir("good"), bad);
    edit(bad, "optimizer.safetensors", "state.1.exp_avg_sq", "state.1.exp_avg_sk");
    assert_error(ca_load_state(r.acc, bad), CA_ERR_INVALID, "optimizer.safetensors: no tensor 'state.1.exp_avg_sq'", NULL);
    assert_unchanged(&r, p0, len, steps);

    /* a loader of another batch size */
    g_batch = 4;
    run_open(&other, 8, false, NULL);
    g_batch = 8;
    assert_error(ca_load_state(other.acc, in_dir("good")), CA_ERR_INVALID,
                 "dataloaders[0]: batch size 8, 90 samples, shuffled in the file; batch size 4", NULL);
    run_close(&other);
    free(p0);
    run_close(&r);
}

/* A load reads only the files complete.json lists (and so has checked): a file it leaves out is
 * not read even where the directory holds it, and a listed name outside the directory is refused
 * although its size and CRC-32 are right. The run is unchanged. */
static void test_manifest_only(void **state) {
    (void)state;
    run r;
    float l[64];
    run_open(&r, 8, false, NULL);
    assert_false(train(&r, 1, 3, l));
    T_OK(ca_save_state(r.acc, in_dir("good")));
    assert_false(train(&r, 1, 7, l));
    size_t len;
    uint8_t *p0 = params(r.m, &len);
    int64_t steps = ca_optimizer_steps(r.opt);
    char bad[600];
    snprintf(bad, sizeof bad, "%s", in_dir("bad"));
    const char *unlisted[] = {"random_states_0.json", "caccel_state.json", "optimizer.safetensors",
                              "model.safetensors", "custom_checkpoint_0.bin"};
    for (size_t i = 0; i < sizeof unlisted / sizeof *unlisted; i++) {
        copy_tree(in_dir("good"), bad);
        reseal_list(bad, unlisted[i], NULL);
        assert_error(ca_load_state(r.acc, bad), CA_ERR_IO, "complete.json does not list", unlisted[i]);
        assert_unchanged(&r, p0, len, steps);
    }
    copy_tree(in_dir("good"), bad);
    FILE *f = fopen(in_dir("outside.bin"), "w");
    fputs("not the checkpoint's", f);
    fclose(f);
    reseal_list(bad, NULL, "../outside.bin");
    assert_error(ca_load_state(r.acc, bad), CA_ERR_IO, "\"../outside.bin\" (20 bytes) is not a file of the "
                 "checkpoint's directory", "complete.json");
    assert_unchanged(&r, p0, len, steps);
    copy_tree(in_dir("good"), bad);
    reseal(bad);
    T_OK(ca_load_state(r.acc, bad));
    assert_int_equal(r.met.steps, 3);
    free(p0);
    run_close(&r);
}

/* ------------------------------------------------------------------ caccel merge-weights */

/* `caccel merge-weights ck out` of a damaged copy of a sharded checkpoint: exit status 1, the
 * message on stderr has `a` and `b`, and out is not there afterwards. */
static void merge_refused(const char *ck, const char *a, const char *b) {
    const char *build = getenv("CACCEL_TEST_BUILDDIR");
    char cmd[2400], out[600], err[600], text[4096] = "";
    snprintf(out, sizeof out, "%s", in_dir("merged"));
    snprintf(err, sizeof err, "%s", in_dir("merge.err"));
    snprintf(cmd, sizeof cmd, "'%s/tools/caccel' merge-weights '%s' '%s' >/dev/null 2>'%s'", build ? build : ".", ck,
             out, err);
    int rc = system(cmd);
    FILE *f = fopen(err, "r");
    assert_non_null(f);
    text[fread(text, 1, sizeof text - 1, f)] = '\0';
    fclose(f);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 1) fail_msg("merge-weights %s: status %d, not 1: %s", ck, rc, text);
    if (!strstr(text, "caccel merge-weights: error: ") || !strstr(text, a) || (b && !strstr(text, b)))
        fail_msg("merge-weights %s: '%s'%s%s not in: %s", ck, a, b ? " and " : "", b ? b : "", text);
    if (access(out, F_OK) == 0) fail_msg("merge-weights %s left %s behind", ck, out);
    printf("refused: %s", text);
}

/* A sharded checkpoint (fsdp_state_dict_type SHARDED_STATE_DICT) of one process merges; each
 * defect of its index, a flipped byte in a shard and a missing complete.json are refused. The
 * index's fields are edited with the manifest resealed, so the check of the index itself is
 * what refuses them. */
static void test_merge_weights(void **state) {
    (void)state;
    const char *const settings[] = {"distributed_type=FSDP", "fsdp_config.fsdp_sharding_strategy=SHARD_GRAD_OP",
                                    "fsdp_config.fsdp_state_dict_type=SHARDED_STATE_DICT", NULL};
    run r;
    float l[64];
    run_open(&r, 8, false, settings);
    assert_false(train(&r, 1, 3, l));
    T_OK(ca_save_state(r.acc, in_dir("good")));
    run_close(&r);
    char good[600], bad[600], p[700];
    snprintf(good, sizeof good, "%s", in_dir("good"));
    snprintf(bad, sizeof bad, "%s", in_dir("bad"));

    T_OK(ca_merge_weights(good, in_dir("merged")));
    assert_int_equal(access(in_dir("merged/model.safetensors"), F_OK), 0);
    t_rm_tree(in_dir("merged"));

    /* the index's first entry is fc1.weight [8, 6] */
    copy_tree(good, bad);
    edit(bad, "zero_index.json", "\"shape\":", "\"shape\":7,\"was\":");
    merge_refused(bad, "zero_index.json: params[0] ('fc1.weight'): key \"shape\" is missing or not an array", NULL);
    copy_tree(good, bad);
    edit(bad, "zero_index.json", "\"shape\":[", "\"shape\":[-4,");
    merge_refused(bad, "zero_index.json: params[0] ('fc1.weight'): key \"shape\": dimension 0 is -4, not a size",
                  NULL);
    copy_tree(good, bad);
    edit(bad, "zero_index.json", "\"shape\":[", "\"shape\":[4611686018427387904,");
    merge_refused(bad, "zero_index.json: params[0] ('fc1.weight'): key \"shape\": the element count overflows",
                  NULL);
    copy_tree(good, bad);
    edit(bad, "zero_index.json", "\"shape\":[", "\"shape\":[1,1,1,1,1,1,1,");
    merge_refused(bad, "zero_index.json: params[0] ('fc1.weight'): key \"shape\" has 9 dimensions, at most 8", NULL);
    copy_tree(good, bad);
    edit(bad, "zero_index.json", "\"offset\":", "\"offset\":80,\"was\":");
    merge_refused(bad, "zero_index.json: params[0] ('fc1.weight'): 48 elements at key \"offset\" 80 lie outside",
                  NULL);
    copy_tree(good, bad);
    edit(bad, "zero_index.json", "\"fc1.bias\"", "\"fc1.weight\"");
    merge_refused(bad, "zero_index.json: ", "model.safetensors: tensor 'fc1.weight' given twice");
    copy_tree(good, bad);
    edit(bad, "zero_index.json", "\"world_size\":1", "\"world_size\":4");
    edit(bad, "zero_index.json", "\"shard\":", "\"shard\":4611686018427387968,\"was\":");
    merge_refused(bad, "zero_index.json: key \"shard\" (4611686018427387968) times key \"world_size\" (4)",
                  "overflow");

    copy_tree(good, bad);   /* a bit of the first parameter (the data follows the 8-byte length and the header) */
    snprintf(p, sizeof p, "%s/zero_shard_0.safetensors", bad);
    FILE *f = fopen(p, "rb");
    uint8_t len8[8];
    assert_int_equal(fread(len8, 1, 8, f), 8);
    fclose(f);
    long header = 0;
    for (int i = 7; i >= 0; i--) header = header << 8 | len8[i];
    flip_byte(p, 8 + header + 1);
    merge_refused(bad, "zero_shard_0.safetensors: corrupt: CRC-32", NULL);
    copy_tree(good, bad);
    snprintf(p, sizeof p, "%s/complete.json", bad);
    unlink(p);
    merge_refused(bad, "merge_weights: ", "bad is not a complete checkpoint: it has no complete.json");
}

/* An iterable dataset: load_state continues at the saved batch of the epoch, reading the stream
 * again from its start (it has no length, so the checkpoint records -1 batches per epoch). */
typedef struct numbers { int64_t n, pos; } numbers;

static ca_status num_begin(void *ctx, int64_t epoch) {
    (void)epoch;
    ((numbers *)ctx)->pos = 0;
    return CA_OK;
}

static ca_status num_next(void *ctx, void *x, void *y, bool *end) {
    numbers *c = ctx;
    if (c->pos >= c->n) {
        *end = true;
        return CA_OK;
    }
    *(float *)x = (float)c->pos;
    *(int64_t *)y = c->pos++;
    return CA_OK;
}

static ca_dataloader *stream_loader(ca_accelerator *acc, numbers *c, ca_dataset **ds) {
    ca_iterable_ops ops = {.struct_size = sizeof ops, .begin = num_begin, .next = num_next};
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 0}, ys = {.dtype = CA_I64, .ndim = 0};
    T_OK(ca_dataset_create_iterable(&ops, c, &xs, &ys, ds));
    ca_dataloader *dl;
    T_OK(ca_dataloader_create(*ds, &(ca_loader_opts){.batch_size = 4}, &dl));
    T_OK(ca_prepare_dataloader(acc, dl));
    return dl;
}

static void test_stream_resume(void **state) {
    (void)state;
    numbers c = {.n = 30};
    ca_accelerator *acc;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv_cpu}, &acc));
    ca_dataset *ds;
    ca_dataloader *dl = stream_loader(acc, &c, &ds);
    ca_batch b;
    for (int k = 0; k < 3; k++) assert_true(ca_dataloader_next(dl, &b));
    T_OK(ca_save_state(acc, in_dir("stream")));
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_accelerator_destroy(acc);

    T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv_cpu}, &acc));
    dl = stream_loader(acc, &c, &ds);
    T_OK(ca_load_state(acc, in_dir("stream")));
    int64_t want = 12, batches = 0;
    while (ca_dataloader_next(dl, &b)) {
        assert_int_equal(b.index, 3 + batches++);
        int64_t y[4];
        T_OK(ca_tensor_to_host(b.y, y, sizeof *y * (size_t)b.size));
        for (int64_t t = 0; t < b.size; t++) assert_int_equal(y[t], want++);
    }
    T_OK(ca_dataloader_status(dl));
    assert_int_equal(want, 30);                  /* batches 3 .. 7, the last one short */
    assert_int_equal(batches, 5);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_accelerator_destroy(acc);
}

/* ------------------------------------------------------------------ kill -9 at every stage of a save */

static bool is_link(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

static bool exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* The run of the kill tests: `named` saves to DIR/ck, else automatically named under DIR with
 * total_limit 1 (project_dir and its setting live in `pd`). */
static void kill_run_open(run *r, const char *dir, bool named, char *pd, size_t len) {
    snprintf(pd, len, "project_dir=%s", dir);
    const char *const autos[] = {pd, "automatic_checkpoint_naming=true", "total_limit=1", NULL};
    run_open(r, 8, false, named ? NULL : autos);
}

static ca_status kill_save(run *r, const char *dir, bool named) {
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    return ca_save_state(r->acc, named ? ck : NULL);
}

static ca_status kill_load(run *r, const char *dir, bool named) {
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    return ca_load_state(r->acc, named ? ck : NULL);
}

/* The child: a save after micro-step 3, another after micro-step 6 (where the hook holds it). */
static int kill_child_main(const char *dir, const char *mode) {
    bool named = !strcmp(mode, "named");
    run r;
    float l[64];
    char pd[600];
    kill_run_open(&r, dir, named, pd, sizeof pd);
    train(&r, 1, 3, l);
    T_OK(kill_save(&r, dir, named));
    train(&r, 1, 6, l);
    T_OK(kill_save(&r, dir, named));
    run_close(&r);
    ca_shutdown();
    return 0;
}

/* Runs the child with `env` added to the environment, reads its stderr until it says it stalled,
 * and kills it with SIGKILL there. False when it ended without stalling. */
static bool kill_child_at(const char *dir, const char *mode, const char *const *env) {
    int n = 0, p[2];
    while (environ[n]) n++;
    char **envp = calloc((size_t)n + 4, sizeof *envp);
    memcpy(envp, environ, (size_t)n * sizeof *envp);
    for (int i = 0; env[i]; i++) envp[n++] = (char *)env[i];
    char *argv[] = {(char *)g_argv0, "--kill-child", (char *)dir, (char *)mode, NULL};
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
    bool stalled = false;
    out[0] = '\0';
    while (!stalled && len < sizeof out - 1 && (k = read(p[0], out + len, sizeof out - 1 - len)) > 0) {
        out[len += (size_t)k] = '\0';
        stalled = strstr(out, "stalled at") != NULL;
    }
    if (stalled) kill(pid, SIGKILL);
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!stalled) fprintf(stderr, "the child ended (status %d) without stalling:\n%s\n", st, out);
    return stalled;
}

typedef struct kill_case {
    const char *mode, *stage;
    bool no_swap;           /* CACCEL_TEST_SAVE_NO_SWAP: the path of systems without a swap */
    int64_t steps;          /* the checkpoint load_state must find: the first save's (3) or the second's (6) */
} kill_case;

/* After the kill, the next save cleans up and completes: only the new checkpoint is left. */
static void kill_check_next_save(run *r, const char *dir, const kill_case *c) {
    bool named = !strcmp(c->mode, "named");
    char p[700];
    train(r, 2, r->met.steps + 2, (float[256]){0});
    int64_t steps = r->met.steps;
    T_OK(kill_save(r, dir, named));
    r->met.steps = -1;
    T_OK(kill_load(r, dir, named));
    assert_int_equal(r->met.steps, steps);
    if (named) {
        snprintf(p, sizeof p, "%s/ck.tmp", dir);
        if (exists(p)) fail_msg("%s: %s left after the next save", c->stage, p);
        snprintf(p, sizeof p, "%s/ck.old", dir);
        if (exists(p)) fail_msg("%s: %s left after the next save", c->stage, p);
        return;
    }
    /* automatic, total_limit 1: the loaded checkpoint_<k> is followed by checkpoint_<k+1>, alone */
    snprintf(p, sizeof p, "%s/checkpoints", dir);
    DIR *d = opendir(p);
    struct dirent *e;
    char want[64];
    snprintf(want, sizeof want, "checkpoint_%d", c->steps == 3 ? 1 : 2);
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' && strcmp(e->d_name, want) != 0)
            fail_msg("%s: %s/%s left after the next save (only %s expected)", c->stage, p, e->d_name, want);
    closedir(d);
}

/* A save killed with SIGKILL at each of its stages (CACCEL_TEST_SAVE_STALL), over a named
 * checkpoint (with the swap and with the path of systems without one) and automatically named
 * with total_limit: load_state then loads a complete checkpoint, the previous or the new one as
 * the stage says, never fails for want of one; the next save clears what the killed one left. */
static void test_kill_every_stage(void **state) {
    (void)state;
    static const kill_case cases[] = {
        {"named", "files", false, 3},   {"named", "manifest", false, 3}, {"named", "renamed", false, 6},
        {"named", "removing", false, 6}, {"named", "files", true, 3},    {"named", "manifest", true, 3},
        {"named", "aside", true, 6},     {"named", "renamed", true, 6},  {"named", "removing", true, 6},
        {"auto", "files", false, 3},    {"auto", "manifest", false, 3},  {"auto", "renamed", false, 6},
        {"auto", "pruning", false, 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const kill_case *c = &cases[i];
        bool named = !strcmp(c->mode, "named");
        char dir[600], stall[64], pd[600];
        snprintf(dir, sizeof dir, "%s/kill%zu", g_dir, i);
        assert_int_equal(mkdir(dir, 0755), 0);
        snprintf(stall, sizeof stall, "CACCEL_TEST_SAVE_STALL=%s:2", c->stage);
        const char *env[] = {stall, c->no_swap ? "CACCEL_TEST_SAVE_NO_SWAP=1" : NULL, NULL};
        if (!kill_child_at(dir, c->mode, env)) fail_msg("%s%s: no stall", c->stage, c->no_swap ? " (no swap)" : "");
        if (c->no_swap) setenv("CACCEL_TEST_SAVE_NO_SWAP", "1", 1);
        run r;
        kill_run_open(&r, dir, named, pd, sizeof pd);
        r.met.steps = -1;
        ca_status s = kill_load(&r, dir, named);
        if (s != CA_OK || r.met.steps != c->steps)
            fail_msg("%s %s%s: load_state %s (%s), micro-step %lld, expected %lld", c->mode, c->stage,
                     c->no_swap ? " (no swap)" : "", ca_status_name(s), ca_last_error(),
                     (long long)r.met.steps, (long long)c->steps);
        kill_check_next_save(&r, dir, c);
        unsetenv("CACCEL_TEST_SAVE_NO_SWAP");
        run_close(&r);
    }
}

/* ------------------------------------------------------------------ what is not save_state's */

static void make_file(const char *path) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("keep me\n", f);
    fclose(f);
}

/* The victim looks like a checkpoint (complete.json, caccel_state.json) and holds a file. */
static void make_victim(void) {
    assert_int_equal(mkdir(in_dir("victim"), 0755), 0);
    make_file(in_dir("victim/complete.json"));
    make_file(in_dir("victim/caccel_state.json"));
    make_file(in_dir("victim/precious"));
}

static void assert_victim(const char *when) {
    const char *files[] = {"victim/complete.json", "victim/caccel_state.json", "victim/precious"};
    for (int i = 0; i < 3; i++)
        if (!exists(in_dir(files[i]))) fail_msg("%s: %s was removed", when, in_dir(files[i]));
}

/* A planted link or a foreign directory where save_state keeps <dir>.tmp or <dir>.old, or in place
 * of <dir>: nothing of it or behind it is removed, and the error names it. */
static void test_not_ours(void **state) {
    (void)state;
    run r;
    float l[64];
    char pd[300];
    snprintf(pd, sizeof pd, "project_dir=%s/proj", g_dir);
    const char *const settings[] = {pd, "automatic_checkpoint_naming=true", "total_limit=1", "iteration=1", NULL};
    run_open(&r, 8, false, settings);
    assert_false(train(&r, 1, 3, l));
    make_victim();
    const char *links[] = {"ck.tmp", "ck.old"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(symlink(in_dir("victim"), in_dir(links[i])), 0);
        assert_error(ca_save_state(r.acc, in_dir("ck")), CA_ERR_STATE, links[i], "is a symbolic link: not removing it");
        assert_victim(links[i]);
        assert_true(is_link(in_dir(links[i])));
        unlink(in_dir(links[i]));
    }
    assert_int_equal(symlink(in_dir("victim"), in_dir("ck2")), 0);
    assert_error(ca_save_state(r.acc, in_dir("ck2")), CA_ERR_STATE, "ck2 is a symbolic link: not replacing it", NULL);
    assert_victim("ck2");
    const char *dirs[] = {"ck.tmp", "ck.old"};
    for (int i = 0; i < 2; i++) {
        char f[600];
        assert_int_equal(mkdir(in_dir(dirs[i]), 0755), 0);
        snprintf(f, sizeof f, "%s/notes.txt", in_dir(dirs[i]));
        make_file(f);
        assert_error(ca_save_state(r.acc, in_dir("ck")), CA_ERR_STATE, dirs[i], "exists and is not a checkpoint");
        if (!exists(f)) fail_msg("%s was removed", f);
        unlink(f);
        rmdir(in_dir(dirs[i]));
    }
    /* caccel's own marker, but a directory inside: not a checkpoint either */
    assert_int_equal(mkdir(in_dir("ck.tmp"), 0755), 0);
    assert_int_equal(mkdir(in_dir("ck.tmp/sub"), 0755), 0);
    make_file(in_dir("ck.tmp/complete.json"));
    assert_error(ca_save_state(r.acc, in_dir("ck")), CA_ERR_STATE, "ck.tmp holds a directory (sub)", NULL);
    assert_true(exists(in_dir("ck.tmp/complete.json")));
    T_OK(ca_save_state(r.acc, in_dir("ok")));   /* elsewhere it saves */

    /* automatic naming: a planted checkpoint_1.tmp, and a link checkpoint_0 that total_limit passes over */
    assert_int_equal(mkdir(in_dir("proj"), 0755), 0);
    assert_int_equal(mkdir(in_dir("proj/checkpoints"), 0755), 0);
    assert_int_equal(symlink(in_dir("victim"), in_dir("proj/checkpoints/checkpoint_1.tmp")), 0);
    assert_error(ca_save_state(r.acc, NULL), CA_ERR_STATE, "checkpoint_1.tmp is a symbolic link", NULL);
    assert_victim("checkpoint_1.tmp");
    unlink(in_dir("proj/checkpoints/checkpoint_1.tmp"));
    assert_int_equal(symlink(in_dir("victim"), in_dir("proj/checkpoints/checkpoint_0")), 0);
    T_OK(ca_save_state(r.acc, NULL));
    T_OK(ca_save_state(r.acc, NULL));            /* total_limit 1: checkpoint_1 goes, the link stays */
    assert_victim("total_limit");
    assert_true(is_link(in_dir("proj/checkpoints/checkpoint_0")));
    assert_false(exists(in_dir("proj/checkpoints/checkpoint_1")));
    assert_true(exists(in_dir("proj/checkpoints/checkpoint_2/complete.json")));
    run_close(&r);
}

/* Fills the file system of `dir` to the last byte. */
static void fill_disk(const char *dir) {
    char p[600];
    snprintf(p, sizeof p, "%s/filler", dir);
    FILE *f = fopen(p, "wb");
    static char block[4096];
    if (!f) fail_msg("cannot create %s", p);
    setvbuf(f, NULL, _IONBF, 0);
    for (size_t n = sizeof block; n >= 1; n /= 2)   /* smaller writes fill the last partial block */
        while (fwrite(block, 1, n, f) == n) {
        }
    fclose(f);
}

/* Fills the file system of `dir`, then frees `room` bytes again. */
static void fill_disk_but(const char *dir, long room) {
    char p[600];
    struct stat st;
    fill_disk(dir);
    snprintf(p, sizeof p, "%s/filler", dir);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(truncate(p, st.st_size > room ? st.st_size - room : 0), 0);
}

/* Saves over the checkpoint `target` (NULL: automatically named, total_limit 1) with a page more
 * free space each time, from none until two saves in a row succeed: the disk fills up at every
 * point of a save in turn. After each, with the space freed again, load_state loads the new
 * checkpoint if the save succeeded, else the previous one. */
static void full_disk_sweep(run *r, const char *dir, const char *target) {
    float losses[256];
    char filler[600];
    snprintf(filler, sizeof filler, "%s/filler", dir);
    T_OK(ca_save_state(r->acc, target));
    int64_t saved = r->met.steps;
    int failed = 0, ok_in_a_row = 0;
    for (long room = 0; ok_in_a_row < 2 && room < 64 * 4096; room += 4096) {
        train(r, 100, r->met.steps + 1, losses);
        int64_t now = r->met.steps;
        fill_disk_but(dir, room);
        ca_status s = ca_save_state(r->acc, target);
        unlink(filler);
        failed += s != CA_OK;
        ok_in_a_row = s == CA_OK ? ok_in_a_row + 1 : 0;
        if (s == CA_OK) saved = now;
        else printf("  %ld bytes free: %s\n", room, ca_last_error());
        r->met.steps = -1;
        ca_status l = ca_load_state(r->acc, target);
        char msg[1200];
        snprintf(msg, sizeof msg, "%s, %ld bytes free: save %s; load_state %s (%s), micro-step %lld, expected %lld",
                 target ? target : "automatic", room, ca_status_name(s), ca_status_name(l), ca_last_error(),
                 (long long)r->met.steps, (long long)saved);
        if (l != CA_OK || r->met.steps != saved) {
            printf("FAIL: %s\n", msg);   /* fail_msg outside a cmocka test may not print it */
            fail_msg("%s", msg);
        }
    }
    if (!failed || ok_in_a_row < 2) {
        printf("FAIL: %s: %d saves failed, %d in a row succeeded\n", target ? target : "automatic", failed, ok_in_a_row);
        fail_msg("the sweep did not reach a full disk and two good saves");
    }
    printf("%s: %d saves failed on the full disk, the checkpoint before each loaded\n",
           target ? target : "automatic", failed);
}

static int full_disk_main(const char *dir) {
    snprintf(g_dir, sizeof g_dir, "%s", dir);
    run r;
    float losses[64];
    run_open(&r, 4, false, NULL);
    train(&r, 1, 5, losses);
    T_OK(ca_save_state(r.acc, in_dir("first")));
    size_t len, n;
    uint8_t *p0 = params(r.m, &len);
    int64_t steps = ca_optimizer_steps(r.opt);
    fill_disk(dir);
    ca_status s = ca_save_state(r.acc, in_dir("second"));
    printf("save_state on a full disk: %s: %s\n", ca_status_name(s), ca_last_error());
    if (s == CA_OK) fail_msg("save_state on a full disk succeeded");
    struct stat st;
    char marker[600];
    snprintf(marker, sizeof marker, "%s/complete.json", in_dir("second"));
    if (stat(marker, &st) == 0) fail_msg("%s exists after a failed save", marker);
    train(&r, 1, 8, losses);   /* move on, then go back to the first checkpoint */
    T_OK(ca_load_state(r.acc, in_dir("first")));
    uint8_t *p1 = params(r.m, &n);
    if (n != len || memcmp(p0, p1, len) != 0 || ca_optimizer_steps(r.opt) != steps || r.met.steps != 5)
        fail_msg("the first checkpoint did not restore the run");
    free(p1);
    printf("the first checkpoint loads after the failed save\n");
    free(p0);
    snprintf(marker, sizeof marker, "%s/filler", dir);
    unlink(marker);
    full_disk_sweep(&r, dir, in_dir("first"));
    run_close(&r);

    char pd[600];
    snprintf(pd, sizeof pd, "project_dir=%s", dir);
    const char *const autos[] = {pd, "automatic_checkpoint_naming=true", "total_limit=1", NULL};
    run_open(&r, 4, false, autos);
    full_disk_sweep(&r, dir, NULL);
    run_close(&r);
    return 0;
}

int main(int argc, char **argv) {
    ca_log_set_level(CA_LOG_ERROR);
    if (argc == 3 && !strcmp(argv[1], "--full-disk")) return full_disk_main(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "--ranks")) return ranks_main(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "--kill-child")) return kill_child_main(argv[2], argv[3]);
    g_argv0 = argv[0];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_exact_resume, setup, teardown),
        cmocka_unit_test_setup_teardown(test_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_project, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_contents, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manifest_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_merge_weights, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_resume, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_every_stage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_ours, setup, teardown),
        cmocka_unit_test(test_skip_reads_nothing),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_shutdown();
    return rc;
}
