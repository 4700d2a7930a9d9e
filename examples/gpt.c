/* A GPT-style decoder trained from scratch as a byte-level language model on Debian's fortunes:
 * token + learned position embeddings, pre-LayerNorm blocks with causal self-attention and a
 * GELU (tanh) MLP, a final LayerNorm and an output layer tied to the token embedding. The same
 * program runs on one process, under `caccel launch` or mpirun, or on a GPU; the shape flags set
 * GPT-2-124M's (--n_layer 12 --n_head 12 --n_embd 768 --block_size 1024 --vocab_size 50304).
 * Parameter names are nanoGPT's (transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ...),
 * so PyTorch loads a saved model with load_state_dict (docs/GPT.md). */
#include <caccel/caccel.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef struct args {
    int n_layer, n_head;
    int64_t n_embd, block_size, vocab_size;
    double dropout;
    int64_t batch_size, max_steps, log_interval, eval_interval, eval_samples;
    double lr, min_lr_ratio, warmup, weight_decay, grad_clip, init_std;
    uint64_t seed;
    const char *data;          /* directory of fortune files */
    int64_t sample_tokens, top_k;
    double temperature;
    const char *prompt;
    const char *output_dir;    /* save the trained model (model.safetensors) */
    const char *parity_dir;    /* write weights, one batch's logits, loss and gradients; no training */
    bool gradient_checkpointing;   /* recompute each block's activations in backward */
    bool sequence_parallel;    /* under tensor parallelism, the norms and the residual stream on 1/tp of the tokens */
    int tp;                    /* parallelism_config_tp_size (set by main) */
} args;

static void usage(FILE *f) {
    fprintf(f,
            "usage: gpt [--n_layer N] [--n_head N] [--n_embd N] [--block_size T] [--vocab_size V]\n"
            "           [--dropout P] [--batch_size B] [--max_steps N] [--lr X] [--min_lr_ratio X]\n"
            "           [--warmup FRACTION] [--weight_decay X] [--grad_clip X] [--init_std X] [--seed N]\n"
            "           [--log_interval N] [--eval_interval N] [--eval_samples N] [--data DIR]\n"
            "           [--sample_tokens N] [--temperature X] [--top_k K] [--prompt TEXT]\n"
            "           [--output_dir DIR] [--parity_dir DIR] [--gradient_checkpointing] [--sequence_parallel]\n"
            "           [configuration flags]\n"
            "Tokens are bytes (0..255); --vocab_size (at least 256) only sizes the embedding, so\n"
            "GPT-2's 50304 can be set for benchmarks. --data: a directory of fortune files (default\n"
            "$CACCEL_FORTUNES_DIR, else /usr/share/games/fortunes). Configuration flags are\n"
            "Accelerate's (--cpu, --mixed_precision bf16, --gradient_accumulation_steps N, ...):\n"
            "see `caccel --help` and docs/CONFIGURATION.md. Defaults: 4 layers, 4 heads, 128\n"
            "channels, block 64, batch 32, 600 steps of AdamW at lr 4e-3 (5%% warm-up, cosine to\n"
            "10%%), dropout 0. --gradient_checkpointing keeps only each block's input during\n"
            "forward and recomputes the block in backward (less memory, about one more forward).\n"
            "--sequence_parallel (with parallelism_config_tp_size above 1, Megatron's): the LayerNorms\n"
            "and the residual stream hold 1/tp of the tokens on each rank (each dropping its tokens'\n"
            "part of one process's masks).\n"
            "docs/GPT.md describes the model.\n");
}

static bool flag(const char *arg, const char *name, int argc, char **argv, int *i, const char **val) {
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return false;
    if (arg[n] == '=') { *val = arg + n + 1; return true; }
    if (arg[n] != '\0') return false;
    if (*i + 1 >= argc) {
        fprintf(stderr, "gpt: %s needs a value\n", name);
        exit(2);
    }
    *val = argv[++*i];
    return true;
}

static args parse(int argc, char **argv) {
    /* defaults: about 2 CPU-minutes on 2 vCPUs to a validation loss near 2.07 (docs/GPT.md) */
    args a = {.n_layer = 4, .n_head = 4, .n_embd = 128, .block_size = 64, .vocab_size = 256,
              .batch_size = 32, .max_steps = 600, .log_interval = 50, .eval_interval = 200,
              .eval_samples = 128, .lr = 4e-3, .min_lr_ratio = 0.1, .warmup = 0.05,
              .weight_decay = 0.1, .grad_clip = 1.0, .init_std = 0.02, .seed = 1337, .sample_tokens = 300,
              .top_k = 40, .temperature = 0.8, .prompt = "\n"};
    for (int i = 1; i < argc; i++) {
        const char *v, *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) { usage(stdout); exit(0); }
        else if (flag(s, "--n_layer", argc, argv, &i, &v)) a.n_layer = atoi(v);
        else if (flag(s, "--n_head", argc, argv, &i, &v)) a.n_head = atoi(v);
        else if (flag(s, "--n_embd", argc, argv, &i, &v)) a.n_embd = atoll(v);
        else if (flag(s, "--block_size", argc, argv, &i, &v)) a.block_size = atoll(v);
        else if (flag(s, "--vocab_size", argc, argv, &i, &v)) a.vocab_size = atoll(v);
        else if (flag(s, "--dropout", argc, argv, &i, &v)) a.dropout = atof(v);
        else if (flag(s, "--batch_size", argc, argv, &i, &v)) a.batch_size = atoll(v);
        else if (flag(s, "--max_steps", argc, argv, &i, &v)) a.max_steps = atoll(v);
        else if (flag(s, "--lr", argc, argv, &i, &v)) a.lr = atof(v);
        else if (flag(s, "--min_lr_ratio", argc, argv, &i, &v)) a.min_lr_ratio = atof(v);
        else if (flag(s, "--warmup", argc, argv, &i, &v)) a.warmup = atof(v);
        else if (flag(s, "--weight_decay", argc, argv, &i, &v)) a.weight_decay = atof(v);
        else if (flag(s, "--grad_clip", argc, argv, &i, &v)) a.grad_clip = atof(v);
        else if (flag(s, "--init_std", argc, argv, &i, &v)) a.init_std = atof(v);
        else if (flag(s, "--seed", argc, argv, &i, &v)) a.seed = strtoull(v, NULL, 10);
        else if (flag(s, "--log_interval", argc, argv, &i, &v)) a.log_interval = atoll(v);
        else if (flag(s, "--eval_interval", argc, argv, &i, &v)) a.eval_interval = atoll(v);
        else if (flag(s, "--eval_samples", argc, argv, &i, &v)) a.eval_samples = atoll(v);
        else if (flag(s, "--data", argc, argv, &i, &v)) a.data = v;
        else if (flag(s, "--sample_tokens", argc, argv, &i, &v)) a.sample_tokens = atoll(v);
        else if (flag(s, "--temperature", argc, argv, &i, &v)) a.temperature = atof(v);
        else if (flag(s, "--top_k", argc, argv, &i, &v)) a.top_k = atoll(v);
        else if (flag(s, "--prompt", argc, argv, &i, &v)) a.prompt = v;
        else if (flag(s, "--output_dir", argc, argv, &i, &v)) a.output_dir = v;
        else if (flag(s, "--parity_dir", argc, argv, &i, &v)) a.parity_dir = v;
        else if (!strcmp(s, "--gradient_checkpointing")) a.gradient_checkpointing = true;
        else if (!strcmp(s, "--sequence_parallel")) a.sequence_parallel = true;
        else {
            int arity = ca_config_flag_arity(s);          /* the accelerator reads these */
            if (arity < 0) {
                fprintf(stderr, "gpt: unknown argument '%s'\n", s);
                usage(stderr);
                exit(2);
            }
            i += arity;
        }
    }
    const char *bad = a.n_layer < 1 || a.n_head < 1 || a.n_embd < 1 || a.block_size < 1 ? "the shape flags must be positive"
                    : a.n_embd % a.n_head ? "--n_embd must be a multiple of --n_head"
                    : a.vocab_size < 256 ? "--vocab_size must be at least 256 (tokens are bytes)"
                    : a.batch_size < 1 || a.max_steps < 1 || a.lr <= 0 ? "--batch_size, --max_steps and --lr must be positive"
                    : a.dropout < 0 || a.dropout >= 1 ? "--dropout must be in [0, 1)"
                    : a.temperature <= 0 ? "--temperature must be positive" : NULL;
    if (bad) {
        fprintf(stderr, "gpt: %s\n", bad);
        exit(2);
    }
    return a;
}

