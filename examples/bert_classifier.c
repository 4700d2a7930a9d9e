/* Fine-tunes a pretrained BERT (a Hugging Face checkpoint directory, all-MiniLM-L6-v2 by default)
 * as BertForSequenceClassification on the fortunes task: which collection a fortune comes from.
 * Accelerate's tutorial loop (examples/nlp_example.py) line for line: AdamW, a linear schedule with
 * warm-up, accumulation, clipping and mixed precision through the configuration; the same program
 * on 1 or N processes (caccel launch, mpirun). --from_scratch trains the same architecture from
 * random weights and --baseline bow a bag-of-words logistic regression, the two references the
 * pretrained model must beat. --output_dir writes a checkpoint transformers' from_pretrained loads. */
#include <caccel/caccel.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef struct args {
    const char *model_dir;     /* Hugging Face checkpoint directory (config, weights, tokenizer) */
    const char *output_dir;
    int epochs;
    int64_t batch_size, max_length, max_steps, log_interval;
    double lr, warmup, max_grad_norm, weight_decay;
    uint64_t seed;
    bool from_scratch, bow, gradient_checkpointing;
} args;

static void usage(FILE *f) {
    fprintf(f,
            "usage: bert_classifier [--model DIR] [--output_dir DIR] [--epochs N] [--batch_size N]\n"
            "                       [--max_length N] [--lr X] [--warmup FRACTION] [--max_grad_norm X]\n"
            "                       [--weight_decay X] [--seed N] [--max_steps N] [--log_interval N]\n"
            "                       [--from_scratch] [--baseline bow] [--gradient_checkpointing]\n"
            "                       [configuration flags]\n"
            "Defaults: 1 epoch (bow: 5), batch 16, max_length 64, lr 1e-4 (bow: 1e-2), warmup 0.1 of the steps,\n"
            "max_grad_norm 1, weight_decay 0.01, seed 42.\n"
            "--model DIR: a Hugging Face BERT checkpoint directory (config.json, model.safetensors,\n"
            "tokenizer.json or vocab.txt); default $CACCEL_MINILM_DIR (tools/fetch-minilm.sh).\n"
            "--from_scratch: the same architecture, randomly initialised (the tokenizer still\n"
            "comes from DIR). --baseline bow: bag-of-words logistic regression on the same tokens.\n"
            "--output_dir DIR: writes config.json, model.safetensors and tokenizer.json there\n"
            "(BertForSequenceClassification, Hugging Face's names).\n"
            "--gradient_checkpointing: each encoder layer keeps only its input during forward and\n"
            "is recomputed in backward (docs/ACTIVATION_CHECKPOINTING.md).\n"
            "Configuration flags are Accelerate's (--cpu, --mixed_precision bf16,\n"
            "--gradient_accumulation_steps N, --config_file F, ...): see `caccel --help`.\n");
}

static bool flag(const char *arg, const char *name, int argc, char **argv, int *i, const char **val) {
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return false;
    if (arg[n] == '=') { *val = arg + n + 1; return true; }
    if (arg[n] != '\0') return false;
    if (*i + 1 >= argc) {
        fprintf(stderr, "bert_classifier: %s needs a value\n", name);
        exit(2);
    }
    *val = argv[++*i];
    return true;
}

