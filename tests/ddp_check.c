/* ddp_check: data-parallel training checks run as real processes (caccel launch or mpirun), driven
 * by tests/test_ddp.sh. Every mode prints "key=value" lines that the script compares across world sizes.
 *   --mode plain  : S steps, batch B per rank; dumps the parameters
 *   --mode accum  : S real steps of k micro-batches; counts collectives and bytes sent per real step
 *   --mode clip   : clip_grad_norm(0.5) every step; prints the first norm
 *   --mode fp16inf: fp16, the last rank puts an Inf in a gradient at step 3 (--inf-input: in its input
 *     instead, so that the overflow goes through backward and the gradient reduction)
 *   --mode uneven : 103 samples, evaluation through gather_for_metrics
 * --dump-grads PATH: rank 0 writes the gradients after the first backward (the averaged ones: as the
 *   optimizer sees them) and prints fp16_exact=N/M and bf16_exact=N/M: how many of the M values an fp16
 *   or a bf16 tensor holds exactly (all of them after an all-reduce compressed to that type).
 *   --mode localsgd: Accelerate's LocalSGD over the run, parameters averaged every --local-sgd-steps K
 *   --mode localsgd-ref --sim N: one process plays N ranks of --mode localsgd (N model copies, each on
 *     its slice of the global batch, averaged every K steps and at the end) and dumps copy 0
 * --digest: every rank prints params_fnv=H, an FNV-1a hash of its parameters' bytes after training
 *   (equal on every rank when they stayed in step).
 * --sched-total T attaches a linear schedule over T one-process steps; every mode prints lr_factor
 *   (the learning rate / --lr, 0.2 by default) and lr.
 * --read-sharded: after training, before ca_summon_full_params, reads fc1.weight and prints
 *   read_sharded=<the error> (under stage 3 its values are a shard until the summon).
 * --stop-rank R: rank R stops itself (SIGSTOP) before its third micro-step, a hung peer.
 * --freeze NAME: the parameters of child NAME (fc1, fc2) are frozen (requires_grad false) before the
 *   optimizer is made; every rank prints opt_state_bytes=B (the optimizer's own state tensors) and, after
 *   training, frozen_unchanged=1 when the frozen parameters still hold their first values bit for bit.
 * --save-model DIR writes the model's files (ca_save_model) after training; --load-model DIR loads them
 *   (ca_load_model) right after ca_prepare.
 * --load-model-early DIR loads them before ca_prepare instead (into the meta model under --meta).
 * --try-load-model DIR: every rank prints its digest (--digest's line), ca_load_model's status
 *   (load_model=STATUS: message) and its digest again, and leaves (a failed load may have left the
 *   communicator broken: no teardown collective).
 * --try-load-state DIR: after the training loop every rank prints its state digest (--state-digest's
 *   line), ca_load_state's status (load_state=STATUS: message) and the digest again; with --after K it
 *   then trains K more steps and prints its params_fnv line, else it leaves (status 3 when the load
 *   failed: the group may be dead). --state-digest: after the training loop every rank prints
 *   state_fnv=H, an FNV-1a hash of its parameters (stage 3: summoned, collective), optimizer state tensors (not under ZeRO, whose
 *   shard is not public), step count, learning rate, loss scaler and generator, and next_batch=H, of
 *   the next batch its loader gives (its data position).
 * --try-load-early DIR: before ca_prepare (and --load-model-early), ca_load_model(DIR) into the model
 *   (meta under --meta): every rank prints early_load=STATUS: message and meta_params=N (its meta
 *   parameters after it); with --leave it then leaves (status 3 when the load failed: the group may
 *   be dead), else it goes on.
 * --cut-before-prepare FILE: after that load rank 0 cuts FILE's last 4 bytes, before ca_prepare.
 * --load-state DIR loads a state saved by --save-state DIR (after the training loop) right after ca_prepare.
 * --adamw trains with AdamW (lr --lr / 20) instead of SGD with momentum.
 * --meta builds the model under ca_init_empty_weights (no storage until ca_prepare); with --mem every
 *   rank prints prepare_peak_bytes (the allocator's peak from before the model was built to the end of
 *   ca_prepare), model_bytes and largest_param_bytes.
 * --tp-plan: the layers alternate colwise and rowwise (fc1 colwise, fc2 rowwise) under
 *   parallelism_config_tp_size; --depth must then be even.
 * --hidden H widens the hidden layer (32); --depth D adds D Linear(H, H)+Tanh layers (0); --mem prints
 * state_bytes: the allocator's bytes in use before the last step for parameters, gradients and
 * optimizer state (the growth from before ca_prepare, plus the parameters the model held then; the
 * batch, a few hundred bytes, is in it), step_peak_bytes: the most allocated during the last step
 * above what was allocated before it, and param_bytes: the parameters' f32 bytes (= the gradient's);
 * with --load-state also load_peak_bytes (the most allocated during ca_load_state above what was
 * allocated before it), model_bytes, load_maxrss_kb=A->B (the process's peak resident memory before and
 * after ca_load_state), load_ms and load_cpu_ms (its wall and CPU time). */
#include <caccel/caccel.h>

