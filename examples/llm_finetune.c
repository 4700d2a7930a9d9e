/* Causal language-model fine-tuning of a Hugging Face decoder checkpoint (Llama, Qwen2, Mistral,
 * GPT-2: any directory AutoModelForCausalLM.from_pretrained reads, with its tokenizer.json), with
 * LoRA adapters (--lora_r N, PEFT's files) or every parameter (--lora_r 0), on the fortunes or on a
 * file of one text per line. The texts are tokenized, each followed by the end-of-sequence token,
 * concatenated and cut into blocks of --block_size tokens (transformers' run_clm group_texts); the
 * loss is the causal-LM loss (labels shifted by one inside it). Every epoch prints the training and
 * held-out loss and perplexity. --from_scratch builds the model of DIR/config.json with fresh
 * weights instead of reading them (and writes a byte-level tokenizer.json when DIR has none), which
 * is how the tests and the README make a small Llama to fine-tune. The same program runs under
 * `caccel launch` or mpirun, in bf16, with FSDP or on the lazy device (docs/DECODER.md). */
#include <caccel/caccel.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct args {
    const char *model, *data, *output_dir, *prompt, *target_modules, *checkpoint_dir;
    int64_t lora_r, block_size, batch_size, max_steps, epochs, log_interval, sample_tokens, top_k, eval_blocks;
    int64_t checkpointing_steps;
    double lora_alpha, lora_dropout, lr, weight_decay, grad_clip, temperature, warmup;
    uint64_t seed;
    bool from_scratch, gradient_checkpointing, resume;
} args;

static void usage(FILE *f) {
    fprintf(f,
            "usage: llm_finetune --model DIR [--from_scratch] [--lora_r N] [--lora_alpha X]\n"
            "           [--lora_dropout P] [--target_modules a,b,...] [--data FILE] [--block_size T]\n"
            "           [--batch_size B] [--epochs N] [--max_steps N] [--lr X] [--weight_decay X]\n"
            "           [--warmup FRACTION] [--grad_clip X] [--seed N] [--log_interval N]\n"
            "           [--output_dir DIR] [--sample_tokens N] [--temperature X] [--top_k K]\n"
            "           [--prompt TEXT] [--eval_blocks N] [--gradient_checkpointing]\n"
            "           [--checkpoint_dir DIR [--checkpointing_steps N] [--resume]] [configuration flags]\n"
            "--model: a Hugging Face checkpoint directory (config.json, model.safetensors or its\n"
            "index, tokenizer.json). --lora_r 0 fine-tunes every parameter; otherwise LoRA adapters\n"
            "of rank N on --target_modules (PEFT's default for the family when not given) train and\n"
            "the base stays frozen. --data: one text per line (default: the fortunes of\n"
            "$CACCEL_FORTUNES_DIR, else /usr/share/games/fortunes); every tenth text is held out\n"
            "(--eval_blocks N: only its first N blocks are evaluated; 0, the default: all).\n"
            "--output_dir: the adapter (adapter_model.safetensors, adapter_config.json) or, for a\n"
            "full fine-tune, the whole model in Hugging Face's layout. Defaults: LoRA r 8, alpha 16,\n"
            "block 128, batch 8, 1 epoch, lr 2e-4 (LoRA) or 5e-5 (full), 2 samples of 40 tokens.\n"
            "--checkpoint_dir: save_state every --checkpointing_steps optimizer steps into\n"
            "DIR/checkpoints/checkpoint_<i>; --resume continues from the newest complete one.\n"
            "Configuration flags are Accelerate's (--mixed_precision bf16, --use_fsdp, ...).\n");
}

static bool flag(const char *arg, const char *name, int argc, char **argv, int *i, const char **val) {
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return false;
    if (arg[n] == '=') { *val = arg + n + 1; return true; }
    if (arg[n] != '\0') return false;
    if (*i + 1 >= argc) {
        fprintf(stderr, "llm_finetune: %s needs a value\n", name);
        exit(2);
    }
    *val = argv[++*i];
    return true;
}