/* ------------------------------------------------------------------ data */

/* The corpus: every fortune file of the directory (names without an extension, sorted), each
 * entry followed by "\n%\n" as in the files. Entry k of a file is held out when k % 10 == 9: a
 * fixed split without random state, no entry in both. */
typedef struct corpus {
    uint8_t *train, *val;
    int64_t n_train, n_val;
    int files;
} corpus;

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void append(uint8_t **buf, int64_t *n, int64_t *cap, const char *s, size_t len) {
    if (*n + (int64_t)len > *cap) {
        *cap = (*cap + (int64_t)len) * 2;
        *buf = realloc(*buf, (size_t)*cap);
        if (!*buf) { fprintf(stderr, "gpt: out of memory reading the corpus\n"); exit(1); }
    }
    memcpy(*buf + *n, s, len);
    *n += (int64_t)len;
}

static corpus read_corpus(const char *dir) {
    if (!dir) dir = getenv("CACCEL_FORTUNES_DIR");
    if (!dir || !*dir) dir = "/usr/share/games/fortunes";
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "gpt: cannot open the fortunes directory %s: %s (apt-get install fortunes, or --data DIR)\n",
                dir, strerror(errno));
        exit(1);
    }
    char **names = NULL;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || strchr(e->d_name, '.')) continue;     /* .dat indexes, .u8 links */
        names = realloc(names, sizeof *names * (size_t)(n + 1));
        if (!names || !(names[n++] = strdup(e->d_name))) { fprintf(stderr, "gpt: out of memory\n"); exit(1); }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    corpus c = {.files = n};
    int64_t cap_t = 0, cap_v = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) { c.files--; free(names[i]); continue; }
        char **entries;
        int64_t ne;
        CA_CHECK(ca_fortunes_read(path, &entries, &ne));
        for (int64_t k = 0; k < ne; k++) {
            bool held = k % 10 == 9;
            append(held ? &c.val : &c.train, held ? &c.n_val : &c.n_train, held ? &cap_v : &cap_t,
                   entries[k], strlen(entries[k]));
            append(held ? &c.val : &c.train, held ? &c.n_val : &c.n_train, held ? &cap_v : &cap_t, "\n%\n", 3);
        }
        ca_fortunes_free(entries, ne);
        free(names[i]);
    }
    free(names);
    if (c.files == 0) {
        fprintf(stderr, "gpt: no fortune files in %s (apt-get install fortunes, or --data DIR)\n", dir);
        exit(1);
    }
    return c;
}

/* Windows of block_size + 1 bytes: x = bytes [s, s+T), y = [s+1, s+T+1). Window i starts at
 * i * stride; the training set uses stride T (disjoint targets), the validation subset spreads a
 * fixed number of windows over the whole held-out text. */
typedef struct windows {
    const uint8_t *bytes;
    int64_t n, stride, T;
} windows;

static int64_t win_length(void *ctx) { return ((windows *)ctx)->n; }

static ca_status win_get(void *ctx, int64_t i, void *x, void *y) {
    const windows *w = ctx;
    const uint8_t *p = w->bytes + i * w->stride;
    int64_t *xi = x, *yi = y;
    for (int64_t t = 0; t < w->T; t++) {
        xi[t] = p[t];
        yi[t] = p[t + 1];
    }
    return CA_OK;
}

static ca_dataset *window_dataset(const uint8_t *bytes, int64_t len, int64_t T, int64_t max_windows) {
    if (len < T + 1) {
        fprintf(stderr, "gpt: %lld bytes of text are fewer than --block_size + 1\n", (long long)len);
        exit(1);
    }
    windows *w = malloc(sizeof *w);
    if (!w) exit(1);
    int64_t span = len - T - 1;    /* last possible start */
    *w = (windows){.bytes = bytes, .T = T, .stride = T, .n = span / T + 1};
    if (max_windows > 0 && w->n > max_windows) {
        w->n = max_windows;
        w->stride = max_windows > 1 ? span / (max_windows - 1) : 0;
    }
    ca_sample_spec spec = {.dtype = CA_I64, .ndim = 1, .shape = {T}};
    ca_dataset *ds;
    CA_CHECK(ca_dataset_create(&(ca_dataset_ops){.struct_size = sizeof(ca_dataset_ops), .length = win_length,
                                                 .get = win_get, .destroy = free},
                               w, &spec, &spec, &ds));
    return ds;
}