#include "tests/synthetic_data.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct opts {
    const char *mode;
    int steps, k;
    int64_t batch, hidden, depth;
    const char *dump, *dump_grads, *freeze, *save_state, *load_state, *save_model, *load_model, *load_early, *try_load,
        *cut, *try_state, *try_early;
    int after;                   /* --after K: see --try-load-state */
    int solo;                    /* --solo N: see solo() */
    bool state_digest, leave;   /* --leave: see --try-load-early */
    int64_t sched_total;
    double lr;
    bool mem, digest, inf_input, read_sharded, adamw, meta, tp_plan;
    int stop_rank;               /* --stop-rank R: rank R stops itself (SIGSTOP) before micro-step 3 */
    int lsgd_steps, sim;         /* --local-sgd-steps K, --sim N */
    int save_every, halt_step;   /* --save-every N, --halt-step S, --gate-step S --gate FILE: see elastic_train */
    int async_from;              /* --async-save-from S: see elastic_train */
    int gate_step, gate_restart;
    const char *gate;
    bool resume;
} opts;

static ca_dataset *synthetic(int64_t n) {
    return synthetic_classes(n, 8, 3);
}

/* --tp-plan: fc1, h1, h3, ... colwise, h0, h2, ..., fc2 rowwise (a colwise layer's split output into the
 * next rowwise one; --depth even), applied at parallelism_config_tp_size above 1. */
static void tp_plan(ca_module *m, int64_t depth) {
    CA_CHECK(ca_tp_plan(m, "fc1", "colwise"));
    for (int64_t i = 0; i < depth; i++) {
        char name[32];
        snprintf(name, sizeof name, "h%lld", (long long)i);
        CA_CHECK(ca_tp_plan(m, name, i % 2 ? "colwise" : "rowwise"));
    }
    CA_CHECK(ca_tp_plan(m, "fc2", "rowwise"));
}

static ca_module *model(int64_t hidden, int64_t depth) {
    ca_module *m, *l;
    CA_CHECK(ca_sequential_create(&m));
    CA_CHECK(ca_linear_create(8, hidden, true, &l)); CA_CHECK(ca_module_add(m, "fc1", l));
    CA_CHECK(ca_tanh_create(&l));                CA_CHECK(ca_module_add(m, "act", l));
    for (int64_t i = 0; i < depth; i++) {
        char name[32];
        snprintf(name, sizeof name, "h%lld", (long long)i);
        CA_CHECK(ca_linear_create(hidden, hidden, true, &l)); CA_CHECK(ca_module_add(m, name, l));
        snprintf(name, sizeof name, "h%lld_act", (long long)i);
        CA_CHECK(ca_tanh_create(&l)); CA_CHECK(ca_module_add(m, name, l));
    }
    CA_CHECK(ca_linear_create(hidden, 3, true, &l)); CA_CHECK(ca_module_add(m, "fc2", l));
    return m;
}

static void dump(ca_accelerator *acc, ca_module *m, const char *path) {
    if (!path || !ca_is_main_process(acc)) return;
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    for (int i = 0; i < ca_module_num_params(m); i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        float *h = malloc(ca_tensor_nbytes(p));
        CA_CHECK(ca_tensor_to_host(p, h, ca_tensor_nbytes(p)));
        fwrite(h, 1, ca_tensor_nbytes(p), f);
        free(h);
    }
    fclose(f);
}

/* The bytes of every parameter of m, one after another (on the host). */
static size_t snapshot_bytes(ca_module *m) {
    size_t n = 0;
    for (int i = 0; i < ca_module_num_params(m); i++) n += ca_tensor_nbytes(ca_module_param_at(m, i));
    return n;
}

static void *snapshot(ca_module *m) {
    unsigned char *b = malloc(snapshot_bytes(m) + 1);
    size_t off = 0;
    for (int i = 0; i < ca_module_num_params(m); i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        CA_CHECK(ca_tensor_to_host(p, b + off, ca_tensor_nbytes(p)));
        off += ca_tensor_nbytes(p);
    }
    return b;
}

/* FNV-1a over every parameter's bytes. */
static void digest(ca_module *m, int rank) {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < ca_module_num_params(m); i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        size_t n = ca_tensor_nbytes(p);
        unsigned char *b = malloc(n);
        CA_CHECK(ca_tensor_to_host(p, b, n));
        for (size_t j = 0; j < n; j++) h = (h ^ b[j]) * 1099511628211ULL;
        free(b);
    }
    printf("rank=%d params_fnv=%016llx\n", rank, (unsigned long long)h);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    for (size_t j = 0; j < n; j++) h = (h ^ ((const unsigned char *)p)[j]) * 1099511628211ULL;
    return h;
}

static uint64_t fnv_tensor(uint64_t h, ca_tensor *t) {
    size_t n = ca_tensor_nbytes(t);
    unsigned char *b = malloc(n ? n : 1);
    CA_CHECK(ca_tensor_to_host(t, b, n));
    h = fnv(h, b, n);
    free(b);
    return h;
}