static bool parse_one(args *a, const char *s, int argc, char **argv, int *i) {
    const char *v;
    if (flag(s, "--model", argc, argv, i, &v)) a->model = v;
    else if (flag(s, "--data", argc, argv, i, &v)) a->data = v;
    else if (flag(s, "--output_dir", argc, argv, i, &v)) a->output_dir = v;
    else if (flag(s, "--prompt", argc, argv, i, &v)) a->prompt = v;
    else if (flag(s, "--target_modules", argc, argv, i, &v)) a->target_modules = v;
    else if (flag(s, "--lora_r", argc, argv, i, &v)) a->lora_r = atoll(v);
    else if (flag(s, "--lora_alpha", argc, argv, i, &v)) a->lora_alpha = atof(v);
    else if (flag(s, "--lora_dropout", argc, argv, i, &v)) a->lora_dropout = atof(v);
    else if (flag(s, "--block_size", argc, argv, i, &v)) a->block_size = atoll(v);
    else if (flag(s, "--batch_size", argc, argv, i, &v)) a->batch_size = atoll(v);
    else if (flag(s, "--epochs", argc, argv, i, &v)) a->epochs = atoll(v);
    else if (flag(s, "--max_steps", argc, argv, i, &v)) a->max_steps = atoll(v);
    else if (flag(s, "--lr", argc, argv, i, &v)) a->lr = atof(v);
    else if (flag(s, "--weight_decay", argc, argv, i, &v)) a->weight_decay = atof(v);
    else if (flag(s, "--warmup", argc, argv, i, &v)) a->warmup = atof(v);
    else if (flag(s, "--grad_clip", argc, argv, i, &v)) a->grad_clip = atof(v);
    else if (flag(s, "--seed", argc, argv, i, &v)) a->seed = strtoull(v, NULL, 10);
    else if (flag(s, "--log_interval", argc, argv, i, &v)) a->log_interval = atoll(v);
    else if (flag(s, "--sample_tokens", argc, argv, i, &v)) a->sample_tokens = atoll(v);
    else if (flag(s, "--temperature", argc, argv, i, &v)) a->temperature = atof(v);
    else if (flag(s, "--top_k", argc, argv, i, &v)) a->top_k = atoll(v);
    else if (flag(s, "--eval_blocks", argc, argv, i, &v)) a->eval_blocks = atoll(v);
    else if (flag(s, "--checkpoint_dir", argc, argv, i, &v)) a->checkpoint_dir = v;
    else if (flag(s, "--checkpointing_steps", argc, argv, i, &v)) a->checkpointing_steps = atoll(v);
    else if (!strcmp(s, "--resume")) a->resume = true;
    else if (!strcmp(s, "--from_scratch")) a->from_scratch = true;
    else if (!strcmp(s, "--gradient_checkpointing")) a->gradient_checkpointing = true;
    else return false;
    return true;
}

static args parse(int argc, char **argv) {
    args a = {.lora_r = 8, .lora_alpha = 16, .lora_dropout = 0.05, .block_size = 128, .batch_size = 8,
              .epochs = 1, .lr = -1, .warmup = 0.03, .grad_clip = 1.0, .seed = 42, .log_interval = 10,
              .sample_tokens = 40, .temperature = 0.8, .top_k = 40, .prompt = "A"};
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) { usage(stdout); exit(0); }
        if (parse_one(&a, s, argc, argv, &i)) continue;
        int arity = ca_config_flag_arity(s);          /* the accelerator reads these */
        if (arity < 0) {
            fprintf(stderr, "llm_finetune: unknown argument '%s'\n", s);
            usage(stderr);
            exit(2);
        }
        i += arity;
    }
    if (a.lr < 0) a.lr = a.lora_r > 0 ? 2e-4 : 5e-5;
    const char *bad = !a.model ? "--model DIR is required"
                    : a.lora_r < 0 || a.block_size < 2 || a.batch_size < 1 || a.epochs < 1 || a.eval_blocks < 0 ? "--lora_r and --eval_blocks must be >= 0, --block_size >= 2, --batch_size and --epochs >= 1"
                    : a.lr <= 0 || a.temperature <= 0 ? "--lr and --temperature must be positive"
                    : a.lora_dropout < 0 || a.lora_dropout >= 1 ? "--lora_dropout must be in [0, 1)"
                    : (a.resume || a.checkpointing_steps) && !a.checkpoint_dir ? "--resume and --checkpointing_steps need --checkpoint_dir"
                    : a.checkpointing_steps < 0 ? "--checkpointing_steps must be >= 0" : NULL;
    if (bad) {
        fprintf(stderr, "llm_finetune: %s\n", bad);
        exit(2);
    }
    return a;
}

/* ------------------------------------------------------------------ data */

typedef struct texts {
    char **v;
    int64_t n, cap;
} texts;

static void texts_add(texts *t, const char *s, size_t len) {
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 256;
        t->v = realloc(t->v, sizeof *t->v * (size_t)t->cap);
        if (!t->v) { fprintf(stderr, "llm_finetune: out of memory reading the texts\n"); exit(1); }
    }
    char *c = malloc(len + 1);
    if (!c) { fprintf(stderr, "llm_finetune: out of memory reading the texts\n"); exit(1); }
    memcpy(c, s, len);
    c[len] = '\0';
    t->v[t->n++] = c;
}

static void texts_free(texts *t) {
    for (int64_t i = 0; i < t->n; i++) free(t->v[i]);
    free(t->v);
}

/* --data FILE: one text per line (empty lines skipped). A regular file is required (a FIFO or a
 * device would block or never end). */
static texts read_lines(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "llm_finetune: --data %s: %s\n", path, errno ? strerror(errno) : "not a regular file");
        exit(1);
    }
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "llm_finetune: --data %s: %s\n", path, strerror(errno)); exit(1); }
    texts t = {0};
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        if (len > 0) texts_add(&t, line, (size_t)len);
    }
    free(line);
    fclose(f);
    return t;
}

/* The fortunes: every entry of the default collections, in file order. */
static texts read_fortunes(void) {
    const char *dir = getenv("CACCEL_FORTUNES_DIR");
    if (!dir || !*dir) dir = "/usr/share/games/fortunes";
    int nc;
    const char *const *names = ca_fortunes_default_collections(&nc);
    texts t = {0};
    for (int c = 0; c < nc; c++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[c]);
        char **e;
        int64_t ne;
        CA_CHECK(ca_fortunes_read(path, &e, &ne));
        for (int64_t k = 0; k < ne; k++) texts_add(&t, e[k], strlen(e[k]));
        ca_fortunes_free(e, ne);
    }
    return t;
}

