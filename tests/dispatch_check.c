/* dispatch_check: dispatch_batches across real processes (caccel launch or mpirun), run by
 * tests/test_dispatch.sh. The data exists on rank 0 only: every dataset callback fails the run when it
 * is called on another rank. Prints "key=value" lines.
 *   training: S steps of SGD on an iterable dataset (a stream of 4096 samples read in order), batch T
 *             per process (or global with --split_batches true); dumps the parameters
 *   ids:      a map-style dataset and a stream of E numbered samples, in order, batch B, with and
 *             without drop_last: per step, the sample ids this rank got and how many are repeats
 *             ("ids KIND drop=D rank=R step=S ids=a,b pad=P"), then what gather_for_metrics gave
 *             ("gather KIND drop=D rank=R count=C sum=S repeats=K batches=N"); then the same epoch
 *             resumed at batch 1 ("skip KIND drop=D rank=R step=S ids=a,b pad=P", S the batch's index)
 *   with gradient_accumulation_steps > 1: "last KIND drop=D rank=R step=S" where the step ended an
 *             accumulation cycle (the loader's last batch, which every rank must see on the same step)
 *   last, with dispatch_batches on several processes: a loader with a custom batch sampler is refused
 *   --fail-at K: first an epoch of the map-style dataset whose sample K cannot be read (read_error) */
#include <caccel/caccel.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { IN = 8, CLASSES = 3, TRAIN_N = 4096 };

static int g_rank;

/* The data lives on rank 0: a read anywhere else is the failure this test looks for. */
static void only_rank0(const char *what) {
    if (g_rank == 0) return;
    printf("rank=%d FAIL: the dataset's %s was called on rank %d\n", g_rank, what, g_rank);
    fflush(stdout);
    exit(9);
}

/* Sample i of the synthetic data (the same in every run). */
static void sample(int64_t i, float *x, int64_t *cls) {
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    for (int j = 0; j < IN; j++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        x[j] = (float)((s >> 40) * (2.0 / 16777216.0) - 1.0);
    }
    *cls = (int64_t)(s % CLASSES);
}

typedef struct source {
    int64_t n, pos;
    bool numbered;                 /* y = the sample's number, else a class */
    int64_t fail_at;               /* get of this sample fails (-1: none) */
} source;

static void write_sample(const source *s, int64_t i, void *x, void *y) {
    int64_t cls;
    sample(i, x, &cls);
    *(int64_t *)y = s->numbered ? i : cls;
}

static ca_status stream_begin(void *ctx, int64_t epoch) {
    (void)epoch;
    only_rank0("begin");
    ((source *)ctx)->pos = 0;
    return CA_OK;
}

static ca_status stream_next(void *ctx, void *x, void *y, bool *end) {
    only_rank0("next");
    source *s = ctx;
    if (s->pos >= s->n) {
        *end = true;
        return CA_OK;
    }
    write_sample(s, s->pos++, x, y);
    return CA_OK;
}

static int64_t map_length(void *ctx) { return ((source *)ctx)->n; }

static ca_status map_get(void *ctx, int64_t i, void *x, void *y) {
    only_rank0("get");
    if (i == ((source *)ctx)->fail_at) return ca_error(CA_ERR_IO, "sample %lld is unreadable", (long long)i);
    write_sample(ctx, i, x, y);
    return CA_OK;
}

static ca_dataset *dataset(bool iterable, int64_t n, bool numbered, int64_t fail_at) {
    source *s = calloc(1, sizeof *s);
    if (!s) exit(1);
    *s = (source){.n = n, .numbered = numbered, .fail_at = fail_at};
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {IN}}, ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds;
    if (iterable) {
        ca_iterable_ops ops = {.struct_size = sizeof ops, .begin = stream_begin, .next = stream_next, .destroy = free};
        CA_CHECK(ca_dataset_create_iterable(&ops, s, &xs, &ys, &ds));
    } else {
        ca_dataset_ops ops = {.struct_size = sizeof ops, .length = map_length, .get = map_get, .destroy = free};
        CA_CHECK(ca_dataset_create(&ops, s, &xs, &ys, &ds));
    }
    return ds;
}

static ca_module *model(void) {
    ca_module *m, *l;
    CA_CHECK(ca_sequential_create(&m));
    CA_CHECK(ca_linear_create(IN, 16, true, &l)); CA_CHECK(ca_module_add(m, "fc1", l));
    CA_CHECK(ca_tanh_create(&l));                 CA_CHECK(ca_module_add(m, "act", l));
    CA_CHECK(ca_linear_create(16, CLASSES, true, &l)); CA_CHECK(ca_module_add(m, "fc2", l));
    return m;
}