/* --state-digest: what a failed ca_load_state must leave as it was, then the next batch. */
static void state_digest(ca_accelerator *acc, ca_module *m, ca_optimizer *opt) {
    uint64_t h = 1469598103934665603ULL;
    ca_tensor *p0 = ca_module_num_params(m) ? ca_module_param_at(m, 0) : NULL;
    void *b0 = malloc(p0 ? ca_tensor_nbytes(p0) + 1 : 1);
    /* stage 3: the parameters are shards until summoned (every rank alike: the summon is collective) */
    bool sharded = p0 && ca_tensor_to_host(p0, b0, ca_tensor_nbytes(p0)) != CA_OK;
    free(b0);
    if (sharded) {
        ca_clear_error();
        CA_CHECK(ca_summon_full_params(acc, true));
    }
    for (int i = 0; i < ca_module_num_params(m); i++) h = fnv_tensor(h, ca_module_param_at(m, i));
    if (sharded) CA_CHECK(ca_summon_full_params(acc, false));
    const char *ds = getenv("ACCELERATE_USE_DEEPSPEED");
    for (int i = 0; !(ds && !strcmp(ds, "true")) && i < ca_optimizer_num_state(opt); i++)
        h = fnv_tensor(h, ca_optimizer_state_at(opt, i, NULL));
    int64_t steps = ca_optimizer_steps(opt);
    double lr = ca_optimizer_get_lr(opt, 0);
    ca_grad_scaler_state gs;
    uint64_t rng[2];
    CA_CHECK(ca_grad_scaler_get(acc, &gs));
    ca_rng_get_state(&rng[0], &rng[1]);
    h = fnv(fnv(fnv(fnv(h, &steps, sizeof steps), &lr, sizeof lr), &gs, sizeof gs), rng, sizeof rng);
    printf("rank=%d state_fnv=%016llx\n", ca_process_index(acc), (unsigned long long)h);
    fflush(stdout);
}

static void next_batch_digest(ca_accelerator *acc, ca_dataloader *dl) {
    ca_batch b;
    uint64_t h = 1469598103934665603ULL;
    CA_SCOPE {
        if (ca_dataloader_next(dl, &b)) h = fnv_tensor(fnv_tensor(h, b.x), b.y);
    }
    CA_CHECK(ca_dataloader_status(dl));
    printf("rank=%d next_batch=%016llx\n", ca_process_index(acc), (unsigned long long)h);
    fflush(stdout);
}

/* --solo N: this process goes on alone after the job's part (after --try-load-state, a peer lost):
 * the job's accelerator is destroyed, a single-process one created in the same program, the model's
 * parameters copied into a fresh model it prepares with SGD, N steps trained on its own loader and the
 * model saved (ca_save_model into --save-model DIR, when given) and printed as "rank=R solo_fnv=...". */
static void solo(ca_accelerator *acc, ca_module *m, const opts *o) {
    int rank = ca_process_index(acc), n = ca_module_num_params(m);
    void **h = calloc((size_t)n, sizeof *h);
    for (int i = 0; i < n; i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        h[i] = malloc(ca_tensor_nbytes(p));
        CA_CHECK(ca_tensor_to_host(p, h[i], ca_tensor_nbytes(p)));
    }
    ca_accelerator_destroy(acc);
    const char *one[][2] = {{"WORLD_SIZE", "1"}, {"RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}};
    for (size_t k = 0; k < sizeof one / sizeof one[0]; k++) setenv(one[k][0], one[k][1], 1);
    const char *argv[] = {"ddp_check", "--cpu", NULL};
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = (char **)argv}, &acc));
    CA_CHECK(ca_set_seed(acc, 11));
    ca_module *m2 = model(o->hidden, o->depth);
    for (int i = 0; i < n; i++) {
        ca_tensor *p = ca_module_param_at(m2, i);
        CA_CHECK(ca_tensor_copy_from_host(p, h[i], ca_tensor_nbytes(p)));
        free(h[i]);
    }
    free(h);
    ca_dataset *ds = synthetic(4096);
    ca_dataloader *dl;
    ca_optimizer *opt;
    CA_CHECK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = o->batch, .shuffle = true, .seed = 5}, &dl));
    CA_CHECK(ca_sgd_create(m2, &(ca_sgd_opts){.lr = o->lr, .momentum = 0.9}, &opt));
    CA_CHECK(ca_prepare(acc, m2, opt, dl));
    printf("rank=%d solo: %d process(es) now\n", rank, ca_num_processes(acc));
    ca_batch b;
    for (int step = 0; step < o->solo && ca_dataloader_next(dl, &b); step++) CA_ACCUMULATE(acc, m2) {
        CA_CHECK(ca_backward(acc, ca_cross_entropy(ca_module_forward(m2, b.x), b.y)));
        CA_CHECK(ca_optimizer_step(opt));
        ca_optimizer_zero_grad(opt);
    }
    CA_CHECK(ca_dataloader_status(dl));
    if (o->save_model) CA_CHECK(ca_save_model(acc, m2, o->save_model, 0));
    uint64_t hash = 1469598103934665603ULL;
    for (int i = 0; i < n; i++) hash = fnv_tensor(hash, ca_module_param_at(m2, i));
    printf("rank=%d solo_fnv=%016llx\n", rank, (unsigned long long)hash);
    fflush(stdout);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m2);
    ca_accelerator_destroy(acc);
    ca_shutdown();
    _exit(0);
}