/* Token ids of the texts, each followed by eos (when the model has one), split into the training
 * stream and the held-out one (every tenth text: a fixed split, no text in both). */
typedef struct stream {
    int64_t *ids;
    int64_t n, cap;
} stream;

static void stream_add(stream *s, const int64_t *ids, int64_t n) {
    if (s->n + n > s->cap) {
        s->cap = (s->cap + n) * 2;
        s->ids = realloc(s->ids, sizeof *s->ids * (size_t)s->cap);
        if (!s->ids) { fprintf(stderr, "llm_finetune: out of memory tokenizing\n"); exit(1); }
    }
    memcpy(s->ids + s->n, ids, sizeof *ids * (size_t)n);
    s->n += n;
}

static void tokenize_all(const ca_tokenizer *tok, const texts *t, int64_t eos, stream *train, stream *val) {
    for (int64_t i = 0; i < t->n; i++) {
        int64_t *ids, n;
        ca_status s = ca_tokenizer_tokenize(tok, t->v[i], &ids, &n);
        if (s != CA_OK) {   /* a text the tokenizer refuses (bad UTF-8) is skipped, and said */
            fprintf(stderr, "llm_finetune: text %lld skipped: %s\n", (long long)i, ca_last_error());
            continue;
        }
        stream *dst = i % 10 == 9 ? val : train;
        stream_add(dst, ids, n);
        if (eos >= 0) stream_add(dst, &eos, 1);
        free(ids);
    }
}

/* Blocks of T tokens of a stream (the tail shorter than T dropped, as group_texts does); x and y are
 * the same ids: the loss shifts the labels. */
typedef struct blocks {
    const int64_t *ids;
    int64_t n, T;
} blocks;

static int64_t blk_length(void *ctx) { return ((blocks *)ctx)->n; }

static ca_status blk_get(void *ctx, int64_t i, void *x, void *y) {
    const blocks *b = ctx;
    memcpy(x, b->ids + i * b->T, sizeof(int64_t) * (size_t)b->T);
    memcpy(y, b->ids + i * b->T, sizeof(int64_t) * (size_t)b->T);
    return CA_OK;
}

static ca_dataset *block_dataset(const stream *s, int64_t T, int64_t max_blocks, const char *what) {
    if (s->n < T) {
        fprintf(stderr, "llm_finetune: the %s texts hold %lld tokens, fewer than --block_size %lld\n", what,
                (long long)s->n, (long long)T);
        exit(1);
    }
    blocks *b = malloc(sizeof *b);
    if (!b) exit(1);
    *b = (blocks){.ids = s->ids, .n = s->n / T, .T = T};
    if (max_blocks > 0 && b->n > max_blocks) b->n = max_blocks;
    ca_sample_spec spec = {.dtype = CA_I64, .ndim = 1, .shape = {T}};
    ca_dataset *ds;
    CA_CHECK(ca_dataset_create(&(ca_dataset_ops){.struct_size = sizeof(ca_dataset_ops), .length = blk_length,
                                                 .get = blk_get, .destroy = free},
                               b, &spec, &spec, &ds));
    return ds;
}

/* ------------------------------------------------------------------ tokenizer for --from_scratch */

/* GPT-2's byte-to-character map (the printable bytes stand for themselves, the others move to
 * U+0100 onwards in byte order), which the ByteLevel pre-tokenizer and decoder use. */
static unsigned byte_char(int b) {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return (unsigned)b;
    unsigned n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) n++;
    return 256 + n;
}

static void put_json_char(FILE *f, unsigned cp) {
    if (cp == '"' || cp == '\\') fprintf(f, "\\%c", (char)cp);
    else if (cp < 0x80) fputc((int)cp, f);
    else if (cp < 0x800) fprintf(f, "%c%c", (char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F)));
    else fprintf(f, "%c%c%c", (char)(0xE0 | (cp >> 12)), (char)(0x80 | ((cp >> 6) & 0x3F)), (char)(0x80 | (cp & 0x3F)));
}

/* A byte-level BPE tokenizer.json without merges: one token per byte (ids 0..255) and the special
 * token <|endoftext|> (id 256), which transformers' PreTrainedTokenizerFast and caccel both read.
 * Written to a temporary name and renamed, so a reader never sees half a file. */
static void write_byte_tokenizer(const char *dir) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());   /* ranks may write at once */
    FILE *f = fopen(tmp, "wb");
    if (!f) { fprintf(stderr, "llm_finetune: cannot write %s: %s\n", tmp, strerror(errno)); exit(1); }
    fprintf(f, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[{\"id\":256,"
               "\"content\":\"<|endoftext|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
               "\"normalized\":false,\"special\":true}],\"normalizer\":null,"
               "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,"
               "\"use_regex\":true},\"post_processor\":null,"
               "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,"
               "\"use_regex\":true},\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
               "\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":false,"
               "\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        fputs(b ? ",\"" : "\"", f);
        put_json_char(f, byte_char(b));
        fprintf(f, "\":%d", b);
    }
    fprintf(f, ",\"<|endoftext|>\":256},\"merges\":[]}}\n");
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "llm_finetune: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

static ca_tokenizer *load_tokenizer(const args *a) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", a->model);
    struct stat st;
    if (a->from_scratch && stat(path, &st) != 0) write_byte_tokenizer(a->model);
    ca_tokenizer *tok;
    CA_CHECK(ca_tokenizer_load(path, &tok));
    return tok;
}