static args parse(int argc, char **argv) {
    args a = {.model_dir = getenv("CACCEL_MINILM_DIR"), .epochs = 1, .batch_size = 16, .max_length = 64,
              .lr = 1e-4, .warmup = 0.1, .max_grad_norm = 1.0, .weight_decay = 0.01, .seed = 42};
    bool lr_set = false, epochs_set = false;
    for (int i = 1; i < argc; i++) {
        const char *v, *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) { usage(stdout); exit(0); }
        else if (!strcmp(s, "--from_scratch")) a.from_scratch = true;
        else if (!strcmp(s, "--gradient_checkpointing")) a.gradient_checkpointing = true;
        else if (flag(s, "--model", argc, argv, &i, &v)) a.model_dir = v;
        else if (flag(s, "--output_dir", argc, argv, &i, &v)) a.output_dir = v;
        else if (flag(s, "--epochs", argc, argv, &i, &v)) { a.epochs = atoi(v); epochs_set = true; }
        else if (flag(s, "--batch_size", argc, argv, &i, &v)) a.batch_size = atoll(v);
        else if (flag(s, "--max_length", argc, argv, &i, &v)) a.max_length = atoll(v);
        else if (flag(s, "--max_steps", argc, argv, &i, &v)) a.max_steps = atoll(v);
        else if (flag(s, "--log_interval", argc, argv, &i, &v)) a.log_interval = atoll(v);
        else if (flag(s, "--lr", argc, argv, &i, &v)) { a.lr = atof(v); lr_set = true; }
        else if (flag(s, "--warmup", argc, argv, &i, &v)) a.warmup = atof(v);
        else if (flag(s, "--max_grad_norm", argc, argv, &i, &v)) a.max_grad_norm = atof(v);
        else if (flag(s, "--weight_decay", argc, argv, &i, &v)) a.weight_decay = atof(v);
        else if (flag(s, "--seed", argc, argv, &i, &v)) a.seed = strtoull(v, NULL, 10);
        else if (flag(s, "--baseline", argc, argv, &i, &v)) {
            if (strcmp(v, "bow") != 0) { fprintf(stderr, "bert_classifier: --baseline takes 'bow'\n"); exit(2); }
            a.bow = true;
        } else {
            int arity = ca_config_flag_arity(s);          /* the accelerator reads these */
            if (arity < 0) {
                fprintf(stderr, "bert_classifier: unknown argument '%s'\n", s);
                usage(stderr);
                exit(2);
            }
            i += arity;
        }
    }
    if (!a.model_dir) {
        fprintf(stderr, "bert_classifier: no model: pass --model DIR or set CACCEL_MINILM_DIR "
                        "(tools/fetch-minilm.sh fetches all-MiniLM-L6-v2)\n");
        exit(2);
    }
    if (a.epochs < 1 || a.batch_size < 1 || a.max_length < 3 || a.lr <= 0) {
        fprintf(stderr, "bert_classifier: --epochs, --batch_size, --lr must be positive, --max_length >= 3\n");
        exit(2);
    }
    if (a.bow && !lr_set) a.lr = 1e-2;        /* a linear model on counts wants a larger step */
    if (a.bow && !epochs_set) a.epochs = 5;   /* it converges later, and an epoch costs nothing */
    if (a.bow && a.output_dir) {
        fprintf(stderr, "bert_classifier: --output_dir writes a BERT checkpoint; not with --baseline bow\n");
        exit(2);
    }
    return a;
}

/* ---------------------------------------------------------------- bag-of-words baseline */

/* Logistic regression on token counts: logits = counts(ids) W + b, computed as the sum over
 * the attended positions of W's rows (an embedding of the ids) so no [B, vocab] tensor is made. */
static ca_tensor *bow_forward(ca_module *self, ca_tensor *x, void *ctx) {
    (void)ctx;
    int64_t b = ca_tensor_dim(x, 0), l = ca_tensor_dim(x, 2);
    ca_tensor *ids = ca_contiguous(ca_narrow(x, 1, 0, 1));
    ca_tensor *mask = ca_cast(ca_reshape(ca_narrow(x, 1, 1, 1), 3, (int64_t[]){b, l, 1}), CA_F32);
    ca_tensor *rows = ca_embedding(ca_reshape(ids, 2, (int64_t[]){b, l}), ca_module_param(self, "weight"));
    return ca_add(ca_sum_dim(ca_mul(rows, mask), 1, false), ca_module_param(self, "bias"));
}

static ca_module *bow_create(int64_t vocab, int64_t classes) {
    ca_module *m;
    CA_CHECK(ca_module_create("BagOfWords", bow_forward, NULL, NULL, &m));
    ca_device *cpu = ca_cpu_device();
    CA_CHECK(ca_module_add_param(m, "weight", ca_zeros(cpu, CA_F32, 2, (int64_t[]){vocab, classes})));
    CA_CHECK(ca_module_add_param(m, "bias", ca_zeros(cpu, CA_F32, 1, &classes)));
    return m;
}