/* --try-load-state, --after (returns only after training on) */
static void try_load_state(ca_accelerator *acc, ca_module *m, ca_optimizer *opt, ca_dataloader *dl, const opts *o) {
    int rank = ca_process_index(acc);
    state_digest(acc, m, opt);
    ca_status s = ca_load_state(acc, o->try_state);
    printf("rank=%d load_state=%s: %s\n", rank, ca_status_name(s), s == CA_OK ? "" : ca_last_error());
    state_digest(acc, m, opt);
    if (o->solo > 0) {
        ca_clear_error();
        solo(acc, m, o);
    }
    if (o->after <= 0) {
        next_batch_digest(acc, dl);
        _exit(s == CA_OK ? 0 : 3);
    }
    ca_clear_error();
    ca_batch b;
    for (int step = 0; step < o->after; step++) {
        if (!ca_dataloader_next(dl, &b)) {
            CA_CHECK(ca_dataloader_status(dl));
            step--;
            continue;   /* the next epoch */
        }
        CA_ACCUMULATE(acc, m) {   /* as the training loop steps */
            CA_CHECK(ca_backward(acc, ca_cross_entropy(ca_module_forward(m, b.x), b.y)));
            CA_CHECK(ca_optimizer_step(opt));
            ca_optimizer_zero_grad(opt);
        }
    }
    printf("rank=%d continued %d steps\n", rank, o->after);
    CA_CHECK(ca_summon_full_params(acc, true));   /* as main's digest: stage 3's shards, tp's slices whole */
    digest(m, rank);
    CA_CHECK(ca_summon_full_params(acc, false));
    fflush(stdout);
}

/* How many of g's n values (on the host: h) survive a round trip through the 16-bit type dt. */
static int64_t exact_in(ca_tensor *g, const float *h, size_t n, ca_dtype dt) {
    float *r = malloc(n * sizeof(float));
    CA_SCOPE {
        ca_tensor *back = ca_cast(ca_cast(g, dt), CA_F32);
        CA_CHECK(back ? ca_tensor_to_host(back, r, n * sizeof(float)) : ca_last_status());
    }
    int64_t exact = 0;
    for (size_t j = 0; j < n; j++) exact += memcmp(&h[j], &r[j], sizeof(float)) == 0;
    free(r);
    return exact;
}

/* Rank 0: the gradients as the optimizer would see them, and how many an fp16 and a bf16 tensor hold
 * exactly (all of them after an all-reduce compressed to that type). */
static void dump_grads(ca_accelerator *acc, ca_module *m, const char *path) {
    if (!ca_is_main_process(acc)) return;
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    int64_t fp16 = 0, bf16 = 0, total = 0;
    for (int i = 0; i < ca_module_num_params(m); i++) {
        ca_tensor *g = ca_tensor_grad(ca_module_param_at(m, i));
        size_t n = ca_tensor_nbytes(g) / sizeof(float);
        float *h = malloc(n * sizeof(float));
        CA_CHECK(ca_tensor_to_host(g, h, n * sizeof(float)));
        fp16 += exact_in(g, h, n, CA_F16);
        bf16 += exact_in(g, h, n, CA_BF16);
        total += (int64_t)n;
        fwrite(h, sizeof(float), n, f);
        free(h);
    }
    fclose(f);
    printf("rank=0 fp16_exact=%lld/%lld bf16_exact=%lld/%lld\n", (long long)fp16, (long long)total, (long long)bf16,
           (long long)total);
}

static opts parse(int argc, char **argv) {
    opts o = {.mode = "plain", .lr = 0.2, .steps = 10, .k = 1, .batch = 8, .hidden = 32, .stop_rank = -1, .lsgd_steps = 4,
              .sim = 2, .gate_restart = 1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mode") && i + 1 < argc) o.mode = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) o.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--k") && i + 1 < argc) o.k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) o.batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) o.dump = argv[++i];
        else if (!strcmp(argv[i], "--freeze") && i + 1 < argc) o.freeze = argv[++i];
        else if (!strcmp(argv[i], "--save-state") && i + 1 < argc) o.save_state = argv[++i];
        else if (!strcmp(argv[i], "--load-state") && i + 1 < argc) o.load_state = argv[++i];
        else if (!strcmp(argv[i], "--save-model") && i + 1 < argc) o.save_model = argv[++i];
        else if (!strcmp(argv[i], "--load-model") && i + 1 < argc) o.load_model = argv[++i];
        else if (!strcmp(argv[i], "--load-model-early") && i + 1 < argc) o.load_early = argv[++i];
        else if (!strcmp(argv[i], "--try-load-model") && i + 1 < argc) o.try_load = argv[++i];
        else if (!strcmp(argv[i], "--try-load-state") && i + 1 < argc) o.try_state = argv[++i];
        else if (!strcmp(argv[i], "--try-load-early") && i + 1 < argc) o.try_early = argv[++i];
        else if (!strcmp(argv[i], "--after") && i + 1 < argc) o.after = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--solo") && i + 1 < argc) o.solo = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--state-digest")) o.state_digest = true;
        else if (!strcmp(argv[i], "--leave")) o.leave = true;
        else if (!strcmp(argv[i], "--cut-before-prepare") && i + 1 < argc) o.cut = argv[++i];
        else if (!strcmp(argv[i], "--dump-grads") && i + 1 < argc) o.dump_grads = argv[++i];
        else if (!strcmp(argv[i], "--hidden") && i + 1 < argc) o.hidden = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--depth") && i + 1 < argc) o.depth = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--mem")) o.mem = true;
        else if (!strcmp(argv[i], "--adamw")) o.adamw = true;
        else if (!strcmp(argv[i], "--meta")) o.meta = true;
        else if (!strcmp(argv[i], "--tp-plan")) o.tp_plan = true;
        else if (!strcmp(argv[i], "--digest")) o.digest = true;
        else if (!strcmp(argv[i], "--inf-input")) o.inf_input = true;
        else if (!strcmp(argv[i], "--read-sharded")) o.read_sharded = true;
        else if (!strcmp(argv[i], "--lr") && i + 1 < argc) o.lr = atof(argv[++i]);
        else if (!strcmp(argv[i], "--local-sgd-steps") && i + 1 < argc) o.lsgd_steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sim") && i + 1 < argc) o.sim = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stop-rank") && i + 1 < argc) o.stop_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sched-total") && i + 1 < argc) o.sched_total = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--save-every") && i + 1 < argc) o.save_every = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--async-save-from") && i + 1 < argc) o.async_from = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--halt-step") && i + 1 < argc) o.halt_step = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--resume")) o.resume = true;
        else if (!strcmp(argv[i], "--gate-step") && i + 1 < argc) o.gate_step = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gate") && i + 1 < argc) o.gate = argv[++i];
        else if (!strcmp(argv[i], "--gate-restart") && i + 1 < argc) o.gate_restart = atoi(argv[++i]);
        else if (ca_config_flag_arity(argv[i]) >= 0) i += ca_config_flag_arity(argv[i]);
        else { fprintf(stderr, "ddp_check: unknown argument %s\n", argv[i]); exit(2); }
    }
    return o;
}