/* ------------------------------------------------------------------ model */

/* Splits "a,b,c" in place into at most max names. */
static int split_names(char *s, const char **out, int max) {
    int n = 0;
    for (char *tok = strtok(s, ","); tok && n < max; tok = strtok(NULL, ",")) out[n++] = tok;
    return n;
}

/* PEFT's default target modules for the family (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING). */
static const char *default_targets(const ca_causal_lm_config *cfg) {
    const char *type = ca_causal_lm_model_type(cfg->family);
    return type && !strcmp(type, "gpt2") ? "c_attn" : "q_proj,v_proj";
}

static int64_t eos_id(const ca_causal_lm_config *cfg) { return cfg->n_eos > 0 ? cfg->eos_token_ids[0] : -1; }

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

/* The model of --model: read (or, --from_scratch, initialised) and, with --lora_r, wrapped with
 * adapters (PEFT's default targets for the family unless --target_modules names them). */
static ca_module *load_model(ca_accelerator *acc, const args *a, ca_causal_lm_config *cfg) {
    CA_CHECK(ca_causal_lm_config_load(a->model, cfg));
    ca_module *m;
    bool lean = !a->from_scratch && ram_efficient_loading(acc), was = ca_init_empty_weights_enabled();
    if (lean) CA_CHECK(ca_init_empty_weights(true));
    CA_CHECK(ca_causal_lm_create(cfg, &m));
    if (!a->from_scratch) CA_CHECK(ca_causal_lm_load_pretrained(m, a->model, NULL));
    if (lean) {
        CA_CHECK(ca_init_empty_weights(was));
        ca_print(acc, "llm_finetune: fsdp_cpu_ram_efficient_loading: %s is read at ca_prepare\n", a->model);
    }
    if (a->gradient_checkpointing) {
        int n = 0;
        CA_CHECK(ca_module_checkpoint_layers(m, true, &n));
        ca_print(acc, "llm_finetune: gradient checkpointing: %d layers recompute their activations in backward\n", n);
    }
    if (a->lora_r == 0) return m;
    ca_lora_config lc;
    ca_lora_config_init(&lc);
    lc.r = a->lora_r;
    lc.lora_alpha = a->lora_alpha;
    lc.lora_dropout = a->lora_dropout;
    lc.task_type = "CAUSAL_LM";
    lc.base_model_name_or_path = a->model;
    static char buf[1024];
    static const char *names[32];
    snprintf(buf, sizeof buf, "%s", a->target_modules ? a->target_modules : default_targets(cfg));
    lc.target_modules = names;
    lc.n_target_modules = split_names(buf, names, 32);
    int wrapped = 0;
    CA_CHECK(ca_lora_apply(m, &lc, &wrapped));
    char line[160];
    ca_module_trainable_summary(m, line, sizeof line);
    ca_print(acc, "llm_finetune: LoRA r %lld, alpha %g on %d layers (%s); %s\n", (long long)a->lora_r,
             a->lora_alpha, wrapped, a->target_modules ? a->target_modules : "the family's default", line);
    return m;
}

/* AdamW over the trainable parameters: matrices decay, vectors (norms, biases) do not. */
static ca_optimizer *make_optimizer(ca_module *m, const args *a) {
    int n = ca_module_num_params(m), nd = 0, nn = 0;
    ca_tensor **decay = malloc(sizeof *decay * (size_t)n), **no_decay = malloc(sizeof *no_decay * (size_t)n);
    if (!decay || !no_decay) exit(1);
    for (int i = 0; i < n; i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        if (!ca_tensor_requires_grad(p)) continue;
        if (ca_tensor_ndim(p) >= 2) decay[nd++] = p;
        else no_decay[nn++] = p;
    }
    ca_adamw_opts o = {.lr = a->lr, .beta1 = 0.9, .beta2 = 0.999, .weight_decay = a->weight_decay,
                       .weight_decay_set = true};
    ca_optimizer *opt;
    CA_CHECK(ca_adamw_create_params(decay, nd, &o, &opt));
    o.weight_decay = 0;
    if (nn > 0) CA_CHECK(ca_optimizer_add_group(opt, no_decay, nn, &o));
    free(decay);
    free(no_decay);
    return opt;
}

/* ------------------------------------------------------------------ loop */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Sums of n (<= 4) values over ranks. */
static void reduce_sum(ca_accelerator *acc, double *v, int n) {
    CA_SCOPE {
        float f[4];
        for (int i = 0; i < n; i++) f[i] = (float)v[i];
        ca_tensor *t = ca_from_host(ca_accelerator_device(acc), CA_F32, CA_SHAPE(n), f);
        CA_CHECK(ca_reduce(acc, t, CA_OP_SUM));
        CA_CHECK(ca_tensor_to_host(t, f, sizeof(float) * (size_t)n));
        for (int i = 0; i < n; i++) v[i] = f[i];
    }
}