/* ------------------------------------------------------------------ model */

typedef struct gpt gpt;

typedef struct block {
    const gpt *g;              /* the owner (a checkpointed block's context) */
    ca_module *module;         /* "transformer.h.N" (checkpointed when marked) */
    ca_module *ln_1, *c_attn, *attn_proj, *ln_2, *c_fc, *mlp_proj;
} block;

struct gpt {
    args a;
    ca_module *wte, *wpe, *ln_f;
    block *h;
    int64_t *positions;        /* 0 .. block_size-1 */
};

static void gpt_free(void *p) {
    gpt *g = p;
    free(g->h);
    free(g->positions);
    free(g);
}

static ca_module *container(const char *type) {
    ca_module *m;
    CA_CHECK(ca_module_create(type, NULL, NULL, NULL, &m));
    return m;
}

static ca_module *add(ca_module *parent, const char *name, ca_module *child) {
    CA_CHECK(ca_module_add(parent, name, child));
    return child;
}

static ca_module *linear(ca_module *parent, const char *name, int64_t in, int64_t out) {
    ca_module *l;
    CA_CHECK(ca_linear_create(in, out, true, &l));
    return add(parent, name, l);
}

static ca_module *layer_norm(ca_module *parent, const char *name, int64_t dim) {
    ca_module *l;
    CA_CHECK(ca_layer_norm_create(dim, 1e-5, &l));
    return add(parent, name, l);
}

static bool training(const gpt *g) { return ca_module_is_training(g->wte); }

/* Under tensor parallelism (parallelism_config_tp_size) c_attn gives this rank's heads only: the channels
 * and heads are taken from its output. */
static ca_tensor *attention(const gpt *g, const block *b, ca_tensor *x) {
    ca_tensor *qkv = ca_module_forward(b->c_attn, x), *p[3];
    if (!qkv) return NULL;
    int64_t B = ca_tensor_dim(qkv, 0), T = ca_tensor_dim(qkv, 1);   /* all the tokens (sequence-parallel: x has 1/tp) */
    int64_t C = ca_tensor_dim(qkv, 2) / 3, H = g->a.n_head * C / g->a.n_embd;
    if (ca_split(qkv, 2, 3, (int64_t[]){C, C, C}, p) != CA_OK) return NULL;
    for (int i = 0; i < 3; i++)   /* [B, T, C] -> [B, H, T, D] */
        p[i] = ca_transpose(ca_reshape(p[i], CA_SHAPE(B, T, H, C / H)), 1, 2);
    /* at tp each rank drops what one process drops for its heads (the dropouts after the rowwise layers
     * and the embedding see the whole activations, the same on every rank: the same mask; under
     * --sequence_parallel the rowwise layers' outputs are the rank's tokens, which drop as those tokens of
     * one process's mask) */
    double drop = training(g) ? g->a.dropout : 0.0;
    int64_t h0, heads;
    if (ca_tp_heads(b->c_attn, H, &h0, &heads) != CA_OK) return NULL;
    ca_tensor *y = ca_scaled_dot_product_attention_heads(p[0], p[1], p[2], NULL, true, drop, 0.0, h0, heads);
    y = ca_reshape(ca_contiguous(ca_transpose(y, 1, 2)), CA_SHAPE(B, T, C));
    return ca_tp_sequence_dropout(b->attn_proj, ca_module_forward(b->attn_proj, y), g->a.dropout, training(g));
}

static ca_tensor *mlp(const gpt *g, const block *b, ca_tensor *x) {
    ca_tensor *h = ca_gelu(ca_module_forward(b->c_fc, x));
    return ca_tp_sequence_dropout(b->mlp_proj, ca_module_forward(b->mlp_proj, h), g->a.dropout, training(g));
}

static ca_tensor *block_forward(const gpt *g, const block *b, ca_tensor *x) {
    x = ca_add(x, attention(g, b, ca_module_forward(b->ln_1, x)));
    return ca_add(x, mlp(g, b, ca_module_forward(b->ln_2, x)));
}

/* ctx: the block, which lives as long as the model (backward reruns this). */
static ca_status checkpointed_block(void *ctx, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out) {
    (void)n_in;
    (void)n_out;
    const block *b = ctx;
    out[0] = block_forward(b->g, b, in[0]);
    return out[0] ? CA_OK : ca_last_status();
}

/* --gradient_checkpointing marks every block: its activations are recomputed in backward. */
static ca_tensor *run_block(const gpt *g, const block *b, ca_tensor *x) {
    if (!ca_module_checkpointing(b->module)) return block_forward(g, b, x);
    ca_tensor *y = NULL;
    (void)g;
    return ca_checkpoint(checkpointed_block, (void *)b, 1, &x, 1, &y) == CA_OK ? y : NULL;
}

/* Under context parallelism (parallelism_config_cp_size) the global positions of the tokens this rank
 * holds, split with the batch by ca_maybe_context_parallel; NULL: 0 .. T-1. */
static ca_tensor *split_positions;

/* idx [B, T] (i64 bytes) -> logits [B, T, vocab_size], under tensor parallelism this rank's vocabulary
 * slice [B, T, vocab_size / tp] (the tied token embedding's rows it holds). */