/* --mode localsgd-ref: N model copies from the same start, copy r trained on slice r of each global
 * batch of N * batch (what rank r of N sees), their parameters averaged every K steps and at the end:
 * sum in rank order, times 1/N, as the backends average. */
static void average_copies(ca_module **ms, int n) {
    for (int i = 0; i < ca_module_num_params(ms[0]); i++) {
        size_t bytes = ca_tensor_nbytes(ca_module_param_at(ms[0], i)), len = bytes / sizeof(float);
        float *sum = calloc(len, sizeof(float)), *h = malloc(bytes);
        for (int r = 0; r < n; r++) {
            CA_CHECK(ca_tensor_to_host(ca_module_param_at(ms[r], i), h, bytes));
            for (size_t j = 0; j < len; j++) sum[j] += h[j];
        }
        for (size_t j = 0; j < len; j++) sum[j] = (n & (n - 1)) == 0 ? sum[j] * (1.0f / (float)n) : sum[j] / (float)n;
        for (int r = 0; r < n; r++) CA_CHECK(ca_tensor_copy_from_host(ca_module_param_at(ms[r], i), sum, bytes));
        free(sum);
        free(h);
    }
}

static void localsgd_reference(ca_accelerator *acc, const opts *o, ca_dataset *ds) {
    enum { MAXN = 8 };
    int n = o->sim < 1 ? 1 : o->sim > MAXN ? MAXN : o->sim;
    ca_module *ms[MAXN];
    ca_optimizer *os[MAXN];
    for (int r = 0; r < n; r++) {
        ms[r] = model(o->hidden, o->depth);
        CA_CHECK(ca_sgd_create(ms[r], &(ca_sgd_opts){.lr = 0.2, .momentum = 0.9}, &os[r]));
    }
    for (int i = 0; i < ca_module_num_params(ms[0]); i++) {   /* every copy starts from copy 0 */
        size_t bytes = ca_tensor_nbytes(ca_module_param_at(ms[0], i));
        float *h = malloc(bytes);
        CA_CHECK(ca_tensor_to_host(ca_module_param_at(ms[0], i), h, bytes));
        for (int r = 1; r < n; r++) CA_CHECK(ca_tensor_copy_from_host(ca_module_param_at(ms[r], i), h, bytes));
        free(h);
    }
    ca_dataloader *dl;
    CA_CHECK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = o->batch * n, .shuffle = true, .seed = 5}, &dl));
    CA_CHECK(ca_prepare(acc, NULL, NULL, dl));
    ca_batch b;
    for (int step = 0; step < o->steps && ca_dataloader_next(dl, &b); step++) {
        for (int r = 0; r < n; r++) CA_SCOPE {
            ca_tensor *x = ca_narrow(b.x, 0, r * o->batch, o->batch), *y = ca_narrow(b.y, 0, r * o->batch, o->batch);
            CA_CHECK(ca_backward(acc, ca_cross_entropy(ca_module_forward(ms[r], x), y)));
            CA_CHECK(ca_optimizer_step(os[r]));
            ca_optimizer_zero_grad(os[r]);
        }
        if ((step + 1) % o->lsgd_steps == 0) average_copies(ms, n);
    }
    CA_CHECK(ca_dataloader_status(dl));
    average_copies(ms, n);
    dump(acc, ms[0], o->dump);
    printf("rank=0 reference_copies=%d\n", n);
    ca_dataloader_destroy(dl);
    for (int r = 0; r < n; r++) {
        ca_optimizer_destroy(os[r]);
        ca_module_destroy(ms[r]);
    }
}

/* Evaluation over the whole set: every rank must see exactly n predictions. */
static int uneven(ca_accelerator *acc, ca_module *m, ca_dataset *ds) {
    ca_dataloader *dl;
    CA_CHECK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = 8}, &dl));
    CA_CHECK(ca_prepare_dataloader(acc, dl));
    int64_t seen = 0, batches = 0;
    ca_batch b;
    while (ca_dataloader_next(dl, &b)) {
        CA_NO_GRAD {
            ca_tensor *pred = ca_gather_for_metrics(acc, ca_argmax(ca_module_forward(m, b.x)), &b);
            CA_CHECK(pred ? CA_OK : ca_last_status());
            seen += ca_tensor_dim(pred, 0);
        }
        batches++;
    }
    CA_CHECK(ca_dataloader_status(dl));
    printf("rank=%d eval_samples=%lld eval_batches=%lld\n", ca_process_index(acc), (long long)seen, (long long)batches);
    ca_dataloader_destroy(dl);
    return 0;
}