/* The data-parallel ranks (dp_replicate x dp_shard of the device mesh): the ranks of a tensor-parallel
 * group read the same batches, so they count once. */
static int data_parallel(ca_accelerator *acc) {
    ca_mesh_shape m;
    CA_CHECK(ca_accelerator_mesh(acc, &m, NULL));
    return m.size[CA_MESH_DP_REPLICATE] * m.size[CA_MESH_DP_SHARD];
}

/* A loss kept from a scope that has ended: read, then freed; 0 when none. */
static double read_loss(ca_tensor **t) {
    if (!*t) return 0;
    double v = ca_item(*t);
    ca_tensor_free(*t);
    *t = NULL;
    return v;
}

static int cp_size(ca_accelerator *acc) {
    ca_mesh_shape m;
    CA_CHECK(ca_accelerator_mesh(acc, &m, NULL));
    return m.size[CA_MESH_CP];
}

/* The causal-LM loss under context parallelism (parallelism_config_cp_size): the labels shifted by one
 * before the split (the shift crosses the chunks), then the ids, those labels and the global positions
 * split by ca_maybe_context_parallel; the model takes [B, 3, T / cp] (ids, no padding, positions) and the
 * loss means over the tokens of every cp rank. The caller ends the split after backward. */
static ca_tensor *cp_loss(ca_accelerator *acc, ca_module *model, const ca_batch *b) {
    int64_t B = ca_tensor_dim(b->x, 0), T = ca_tensor_dim(b->x, 1), *p = malloc(sizeof *p * (size_t)(B * T));
    if (!p) exit(1);
    for (int64_t i = 0; i < B * T; i++) p[i] = i % T;
    ca_device *dev = ca_accelerator_device(acc);
    ca_tensor *next[2] = {ca_narrow(b->y, 1, 1, T - 1), ca_full(dev, CA_I64, 2, (int64_t[]){B, 1}, -100.0)};
    ca_tensor *buf[3] = {b->x, ca_concat(2, next, 1), ca_from_host(dev, CA_I64, 2, (int64_t[]){B, T}, p)};
    free(p);
    CA_CHECK(ca_maybe_context_parallel(acc, 3, buf, (int[]){1, 1, 1}));
    int64_t t = ca_tensor_dim(buf[0], 1);
    ca_tensor *rows[3] = {buf[0], ca_full(dev, CA_I64, 2, (int64_t[]){B, t}, 1.0), buf[2]};
    ca_tensor *logits = ca_module_forward(model, ca_stack(3, rows, 1));
    ca_module *head = ca_module_child(model, "lm_head");   /* the output layer, or the tied embedding */
    if (!head) head = ca_module_child(model, "model.embed_tokens");
    int64_t v = logits ? ca_tensor_dim(logits, 2) : 0;
    return ca_tp_cross_entropy(head, ca_reshape(logits, 2, (int64_t[]){B * t, v}),
                               ca_reshape(buf[1], 1, (int64_t[]){B * t}));
}

/* Mean causal-LM loss per block over the held-out blocks (every rank's share, padding excluded). */
static double evaluate(ca_accelerator *acc, ca_module *m, ca_dataloader *dl) {
    ca_module_train(m, false);
    bool cp = cp_size(acc) > 1;
    double s[2] = {0, 0};
    ca_batch b;
    while (ca_dataloader_next(dl, &b)) {
        /* a batch of padding only still runs the forward, counted 0: under FULL_SHARD it is collective */
        int64_t real = b.size - b.num_padded, rows = real > 0 ? real : b.size;
        if (real < 0) real = 0;
        ca_tensor *loss = NULL;
        CA_NO_GRAD CA_SCOPE {
            ca_batch part = b;   /* the rows that hold data */
            part.x = ca_narrow(b.x, 0, 0, rows);
            part.y = ca_narrow(b.y, 0, 0, rows);
            /* as in training: under context parallelism each cp rank holds its part of every block */
            ca_tensor *l = cp ? cp_loss(acc, m, &part) : ca_causal_lm_loss(ca_module_forward(m, part.x), part.y);
            ca_context_parallel_end(acc);
            loss = ca_tensor_keep(ca_detach(l));
        }
        if (!loss) CA_CHECK(ca_last_status());
        s[0] += read_loss(&loss) * (double)real;
        s[1] += (double)real;
    }
    CA_CHECK(ca_dataloader_status(dl));
    ca_module_train(m, true);
    reduce_sum(acc, s, 2);
    return s[0] / s[1];
}

static ca_tensor *micro_step(ca_accelerator *acc, ca_module *model, ca_optimizer *opt, const ca_batch *b,
                             const args *a) {
    ca_tensor *l = NULL;
    bool cp = cp_size(acc) > 1;
    CA_SCOPE CA_ACCUMULATE(acc, model) {
        ca_tensor *loss = cp ? cp_loss(acc, model, b) : ca_causal_lm_loss(ca_module_forward(model, b->x), b->y);
        if (!loss) CA_CHECK(ca_last_status());
        CA_CHECK(ca_backward(acc, loss));
        ca_context_parallel_end(acc);
        if (a->grad_clip > 0 && ca_sync_gradients(acc)) CA_CHECK(ca_clip_grad_norm(acc, a->grad_clip, NULL));
        CA_CHECK(ca_optimizer_step(opt));
        ca_optimizer_zero_grad(opt);
        l = ca_tensor_keep(ca_detach(loss));
    }
    return l;
}

