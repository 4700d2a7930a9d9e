/* data_check: training and evaluation on data without a length and with a custom batch sampler, run
 * as real processes (caccel launch or mpirun) by tests/test_data_dist.sh. Prints "key=value" lines.
 *   training: S steps of SGD on an iterable dataset (a callback reading a stream of N samples in
 *             order), batch B per process (or global with --split_batches true); dumps the parameters
 *   evaluation: a stream of E samples whose target is the sample's number, and a custom batch
 *             sampler (batches of 6, the full ones in reverse order) over E samples; gather_for_metrics of the
 *             numbers must give every sample exactly once: eval_count=E and eval_sum=E(E-1)/2
 *   --varying: instead, only prepares (ca_prepare) a loader whose batch sampler declares varying batch sizes
 *             (batch_size 0: batches of 6 and 5 in turn) and prints varying_sampler=ok or the error */
#include <caccel/caccel.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { IN = 8, CLASSES = 3 };

typedef struct stream {
    int64_t n, pos;
    bool numbered;                 /* y = the sample's number, else a class */
} stream;

/* Sample i of the synthetic stream (the same on every process and every pass). */
static void sample(int64_t i, float *x, int64_t *cls) {
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    for (int j = 0; j < IN; j++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        x[j] = (float)((s >> 40) * (2.0 / 16777216.0) - 1.0);
    }
    *cls = (int64_t)(s % CLASSES);
}

static ca_status stream_begin(void *ctx, int64_t epoch) {
    (void)epoch;
    ((stream *)ctx)->pos = 0;
    return CA_OK;
}

static ca_status stream_next(void *ctx, void *x, void *y, bool *end) {
    stream *s = ctx;
    if (s->pos >= s->n) {
        *end = true;
        return CA_OK;
    }
    int64_t cls, i = s->pos++;
    sample(i, x, &cls);
    *(int64_t *)y = s->numbered ? i : cls;
    return CA_OK;
}

static ca_dataset *stream_dataset(int64_t n, bool numbered) {
    stream *s = calloc(1, sizeof *s);
    if (!s) exit(1);
    *s = (stream){.n = n, .numbered = numbered};
    ca_iterable_ops ops = {.struct_size = sizeof ops, .begin = stream_begin, .next = stream_next, .destroy = free};
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {IN}}, ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds;
    CA_CHECK(ca_dataset_create_iterable(&ops, s, &xs, &ys, &ds));
    return ds;
}

/* The same E numbered samples with random access, for the batch sampler. */
static ca_dataset *numbered_memory(int64_t n) {
    float *x = malloc(sizeof(float) * (size_t)(n * IN));
    int64_t *y = malloc(sizeof(int64_t) * (size_t)n), cls;
    if (!x || !y) exit(1);
    for (int64_t i = 0; i < n; i++) {
        sample(i, x + i * IN, &cls);
        y[i] = i;
    }
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {IN}}, ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds;
    CA_CHECK(ca_dataset_from_memory(&xs, x, &ys, y, n, &ds));
    free(x);
    free(y);
    return ds;
}

/* Batches of 6 of [0, n): the full ones from the last to the first, then the short rest (a short
 * batch anywhere but last gives the processes batches of different sizes, in Accelerate as here). */
typedef struct reverse_sampler { int64_t n, next; } reverse_sampler;

static ca_status rs_begin(void *ctx, int64_t epoch) {
    (void)epoch;
    ((reverse_sampler *)ctx)->next = 0;
    return CA_OK;
}

static ca_status rs_next(void *ctx, int64_t *idx, int64_t cap, int64_t *len) {
    reverse_sampler *r = ctx;
    int64_t full = r->n / 6, nb = (r->n + 5) / 6, j = r->next < full ? full - 1 - r->next : r->next;
    *len = 0;
    if (r->next >= nb) return CA_OK;
    r->next++;
    for (int64_t i = 6 * j; i < r->n && i < 6 * j + 6 && *len < cap; i++) idx[(*len)++] = i;
    return CA_OK;
}

/* Batches of 6 and 5 in turn over [0, n): a sampler whose batch size varies (declared as 0). */
static ca_status vs_next(void *ctx, int64_t *idx, int64_t cap, int64_t *len) {
    reverse_sampler *r = ctx;   /* next: the first index of the next batch */
    int64_t want = (r->next / 11) * 11 == r->next ? 6 : 5;
    *len = 0;
    for (int64_t i = r->next; i < r->n && *len < want && *len < cap; i++) idx[(*len)++] = i;
    r->next += *len;
    return CA_OK;
}

static void prepare_varying(ca_accelerator *acc, int64_t e) {
    ca_dataset *em = numbered_memory(e);
    ca_dataloader *el;
    CA_CHECK(ca_dataloader_create(em, &(ca_loader_opts){0}, &el));
    reverse_sampler *vs = calloc(1, sizeof *vs);
    if (!vs) exit(1);
    vs->n = e;
    ca_batch_sampler_ops so = {.struct_size = sizeof so, .begin = rs_begin, .next = vs_next, .destroy = free};
    CA_CHECK(ca_dataloader_set_batch_sampler(el, &so, vs, 0, false));
    ca_status s = ca_prepare(acc, NULL, NULL, el);
    printf("rank=%d varying_sampler=%s\n", ca_process_index(acc), s == CA_OK ? "ok" : ca_last_error());
    ca_clear_error();
    ca_dataloader_destroy(el);
    ca_dataset_destroy(em);
}