static void train(ca_accelerator *acc, int64_t batch, int64_t steps, const char *dump) {
    ca_dataset *ds = dataset(true, TRAIN_N, false, -1);
    ca_dataloader *dl;
    CA_CHECK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = batch, .drop_last = true}, &dl));
    ca_module *m = model();
    ca_optimizer *opt;
    CA_CHECK(ca_sgd_create(m, &(ca_sgd_opts){.lr = 0.2, .momentum = 0.9}, &opt));
    CA_CHECK(ca_prepare(acc, m, opt, dl));
    int64_t step = 0, rows = 0;
    ca_batch b;
    while (step < steps && ca_dataloader_next(dl, &b)) {
        ca_tensor *loss = ca_cross_entropy(ca_module_forward(m, b.x), b.y);
        CA_CHECK(ca_backward(acc, loss));
        CA_CHECK(ca_optimizer_step(opt));
        ca_optimizer_zero_grad(opt);
        rows += b.size;
        step++;
    }
    CA_CHECK(ca_dataloader_status(dl));
    printf("train rank=%d steps=%lld rows_per_step=%lld device=%s\n", g_rank, (long long)step,
           (long long)(rows / (step ? step : 1)), ca_device_name(ca_accelerator_device(acc)));
    if (dump && ca_is_main_process(acc)) {
        FILE *f = fopen(dump, "wb");
        if (!f) { perror(dump); exit(1); }
        for (int i = 0; i < ca_module_num_params(m); i++) {
            ca_tensor *p = ca_module_param_at(m, i);
            float h[512];
            if (ca_tensor_nbytes(p) > sizeof h) exit(5);
            CA_CHECK(ca_tensor_to_host(p, h, ca_tensor_nbytes(p)));
            fwrite(h, 1, ca_tensor_nbytes(p), f);
        }
        fclose(f);
    }
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
}

/* Prints the ids of batch b as "WHAT KIND drop=D rank=R step=S ids=a,b pad=P". */
static void print_ids(const char *what, const char *kind, bool drop, int64_t step, const ca_batch *b) {
    int64_t h[512];
    if (b->size > 512) exit(3);
    CA_CHECK(ca_tensor_to_host(b->y, h, sizeof *h * (size_t)b->size));
    char line[4096];
    int len = 0;
    for (int64_t t = 0; t < b->size && len < (int)sizeof line - 24; t++)
        len += snprintf(line + len, sizeof line - (size_t)len, "%s%lld", t ? "," : "", (long long)h[t]);
    printf("%s %s drop=%d rank=%d step=%lld ids=%s pad=%lld\n", what, kind, drop, g_rank, (long long)step, line,
           (long long)b->num_padded);
}

/* One epoch of numbered samples: this rank's ids per step, then gather_for_metrics of them. */
static void ids(ca_accelerator *acc, bool iterable, int64_t n, int64_t batch, bool drop) {
    const char *kind = iterable ? "stream" : "map";
    ca_dataset *ds = dataset(iterable, n, true, -1);
    ca_dataloader *dl;
    CA_CHECK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = batch, .drop_last = drop}, &dl));
    CA_CHECK(ca_prepare_dataloader(acc, dl));
    int64_t count = 0, sum = 0, repeats = 0, steps = 0, expect = ca_dataloader_num_batches(dl);
    unsigned char *seen = calloc((size_t)n, 1);
    if (!seen) exit(1);
    ca_batch b;
    bool accumulating = ca_accelerator_settings(acc)->gradient_accumulation_steps > 1;
    while (ca_dataloader_next(dl, &b)) {
        print_ids("ids", kind, drop, steps, &b);
        /* the end of the dataloader ends an accumulation cycle: it shows which step the loader marked last */
        CA_ACCUMULATE(acc, NULL) {
            if (accumulating && ca_sync_gradients(acc))
                printf("last %s drop=%d rank=%d step=%lld\n", kind, drop, g_rank, (long long)steps);
        }
        ca_tensor *all = ca_gather_for_metrics(acc, b.y, &b);
        CA_CHECK(all ? CA_OK : ca_last_status());
        int64_t k = ca_tensor_dim(all, 0), g[2048];
        if (k > 2048) exit(3);
        CA_CHECK(ca_tensor_to_host(all, g, sizeof *g * (size_t)k));
        for (int64_t t = 0; t < k; t++) {
            if (g[t] < 0 || g[t] >= n) exit(4);
            repeats += seen[g[t]]++ > 0;
            sum += g[t];
        }
        count += k;
        steps++;
    }
    CA_CHECK(ca_dataloader_status(dl));
    if (!iterable && expect != steps)
        printf("rank=%d FAIL: %s drop=%d: num_batches %lld, handed out %lld\n", g_rank, kind, drop, (long long)expect,
               (long long)steps);
    printf("gather %s drop=%d rank=%d count=%lld sum=%lld repeats=%lld batches=%lld\n", kind, drop, g_rank,
           (long long)count, (long long)sum, (long long)repeats, (long long)steps);
    /* resume: the same epoch from batch 1 (a stream is read from its start and batch 0 dropped) */
    CA_CHECK(ca_dataloader_set_epoch(dl, 0));
    CA_CHECK(ca_dataloader_skip_batches(dl, 1));
    while (ca_dataloader_next(dl, &b)) print_ids("skip", kind, drop, b.index, &b);
    CA_CHECK(ca_dataloader_status(dl));
    free(seen);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
}