static ca_tensor *gpt_forward(ca_module *self, ca_tensor *idx, void *ctx) {
    (void)self;
    const gpt *g = ctx;
    int64_t T = ca_tensor_dim(idx, 1);
    if (T > g->a.block_size) {
        ca_error(CA_ERR_INVALID, "gpt: sequence of %lld tokens is longer than block_size %lld",
                 (long long)T, (long long)g->a.block_size);
        return NULL;
    }
    ca_tensor *pos = split_positions ? split_positions
                                     : ca_from_host(ca_tensor_device(idx), CA_I64, CA_SHAPE(T), g->positions);
    ca_tensor *x = ca_add(ca_module_forward(g->wte, idx), ca_module_forward(g->wpe, pos));
    x = ca_dropout(x, g->a.dropout, training(g));
    /* --sequence_parallel: each tp rank runs the blocks' norms and residual stream on its tokens (the
     * sequence padded to a multiple of tp: causal attention keeps the padding out of the real tokens) */
    int64_t pad = g->a.sequence_parallel ? (g->a.tp - T % g->a.tp) % g->a.tp : 0;
    if (pad && x) {
        ca_tensor *zeros = ca_zeros(ca_tensor_device(x), ca_tensor_dtype(x), CA_SHAPE(ca_tensor_dim(x, 0), pad, g->a.n_embd));
        x = ca_concat(2, (ca_tensor *[]){x, zeros}, 1);
    }
    x = ca_tp_sequence_split(g->wte, x);
    for (int l = 0; l < g->a.n_layer; l++) x = run_block(g, &g->h[l], x);
    x = ca_tp_sequence_gather(g->wte, ca_module_forward(g->ln_f, x));
    if (pad && x) x = ca_narrow(x, 1, 0, T);
    return ca_embedding_attend(g->wte, x);   /* tied to the token embedding */
}

/* GPT-2's initialisation: weights N(0, 0.02) (--init_std), the projections into the residual
 * stream N(0, 0.02 / sqrt(2 n_layer)), biases 0; LayerNorm 1 and 0. */
static void init_normal(ca_tensor *p, double std) {
    CA_SCOPE {
        ca_tensor *r = ca_rand_normal(ca_tensor_device(p), CA_F32, ca_tensor_ndim(p), ca_tensor_shape(p), 0.0f, (float)std);
        CA_CHECK(r ? ca_tensor_copy_(p, r) : CA_ERR_NOMEM);
    }
}

static void init_linear(ca_module *l, double std) {
    init_normal(ca_module_param(l, "weight"), std);
    CA_SCOPE {
        ca_tensor *b = ca_module_param(l, "bias");
        CA_CHECK(ca_tensor_copy_(b, ca_zeros(ca_tensor_device(b), CA_F32, ca_tensor_ndim(b), ca_tensor_shape(b))));
    }
}

static ca_module *build_gpt(const args *a) {
    gpt *g = calloc(1, sizeof *g);
    if (!g) exit(1);
    g->a = *a;
    g->h = calloc((size_t)a->n_layer, sizeof *g->h);
    g->positions = malloc(sizeof(int64_t) * (size_t)a->block_size);
    if (!g->h || !g->positions) exit(1);
    for (int64_t t = 0; t < a->block_size; t++) g->positions[t] = t;
    ca_module *root, *tr, *hs, *l;
    CA_CHECK(ca_module_create("GPT", gpt_forward, g, gpt_free, &root));
    tr = add(root, "transformer", container("ModuleDict"));
    CA_CHECK(ca_embedding_create(a->vocab_size, a->n_embd, &l));  g->wte = add(tr, "wte", l);
    CA_CHECK(ca_embedding_create(a->block_size, a->n_embd, &l));  g->wpe = add(tr, "wpe", l);
    hs = add(tr, "h", container("ModuleList"));
    double std = a->init_std, proj_std = std / sqrt(2.0 * a->n_layer);
    for (int i = 0; i < a->n_layer; i++) {
        block *b = &g->h[i];
        ca_module *blk = add(hs, NULL, container("Block"));
        b->module = blk;
        b->g = g;
        b->ln_1 = layer_norm(blk, "ln_1", a->n_embd);
        ca_module *at = add(blk, "attn", container("CausalSelfAttention"));
        b->c_attn = linear(at, "c_attn", a->n_embd, 3 * a->n_embd);
        b->attn_proj = linear(at, "c_proj", a->n_embd, a->n_embd);
        b->ln_2 = layer_norm(blk, "ln_2", a->n_embd);
        ca_module *m = add(blk, "mlp", container("MLP"));
        b->c_fc = linear(m, "c_fc", a->n_embd, 4 * a->n_embd);
        b->mlp_proj = linear(m, "c_proj", 4 * a->n_embd, a->n_embd);
        init_linear(b->c_attn, std);
        init_linear(b->attn_proj, proj_std);
        init_linear(b->c_fc, std);
        init_linear(b->mlp_proj, proj_std);
    }
    g->ln_f = layer_norm(tr, "ln_f", a->n_embd);
    init_normal(ca_module_param(g->wte, "weight"), std);
    init_normal(ca_module_param(g->wpe, "weight"), std);
    /* Megatron's split, used when parallelism_config_tp_size is above 1: the token embedding by its rows (the
     * vocabulary: the tied output layer gives each rank its slice of the logits, the loss is vocabulary-parallel),
     * q, k, v and the MLP's first layer by their output features (c_attn's three blocks alike: each rank whole
     * heads), the projections back into the residual stream by their input features; wpe and norms stay whole */
    CA_CHECK(ca_tp_plan(root, "transformer.wte", "rowwise"));
    CA_CHECK(ca_tp_plan_fused(root, "transformer.h.*.attn.c_attn", "colwise", 3));
    CA_CHECK(ca_tp_plan(root, "transformer.h.*.attn.c_proj", "rowwise"));
    CA_CHECK(ca_tp_plan(root, "transformer.h.*.mlp.c_fc", "colwise"));
    CA_CHECK(ca_tp_plan(root, "transformer.h.*.mlp.c_proj", "rowwise"));
    if (a->sequence_parallel) {   /* the norms on this rank's tokens: Megatron's sequence parallelism */
        CA_CHECK(ca_tp_plan(root, "transformer.h.*.ln_1", "sequence_parallel"));
        CA_CHECK(ca_tp_plan(root, "transformer.h.*.ln_2", "sequence_parallel"));
        CA_CHECK(ca_tp_plan(root, "transformer.ln_f", "sequence_parallel"));
    }
    return root;
}

/* The mean cross-entropy of model m on x against y: under tensor parallelism each rank holds only its
 * vocabulary slice of the logits, and the loss is computed across the tp ranks. */
/* Context parallelism (parallelism_config_cp_size): this rank's tokens of every sequence of x and y
 * and their global positions (split_positions), until cp_end; at cp 1 they stay whole. Training and
 * validation both split: a sequence long enough to need cp is never whole on one rank. */