/* --save-every N (with --project_dir DIR --automatic_checkpoint_naming): trains to --steps optimizer
 * steps, whatever the accumulation (an elastic job changes it), saving a checkpoint every N steps and
 * printing "rank=R trained step S" after each; --resume first loads the newest complete checkpoint, if
 * any. --halt-step S: in the first start (no restart yet) the last rank stops itself (SIGSTOP) after
 * step S, so that a test can kill its machine while no later checkpoint can be written. --gate-step S
 * --gate FILE: after the first restart (the start --gate-restart R names, default 1) every rank prints
 * "rank=R at the gate" after step S and waits until FILE exists (a test lets a machine join meanwhile).
 * --async-save-from S: the saves from step S on are asynchronous (ca_save_state_ex with async). */
static void elastic_train(ca_accelerator *acc, ca_module *m, ca_optimizer *opt, ca_dataloader *dl, const opts *o) {
    if (o->resume) {
        ca_status s = ca_load_state(acc, NULL);
        if (s == CA_ERR_NOT_FOUND) ca_clear_error();
        else CA_CHECK(s);
    }
    int rank = ca_process_index(acc), world = ca_num_processes(acc);
    const char *restart = getenv("CACCEL_RESTART_COUNT");
    bool first = !restart || atoi(restart) == 0;
    ca_batch b;
    while (ca_optimizer_steps(opt) < o->steps) {
        if (!ca_dataloader_next(dl, &b)) {
            CA_CHECK(ca_dataloader_status(dl));
            continue;   /* the next epoch */
        }
        bool boundary = false;
        CA_ACCUMULATE(acc, m) {
            CA_CHECK(ca_backward(acc, ca_cross_entropy(ca_module_forward(m, b.x), b.y)));
            boundary = ca_sync_gradients(acc);
            CA_CHECK(ca_optimizer_step(opt));
            ca_optimizer_zero_grad(opt);
        }
        if (!boundary) continue;
        int64_t step = ca_optimizer_steps(opt);
        printf("rank=%d trained step %lld of %d processes\n", rank, (long long)step, world);
        fflush(stdout);
        if (o->save_every > 0 && step % o->save_every == 0) {
            ca_save_state_options so = {.async = o->async_from > 0 && step >= o->async_from};
            CA_CHECK(ca_save_state_ex(acc, NULL, &so));
        }
        if (first && step == o->halt_step && rank == world - 1) raise(SIGSTOP);
        if (o->gate && (restart ? atoi(restart) : 0) == o->gate_restart && step == o->gate_step) {
            printf("rank=%d at the gate\n", rank);
            fflush(stdout);
            while (access(o->gate, F_OK) != 0) usleep(20 * 1000);
        }
    }
}