/* Rank 0 cannot read sample k: every rank's loader fails on the same step and the ranks stay in step
 * (the barrier after it completes). Prints "failed rank=R step=S: MESSAGE". */
static void read_error(ca_accelerator *acc, int64_t n, int64_t batch, int64_t k) {
    ca_dataset *ds = dataset(false, n, true, k);
    ca_dataloader *dl;
    CA_CHECK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = batch}, &dl));
    CA_CHECK(ca_prepare_dataloader(acc, dl));
    int64_t steps = 0;
    ca_batch b;
    while (ca_dataloader_next(dl, &b)) steps++;
    if (ca_dataloader_status(dl) == CA_OK) printf("rank=%d FAIL: the read error went unnoticed\n", g_rank);
    else printf("failed rank=%d step=%lld: %s\n", g_rank, (long long)steps, ca_last_error());
    CA_CHECK(ca_wait_for_everyone(acc));
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
}

static ca_status one_batch(void *ctx, int64_t *idx, int64_t cap, int64_t *len) {
    (void)ctx;
    (void)cap;
    idx[0] = 0;
    *len = 1;
    return CA_OK;
}

/* A custom batch sampler does not combine with dispatch_batches: prepare says so, naming the key.
 * Prints "sampler rank=R refused: MESSAGE". */
static void sampler_refused(ca_accelerator *acc) {
    ca_dataset *ds = dataset(false, 4, true, -1);
    ca_dataloader *dl;
    CA_CHECK(ca_dataloader_create(ds, NULL, &dl));
    ca_batch_sampler_ops so = {.struct_size = sizeof so, .next = one_batch};
    CA_CHECK(ca_dataloader_set_batch_sampler(dl, &so, NULL, 12, false));   /* split_batches divides 12 */
    if (ca_prepare_dataloader(acc, dl) == CA_ERR_UNSUPPORTED)
        printf("sampler rank=%d refused: %s\n", g_rank, ca_last_error());
    else
        printf("rank=%d FAIL: a custom batch sampler was prepared with dispatch_batches\n", g_rank);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
}

int main(int argc, char **argv) {
    int64_t train_batch = 8, steps = 10, batch = 2, e = 10, fail_at = -1;
    const char *dump = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--train-batch") && i + 1 < argc) train_batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--ids") && i + 1 < argc) e = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
        else if (!strcmp(argv[i], "--fail-at") && i + 1 < argc) fail_at = atoll(argv[++i]);
        else if (ca_config_flag_arity(argv[i]) >= 0) i += ca_config_flag_arity(argv[i]);
        else { fprintf(stderr, "dispatch_check: unknown argument %s\n", argv[i]); return 2; }
    }
    ca_accelerator *acc;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv}, &acc));
    CA_CHECK(ca_set_seed(acc, 11));
    g_rank = ca_process_index(acc);
    if (ca_num_processes(acc) > 1 && !ca_accelerator_settings(acc)->dispatch_batches)
        printf("rank=%d note: dispatch_batches is off\n", g_rank);
    if (fail_at >= 0) read_error(acc, e, batch, fail_at);
    if (steps > 0) train(acc, train_batch, steps, dump);
    for (int drop = 0; drop < 2; drop++) {
        ids(acc, false, e, batch, drop);
        ids(acc, true, e, batch, drop);
    }
    if (ca_num_processes(acc) > 1 && ca_accelerator_settings(acc)->dispatch_batches) sampler_refused(acc);
    CA_CHECK(ca_wait_for_everyone(acc));
    ca_accelerator_destroy(acc);
    ca_shutdown();
    return 0;
}
