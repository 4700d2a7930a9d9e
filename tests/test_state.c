/* save_state / load_state (one process): exact resume, automatic naming with total_limit and the
 * fall-back past incomplete checkpoints, and named errors for incomplete, truncated, corrupt and
 * mismatched checkpoints that leave the run unchanged.
 * With arguments it is the C side of tests/test_state_ranks.sh (under caccel launch, 2 ranks):
 *   test_state --ranks DIR   a save where rank 1 fails, then a load that rank 1 refuses
 * and of tests/test_full_disk.sh:
 *   test_state --full-disk DIR   DIR is on a small file system: a save, the disk filled, a second
 *                                save that must fail, and the first checkpoint loaded again */
#include "test_util.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char *argv_cpu[] = {"test", "--cpu", NULL};
static char g_dir[256];

static void rm_rf(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[768];
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) rm_rf(p);
        else unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

static int setup(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/caccel-state-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ca_scope_release_all();   /* every run is closed by now (another run's loader may hold a scope before) */
    rm_rf(g_dir);
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

/* Rewrites dir/complete.json for the files as they are now (a checkpoint edited after the save). */
static void reseal(const char *dir) {
    char p[700];
    snprintf(p, sizeof p, "%s/complete.json", dir);
    FILE *out = fopen(p, "w");
    assert_non_null(out);
    fputs("{\"files\": {", out);
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "complete.json")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        FILE *f = fopen(p, "rb");
        static uint8_t buf[1 << 22];
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        fprintf(out, "%s\"%s\": {\"size\": %zu, \"crc32\": %u}", n++ ? ", " : "", e->d_name, len, crc32_of(buf, len));
    }
    closedir(d);
    fputs("}}\n", out);
    fclose(out);
}

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
    rm_rf(in_dir("merged"));

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
    run_close(&r);
    return 0;
}

int main(int argc, char **argv) {
    ca_log_set_level(CA_LOG_ERROR);
    if (argc == 3 && !strcmp(argv[1], "--full-disk")) return full_disk_main(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "--ranks")) return ranks_main(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_exact_resume, setup, teardown),
        cmocka_unit_test_setup_teardown(test_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_project, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_contents, setup, teardown),
        cmocka_unit_test_setup_teardown(test_merge_weights, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_resume, setup, teardown),
        cmocka_unit_test(test_skip_reads_nothing),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_shutdown();
    return rc;
}