static ca_module *model(void) {
    ca_module *m, *l;
    CA_CHECK(ca_sequential_create(&m));
    CA_CHECK(ca_linear_create(IN, 16, true, &l)); CA_CHECK(ca_module_add(m, "fc1", l));
    CA_CHECK(ca_tanh_create(&l));                 CA_CHECK(ca_module_add(m, "act", l));
    CA_CHECK(ca_linear_create(16, CLASSES, true, &l)); CA_CHECK(ca_module_add(m, "fc2", l));
    return m;
}

/* Gathers the sample numbers of every batch of dl; prints their count, sum and repeats. */
static void evaluate(ca_accelerator *acc, ca_module *m, ca_dataloader *dl, const char *what, int64_t n) {
    CA_CHECK(ca_prepare_dataloader(acc, dl));
    int64_t count = 0, sum = 0, repeats = 0, batches = 0;
    unsigned char *seen = calloc((size_t)n, 1);
    ca_batch b;
    while (ca_dataloader_next(dl, &b)) {
        CA_NO_GRAD {
            ca_tensor *pred = ca_gather_for_metrics(acc, ca_argmax(ca_module_forward(m, b.x)), &b);
            ca_tensor *ids = ca_gather_for_metrics(acc, b.y, &b);
            CA_CHECK(pred && ids ? CA_OK : ca_last_status());
            int64_t k = ca_tensor_dim(ids, 0), h[512];
            if (k > 512 || ca_tensor_dim(pred, 0) != k) exit(3);
            CA_CHECK(ca_tensor_to_host(ids, h, sizeof *h * (size_t)k));
            for (int64_t t = 0; t < k; t++) {
                if (h[t] < 0 || h[t] >= n) exit(4);
                repeats += seen[h[t]]++ > 0;
                sum += h[t];
            }
            count += k;
        }
        batches++;
    }
    CA_CHECK(ca_dataloader_status(dl));
    printf("rank=%d %s eval_count=%lld eval_sum=%lld repeats=%lld batches=%lld\n", ca_process_index(acc), what,
           (long long)count, (long long)sum, (long long)repeats, (long long)batches);
    free(seen);
}

int main(int argc, char **argv) {
    int64_t batch = 8, steps = 10, n = 4096, e = 103;
    const char *dump = NULL;
    bool varying = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--eval") && i + 1 < argc) e = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
        else if (!strcmp(argv[i], "--varying")) varying = true;
        else if (ca_config_flag_arity(argv[i]) >= 0) i += ca_config_flag_arity(argv[i]);
        else { fprintf(stderr, "data_check: unknown argument %s\n", argv[i]); return 2; }
    }
    ca_accelerator *acc;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv}, &acc));
    CA_CHECK(ca_set_seed(acc, 11));
    int rank = ca_process_index(acc);
    if (varying) {
        prepare_varying(acc, e);
        ca_accelerator_destroy(acc);
        ca_shutdown();
        return 0;
    }

    ca_dataset *train = stream_dataset(n, false);
    ca_dataloader *dl;
    CA_CHECK(ca_dataloader_create(train, &(ca_loader_opts){.batch_size = batch, .drop_last = true}, &dl));
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
    printf("rank=%d train_steps=%lld rows_per_step=%lld\n", rank, (long long)step, (long long)(rows / (step ? step : 1)));
    if (dump && ca_is_main_process(acc)) {
        FILE *f = fopen(dump, "wb");
        if (!f) { perror(dump); return 1; }
        for (int i = 0; i < ca_module_num_params(m); i++) {
            ca_tensor *p = ca_module_param_at(m, i);
            float h[512];
            if (ca_tensor_nbytes(p) > sizeof h) return 5;
            CA_CHECK(ca_tensor_to_host(p, h, ca_tensor_nbytes(p)));
            fwrite(h, 1, ca_tensor_nbytes(p), f);
        }
        fclose(f);
    }

    ca_dataset *es = stream_dataset(e, true);
    ca_dataloader *el;
    CA_CHECK(ca_dataloader_create(es, &(ca_loader_opts){.batch_size = batch}, &el));
    evaluate(acc, m, el, "stream", e);
    ca_dataloader_destroy(el);
    ca_dataset_destroy(es);

    ca_dataset *em = numbered_memory(e);
    CA_CHECK(ca_dataloader_create(em, &(ca_loader_opts){0}, &el));
    reverse_sampler *rs = calloc(1, sizeof *rs);
    if (!rs) return 1;
    rs->n = e;
    ca_batch_sampler_ops so = {.struct_size = sizeof so, .begin = rs_begin, .next = rs_next, .destroy = free};
    CA_CHECK(ca_dataloader_set_batch_sampler(el, &so, rs, 6, false));
    evaluate(acc, m, el, "sampler", e);
    ca_dataloader_destroy(el);
    ca_dataset_destroy(em);

    CA_CHECK(ca_wait_for_everyone(acc));
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(train);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
    ca_shutdown();
    return 0;
}
