/* Fashion-MNIST with an MLP (784-256-128-10, AdamW): the same program on a laptop CPU, under
 * mpirun, under `caccel launch`, or on a GPU, chosen by configuration alone. */
#include <caccel/caccel.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef struct args {
    int epochs;
    int64_t batch_size;
    double lr;
    uint64_t seed;
    const char *data;
    const char *schedule;      /* constant | cosine | linear */
    double warmup;             /* fraction of the steps */
    int64_t max_steps;         /* stop after this many optimizer steps (0: all) */
    const char *dump_params;   /* write the final parameters here (raw f32, in name order) */
    const char *output_dir;    /* save the trained model here (model.safetensors) */
    const char *checkpoint_dir;      /* save_state into DIR/checkpoints/checkpoint_<i> */
    int64_t checkpointing_steps;     /* ... every N optimizer steps (0: only at epoch ends) */
    bool resume;                     /* load the latest complete checkpoint of checkpoint_dir first */
    int local_sgd_steps;             /* LocalSGD: average the parameters every N steps (0: off) */
    int64_t max_train_samples;       /* train on the first N samples (0: all), as HF's examples */
    int64_t max_eval_samples;        /* evaluate on the first N samples (0: all) */
} args;

static void usage(FILE *f) {
    fprintf(f,
            "usage: fashion_mnist [--epochs N] [--batch-size N] [--lr X] [--seed N] [--data DIR]\n"
            "                     [--schedule constant|linear|cosine] [--warmup FRACTION]\n"
            "                     [--max-steps N] [--dump-params FILE] [--output_dir DIR]\n"
            "                     [--checkpoint_dir DIR [--checkpointing_steps N] [--resume] [--async_save]]\n"
            "                     [--local_sgd_steps N] [--max_train_samples N] [--max_eval_samples N]\n"
            "                     [configuration flags]\n"
            "--output_dir DIR saves the trained model as DIR/model.safetensors (PyTorch's names:\n"
            "fc1.weight, ...; docs/CHECKPOINTS.md).\n"
            "--checkpoint_dir saves the training state at each epoch end (and every N optimizer steps)\n"
            "into DIR/checkpoints/checkpoint_<i> (the program's project_dir; total_limit keeps the newest);\n"
            "--resume continues from the newest complete one there (or starts afresh when there is none).\n"
            "--local_sgd_steps N trains each process on its own and averages the parameters every N\n"
            "optimizer steps and at each epoch's end (Accelerate's LocalSGD; docs/DISTRIBUTED.md).\n"
            "Configuration flags are Accelerate's (--cpu, --mixed_precision bf16, --config_file F,\n"
            "--gradient_accumulation_steps N, ...): see `caccel --help` and docs/CONFIGURATION.md.\n");
}

static bool flag(const char *arg, const char *name, int argc, char **argv, int *i, const char **val) {
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return false;
    if (arg[n] == '=') { *val = arg + n + 1; return true; }
    if (arg[n] != '\0') return false;
    if (*i + 1 >= argc) {
        fprintf(stderr, "fashion_mnist: %s needs a value\n", name);
        exit(2);
    }
    *val = argv[++*i];
    return true;
}

static args parse(int argc, char **argv) {
    args a = {.epochs = 5, .batch_size = 128, .lr = 1e-3, .seed = 42, .schedule = "constant"};
    for (int i = 1; i < argc; i++) {
        const char *v, *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) { usage(stdout); exit(0); }
        else if (flag(s, "--epochs", argc, argv, &i, &v)) a.epochs = atoi(v);
        else if (flag(s, "--batch-size", argc, argv, &i, &v)) a.batch_size = atoll(v);
        else if (flag(s, "--lr", argc, argv, &i, &v)) a.lr = atof(v);
        else if (flag(s, "--seed", argc, argv, &i, &v)) a.seed = strtoull(v, NULL, 10);
        else if (flag(s, "--data", argc, argv, &i, &v)) a.data = v;
        else if (flag(s, "--schedule", argc, argv, &i, &v)) a.schedule = v;
        else if (flag(s, "--warmup", argc, argv, &i, &v)) a.warmup = atof(v);
        else if (flag(s, "--max-steps", argc, argv, &i, &v)) a.max_steps = atoll(v);
        else if (flag(s, "--dump-params", argc, argv, &i, &v)) a.dump_params = v;
        else if (flag(s, "--output_dir", argc, argv, &i, &v)) a.output_dir = v;
        else if (flag(s, "--checkpoint_dir", argc, argv, &i, &v)) a.checkpoint_dir = v;
        else if (flag(s, "--checkpointing_steps", argc, argv, &i, &v)) a.checkpointing_steps = atoll(v);
        else if (!strcmp(s, "--resume")) a.resume = true;
        else if (flag(s, "--local_sgd_steps", argc, argv, &i, &v)) a.local_sgd_steps = atoi(v);
        else if (flag(s, "--max_train_samples", argc, argv, &i, &v)) a.max_train_samples = atoll(v);
        else if (flag(s, "--max_eval_samples", argc, argv, &i, &v)) a.max_eval_samples = atoll(v);
        else {
            int arity = ca_config_flag_arity(s);          /* the accelerator reads these */
            if (arity < 0) {
                fprintf(stderr, "fashion_mnist: unknown argument '%s'\n", s);
                usage(stderr);
                exit(2);
            }
            i += arity;
        }
    }
    if (a.epochs < 1 || a.batch_size < 1 || a.lr <= 0 || a.local_sgd_steps < 0 || a.max_train_samples < 0 ||
        a.max_eval_samples < 0) {
        fprintf(stderr, "fashion_mnist: --epochs, --batch-size and --lr must be positive, --local_sgd_steps, "
                        "--max_train_samples and --max_eval_samples >= 0\n");
        exit(2);
    }
    if ((a.resume || a.checkpointing_steps) && !a.checkpoint_dir) {
        fprintf(stderr, "fashion_mnist: --resume and --checkpointing_steps need --checkpoint_dir\n");
        exit(2);
    }
    return a;
}