/* ---------------------------------------------------------------- helpers */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The batch cut to its longest sequence (the tutorial's padding="longest"): shorter batches,
 * less work. x is [B, 2, max_length] with row 1 the attention mask. */
static ca_tensor *trim(ca_tensor *x) {
    int64_t b = ca_tensor_dim(x, 0), l = ca_tensor_dim(x, 2), longest = 1;
    int64_t *h = malloc((size_t)(b * 2 * l) * sizeof *h);
    if (!h) return NULL;
    CA_CHECK(ca_tensor_to_host(x, h, (size_t)(b * 2 * l) * sizeof *h));
    for (int64_t i = 0; i < b; i++)
        for (int64_t j = l - 1; j >= longest; j--)
            if (h[i * 2 * l + l + j]) { longest = j + 1; break; }
    free(h);
    return longest == l ? x : ca_contiguous(ca_narrow(x, 2, 0, longest));
}

/* The accelerator's throughput line, as examples/gpt.c prints it (this rank's samples/s, tokens/s,
 * FLOP/s and MFU, then the world's sums); none when the interval held only the first, warm-up step.
 * Every rank calls it at the same step: the world's sums are a collective. */
static void log_throughput(ca_accelerator *acc) {
    ca_throughput r;
    if (ca_throughput_report(acc, &r) != CA_OK) { ca_clear_error(); return; }
    CA_CHECK(ca_throughput_log(acc, &r));
}

/* Held-out accuracy over every rank's predictions, with per-class counts. */
static void evaluate(ca_accelerator *acc, ca_module *model, ca_dataloader *dl, const ca_fortunes_info *fi) {
    int64_t correct[CA_FORTUNES_MAX_CLASSES] = {0}, total[CA_FORTUNES_MAX_CLASSES] = {0}, n = 0, c = 0;
    ca_module_train(model, false);
    ca_batch b;
    while (ca_dataloader_next(dl, &b)) {
        CA_NO_GRAD {
            ca_tensor *pred = ca_argmax(ca_module_forward(model, trim(b.x)));
            ca_tensor *p = ca_gather_for_metrics(acc, pred, &b), *y = ca_gather_for_metrics(acc, b.y, &b);
            int64_t k = ca_tensor_numel(p), *hp = malloc((size_t)k * 8), *hy = malloc((size_t)k * 8);
            CA_CHECK(ca_tensor_to_host(p, hp, (size_t)k * 8));
            CA_CHECK(ca_tensor_to_host(y, hy, (size_t)k * 8));
            for (int64_t i = 0; i < k; i++) {
                total[hy[i]]++;
                correct[hy[i]] += hp[i] == hy[i];
            }
            free(hp);
            free(hy);
        }
    }
    CA_CHECK(ca_dataloader_status(dl));
    ca_module_train(model, true);
    char line[1024];
    int off = 0;
    for (int i = 0; i < fi->num_classes; i++) {
        off += snprintf(line + off, sizeof line - (size_t)off, "%s%s %lld/%lld", i ? ", " : "", fi->names[i],
                        (long long)correct[i], (long long)total[i]);
        n += total[i];
        c += correct[i];
    }
    ca_print(acc, "  held-out accuracy %.2f%% (%lld/%lld; %s)\n", 100.0 * (double)c / (double)(n ? n : 1),
             (long long)c, (long long)n, line);
}

static void copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
    if (!out) {
        fprintf(stderr, "bert_classifier: cannot copy %s to %s: %s\n", from, to, strerror(errno));
        exit(1);
    }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    fclose(in);
    if (fclose(out) != 0) { perror(to); exit(1); }
}

/* config.json + model.safetensors (every rank calls ca_save_model) + tokenizer.json. */
static void save(ca_accelerator *acc, ca_module *model, const args *a, const ca_fortunes_info *fi) {
    if (ca_is_main_process(acc) && mkdir(a->output_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "bert_classifier: cannot create --output_dir %s: %s\n", a->output_dir, strerror(errno));
        exit(1);
    }
    CA_CHECK(ca_save_model(acc, model, a->output_dir, 0));
    if (ca_is_main_process(acc)) {
        const char *labels[CA_FORTUNES_MAX_CLASSES];
        for (int i = 0; i < fi->num_classes; i++) labels[i] = fi->names[i];
        CA_CHECK(ca_bert_save_config(model, a->output_dir, labels));
        char from[4096], to[4096];
        snprintf(from, sizeof from, "%s/tokenizer.json", a->model_dir);
        snprintf(to, sizeof to, "%s/tokenizer.json", a->output_dir);
        struct stat st;
        if (stat(from, &st) == 0) copy_file(from, to);
    }
    CA_CHECK(ca_wait_for_everyone(acc));
    ca_print(acc, "fine-tuned model saved to %s (config.json, model.safetensors, tokenizer.json)\n", a->output_dir);
}