static void cp_begin(ca_accelerator *acc, ca_tensor **x, ca_tensor **y) {
    int64_t T = ca_tensor_dim(*x, 1), *t = malloc(sizeof *t * (size_t)T);
    if (!t) exit(1);
    for (int64_t i = 0; i < T; i++) t[i] = i;
    ca_tensor *buf[3] = {*x, *y, ca_from_host(ca_accelerator_device(acc), CA_I64, CA_SHAPE(T), t)};
    free(t);
    CA_CHECK(ca_maybe_context_parallel(acc, 3, buf, (int[]){1, 1, 0}));
    *x = buf[0];
    *y = buf[1];
    split_positions = buf[2];
}

static void cp_end(ca_accelerator *acc) {
    ca_context_parallel_end(acc);
    split_positions = NULL;
}

static ca_tensor *gpt_loss(ca_module *m, ca_tensor *x, ca_tensor *y) {
    ca_tensor *logits = ca_module_forward(m, x);
    return ca_tp_cross_entropy(ca_module_child(m, "transformer.wte"), logits, y);
}

/* AdamW with weight decay on the matrices (and embeddings) only, as GPT-2's recipes do. */
static ca_optimizer *make_optimizer(ca_module *m, const args *a) {
    int n = ca_module_num_params(m), nd = 0, nn = 0;
    ca_tensor **decay = malloc(sizeof *decay * (size_t)n), **no_decay = malloc(sizeof *no_decay * (size_t)n);
    if (!decay || !no_decay) exit(1);
    for (int i = 0; i < n; i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        if (ca_tensor_ndim(p) >= 2) decay[nd++] = p;
        else no_decay[nn++] = p;
    }
    ca_adamw_opts o = {.lr = a->lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = a->weight_decay,
                       .weight_decay_set = true};
    ca_optimizer *opt;
    CA_CHECK(ca_adamw_create_params(decay, nd, &o, &opt));
    o.weight_decay = 0;
    CA_CHECK(ca_optimizer_add_group(opt, no_decay, nn, &o));
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

/* Sums of n values over ranks. */
static void reduce_sum(ca_accelerator *acc, double *v, int n) {
    CA_SCOPE {
        float f[8];
        for (int i = 0; i < n; i++) f[i] = (float)v[i];
        ca_tensor *t = ca_from_host(ca_accelerator_device(acc), CA_F32, CA_SHAPE(n), f);
        CA_CHECK(ca_reduce(acc, t, CA_OP_SUM));
        CA_CHECK(ca_tensor_to_host(t, f, sizeof(float) * (size_t)n));
        for (int i = 0; i < n; i++) v[i] = f[i];
    }
}

/* A loss kept from a scope that has ended: read (running a lazy device's graph, which then sees the
 * scope's temporaries freed) and freed; 0 when none. */
static double read_loss(ca_tensor **t) {
    if (!*t) return 0;
    double v = ca_item(*t);
    ca_tensor_free(*t);
    *t = NULL;
    return v;
}

static int tp_size(ca_accelerator *acc) {
    ca_mesh_shape m;
    CA_CHECK(ca_accelerator_mesh(acc, &m, NULL));
    return m.size[CA_MESH_TP];
}

/* Mean loss per token over the validation windows (every rank's share, padding excluded). */
static double evaluate(ca_accelerator *acc, ca_module *m, ca_dataloader *dl) {
    ca_module_train(m, false);
    double s[2] = {0, 0};   /* loss x windows, windows */
    ca_batch b;
    while (ca_dataloader_next(dl, &b)) {
        /* a batch of padding only still runs the forward, counted 0: under FULL_SHARD it is collective */
        int64_t real = b.size - b.num_padded, rows = real > 0 ? real : b.size;
        if (real < 0) real = 0;
        ca_tensor *loss = NULL;
        CA_NO_GRAD CA_SCOPE {
            ca_tensor *x = ca_narrow(b.x, 0, 0, rows), *y = ca_narrow(b.y, 0, 0, rows);
            cp_begin(acc, &x, &y);   /* as in training: each cp rank its part of every sequence */
            static bool shown;
            if (ca_tensor_dim(x, 1) < ca_tensor_dim(b.x, 1) && !shown && (shown = true))
                printf("gpt: rank %d validates %lld of every %lld tokens (context parallelism)\n",
                       ca_process_index(acc), (long long)ca_tensor_dim(x, 1), (long long)ca_tensor_dim(b.x, 1));
            loss = ca_tensor_keep(ca_detach(gpt_loss(m, x, y)));
            cp_end(acc);
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

/* One byte from the logits of the last position: temperature, top-k, then a draw. */
static int sample_byte(const float *logits, int64_t V, const args *a, uint64_t *rng) {
    float p[256], sorted[256];
    (void)V;   /* rows past 255 are never targets; only bytes are drawn */
    for (int i = 0; i < 256; i++) sorted[i] = p[i] = logits[i] / (float)a->temperature;
    float cut = -INFINITY;
    if (a->top_k > 0 && a->top_k < 256) {
        qsort(sorted, 256, sizeof(float), cmp_desc);
        cut = sorted[a->top_k - 1];
    }
    float mx = -INFINITY;
    for (int i = 0; i < 256; i++) mx = fmaxf(mx, p[i]);
    double sum = 0;
    for (int i = 0; i < 256; i++) sum += p[i] = p[i] >= cut ? expf(p[i] - mx) : 0.0f;
    double u = uniform(rng) * sum;
    int k = -1;
    for (int i = 0; i < 256; i++) {
        if (p[i] > 0) k = i;   /* rounding may leave u >= 0: then the last candidate */
        if ((u -= p[i]) < 0) break;
    }
    return k;
}

/* The last position's logits of the whole vocabulary into row (V floats): under tensor parallelism each
 * rank holds its slice; they are gathered over the processes and this rank's tp group's read (the ranks of
 * a group are consecutive, tp innermost in the mesh). */
static void last_logits(ca_accelerator *acc, ca_tensor *logits, float *row, int64_t V) {
    int64_t T = ca_tensor_dim(logits, 1);
    int tp = tp_size(acc);
    ca_tensor *last = ca_contiguous(ca_cast(ca_narrow(logits, 1, T - 1, 1), CA_F32));
    if (tp > 1) last = ca_contiguous(ca_gather(acc, last));   /* [processes, 1, V / tp] */
    if (!last) CA_CHECK(ca_last_status());
    size_t n = (size_t)ca_tensor_numel(last);
    float *all = malloc(sizeof(float) * n);
    if (!all) exit(1);
    CA_CHECK(ca_tensor_to_host(last, all, sizeof(float) * n));
    size_t first = tp > 1 ? (size_t)(ca_process_index(acc) / tp) * (size_t)V : 0;
    memcpy(row, all + first, sizeof(float) * (size_t)V);
    free(all);
}

/* The main process, or under tensor parallelism every process (its forward is collective over tp; the
 * sampling's generator is seeded alike, so every rank draws the same bytes); the main process prints. */
static void generate(ca_accelerator *acc, ca_module *m, const args *a) {
    size_t np = strlen(a->prompt), n = np;
    int64_t cap = (int64_t)np + a->sample_tokens + 1;   /* + 1: an empty prompt becomes a newline */
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)cap);
    float *row = malloc(sizeof(float) * (size_t)a->vocab_size);
    if (!ids || !row) exit(1);
    for (size_t i = 0; i < np; i++) ids[i] = (unsigned char)a->prompt[i];
    if (n == 0) ids[n++] = '\n';
    uint64_t rng = a->seed;
    ca_module_train(m, false);
    for (int64_t s = 0; s < a->sample_tokens; s++) {
        int64_t T = (int64_t)n < a->block_size ? (int64_t)n : a->block_size;
        CA_NO_GRAD CA_SCOPE {
            ca_tensor *x = ca_from_host(ca_accelerator_device(acc), CA_I64, CA_SHAPE(1, T), ids + n - (size_t)T);
            last_logits(acc, ca_module_forward(m, x), row, a->vocab_size);
        }
        ids[n++] = sample_byte(row, a->vocab_size, a, &rng);
    }
    ca_module_train(m, true);
    ca_print(acc, "sample (seed %llu, temperature %.2f, top-k %lld, %lld bytes after the prompt):\n",
             (unsigned long long)a->seed, a->temperature, (long long)a->top_k, (long long)a->sample_tokens);
    unsigned char *text = malloc(n);   /* written as bytes: a sample may hold any byte */
    if (!text) exit(1);
    for (size_t i = 0; i < n; i++) text[i] = (unsigned char)ids[i];
    if (ca_is_main_process(acc)) {
        fwrite(text, 1, n, stdout);
        printf("\n-- end of sample\n");
        fflush(stdout);
    }
    free(text);
    free(ids);
    free(row);
}

static void write_file(const char *dir, const char *name, const void *data, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "gpt: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

static void *host_copy(ca_tensor *t) {
    size_t n = ca_tensor_nbytes(t);
    void *h = malloc(n ? n : 1);
    if (!h) exit(1);
    CA_CHECK(ca_tensor_to_host(t, h, n));
    return h;
}

/* For the PyTorch parity test: the initial weights (model.safetensors; 1-D parameters perturbed), the first training batch
 * (x.bin, y.bin: i64), its logits (f32; under tensor parallelism this rank's vocabulary slice), loss (loss.txt)
 * and every parameter's gradient (grads.bin, f32 in the order and with the names and sizes of grads.txt),
 * with dropout off. */
static void parity_dump(ca_accelerator *acc, ca_module *m, ca_dataset *ds, const args *a) {
    if (mkdir(a->parity_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "gpt: cannot create --parity_dir %s: %s\n", a->parity_dir, strerror(errno));
        exit(1);
    }
    /* biases and LayerNorm start at 0 and 1: perturb them so that the comparison sees them */
    for (int i = 0; i < ca_module_num_params(m); i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        if (ca_tensor_ndim(p) == 1) CA_SCOPE {
            ca_tensor *r = ca_rand_normal(ca_tensor_device(p), CA_F32, 1, ca_tensor_shape(p), 0.0f, (float)a->init_std);
            ca_tensor *q = ca_add(p, r);
            CA_CHECK(q ? ca_tensor_copy_(p, q) : ca_last_status());
        }
    }
    CA_CHECK(ca_save_model(acc, m, a->parity_dir, 0));
    int64_t B = a->batch_size, T = a->block_size;
    int64_t *x = malloc(sizeof(int64_t) * (size_t)(B * T)), *y = malloc(sizeof(int64_t) * (size_t)(B * T));
    if (!x || !y) exit(1);
    for (int64_t i = 0; i < B; i++) CA_CHECK(ca_dataset_get(ds, i, x + i * T, y + i * T));
    write_file(a->parity_dir, "x.bin", x, sizeof(int64_t) * (size_t)(B * T));
    write_file(a->parity_dir, "y.bin", y, sizeof(int64_t) * (size_t)(B * T));
    CA_SCOPE {
        ca_device *dev = ca_accelerator_device(acc);
        ca_tensor *logits = ca_module_forward(m, ca_from_host(dev, CA_I64, CA_SHAPE(B, T), x));
        ca_tensor *loss = ca_tp_cross_entropy(ca_module_child(m, "transformer.wte"), logits,
                                              ca_from_host(dev, CA_I64, CA_SHAPE(B, T), y));
        if (!loss) CA_CHECK(ca_last_status());
        CA_CHECK(ca_autograd_backward(loss));
        void *h = host_copy(ca_cast(logits, CA_F32));
        write_file(a->parity_dir, "logits.bin", h, sizeof(float) * (size_t)ca_tensor_numel(logits));
        free(h);
        char txt[64];
        int len = snprintf(txt, sizeof txt, "%.9g\n", ca_item(loss));
        write_file(a->parity_dir, "loss.txt", txt, (size_t)len);
        char path[4096];
        snprintf(path, sizeof path, "%s/grads.bin", a->parity_dir);
        FILE *g = fopen(path, "wb");
        snprintf(path, sizeof path, "%s/grads.txt", a->parity_dir);
        FILE *names = fopen(path, "w");
        if (!g || !names) { fprintf(stderr, "gpt: cannot write in %s\n", a->parity_dir); exit(1); }
        for (int i = 0; i < ca_module_num_params(m); i++) {
            ca_tensor *gr = ca_tensor_grad(ca_module_param_at(m, i));
            if (!gr) { fprintf(stderr, "gpt: %s has no gradient\n", ca_module_param_name(m, i)); exit(1); }
            void *gh = host_copy(gr);
            fwrite(gh, 1, ca_tensor_nbytes(gr), g);
            free(gh);
            fprintf(names, "%s %lld\n", ca_module_param_name(m, i), (long long)ca_tensor_numel(gr));
        }
        fclose(g);
        fclose(names);
        ca_print(acc, "parity files written to %s (loss %.6f)\n", a->parity_dir, ca_item(loss));
    }
    free(x);
    free(y);
}

/* The processes that read different batches: all of them, but under tensor parallelism the ranks of one
 * tp group read the same ones (the device mesh's dp_replicate x dp_shard). */
static int data_parallel(ca_accelerator *acc) {
    ca_mesh_shape m;
    CA_CHECK(ca_accelerator_mesh(acc, &m, NULL));
    return m.size[CA_MESH_DP_REPLICATE] * m.size[CA_MESH_DP_SHARD];
}

static void print_header(ca_accelerator *acc, ca_module *model, const corpus *c, ca_dataset *train,
                         ca_dataset *val, const args *a, int64_t ga) {
    int np = ca_num_processes(acc), dp = data_parallel(acc);
    ca_print(acc, "gpt: %d process(es) on %s, mixed precision %s; %d layers, %d heads, %lld channels, "
                  "block %lld, vocab %lld: %lld parameters\n",
             np, ca_device_name(ca_accelerator_device(acc)), ca_mixed_precision_name(ca_accelerator_mixed_precision(acc)),
             a->n_layer, a->n_head, (long long)a->n_embd, (long long)a->block_size, (long long)a->vocab_size,
             (long long)ca_module_param_count(model));
    ca_print(acc, "data: %d fortune files, %lld training bytes (%lld windows), %lld held-out bytes "
                  "(%lld validation windows); batch %lld x %lld accumulation x %d %sprocesses = %lld tokens per step\n",
             c->files, (long long)c->n_train, (long long)ca_dataset_length(train), (long long)c->n_val,
             (long long)ca_dataset_length(val), (long long)a->batch_size, (long long)ga, dp,
             dp != np ? "data-parallel " : "", (long long)(a->batch_size * ga * dp * a->block_size));
}

static void save(ca_accelerator *acc, ca_module *model, const char *dir) {
    if (ca_is_main_process(acc) && mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "gpt: cannot create --output_dir %s: %s\n", dir, strerror(errno));
        exit(1);
    }
    CA_CHECK(ca_save_model(acc, model, dir, 0));   /* every rank calls it */
    ca_print(acc, "model saved to %s/model.safetensors\n", dir);
}

/* One micro-step: forward, backward, and (on a synchronising step) clip and step. Returns the loss,
 * detached and kept: the caller reads it later, after the dataloader has run the step's graph (read
 * here, it would make a GPU wait for the step and a lazy device run the step's graph while its
 * temporaries are alive: torch_xla's add_step_closure). The temporaries end with the step's scope,
 * so even a graph run before the next batch (the last step's) sees them freed. */
static ca_tensor *micro_step(ca_accelerator *acc, ca_module *model, ca_optimizer *opt, const ca_batch *b,
                             const args *a) {
    ca_tensor *l = NULL;
    CA_SCOPE CA_ACCUMULATE(acc, model) {
        ca_tensor *x = b->x, *y = b->y;
        cp_begin(acc, &x, &y);
        ca_tensor *logits = ca_module_forward(model, x);
        static bool shown;   /* once a rank: its slice of the logits, never the whole vocabulary */
        if (logits && !shown && tp_size(acc) > 1 && (shown = true))
            printf("gpt: rank %d holds logits [%lld, %lld, %lld] of vocab %lld at tp %d\n", ca_process_index(acc),
                   (long long)ca_tensor_dim(logits, 0), (long long)ca_tensor_dim(logits, 1),
                   (long long)ca_tensor_dim(logits, 2), (long long)a->vocab_size, tp_size(acc));
        fflush(stdout);
        ca_tensor *loss = ca_tp_cross_entropy(ca_module_child(model, "transformer.wte"), logits, y);
        if (!loss) CA_CHECK(ca_last_status());
        CA_CHECK(ca_backward(acc, loss));
        cp_end(acc);
        if (a->grad_clip > 0 && ca_sync_gradients(acc)) CA_CHECK(ca_clip_grad_norm(acc, a->grad_clip, NULL));
        CA_CHECK(ca_optimizer_step(opt));
        ca_optimizer_zero_grad(opt);
        l = ca_tensor_keep(ca_detach(loss));
    }
    return l;
}

/* The accelerator's throughput line (achieved FLOP/s from the kernels' counts, MFU against the
 * device's peak) for the interval just logged; none when it held only the first, warm-up step. */
static void log_throughput(ca_accelerator *acc) {
    ca_throughput r;
    if (ca_throughput_report(acc, &r) != CA_OK) { ca_clear_error(); return; }
    CA_CHECK(ca_throughput_log(acc, &r));
}

/* Trains max_steps optimizer steps, logging and evaluating at the intervals. */
static void train_loop(ca_accelerator *acc, ca_module *model, ca_optimizer *opt, ca_dataloader *train_dl,
                         ca_dataloader *val_dl, const args *a) {
    double sum[3] = {0, 0, 0};   /* loss sum, micro-steps, samples: over the interval */
    double t0 = now_s(), t_start = t0, val_loss = NAN;
    ca_batch b;
    ca_tensor *loss = NULL;   /* the last micro-step's, read once its graph has run */
    while (ca_optimizer_steps(opt) < a->max_steps) {
        if (!ca_dataloader_next(train_dl, &b)) { CA_CHECK(ca_dataloader_status(train_dl)); continue; }
        sum[0] += read_loss(&loss);
        int64_t before = ca_optimizer_steps(opt);
        loss = micro_step(acc, model, opt, &b, a);
        sum[1] += 1;
        sum[2] += (double)b.size;
        CA_CHECK(ca_throughput_step(acc, b.size, b.size * a->block_size));   /* a token: a byte of text */
        int64_t step = ca_optimizer_steps(opt);
        if (step == before) continue;   /* an accumulation micro-step */
        if (a->log_interval > 0 && (step % a->log_interval == 0 || step == a->max_steps)) {
            sum[0] += read_loss(&loss);
            reduce_sum(acc, sum, 3);
            sum[2] /= ca_num_processes(acc) / data_parallel(acc);   /* the ranks of a tp or cp group train on
                                                                     * the same samples: counted once */
            double secs = now_s() - t0, l = sum[0] / sum[1];
            ca_print(acc, "step %lld/%lld: loss %.4f, perplexity %.2f, lr %.2e, %.1f samples/s, %.0f tokens/s\n",
                     (long long)step, (long long)a->max_steps, l, exp(l), ca_optimizer_get_lr(opt, 0),
                     sum[2] / secs, sum[2] * (double)a->block_size / secs);
            sum[0] = sum[1] = sum[2] = 0;
            t0 = now_s();
            log_throughput(acc);
        }
        if ((a->eval_interval > 0 && step % a->eval_interval == 0) || step == a->max_steps) {
            CA_CHECK(ca_throughput_pause(acc));   /* throughput excludes evaluation */
            val_loss = evaluate(acc, model, val_dl);
            ca_print(acc, "step %lld: validation loss %.4f, perplexity %.2f\n", (long long)step, val_loss, exp(val_loss));
            t0 = now_s();
            CA_CHECK(ca_throughput_resume(acc));
        }
    }
    read_loss(&loss);   /* a step after the last logged one (no log interval): freed */
    ca_print(acc, "trained %lld steps in %.1f s; final validation loss %.4f (perplexity %.2f, %.3f bits per byte)\n",
             (long long)ca_optimizer_steps(opt), now_s() - t_start, val_loss, exp(val_loss), val_loss / log(2.0));
    ca_allocator_stats st;   /* torch.cuda.max_memory_reserved: what the device held at most */
    CA_CHECK(ca_device_memory_stats(ca_accelerator_device(acc), &st));
    ca_print(acc, "device memory: %.1f MiB held at most (%s)\n", (double)st.peak_reserved / (1 << 20),
             ca_device_name(ca_accelerator_device(acc)));
}

static void run_training(ca_accelerator *acc, ca_module *model, const corpus *c, ca_dataset *train, ca_dataset *val,
                         const args *a) {
    ca_dataloader *train_dl, *val_dl;
    CA_CHECK(ca_dataloader_create(train, &(ca_loader_opts){.batch_size = a->batch_size, .shuffle = true,
                                                          .drop_last = true}, &train_dl));
    CA_CHECK(ca_dataloader_create(val, &(ca_loader_opts){.batch_size = a->batch_size}, &val_dl));
    ca_optimizer *opt = make_optimizer(model, a);
    CA_CHECK(ca_prepare(acc, model, opt, train_dl));
    CA_CHECK(ca_prepare_dataloader(acc, val_dl));
    /* in one-process steps: a prepared schedule advances one step per data-parallel process per step */
    int64_t total = a->max_steps * data_parallel(acc);
    CA_CHECK(ca_optimizer_set_schedule(opt, &(ca_lr_schedule){.kind = CA_SCHED_COSINE,
                                                               .warmup_steps = (int64_t)(a->warmup * (double)total),
                                                               .total_steps = total, .min_lr_ratio = a->min_lr_ratio}));
    int64_t ga = ca_accelerator_settings(acc)->gradient_accumulation_steps;
    print_header(acc, model, c, train, val, a, ga < 1 ? 1 : ga);
    train_loop(acc, model, opt, train_dl, val_dl, a);
    /* generation runs on the main process only: under stage 3 (FULL_SHARD) every process first gathers
     * the whole parameters, or the main process's forward would wait for the others in a gather */
    if (a->sample_tokens > 0) CA_CHECK(ca_summon_full_params(acc, true));
    ca_mesh_shape mesh;
    CA_CHECK(ca_accelerator_mesh(acc, &mesh, NULL));
    if (a->sample_tokens > 0 && (ca_is_main_process(acc) || mesh.size[CA_MESH_TP] > 1)) generate(acc, model, a);
    if (a->output_dir) save(acc, model, a->output_dir);
    ca_dataloader_destroy(train_dl);
    ca_dataloader_destroy(val_dl);
    ca_optimizer_destroy(opt);
}

int main(int argc, char **argv) {
    args a = parse(argc, argv);
    ca_accelerator *acc;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv}, &acc));
    CA_CHECK(ca_set_seed(acc, a.seed));
    CA_CHECK(ca_init_trackers(acc, "gpt", NULL));   /* --log_with json,csv: the throughput metrics */

    ca_mesh_shape mesh;
    CA_CHECK(ca_accelerator_mesh(acc, &mesh, NULL));
    if (a.n_head % mesh.size[CA_MESH_TP] != 0) {   /* each tensor-parallel rank computes whole heads */
        fprintf(stderr, "gpt: --n_head %d is not a multiple of parallelism_config_tp_size %d (each tensor-parallel "
                "rank computes whole heads)\n", a.n_head, mesh.size[CA_MESH_TP]);
        exit(2);
    }
    a.tp = mesh.size[CA_MESH_TP];
    if (a.sequence_parallel && a.dropout != 0 && a.block_size % a.tp != 0) {
        fprintf(stderr, "gpt: --sequence_parallel with --dropout above 0 needs a --block_size that "
                "parallelism_config_tp_size %d divides (the padded tokens would shift the masks from one "
                "process's); --block_size is %lld\n", a.tp, (long long)a.block_size);
        exit(2);
    }
    corpus c = read_corpus(a.data);
    ca_dataset *train = window_dataset(c.train, c.n_train, a.block_size, 0);
    ca_dataset *val = window_dataset(c.val, c.n_val, a.block_size, a.eval_samples);
    ca_module *model = build_gpt(&a);
    if (a.gradient_checkpointing) {
        int n = 0;
        CA_CHECK(ca_module_checkpoint_layers(model, true, &n));
        ca_print(acc, "gpt: gradient checkpointing: %d blocks recompute their activations in backward\n", n);
    }
    if (a.parity_dir) {
        if (a.dropout != 0) { fprintf(stderr, "gpt: --parity_dir needs --dropout 0\n"); exit(2); }
        CA_CHECK(ca_prepare(acc, model, NULL, NULL));
        parity_dump(acc, model, train, &a);
    } else {
        run_training(acc, model, &c, train, val, &a);
    }
    CA_CHECK(ca_wait_for_everyone(acc));
    ca_dataset_destroy(train);
    ca_dataset_destroy(val);
    ca_module_destroy(model);
    free(c.train);
    free(c.val);
    ca_accelerator_destroy(acc);
    ca_scope_release_all();
    ca_shutdown();
    return 0;
}