static ca_module *build_mlp(void) {
    ca_module *seq, *l;
    CA_CHECK(ca_sequential_create(&seq));
    CA_CHECK(ca_flatten_create(&l));                   CA_CHECK(ca_module_add(seq, "flatten", l));
    CA_CHECK(ca_linear_create(784, 256, true, &l));    CA_CHECK(ca_module_add(seq, "fc1", l));
    CA_CHECK(ca_relu_create(&l));                      CA_CHECK(ca_module_add(seq, "relu1", l));
    CA_CHECK(ca_linear_create(256, 128, true, &l));    CA_CHECK(ca_module_add(seq, "fc2", l));
    CA_CHECK(ca_relu_create(&l));                      CA_CHECK(ca_module_add(seq, "relu2", l));
    CA_CHECK(ca_linear_create(128, 10, true, &l));     CA_CHECK(ca_module_add(seq, "fc3", l));
    return seq;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The first n samples of a dataset (n 0: all of it), as `select(range(n))` of Hugging Face's
 * datasets: the wrapper owns the dataset it wraps. */
typedef struct head { ca_dataset *d; int64_t n; } head;
static int64_t head_length(void *ctx) { return ((head *)ctx)->n; }
static ca_status head_get(void *ctx, int64_t i, void *x, void *y) { return ca_dataset_get(((head *)ctx)->d, i, x, y); }
static void head_destroy(void *ctx) { ca_dataset_destroy(((head *)ctx)->d); free(ctx); }

static ca_dataset *first_samples(ca_dataset *d, int64_t n) {
    if (n <= 0 || n >= ca_dataset_length(d)) return d;
    head *h = malloc(sizeof *h);
    if (!h) { fprintf(stderr, "fashion_mnist: out of memory\n"); exit(1); }
    *h = (head){d, n};
    static const ca_dataset_ops ops = {sizeof ops, head_length, head_get, head_destroy};
    ca_dataset *out;
    CA_CHECK(ca_dataset_create(&ops, h, ca_dataset_x_spec(d), ca_dataset_y_spec(d), &out));
    return out;
}

/* Correct predictions and samples over this rank's shard, padding excluded. */
static void evaluate(ca_accelerator *acc, ca_module *m, ca_dataloader *dl, double *correct, double *total) {
    ca_module_train(m, false);
    ca_batch b;
    *correct = *total = 0;
    while (ca_dataloader_next(dl, &b)) {
        CA_NO_GRAD {
            ca_tensor *pred = ca_argmax(ca_module_forward(m, b.x));
            int64_t n = b.size - b.num_padded, *p = malloc((size_t)b.size * 8), *y = malloc((size_t)b.size * 8);
            CA_CHECK(ca_tensor_to_host(pred, p, (size_t)b.size * 8));
            CA_CHECK(ca_tensor_to_host(b.y, y, (size_t)b.size * 8));
            for (int64_t i = 0; i < n; i++) *correct += p[i] == y[i];
            *total += (double)n;
            free(p);
            free(y);
        }
    }
    CA_CHECK(ca_dataloader_status(dl));
    ca_module_train(m, true);
}

/* A loss kept from an earlier step: read (its graph has run by now) and freed; 0 when none. */
static double read_loss(ca_tensor **t) {
    if (!*t) return 0;
    double v = ca_item(*t);
    ca_tensor_free(*t);
    *t = NULL;
    return v;
}

static void dump_params(ca_module *m, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    for (int i = 0; i < ca_module_num_params(m); i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        size_t n = ca_tensor_nbytes(p);
        void *h = malloc(n);
        CA_CHECK(ca_tensor_to_host(p, h, n));
        fwrite(h, 1, n, f);
        free(h);
    }
    fclose(f);
}

/* This rank's figures of the epoch in flight: saved with the state so that a resumed epoch
 * reports what the uninterrupted one would have. */
typedef struct epoch_metrics {
    double loss_sum;
    int64_t steps, samples;
} epoch_metrics;

static ca_status metrics_save(void *ctx, void **data, size_t *len) {
    if (!(*data = malloc(sizeof(epoch_metrics)))) return ca_error(CA_ERR_NOMEM, "epoch metrics: out of memory");
    memcpy(*data, ctx, *len = sizeof(epoch_metrics));
    return CA_OK;
}

static ca_status metrics_load(void *ctx, const void *data, size_t len, bool apply) {
    if (len != sizeof(epoch_metrics))
        return ca_error(CA_ERR_INVALID, "epoch metrics: %zu bytes, expected %zu", len, sizeof(epoch_metrics));
    if (apply) memcpy(ctx, data, len);
    return CA_OK;
}

/* Is there a DIR/checkpoints/checkpoint_<n>/complete.json (what ca_load_state resumes from)? */
static bool has_complete_checkpoint(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/checkpoints", dir);
    DIR *d = opendir(path);
    if (!d) return false;
    bool found = false;
    struct stat sb;
    for (struct dirent *e; !found && (e = readdir(d));) {
        /* checkpoint_<digits> only: a checkpoint_<n>.tmp that a killed save left is not loaded */
        const char *num = e->d_name + 11;
        if (strncmp(e->d_name, "checkpoint_", 11) != 0 || !*num || strspn(num, "0123456789") != strlen(num)) continue;
        snprintf(path, sizeof path, "%s/checkpoints/%s/complete.json", dir, e->d_name);
        found = stat(path, &sb) == 0;
    }
    closedir(d);
    return found;
}

/* --checkpoint_dir: the run's project_dir, with automatic checkpoint naming. */
static ca_status setup_checkpoints(ca_accelerator *acc, const args *a, epoch_metrics *em) {
    if (!a->checkpoint_dir) return CA_OK;
    ca_status s = ca_register_for_checkpointing(acc, &(ca_checkpointable){
        .name = "epoch_metrics", .save = metrics_save, .load = metrics_load, .ctx = em, .per_rank = true});
    if (s != CA_OK || !a->resume) return s;
    /* nothing saved yet (the first run under `caccel launch --max_restarts`): start from the beginning */
    if (!has_complete_checkpoint(a->checkpoint_dir)) {
        ca_log_printf(CA_LOG_WARNING, "fashion_mnist: no complete checkpoint under %s yet: starting from the "
                      "beginning", a->checkpoint_dir);
        return CA_OK;
    }
    return ca_load_state(acc, NULL);
}

/* The run's hyperparameters go with the trackers' files (hparams.json). */
static ca_status init_trackers(ca_accelerator *acc, const args *a) {
    char ep[32], bs[32], lr[32], seed[32], sched[80];
    snprintf(ep, sizeof ep, "epochs=%d", a->epochs);
    snprintf(bs, sizeof bs, "batch_size=%lld", (long long)a->batch_size);
    snprintf(lr, sizeof lr, "lr=%g", a->lr);
    snprintf(seed, sizeof seed, "seed=%llu", (unsigned long long)a->seed);
    snprintf(sched, sizeof sched, "schedule=%s", a->schedule);
    const char *const hp[] = {ep, bs, lr, seed, sched, NULL};
    return ca_init_trackers(acc, "fashion_mnist", hp);
}

/* The accelerator's throughput line (this rank's samples/s, FLOP/s and MFU, then the world's sums);
 * none when the interval held only the first, warm-up step. Every rank calls it at the same step: the
 * world's sums are a collective. */
static void log_throughput(ca_accelerator *acc) {
    ca_throughput r;
    if (ca_throughput_report(acc, &r) != CA_OK) { ca_clear_error(); return; }
    CA_CHECK(ca_throughput_log(acc, &r));
}

int main(int argc, char **argv) {
    args a = parse(argc, argv);
    ca_accelerator *acc;
    char project[4096];
    snprintf(project, sizeof project, "project_dir=%s", a.checkpoint_dir ? a.checkpoint_dir : "");
    const char *const ck_settings[] = {project, "automatic_checkpoint_naming=true", NULL};
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv,
                                                 .settings = a.checkpoint_dir ? ck_settings : NULL}, &acc));
    CA_CHECK(ca_set_seed(acc, a.seed));

    ca_dataset *train, *test;
    CA_CHECK(ca_fashion_mnist_open(a.data, true, &train));
    CA_CHECK(ca_fashion_mnist_open(a.data, false, &test));
    train = first_samples(train, a.max_train_samples);
    test = first_samples(test, a.max_eval_samples);
    ca_loader_opts lo = {.batch_size = a.batch_size, .shuffle = true, .x_dtype = CA_F32, .x_dtype_set = true,
                         .x_scale = 1.0f / 255.0f};
    ca_dataloader *train_dl, *test_dl;
    CA_CHECK(ca_dataloader_create(train, &lo, &train_dl));
    lo.shuffle = false;
    lo.batch_size = 1000;
    CA_CHECK(ca_dataloader_create(test, &lo, &test_dl));

    ca_module *model = build_mlp();
    ca_optimizer *opt;
    CA_CHECK(ca_adamw_create(model, &(ca_adamw_opts){.lr = a.lr}, &opt));
    CA_CHECK(ca_prepare(acc, model, opt, train_dl));
    CA_CHECK(ca_prepare_dataloader(acc, test_dl));

    int64_t per_epoch = ca_dataloader_num_batches(train_dl);
    int64_t ga = ca_accelerator_settings(acc)->gradient_accumulation_steps;
    /* in one-process steps: a prepared schedule advances num_processes steps per step (as Accelerate's);
     * warmup is a whole number of optimizer steps, so the same global batches warm up at any world size */
    int64_t opt_steps = per_epoch * a.epochs / (ga > 0 ? ga : 1), world = ca_num_processes(acc);
    if (strcmp(a.schedule, "constant") != 0 || a.warmup > 0) {
        ca_lr_schedule s = {.kind = !strcmp(a.schedule, "cosine") ? CA_SCHED_COSINE
                                    : !strcmp(a.schedule, "linear") ? CA_SCHED_LINEAR : CA_SCHED_CONSTANT,
                            .warmup_steps = (int64_t)(a.warmup * (double)opt_steps) * world,
                            .total_steps = opt_steps * world};
        CA_CHECK(ca_optimizer_set_schedule(opt, &s));
    }
    ca_print(acc, "fashion_mnist: %d process(es) on %s, mixed precision: %s, %lld parameters, %lld batches of %lld per epoch and process\n",
             ca_num_processes(acc), ca_device_name(ca_accelerator_device(acc)),
             ca_mixed_precision_name(ca_accelerator_mixed_precision(acc)),
             (long long)ca_module_param_count(model), (long long)per_epoch, (long long)a.batch_size);

    epoch_metrics em = {0};
    CA_CHECK(setup_checkpoints(acc, &a, &em));
    CA_CHECK(init_trackers(acc, &a));   /* --log_with json,csv: <logging_dir>/fashion_mnist/ */
    bool done = a.max_steps && ca_optimizer_steps(opt) >= a.max_steps;
    for (int epoch = (int)ca_dataloader_epoch(train_dl); epoch < a.epochs && !done; epoch++) {
        double t0 = now_s();
        char desc[64];
        snprintf(desc, sizeof desc, "epoch %d/%d", epoch + 1, a.epochs);
        ca_progress *bar;   /* stderr of the main process; --progress false or CACCEL_LOG_LEVEL=ERROR: none */
        /* a resumed epoch starts where it stopped */
        CA_CHECK(ca_progress_create(acc, &(ca_progress_opts){.total = per_epoch, .initial = em.steps, .desc = desc},
                                    &bar));
        ca_local_sgd *lsgd = NULL;   /* the epoch's LocalSGD block: its end averages the parameters */
        if (a.local_sgd_steps) CA_CHECK(ca_local_sgd_begin(acc, model, a.local_sgd_steps, true, &lsgd));
        ca_batch b;
        /* The loss is read one step late, after the dataloader has run its step's graph: read inside
         * the step, it would make a lazy device (xla) run the graph there, while the step's
         * temporaries are still alive, and make a GPU wait (torch_xla's add_step_closure). */
        ca_tensor *last_loss = NULL;
        CA_CHECK(ca_throughput_resume(acc));   /* paused over the last epoch's evaluation */
        while (ca_dataloader_next(train_dl, &b)) {
            em.loss_sum += read_loss(&last_loss);
            int64_t before = ca_optimizer_steps(opt);
            CA_SCOPE CA_ACCUMULATE(acc, model) {   /* a graph run before the next batch sees them freed */
                ca_tensor *loss = ca_cross_entropy(ca_module_forward(model, b.x), b.y);
                CA_CHECK(ca_backward(acc, loss));
                CA_CHECK(ca_optimizer_step(opt));
                ca_optimizer_zero_grad(opt);
                last_loss = ca_tensor_keep(ca_detach(loss));
            }
            em.steps++;
            em.samples += b.size;
            CA_CHECK(ca_throughput_step(acc, b.size, 0));   /* images: no tokens */
            int64_t read = em.steps - (last_loss != NULL);   /* steps whose loss is in loss_sum */
            if (read > 0) CA_CHECK(ca_progress_set_loss(bar, em.loss_sum / (double)read));
            CA_CHECK(ca_progress_update(bar, 1));
            int64_t now = ca_optimizer_steps(opt);
            if (lsgd && now > before) CA_CHECK(ca_local_sgd_step(lsgd));
            if (a.checkpointing_steps && now > before && now % a.checkpointing_steps == 0) {
                em.loss_sum += read_loss(&last_loss);   /* the saved metrics hold every step's loss */
                CA_CHECK(ca_throughput_pause(acc));     /* a save is not training throughput */
                CA_CHECK(ca_save_state(acc, NULL));
                CA_CHECK(ca_throughput_resume(acc));
            }
            if (a.max_steps && ca_optimizer_steps(opt) >= a.max_steps) { done = true; break; }
        }
        CA_CHECK(ca_dataloader_status(train_dl));
        em.loss_sum += read_loss(&last_loss);
        CA_CHECK(ca_local_sgd_end(lsgd));
        CA_CHECK(ca_progress_close(bar));
        double secs = now_s() - t0;
        log_throughput(acc);   /* the epoch's line, as examples/gpt.c prints it; then paused for evaluation */
        CA_CHECK(ca_throughput_pause(acc));
        double c, n;
        evaluate(acc, model, test_dl, &c, &n);
        CA_SCOPE {   /* metrics over every rank: mean loss, whole-test-set accuracy, global throughput */
            float local[4] = {(float)(em.loss_sum / (double)(em.steps ? em.steps : 1)), (float)c, (float)n,
                              (float)em.samples};
            ca_tensor *st = ca_from_host(ca_accelerator_device(acc), CA_F32, CA_SHAPE(4), local);
            CA_CHECK(ca_reduce(acc, st, CA_OP_SUM));
            float r[4];
            CA_CHECK(ca_tensor_to_host(st, r, sizeof r));
            ca_metric m[] = {{"train_loss", r[0] / ca_num_processes(acc)}, {"test_accuracy", r[1] / r[2]},
                             {"samples_per_s", r[3] / secs}, {"epoch", epoch + 1}};
            CA_CHECK(ca_log_metrics(acc, m, sizeof m / sizeof m[0], ca_optimizer_steps(opt)));
            ca_print(acc, "epoch %d/%d: train loss %.4f, test accuracy %.2f%% (%d samples), %.0f samples/s (%.1f s)\n",
                     epoch + 1, a.epochs, r[0] / ca_num_processes(acc), 100.0 * r[1] / r[2], (int)r[2],
                     r[3] / secs, secs);
        }
        em = (epoch_metrics){0};
        if (a.checkpoint_dir && !done) CA_CHECK(ca_save_state(acc, NULL));
    }
    if (a.dump_params) CA_CHECK(ca_summon_full_params(acc, true));   /* stage 3 keeps shards between steps */
    if (a.dump_params && ca_is_main_process(acc)) dump_params(model, a.dump_params);
    if (a.output_dir) {
        if (ca_is_main_process(acc) && mkdir(a.output_dir, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "fashion_mnist: cannot create --output_dir %s: %s\n", a.output_dir, strerror(errno));
            exit(1);
        }
        CA_CHECK(ca_save_model(acc, model, a.output_dir, 0));   /* every rank calls it */
        ca_print(acc, "model saved to %s/model.safetensors\n", a.output_dir);
    }
    CA_CHECK(ca_end_training(acc));
    CA_CHECK(ca_wait_for_everyone(acc));

    ca_dataloader_destroy(train_dl);
    ca_dataloader_destroy(test_dl);
    ca_dataset_destroy(train);
    ca_dataset_destroy(test);
    ca_optimizer_destroy(opt);
    ca_module_destroy(model);
    ca_accelerator_destroy(acc);
    ca_scope_release_all();
    ca_shutdown();
    return 0;
}