/* fsdp_cpu_ram_efficient_loading set true (a config file, the environment, a flag), as Accelerate's
 * from_pretrained under it: the model is built without storage (ca_init_empty_weights) and the
 * checkpoint read at ca_prepare, each rank its shard's bytes under FULL_SHARD, rank 0 for all the
 * ranks under DDP. Left at its default the model is read here, as before. */
static bool ram_efficient_loading(const ca_accelerator *acc) {
    const ca_config *c = ca_accelerator_config(acc);
    const char *key = "fsdp_config.fsdp_cpu_ram_efficient_loading";
    bool on = false;
    if (ca_config_source_of(c, key) == CA_SRC_DEFAULT || ca_config_get_bool(c, key, &on) != CA_OK) return false;
    return on;
}

static ca_module *build_model(ca_accelerator *acc, const args *a, const ca_tokenizer *tok, int classes) {
    if (a->bow) return bow_create(ca_tokenizer_vocab_size(tok), classes);
    ca_bert_config cfg;
    CA_CHECK(ca_bert_config_load(a->model_dir, &cfg));
    ca_module *m;
    bool lean = !a->from_scratch && ram_efficient_loading(acc), was = ca_init_empty_weights_enabled();
    if (lean) CA_CHECK(ca_init_empty_weights(true));   /* the new head too: made at ca_prepare */
    CA_CHECK(ca_bert_for_sequence_classification_create(&cfg, classes, &m));
    if (a->from_scratch) return m;
    ca_bert_load_info info;
    CA_CHECK(ca_bert_load_pretrained(m, a->model_dir, &info));
    if (lean) CA_CHECK(ca_init_empty_weights(was));
    ca_print(acc, "loaded %lld tensors from %s (%lld unused); %lld newly initialised (%s, ...)\n",
             (long long)info.loaded, a->model_dir, (long long)info.unused, (long long)info.initialized,
             info.first_initialized);
    return m;
}