int main(int argc, char **argv) {
    opts o = parse(argc, argv);
    bool fp16 = !strcmp(o.mode, "fp16inf");
    char ga[64];
    snprintf(ga, sizeof ga, "gradient_accumulation_steps=%d", o.k);
    const char *settings[] = {ga, fp16 ? "mixed_precision=fp16" : NULL, NULL};
    ca_accelerator *acc;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv, .settings = settings}, &acc));
    CA_CHECK(ca_set_seed(acc, 11));
    ca_dataset *ds = synthetic(!strcmp(o.mode, "uneven") ? 103 : 4096);
    if (!strcmp(o.mode, "localsgd-ref")) {
        localsgd_reference(acc, &o, ds);
        ca_dataset_destroy(ds);
        ca_accelerator_destroy(acc);
        ca_shutdown();
        return 0;
    }
    ca_dataloader *dl;
    CA_CHECK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = o.batch, .shuffle = true, .seed = 5}, &dl));
    ca_allocator_stats st0, st1, st2;
    CA_CHECK(ca_device_reset_peak_stats(ca_accelerator_device(acc)));
    CA_CHECK(ca_device_memory_stats(ca_accelerator_device(acc), &st0));
    int64_t base0 = (int64_t)st0.allocated;
    /* only --meta switches it: under zero3_init_flag the accelerator has switched it on already */
    if (o.meta) CA_CHECK(ca_init_empty_weights(true));
    ca_module *m = model(o.hidden, o.depth);
    if (o.tp_plan) tp_plan(m, o.depth);
    if (o.meta) CA_CHECK(ca_init_empty_weights(false));
    if (ca_module_is_meta(m)) printf("rank=%d model_meta=1\n", ca_process_index(acc));
    if (o.try_early) {   /* a failed load before prepare leaves the model as it was */
        ca_status s = ca_load_model(acc, m, o.try_early);
        int meta = 0;
        for (int i = 0; i < ca_module_num_params(m); i++) meta += ca_tensor_is_meta(ca_module_param_at(m, i));
        printf("rank=%d early_load=%s: %s\nrank=%d meta_params=%d of %d\n", ca_process_index(acc), ca_status_name(s),
               s == CA_OK ? "" : ca_last_error(), ca_process_index(acc), meta, ca_module_num_params(m));
        fflush(stdout);
        if (o.leave) _exit(s == CA_OK ? 0 : 3);
        ca_clear_error();
    }
    if (o.load_early) CA_CHECK(ca_load_model(acc, m, o.load_early));
    if (o.cut) {   /* the file shrinks between a deferred load (every rank's) and its read */
        CA_CHECK(ca_wait_for_everyone(acc));
        struct stat sb;
        if (ca_process_index(acc) == 0 && (stat(o.cut, &sb) != 0 || truncate(o.cut, sb.st_size - 4) != 0)) {
            perror(o.cut);
            return 1;
        }
        CA_CHECK(ca_wait_for_everyone(acc));
    }
    int64_t pbytes = 0, largest = 0;
    for (int i = 0; i < ca_module_num_params(m); i++) {
        int64_t b = (int64_t)ca_tensor_nbytes(ca_module_param_at(m, i));
        pbytes += b;
        largest = b > largest ? b : largest;
    }
    CA_CHECK(ca_device_memory_stats(ca_accelerator_device(acc), &st0));
    ca_module *frozen = o.freeze ? ca_module_child(m, o.freeze) : NULL;
    void *frozen0 = frozen ? snapshot(frozen) : NULL;
    if (frozen) CA_CHECK(ca_module_requires_grad(frozen, false));
    ca_optimizer *opt;
    if (o.adamw) CA_CHECK(ca_adamw_create(m, &(ca_adamw_opts){.lr = o.lr / 20}, &opt));
    else CA_CHECK(ca_sgd_create(m, &(ca_sgd_opts){.lr = o.lr, .momentum = 0.9}, &opt));
    if (o.sched_total > 0)
        CA_CHECK(ca_optimizer_set_schedule(opt, &(ca_lr_schedule){.kind = CA_SCHED_LINEAR,
                                                                  .total_steps = o.sched_total}));
    CA_CHECK(ca_prepare(acc, m, opt, dl));
    if (o.mem) {   /* the most held from before the model was built to the end of ca_prepare */
        ca_allocator_stats sp;
        CA_CHECK(ca_device_memory_stats(ca_accelerator_device(acc), &sp));
        printf("rank=%d prepare_peak_bytes=%lld model_bytes=%lld largest_param_bytes=%lld\n",
               ca_process_index(acc), (long long)((int64_t)sp.peak_allocated - base0), (long long)pbytes,
               (long long)largest);
    }
    if (o.load_state) {   /* --mem: the most the load held above what the run held before it */
        ca_allocator_stats l0, l1;
        CA_CHECK(ca_device_memory_stats(ca_accelerator_device(acc), &l0));
        CA_CHECK(ca_device_reset_peak_stats(ca_accelerator_device(acc)));
        struct rusage r0, r1;
        struct timespec t0, t1;
        getrusage(RUSAGE_SELF, &r0);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CA_CHECK(ca_load_state(acc, o.load_state));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        getrusage(RUSAGE_SELF, &r1);
        CA_CHECK(ca_device_memory_stats(ca_accelerator_device(acc), &l1));
        if (o.mem) {
            printf("rank=%d load_peak_bytes=%lld model_bytes=%lld\n", ca_process_index(acc),
                   (long long)l1.peak_allocated - (long long)l0.allocated, (long long)pbytes);
            /* the process's peak resident memory before and after the load, and the load's wall time */
#define CPU_MS(r) ((double)((r).ru_utime.tv_sec + (r).ru_stime.tv_sec) * 1e3 + \
                   (double)((r).ru_utime.tv_usec + (r).ru_stime.tv_usec) / 1e3)
            printf("rank=%d load_maxrss_kb=%ld->%ld load_ms=%.1f load_cpu_ms=%.1f\n", ca_process_index(acc), r0.ru_maxrss,
                   r1.ru_maxrss, (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6,
                   CPU_MS(r1) - CPU_MS(r0));
#undef CPU_MS
        }
    }
    if (o.load_model) CA_CHECK(ca_load_model(acc, m, o.load_model));
    if (o.try_load) {
        digest(m, ca_process_index(acc));
        ca_status s = ca_load_model(acc, m, o.try_load);
        printf("rank=%d load_model=%s: %s\n", ca_process_index(acc), ca_status_name(s), s == CA_OK ? "" : ca_last_error());
        digest(m, ca_process_index(acc));
        fflush(stdout);
        _exit(s == CA_OK ? 0 : 3);
    }
    if (o.save_every > 0) {
        elastic_train(acc, m, opt, dl, &o);
        o.steps = 0;   /* the loop below has nothing left to do */
    }
    ca_comm *comm = ca_accelerator_comm(acc);
    int rank = ca_process_index(acc), world = ca_num_processes(acc);
    int rc = 0, micro = 0;
    uint64_t seq0 = ca_comm_seq(comm), bytes0 = ca_comm_bytes(comm);
    ca_local_sgd *lsgd = NULL;
    if (!strcmp(o.mode, "localsgd")) CA_CHECK(ca_local_sgd_begin(acc, m, o.lsgd_steps, true, &lsgd));
    ca_batch b;
    while (micro < o.steps * o.k && ca_dataloader_next(dl, &b)) {
        /* between steps: the loader ended the previous step's scope; only the batch is new */
        CA_CHECK(ca_device_memory_stats(ca_accelerator_device(acc), &st1));
        CA_CHECK(ca_device_reset_peak_stats(ca_accelerator_device(acc)));
        if (micro == 2 && rank == o.stop_rank) {   /* a hung peer: alive, silent */
            printf("rank=%d stops\n", rank);
            fflush(stdout);
            raise(SIGSTOP);
        }
        CA_ACCUMULATE(acc, m) {
            ca_tensor *x = b.x;
            if (fp16 && o.inf_input && micro == 2 && rank == world - 1) x = ca_mul_scalar(x, 1e30);
            ca_tensor *loss = ca_cross_entropy(ca_module_forward(m, x), b.y);
            CA_CHECK(ca_backward(acc, loss));
            micro++;
            if (o.dump_grads && micro == o.k) dump_grads(acc, m, o.dump_grads);
            if (fp16 && !o.inf_input && micro == 3 && rank == world - 1) {   /* overflow on one rank only */
                ca_tensor *g = ca_tensor_grad(ca_module_param(m, "fc2.bias"));
                float h[3];
                CA_CHECK(ca_tensor_to_host(g, h, sizeof h));
                h[0] = 1.0f / 0.0f;
                CA_CHECK(ca_tensor_copy_from_host(g, h, sizeof h));
            }
            if (!strcmp(o.mode, "clip")) {
                double norm;
                CA_CHECK(ca_clip_grad_norm(acc, 0.5, &norm));
                if (ca_optimizer_steps(opt) == 0) printf("rank=%d first_norm=%.6f\n", rank, norm);
            }
            bool boundary = ca_sync_gradients(acc);
            CA_CHECK(ca_optimizer_step(opt));
            ca_optimizer_zero_grad(opt);
            if (lsgd && boundary) CA_CHECK(ca_local_sgd_step(lsgd));
            if (fp16 && micro == 3) {
                ca_grad_scaler_state st;
                CA_CHECK(ca_grad_scaler_get(acc, &st));
                printf("rank=%d skipped=%d scale=%.0f\n", rank, ca_optimizer_step_was_skipped(opt), st.scale);
            }
            if (boundary && !strcmp(o.mode, "accum")) {
                /* every micro-step before the boundary reduced nothing: one bucket, one all-reduce */
                uint64_t seq = ca_comm_seq(comm);
                uint64_t bytes = ca_comm_bytes(comm);
                printf("rank=%d collectives_per_step=%llu\n", rank, (unsigned long long)(seq - seq0));
                printf("rank=%d bytes_per_step=%llu\n", rank, (unsigned long long)(bytes - bytes0));
                seq0 = seq;
                bytes0 = bytes;
            }
        }
    }
    CA_CHECK(ca_dataloader_status(dl));
    if (o.solo > 0 && !o.try_state) solo(acc, m, &o);   /* the run that never tried the load */
    if (o.try_state) {
        try_load_state(acc, m, opt, dl, &o);
        o.save_state = o.save_model = o.dump = NULL;   /* nothing else: the teardown */
        o.digest = false;
    }
    if (o.state_digest) {
        state_digest(acc, m, opt);
        next_batch_digest(acc, dl);
    }
    if (o.save_state) CA_CHECK(ca_save_state(acc, o.save_state));
    if (o.save_model) CA_CHECK(ca_save_model(acc, m, o.save_model, 0));
    if (lsgd) {
        CA_CHECK(ca_local_sgd_end(lsgd));
        printf("rank=%d collectives=%llu\n", rank, (unsigned long long)(ca_comm_seq(comm) - seq0));
    }
    CA_CHECK(ca_device_memory_stats(ca_accelerator_device(acc), &st2));
    if (o.mem) {
        printf("rank=%d state_bytes=%lld\n", rank, (long long)st1.allocated - (long long)st0.allocated + (long long)pbytes);
        printf("rank=%d step_peak_bytes=%lld param_bytes=%lld\n", rank,
               (long long)st2.peak_allocated - (long long)st1.allocated, (long long)pbytes);
    }
    printf("rank=%d steps=%lld lr_factor=%.4f\n", rank, (long long)ca_optimizer_steps(opt),
           ca_optimizer_get_lr(opt, 0) / o.lr);
    printf("rank=%d lr=%.6g\n", rank, ca_optimizer_get_lr(opt, 0));
    if (!strcmp(o.mode, "uneven")) rc = uneven(acc, m, ds);
    if (o.read_sharded) {
        ca_tensor *w = ca_module_param(m, "fc1.weight");
        void *h = malloc(ca_tensor_nbytes(w));
        ca_status s = ca_tensor_to_host(w, h, ca_tensor_nbytes(w));
        printf("rank=%d read_sharded=%s\n", rank, s == CA_OK ? "ok" : ca_last_error());
        ca_clear_error();
        free(h);
    }
    CA_CHECK(ca_summon_full_params(acc, true));   /* stage 3: the parameters are shards until now */
    if (frozen) {
        void *now = snapshot(frozen);
        printf("rank=%d opt_state_bytes=%lld\n", rank, (long long)ca_optimizer_state_bytes(opt));
        printf("rank=%d frozen_unchanged=%d\n", rank, !memcmp(now, frozen0, snapshot_bytes(frozen)));
        free(now);
        free(frozen0);
    }
    dump(acc, m, o.dump);
    if (o.digest) digest(m, rank);
    CA_CHECK(ca_wait_for_everyone(acc));
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
    ca_shutdown();
    return rc;
}