typedef struct run {
    ca_accelerator *acc;
    ca_module *model;
    ca_optimizer *opt;
    ca_dataloader *train, *val;
    int64_t total_steps;
    const args *a;
} run;

/* One epoch (or what is left of --max_steps); logs every log_interval steps. Returns the epoch's
 * mean training loss. */
static double train_epoch(run *r, int64_t epoch) {
    double sum[3] = {0, 0, 0}, tot[2] = {0, 0}, t0 = now_s();
    ca_batch b;
    ca_tensor *loss = NULL;
    int64_t T = r->a->block_size;
    while (ca_optimizer_steps(r->opt) < r->total_steps && ca_dataloader_next(r->train, &b)) {
        double l = read_loss(&loss);
        sum[0] += l, tot[0] += l;
        int64_t before = ca_optimizer_steps(r->opt);
        loss = micro_step(r->acc, r->model, r->opt, &b, r->a);
        sum[1] += 1, tot[1] += 1;
        sum[2] += (double)b.size;
        CA_CHECK(ca_throughput_step(r->acc, b.size, b.size * T));   /* a token: a position of a block */
        int64_t step = ca_optimizer_steps(r->opt);
        if (step != before && r->a->checkpointing_steps && step % r->a->checkpointing_steps == 0) {
            CA_CHECK(ca_throughput_pause(r->acc));   /* the save is not training throughput */
            CA_CHECK(ca_save_state(r->acc, NULL));
            CA_CHECK(ca_throughput_resume(r->acc));
            ca_print(r->acc, "step %lld: state saved under %s/checkpoints\n", (long long)step, r->a->checkpoint_dir);
        }
        if (step == before || r->a->log_interval <= 0 || step % r->a->log_interval) continue;
        double last = read_loss(&loss);
        sum[0] += last, tot[0] += last;
        reduce_sum(r->acc, sum, 3);
        sum[2] /= (double)ca_num_processes(r->acc) / data_parallel(r->acc);   /* a tp group's samples count once */
        double secs = now_s() - t0, m = sum[0] / sum[1];
        ca_print(r->acc, "epoch %lld step %lld/%lld: loss %.6f, perplexity %.2f, lr %.2e, %.0f tokens/s\n",
                 (long long)epoch, (long long)step, (long long)r->total_steps, m, exp(m),
                 ca_optimizer_get_lr(r->opt, 0), sum[2] * (double)T / secs);
        sum[0] = sum[1] = sum[2] = 0;
        t0 = now_s();
        ca_throughput th;   /* achieved FLOP/s and MFU; none when the interval held only the warm-up step */
        if (ca_throughput_report(r->acc, &th) == CA_OK) CA_CHECK(ca_throughput_log(r->acc, &th));
        else ca_clear_error();
    }
    CA_CHECK(ca_dataloader_status(r->train));
    tot[0] += read_loss(&loss);
    reduce_sum(r->acc, tot, 2);
    return tot[1] > 0 ? tot[0] / tot[1] : NAN;
}

/* ------------------------------------------------------------------ sampling */