int main(int argc, char **argv) {
    args a = parse(argc, argv);
    ca_accelerator *acc;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv}, &acc));
    CA_CHECK(ca_set_seed(acc, a.seed));

    ca_tokenizer *tok;
    CA_CHECK(ca_tokenizer_load(a.model_dir, &tok));
    ca_dataset *train, *test;
    ca_fortunes_info fi, fi_test;
    CA_CHECK(ca_fortunes_open(tok, &(ca_fortunes_opts){.train = true, .max_length = a.max_length}, &train, &fi));
    CA_CHECK(ca_fortunes_open(tok, &(ca_fortunes_opts){.max_length = a.max_length}, &test, &fi_test));
    ca_loader_opts lo = {.batch_size = a.batch_size, .shuffle = true};
    ca_dataloader *train_dl, *test_dl;
    CA_CHECK(ca_dataloader_create(train, &lo, &train_dl));
    lo.shuffle = false;
    lo.batch_size = 64;
    CA_CHECK(ca_dataloader_create(test, &lo, &test_dl));

    ca_module *model = build_model(acc, &a, tok, fi.num_classes);
    if (a.gradient_checkpointing) {
        int n = 0;
        CA_CHECK(ca_module_checkpoint_layers(model, true, &n));
        ca_print(acc, "bert_classifier: gradient checkpointing: %d layers recompute their activations in backward\n", n);
    }
    ca_optimizer *opt;
    CA_CHECK(ca_adamw_create(model, &(ca_adamw_opts){.lr = a.lr, .weight_decay = a.weight_decay,
                                                      .weight_decay_set = true}, &opt));
    CA_CHECK(ca_prepare(acc, model, opt, train_dl));
    CA_CHECK(ca_prepare_dataloader(acc, test_dl));

    int64_t per_epoch = ca_dataloader_num_batches(train_dl);
    int64_t ga = ca_accelerator_settings(acc)->gradient_accumulation_steps;
    /* counted for one process: a prepared schedule advances num_processes steps per step */
    int64_t total_steps = per_epoch * ca_num_processes(acc) * a.epochs / (ga > 0 ? ga : 1);
    if (a.max_steps && a.max_steps * ca_num_processes(acc) < total_steps) total_steps = a.max_steps * ca_num_processes(acc);
    CA_CHECK(ca_optimizer_set_schedule(opt, &(ca_lr_schedule){.kind = CA_SCHED_LINEAR, .total_steps = total_steps,
                                                               .warmup_steps = (int64_t)(a.warmup * (double)total_steps)}));
    ca_print(acc, "bert_classifier: %s, %d process(es) on %s, mixed precision %s, %lld parameters; "
             "fortunes %d classes, %lld train / %lld held out, max_length %lld (%lld cut), %lld batches of %lld "
             "per epoch and process\n",
             a.bow ? "bag-of-words baseline" : a.from_scratch ? "BERT from scratch" : "pretrained BERT",
             ca_num_processes(acc), ca_device_name(ca_accelerator_device(acc)),
             ca_mixed_precision_name(ca_accelerator_mixed_precision(acc)), (long long)ca_module_param_count(model),
             fi.num_classes, (long long)fi.total, (long long)fi_test.total, (long long)a.max_length,
             (long long)fi.truncated, (long long)per_epoch, (long long)a.batch_size);

    bool done = false;
    for (int epoch = 0; epoch < a.epochs && !done; epoch++) {
        double loss_sum = 0, interval_sum = 0, t0 = now_s();
        int64_t batches = 0;
        ca_batch b;
        CA_CHECK(ca_throughput_resume(acc));   /* paused over the last epoch's evaluation */
        while (ca_dataloader_next(train_dl, &b)) {
            int64_t tokens = 0;   /* a token: a position of the batch as trimmed */
            CA_ACCUMULATE(acc, model) {
                ca_tensor *x = trim(b.x);
                tokens = b.size * ca_tensor_dim(x, 2);
                ca_tensor *loss = ca_cross_entropy(ca_module_forward(model, x), b.y);
                CA_CHECK(ca_backward(acc, loss));
                if (ca_sync_gradients(acc) && a.max_grad_norm > 0)
                    CA_CHECK(ca_clip_grad_norm(acc, a.max_grad_norm, NULL));
                CA_CHECK(ca_optimizer_step(opt));      /* the schedule steps with it */
                ca_optimizer_zero_grad(opt);
                loss_sum += ca_item(loss);
                interval_sum += ca_item(loss);
            }
            batches++;
            CA_CHECK(ca_throughput_step(acc, b.size, tokens));
            if (a.log_interval && batches % a.log_interval == 0) {   /* this process's batches */
                ca_print(acc, "  step %lld: loss %.4f (mean of the last %lld batches)\n",
                         (long long)ca_optimizer_steps(opt), interval_sum / (double)a.log_interval,
                         (long long)a.log_interval);
                interval_sum = 0;
                log_throughput(acc);   /* every rank: the same batches each */
            }
            if (a.max_steps && ca_optimizer_steps(opt) >= a.max_steps) { done = true; break; }
        }
        CA_CHECK(ca_dataloader_status(train_dl));
        double secs = now_s() - t0;
        CA_SCOPE {   /* the mean train loss over every rank */
            float local[1] = {(float)(loss_sum / (double)(batches ? batches : 1))};
            ca_tensor *st = ca_from_host(ca_accelerator_device(acc), CA_F32, CA_SHAPE(1), local);
            CA_CHECK(ca_reduce(acc, st, CA_OP_SUM));
            ca_print(acc, "epoch %d/%d: train loss %.4f (%lld steps, %.1f s)\n", epoch + 1, a.epochs,
                     ca_item(st) / ca_num_processes(acc), (long long)ca_optimizer_steps(opt), secs);
        }
        CA_CHECK(ca_throughput_pause(acc));   /* throughput excludes evaluation */
        evaluate(acc, model, test_dl, &fi_test);
    }
    if (a.output_dir) save(acc, model, &a, &fi);
    CA_CHECK(ca_wait_for_everyone(acc));

    ca_dataloader_destroy(train_dl);
    ca_dataloader_destroy(test_dl);
    ca_dataset_destroy(train);
    ca_dataset_destroy(test);
    ca_tokenizer_destroy(tok);
    ca_optimizer_destroy(opt);
    ca_module_destroy(model);
    ca_accelerator_destroy(acc);
    ca_scope_release_all();
    ca_shutdown();
    return 0;
}