/* splitmix64: the sampler's own generator, so that a sample depends on --seed only. */
static double uniform(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* One token from the last position's logits (row, V entries; scratch holds V floats): temperature,
 * top-k, then a draw (transformers' TemperatureLogitsWarper and TopKLogitsWarper, then multinomial). */
static int64_t sample_token(float *row, float *scratch, int64_t V, const args *a, uint64_t *rng) {
    for (int64_t i = 0; i < V; i++) scratch[i] = row[i] = row[i] / (float)a->temperature;
    float cut = -INFINITY, mx = -INFINITY;
    if (a->top_k > 0 && a->top_k < V) {
        qsort(scratch, (size_t)V, sizeof(float), cmp_desc);
        cut = scratch[a->top_k - 1];
    }
    for (int64_t i = 0; i < V; i++) mx = fmaxf(mx, row[i]);
    double sum = 0;
    for (int64_t i = 0; i < V; i++) sum += row[i] = row[i] >= cut ? expf(row[i] - mx) : 0.0f;
    double u = uniform(rng) * sum;
    int64_t k = -1;
    for (int64_t i = 0; i < V; i++) {
        if (row[i] > 0) k = i;   /* rounding may leave u >= 0: then the last candidate */
        if ((u -= row[i]) < 0) break;
    }
    return k;
}

/* The logits of the last of n ids (at most the model's context) into row. */
static void last_logits(ca_accelerator *acc, ca_module *m, const int64_t *ids, int64_t n, int64_t ctx, float *row,
                        int64_t V) {
    int64_t T = n < ctx ? n : ctx;
    CA_NO_GRAD CA_SCOPE {
        ca_tensor *x = ca_from_host(ca_accelerator_device(acc), CA_I64, CA_SHAPE(1, T), ids + n - T);
        ca_tensor *last = ca_contiguous(ca_cast(ca_narrow(ca_module_forward(m, x), 1, T - 1, 1), CA_F32));
        if (!last) CA_CHECK(ca_last_status());
        CA_CHECK(ca_tensor_to_host(last, row, sizeof(float) * (size_t)V));
    }
}

/* Two continuations of --prompt (main process only: the forward passes use no collectives, the parameters
 * being summoned whole, tensor-parallel ones too). */
static void generate(ca_accelerator *acc, ca_module *m, const ca_tokenizer *tok, const ca_causal_lm_config *cfg,
                     const args *a) {
    int64_t *prompt, np, V = cfg->vocab_size, ctx = a->block_size, eos = eos_id(cfg);
    CA_CHECK(ca_tokenizer_tokenize(tok, a->prompt, &prompt, &np));
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(np + a->sample_tokens + 1));
    float *row = malloc(sizeof(float) * (size_t)V), *scratch = malloc(sizeof(float) * (size_t)V);
    if (!ids || !row || !scratch) exit(1);
    uint64_t rng = a->seed;
    ca_module_train(m, false);
    for (int s = 0; s < 2; s++) {
        int64_t n = 0;
        if (cfg->bos_token_id >= 0) ids[n++] = cfg->bos_token_id;
        if (np) memcpy(ids + n, prompt, sizeof(int64_t) * (size_t)np);
        n += np;
        if (n == 0) ids[n++] = eos >= 0 ? eos : 0;
        int64_t start = n;
        for (int64_t k = 0; k < a->sample_tokens; k++) {
            last_logits(acc, m, ids, n, ctx, row, V);
            ids[n] = sample_token(row, scratch, V, a, &rng);
            if (ids[n++] == eos) break;
        }
        char *text;
        CA_CHECK(ca_tokenizer_decode(tok, ids + start - np, n - start + np, true, &text));
        ca_print(acc, "sample %d (temperature %.2f, top-k %lld): %s\n", s + 1, a->temperature,
                 (long long)a->top_k, text);
        free(text);
    }
    ca_module_train(m, true);
    free(prompt);
    free(ids);
    free(row);
    free(scratch);
}

/* ------------------------------------------------------------------ main */

/* tokenizer.json beside the saved model, so the directory is a whole checkpoint (written to a
 * temporary name and renamed). */
static void copy_tokenizer(const char *from, const char *to) {
    char src[4096], dst[4096], tmp[4200];
    snprintf(src, sizeof src, "%s/tokenizer.json", from);
    snprintf(dst, sizeof dst, "%s/tokenizer.json", to);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", dst, (long)getpid());
    FILE *in = fopen(src, "rb"), *out = in ? fopen(tmp, "wb") : NULL;
    char buf[65536];
    size_t n;
    bool ok = in && out;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = false;
    if (!ok || rename(tmp, dst) != 0) {
        fprintf(stderr, "llm_finetune: cannot copy %s to %s: %s\n", src, dst, strerror(errno));
        remove(tmp);
        exit(1);
    }
}

static void save(ca_accelerator *acc, ca_module *model, const args *a) {
    if (ca_is_main_process(acc) && mkdir(a->output_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "llm_finetune: cannot create --output_dir %s: %s\n", a->output_dir, strerror(errno));
        exit(1);
    }
    CA_CHECK(ca_wait_for_everyone(acc));
    if (a->lora_r > 0) {   /* the adapters: every rank holds them whole (they are gathered above) */
        if (ca_is_main_process(acc)) CA_CHECK(ca_lora_save(model, a->output_dir));
        ca_print(acc, "adapter saved to %s (adapter_model.safetensors, adapter_config.json)\n", a->output_dir);
    } else {
        CA_CHECK(ca_save_model(acc, model, a->output_dir, 0));   /* every rank calls it */
        if (ca_is_main_process(acc)) {
            CA_CHECK(ca_causal_lm_save_config(model, a->output_dir));
            copy_tokenizer(a->model, a->output_dir);
        }
        ca_print(acc, "model saved to %s in Hugging Face's layout\n", a->output_dir);
    }
}

/* --resume: the newest complete checkpoint of --checkpoint_dir (model, optimizer, schedule, RNG
 * and the dataloader's position), or a fresh start when there is none yet. */
static void resume(run *r) {
    char path[4096];
    snprintf(path, sizeof path, "%s/checkpoints", r->a->checkpoint_dir);
    struct stat st;
    if (stat(path, &st) != 0) {
        ca_print(r->acc, "llm_finetune: no checkpoint under %s yet: starting from the beginning\n", path);
        return;
    }
    CA_CHECK(ca_load_state(r->acc, NULL));
    ca_print(r->acc, "resumed from %s at step %lld\n", path, (long long)ca_optimizer_steps(r->opt));
}

static int64_t plan_steps(run *r) {
    int64_t ga = ca_accelerator_settings(r->acc)->gradient_accumulation_steps;
    int64_t per_epoch = ca_dataloader_num_batches(r->train) / (ga < 1 ? 1 : ga);
    if (per_epoch < 1) per_epoch = 1;
    /* --max_steps, when given, wins over --epochs (transformers' Trainer: max_steps overrides num_train_epochs) */
    return r->a->max_steps > 0 ? r->a->max_steps : r->a->epochs * per_epoch;
}

static void train(run *r, const ca_tokenizer *tok, const ca_causal_lm_config *cfg) {
    const args *a = r->a;
    CA_CHECK(ca_prepare(r->acc, r->model, r->opt, r->train));
    CA_CHECK(ca_prepare_dataloader(r->acc, r->val));
    if (data_parallel(r->acc) < ca_num_processes(r->acc))   /* base_model_tp_plan split the layers at prepare */
        printf("llm_finetune: rank %d holds %lld parameters (its tensor-parallel slices)\n", ca_process_index(r->acc),
               (long long)ca_module_param_count(r->model));
    r->total_steps = plan_steps(r);
    int64_t sched = r->total_steps * data_parallel(r->acc);   /* a prepared schedule counts per data-parallel rank */
    CA_CHECK(ca_optimizer_set_schedule(r->opt, &(ca_lr_schedule){.kind = CA_SCHED_LINEAR,
                                                                  .warmup_steps = (int64_t)(a->warmup * (double)sched),
                                                                  .total_steps = sched}));
    if (a->resume) resume(r);
    double v0 = evaluate(r->acc, r->model, r->val), t0 = now_s();
    ca_print(r->acc, "%s: held-out loss %.4f, perplexity %.2f\n",
             ca_optimizer_steps(r->opt) ? "resumed" : "before training", v0, exp(v0));
    for (int64_t e = ca_dataloader_epoch(r->train) + 1; ca_optimizer_steps(r->opt) < r->total_steps; e++) {
        double tl = train_epoch(r, e);
        CA_CHECK(ca_throughput_pause(r->acc));   /* the next epoch's steps resume it */
        double vl = evaluate(r->acc, r->model, r->val);
        CA_CHECK(ca_throughput_resume(r->acc));
        ca_print(r->acc, "epoch %lld: train loss %.4f (perplexity %.2f), held-out loss %.4f (perplexity %.2f)\n",
                 (long long)e, tl, exp(tl), vl, exp(vl));
    }
    ca_print(r->acc, "trained %lld steps in %.1f s\n", (long long)ca_optimizer_steps(r->opt), now_s() - t0);
    /* under stage 3 and tensor parallelism every process gathers the whole parameters for generation and the
     * adapter's save */
    if (a->sample_tokens > 0 || (a->output_dir && a->lora_r > 0)) CA_CHECK(ca_summon_full_params(r->acc, true));
    if (a->sample_tokens > 0 && ca_is_main_process(r->acc)) generate(r->acc, r->model, tok, cfg, a);
    if (a->output_dir && a->lora_r > 0) save(r->acc, r->model, a);
    if (a->sample_tokens > 0 || (a->output_dir && a->lora_r > 0)) CA_CHECK(ca_summon_full_params(r->acc, false));
    if (a->output_dir && a->lora_r == 0) save(r->acc, r->model, a);
}

int main(int argc, char **argv) {
    args a = parse(argc, argv);
    ca_accelerator *acc;
    char project[4096];   /* --checkpoint_dir: the run's project_dir, with automatic checkpoint naming */
    snprintf(project, sizeof project, "project_dir=%s", a.checkpoint_dir ? a.checkpoint_dir : "");
    const char *const ck_settings[] = {project, "automatic_checkpoint_naming=true", NULL};
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv,
                                                 .settings = a.checkpoint_dir ? ck_settings : NULL}, &acc));
    CA_CHECK(ca_set_seed(acc, a.seed));
    ca_tokenizer *tok = load_tokenizer(&a);
    ca_causal_lm_config cfg;
    ca_module *model = load_model(acc, &a, &cfg);
    texts t = a.data ? read_lines(a.data) : read_fortunes();
    stream tr = {0}, va = {0};
    tokenize_all(tok, &t, eos_id(&cfg), &tr, &va);
    texts_free(&t);
    ca_dataset *train_ds = block_dataset(&tr, a.block_size, 0, "training"),
               *val_ds = block_dataset(&va, a.block_size, a.eval_blocks, "held-out");
    ca_print(acc, "llm_finetune: %s (%lld parameters) on %d process(es), %s; %lld training and %lld held-out "
                  "blocks of %lld tokens\n", a.model, (long long)ca_module_param_count(model), ca_num_processes(acc),
             ca_device_name(ca_accelerator_device(acc)), (long long)ca_dataset_length(train_ds),
             (long long)ca_dataset_length(val_ds), (long long)a.block_size);
    run r = {.acc = acc, .model = model, .a = &a};
    CA_CHECK(ca_dataloader_create(train_ds, &(ca_loader_opts){.batch_size = a.batch_size, .shuffle = true,
                                                             .drop_last = true}, &r.train));
    CA_CHECK(ca_dataloader_create(val_ds, &(ca_loader_opts){.batch_size = a.batch_size}, &r.val));
    r.opt = make_optimizer(model, &a);
    train(&r, tok, &cfg);
    CA_CHECK(ca_wait_for_everyone(acc));
    ca_dataloader_destroy(r.train);
    ca_dataloader_destroy(r.val);
    ca_optimizer_destroy(r.opt);
    ca_dataset_destroy(train_ds);
    ca_dataset_destroy(val_ds);
    ca_module_destroy(model);
    ca_tokenizer_destroy(tok);
    free(tr.ids);
    free(va.ids);
    ca_accelerator_destroy(acc);
    ca_scope_release_all();
    ca_shutdown();
    return 0;
}
