/* sync_check: synchronisation control, objects and padding, and join_uneven_inputs, run as real
 * processes (caccel launch or mpirun) by tests/test_sync.sh. Every mode prints "rank=R key=value"
 * lines that the script checks at each world size.
 *   --mode nosync : CA_NO_SYNC, CA_TRIGGER_SYNC_IN_BACKWARD, ca_set_sync_gradients on a one-weight
 *                   model whose gradient on rank r is r + 1
 *   --mode accum  : the sync pattern of CA_ACCUMULATE as gradient_accumulation_steps changes at run time
 *   --mode trigger: the last rank raises the trigger at iteration 3
 *   --mode objects: gather_object, broadcast_object_list, pad_across_processes, reduce, rng states
 *   --mode models : two models and optimizers on one accelerator, each model its own buckets
 *   --mode teacher: a frozen teacher prepared first (no optimizer), then the trained student
 *   --mode autocast: CA_AUTOCAST scopes, nested, with and without mixed_precision
 *   --mode join   : 103 samples without even batches, trained inside join_uneven_inputs
 *                   (--even yes|no overrides even_batches) */
#include <caccel/caccel.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, world;

/* w * x summed: d/dw = x, so rank r's local gradient is r + 1. */
static void one_backward(ca_accelerator *acc, ca_module *m) {
    int64_t one = 1;
    float x = (float)(rank + 1);
    ca_tensor *in = ca_from_host(ca_accelerator_device(acc), CA_F32, 2, (int64_t[]){1, one}, &x);
    CA_CHECK(ca_backward(acc, ca_sum(ca_module_forward(m, in))));
}

static double grad0(ca_module *m) {
    float g;
    CA_CHECK(ca_tensor_to_host(ca_tensor_grad(ca_module_param_at(m, 0)), &g, sizeof g));
    return g;
}

static double weight0(ca_module *m) {
    float w;
    CA_CHECK(ca_tensor_to_host(ca_module_param_at(m, 0), &w, sizeof w));
    return w;
}

static void nosync(ca_accelerator *acc) {
    ca_module *m;
    ca_optimizer *opt;
    CA_CHECK(ca_linear_create(1, 1, false, &m));
    CA_CHECK(ca_sgd_create(m, &(ca_sgd_opts){.lr = 0.5}, &opt));
    CA_CHECK(ca_prepare(acc, m, opt, NULL));
    ca_comm *c = ca_accelerator_comm(acc);
    uint64_t s0 = ca_comm_seq(c);
    CA_NO_SYNC(acc, m) { one_backward(acc, m); }
    printf("rank=%d nosync_grad=%g nosync_collectives=%llu\n", rank, grad0(m), (unsigned long long)(ca_comm_seq(c) - s0));
    s0 = ca_comm_seq(c);
    one_backward(acc, m);   /* synchronises the sum of both passes: 2 * mean(r + 1) = world + 1 */
    printf("rank=%d synced_grad=%g sync_collectives=%llu\n", rank, grad0(m), (unsigned long long)(ca_comm_seq(c) - s0));
    ca_optimizer_zero_grad(opt);
    CA_NO_SYNC(acc, m) {
        CA_TRIGGER_SYNC_IN_BACKWARD(acc, m) { one_backward(acc, m); }
    }
    printf("rank=%d triggered_grad=%g\n", rank, grad0(m));   /* (world + 1) / 2 */
    ca_optimizer_zero_grad(opt);
    double w0 = weight0(m);
    CA_CHECK(ca_set_sync_gradients(acc, false));
    one_backward(acc, m);
    CA_CHECK(ca_optimizer_step(opt));   /* held back */
    printf("rank=%d unsynced_grad=%g sync_gradients=%d step_moved=%d\n", rank, grad0(m),
           ca_sync_gradients(acc), weight0(m) != w0);
    CA_CHECK(ca_set_sync_gradients(acc, true));
    ca_optimizer_zero_grad(opt);
    one_backward(acc, m);
    CA_CHECK(ca_optimizer_step(opt));
    printf("rank=%d resynced_grad=%g step_delta=%g\n", rank, grad0(m), weight0(m) - w0);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
}

static void accum(ca_accelerator *acc) {
    ca_module *m;
    ca_optimizer *opt;
    CA_CHECK(ca_linear_create(1, 1, false, &m));
    CA_CHECK(ca_sgd_create(m, &(ca_sgd_opts){.lr = 0.1}, &opt));
    CA_CHECK(ca_prepare(acc, m, opt, NULL));
    ca_comm *c = ca_accelerator_comm(acc);
    for (int k = 2; k <= 3; k++) {
        CA_CHECK(ca_set_gradient_accumulation_steps(acc, k));
        char pat[16] = {0}, col[16] = {0};
        for (int i = 0; i < 6; i++) {
            uint64_t s0 = ca_comm_seq(c);
            CA_ACCUMULATE(acc, m) {
                one_backward(acc, m);
                pat[i] = ca_sync_gradients(acc) ? '1' : '0';
                CA_CHECK(ca_optimizer_step(opt));
                ca_optimizer_zero_grad(opt);
            }
            col[i] = (char)('0' + (ca_comm_seq(c) - s0));
        }
        printf("rank=%d k=%d pattern=%s collectives=%s steps=%lld\n", rank, ca_gradient_accumulation_steps(acc),
               pat, col, (long long)ca_optimizer_steps(opt));
    }
    if (ca_set_gradient_accumulation_steps(acc, 0) == CA_OK) exit(3);
    printf("rank=%d error=%s\n", rank, ca_last_error());
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
}

static void trigger(ca_accelerator *acc) {
    int seen = -1;
    for (int i = 0; i < 6 && seen < 0; i++) {
        if (i == 3 && rank == world - 1) CA_CHECK(ca_set_trigger(acc));
        bool raised;
        CA_CHECK(ca_check_trigger(acc, &raised));
        if (raised) seen = i;
    }
    bool again;
    CA_CHECK(ca_check_trigger(acc, &again));
    printf("rank=%d trigger_seen_at=%d again=%d\n", rank, seen, again);
}

static void objects(ca_accelerator *acc) {
    ca_device *dev = ca_accelerator_device(acc);
    char mine[64] = "";
    for (int i = 0; i <= rank; i++) snprintf(mine + strlen(mine), sizeof mine - strlen(mine), "r%d", rank);
    void *all;
    size_t len, counts[16];
    CA_CHECK(ca_gather_object(acc, mine, strlen(mine), &all, &len, counts));
    printf("rank=%d gathered=%.*s count_last=%zu\n", rank, (int)len, (char *)all, counts[world - 1]);
    free(all);
    char root_text[] = "hello from the last rank";
    void *bufs[2] = {rank == world - 1 ? root_text : NULL, rank == world - 1 ? "x" : NULL};
    size_t lens[2] = {rank == world - 1 ? strlen(root_text) : 0, rank == world - 1 ? 1 : 0};
    CA_CHECK(ca_broadcast_object_list(acc, bufs, lens, 2, world - 1));
    printf("rank=%d broadcast=%.*s|%.*s\n", rank, (int)lens[0], (char *)bufs[0], (int)lens[1], (char *)bufs[1]);
    if (rank != world - 1) { free(bufs[0]); free(bufs[1]); }
    /* rank r holds r + 1 rows of value r: padded to world rows with -1, gathered */
    ca_tensor *t = ca_full(dev, CA_F32, 2, (int64_t[]){rank + 1, 2}, rank);
    for (int first = 0; first <= 1; first++) {
        ca_tensor *p = ca_pad_across_processes(acc, t, 0, -1, first);
        ca_tensor *g = ca_gather(acc, p);
        CA_CHECK(g ? CA_OK : ca_last_status());
        int64_t n = ca_tensor_dim(g, 0);
        float h[64];
        CA_CHECK(ca_tensor_to_host(g, h, sizeof(float) * (size_t)(n * 2)));
        printf("rank=%d pad_first=%d rows=%lld col0=", rank, first, (long long)n);
        for (int64_t i = 0; i < n; i++) printf("%g%s", h[2 * i], i + 1 < n ? "," : "\n");
    }
    float v = (float)(rank + 1);
    ca_tensor *s = ca_from_host(dev, CA_F32, 1, (int64_t[]){1}, &v), *mn = ca_from_host(dev, CA_F32, 1, (int64_t[]){1}, &v);
    CA_CHECK(ca_reduce_scaled(acc, s, "sum", 2.0));
    CA_CHECK(ca_reduce_scaled(acc, mn, "mean", 1.0));
    double sv, mv;
    CA_CHECK(ca_tensor_item(s, &sv));
    CA_CHECK(ca_tensor_item(mn, &mv));
    float x = (float)(rank + 1);
    ca_tensor *mx = ca_from_host(dev, CA_F32, 1, (int64_t[]){1}, &x);
    double xv;
    CA_CHECK(ca_reduce_scaled(acc, mx, "max", 1.0));
    CA_CHECK(ca_tensor_item(mx, &xv));
    printf("rank=%d reduce_sum_x2=%g reduce_mean=%g reduce_max=%g\n", rank, sv, mv, xv);
    if (ca_reduce_scaled(acc, s, "prod", 1.0) == CA_OK) exit(3);
    printf("rank=%d reduce_error=%s\n", rank, ca_last_error());
    ca_manual_seed(100 + (uint64_t)rank);   /* every rank its own generator, then rank 0's */
    CA_CHECK(ca_synchronize_rng_states(acc));
    ca_tensor *r = ca_rand_uniform(dev, CA_F32, 1, (int64_t[]){4}, 0, 1);
    ca_tensor *r0 = ca_empty(dev, CA_F32, 1, (int64_t[]){4});
    CA_CHECK(ca_tensor_copy_(r0, r));
    CA_CHECK(ca_broadcast(acc, r0, 0));
    float a[4], b[4];
    CA_CHECK(ca_tensor_to_host(r, a, sizeof a));
    CA_CHECK(ca_tensor_to_host(r0, b, sizeof b));
    printf("rank=%d rng_same_as_rank0=%d\n", rank, !memcmp(a, b, sizeof a));
}

/* Two models prepared on one accelerator (a GAN's generator and critic): a backward reduces the
 * buckets of the models it reached, each model's own. */
static void two_models(ca_accelerator *acc) {
    ca_module *a, *b;
    ca_optimizer *oa, *ob;
    CA_CHECK(ca_linear_create(1, 1, false, &a));
    CA_CHECK(ca_linear_create(1, 1, false, &b));
    CA_CHECK(ca_sgd_create(a, &(ca_sgd_opts){.lr = 0.5}, &oa));
    CA_CHECK(ca_sgd_create(b, &(ca_sgd_opts){.lr = 0.5}, &ob));
    CA_CHECK(ca_prepare(acc, a, oa, NULL));
    CA_CHECK(ca_prepare(acc, b, ob, NULL));
    ca_comm *c = ca_accelerator_comm(acc);
    uint64_t s0 = ca_comm_seq(c);
    one_backward(acc, a);   /* a only: one all-reduce, b's gradient untouched */
    printf("rank=%d a_only collectives=%llu grad_a=%g b_has_grad=%d\n", rank, (unsigned long long)(ca_comm_seq(c) - s0),
           grad0(a), ca_tensor_grad(ca_module_param_at(b, 0)) != NULL);
    ca_optimizer_zero_grad(oa);
    s0 = ca_comm_seq(c);
    float x = (float)(rank + 1);
    ca_tensor *in = ca_from_host(ca_accelerator_device(acc), CA_F32, 2, (int64_t[]){1, 1}, &x);
    ca_tensor *loss = ca_add(ca_sum(ca_module_forward(a, in)), ca_mul(ca_sum(ca_module_forward(b, in)),
                                                                      ca_full(ca_accelerator_device(acc), CA_F32, 0, NULL, 3)));
    CA_CHECK(ca_backward(acc, loss));   /* both: one all-reduce each */
    printf("rank=%d both collectives=%llu grad_a=%g grad_b=%g\n", rank, (unsigned long long)(ca_comm_seq(c) - s0),
           grad0(a), grad0(b));
    double wa = weight0(a), wb = weight0(b);
    CA_CHECK(ca_optimizer_step(oa));
    CA_CHECK(ca_optimizer_step(ob));
    printf("rank=%d steps delta_a=%g delta_b=%g\n", rank, weight0(a) - wa, weight0(b) - wb);
    if (ca_save_state(acc, "unused") == CA_OK) exit(3);
    printf("rank=%d save_state_error=%s\n", rank, ca_last_error());
    ca_optimizer_destroy(oa);
    ca_optimizer_destroy(ob);
    ca_module_destroy(b);
    ca_module_destroy(a);
}

/* A wholly frozen teacher prepared before its student (Accelerate wraps no DDP around a model with
 * nothing to train): the student's bucket is the only reduction. */
static void teacher(ca_accelerator *acc) {
    ca_module *t, *s;
    ca_optimizer *os;
    CA_CHECK(ca_linear_create(1, 1, false, &t));
    CA_CHECK(ca_linear_create(1, 1, false, &s));
    CA_CHECK(ca_module_requires_grad(t, false));
    CA_CHECK(ca_sgd_create(s, &(ca_sgd_opts){.lr = 0.5}, &os));
    CA_CHECK(ca_prepare(acc, t, NULL, NULL));
    CA_CHECK(ca_prepare(acc, s, os, NULL));
    ca_comm *c = ca_accelerator_comm(acc);
    uint64_t s0 = ca_comm_seq(c);
    float x = (float)(rank + 1);
    ca_tensor *in = ca_from_host(ca_accelerator_device(acc), CA_F32, 2, (int64_t[]){1, 1}, &x);
    CA_CHECK(ca_backward(acc, ca_add(ca_sum(ca_module_forward(s, in)), ca_sum(ca_module_forward(t, in)))));
    printf("rank=%d teacher collectives=%llu grad_s=%g teacher_has_grad=%d\n", rank,
           (unsigned long long)(ca_comm_seq(c) - s0), grad0(s), ca_tensor_grad(ca_module_param_at(t, 0)) != NULL);
    ca_optimizer_destroy(os);
    ca_module_destroy(s);
    ca_module_destroy(t);
}

/* The dtype a matmul of f32 inputs produces: the autocast in force. */
static const char *mm(ca_accelerator *acc) {
    ca_tensor *x = ca_full(ca_accelerator_device(acc), CA_F32, 2, (int64_t[]){2, 2}, 1);
    return ca_dtype_name(ca_tensor_dtype(ca_matmul(x, x)));
}

static void autocast(ca_accelerator *acc) {
    ca_module *m;
    CA_CHECK(ca_linear_create(2, 2, false, &m));
    CA_CHECK(ca_prepare(acc, m, NULL, NULL));
    ca_tensor *x = ca_full(ca_accelerator_device(acc), CA_F32, 2, (int64_t[]){2, 2}, 1);
    printf("outside=%s", mm(acc));
    CA_AUTOCAST(acc, NULL) {
        printf(" scope=%s", mm(acc));
        CA_AUTOCAST(acc, &(ca_autocast_opts){.enabled = CA_NO}) {
            printf(" disabled=%s model=%s", mm(acc), ca_dtype_name(ca_tensor_dtype(ca_module_forward(m, x))));
            CA_AUTOCAST(acc, &(ca_autocast_opts){.dtype = CA_F16}) { printf(" f16=%s", mm(acc)); }
            printf(" back=%s", mm(acc));
        }
        printf(" outer=%s", mm(acc));
    }
    printf(" after=%s", mm(acc));
    int ran = 0;
    CA_AUTOCAST(acc, &(ca_autocast_opts){.dtype = CA_I32}) { ran = 1; }
    printf(" bad_ran=%d error=%s\n", ran, ca_last_error());
    ca_module_destroy(m);
}

static ca_dataset *synthetic(int64_t n) {
    float *x = malloc(sizeof(float) * (size_t)(n * 8));
    int64_t *y = malloc(sizeof(int64_t) * (size_t)n);
    uint64_t s = 77;
    for (int64_t i = 0; i < n; i++) {
        for (int j = 0; j < 8; j++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            x[i * 8 + j] = (float)((s >> 40) * (2.0 / 16777216.0) - 1.0);
        }
        y[i] = (int64_t)(s % 3);
    }
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {8}}, ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds;
    CA_CHECK(ca_dataset_from_memory(&xs, x, &ys, y, n, &ds));
    free(x);
    free(y);
    return ds;
}

/* Trains over an uneven split inside join_uneven_inputs; every rank ends with the same parameters. */
static void join(ca_accelerator *acc, ca_tristate even) {
    ca_dataset *ds = synthetic(103);
    ca_dataloader *dl;
    CA_CHECK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = 8}, &dl));
    ca_module *m;
    ca_optimizer *opt;
    CA_CHECK(ca_linear_create(8, 3, true, &m));
    CA_CHECK(ca_sgd_create(m, &(ca_sgd_opts){.lr = 0.1}, &opt));
    CA_CHECK(ca_prepare(acc, m, opt, dl));
    bool joining = getenv("SYNC_CHECK_NO_JOIN") == NULL;   /* without: the longer rank waits forever */
    if (joining) CA_CHECK(ca_join_uneven_inputs_begin(acc, even));
    else CA_CHECK(ca_dataloader_shard(dl, rank, world, even != CA_NO));
    int64_t batches = 0;
    ca_batch b;
    while (ca_dataloader_next(dl, &b)) {
        CA_CHECK(ca_backward(acc, ca_cross_entropy(ca_module_forward(m, b.x), b.y)));
        CA_CHECK(ca_optimizer_step(opt));
        ca_optimizer_zero_grad(opt);
        batches++;
    }
    CA_CHECK(ca_dataloader_status(dl));
    if (joining) CA_CHECK(ca_join_uneven_inputs_end(acc));
    /* the same parameters everywhere: rank 0's copy against this rank's */
    ca_tensor *w = ca_module_param_at(m, 0), *w0 = ca_empty(ca_accelerator_device(acc), CA_F32, 2, (int64_t[]){3, 8});
    CA_CHECK(ca_tensor_copy_(w0, w));
    CA_CHECK(ca_broadcast(acc, w0, 0));
    float a[24], c[24];
    CA_CHECK(ca_tensor_to_host(w, a, sizeof a));
    CA_CHECK(ca_tensor_to_host(w0, c, sizeof c));
    printf("rank=%d batches=%lld params_same=%d joined\n", rank, (long long)batches, !memcmp(a, c, sizeof a));
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
}

int main(int argc, char **argv) {
    const char *mode = "nosync";
    ca_tristate even = CA_UNSET;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mode") && i + 1 < argc) mode = argv[++i];
        else if (!strcmp(argv[i], "--even") && i + 1 < argc) even = !strcmp(argv[++i], "yes") ? CA_YES : CA_NO;
        else if (ca_config_flag_arity(argv[i]) >= 0) i += ca_config_flag_arity(argv[i]);
        else { fprintf(stderr, "sync_check: unknown argument %s\n", argv[i]); return 2; }
    }
    ca_accelerator *acc;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv}, &acc));
    CA_CHECK(ca_set_seed(acc, 3));
    rank = ca_process_index(acc);
    world = ca_num_processes(acc);
    if (!strcmp(mode, "nosync")) nosync(acc);
    else if (!strcmp(mode, "accum")) accum(acc);
    else if (!strcmp(mode, "trigger")) trigger(acc);
    else if (!strcmp(mode, "objects")) objects(acc);
    else if (!strcmp(mode, "join")) join(acc, even);
    else if (!strcmp(mode, "models")) two_models(acc);
    else if (!strcmp(mode, "teacher")) teacher(acc);
    else if (!strcmp(mode, "autocast")) autocast(acc);
    else { fprintf(stderr, "sync_check: unknown mode %s\n", mode); return 2; }
    fflush(stdout);
    CA_CHECK(ca_wait_for_everyone(acc));
    ca_accelerator_destroy(acc);
    ca_shutdown();
    return 0;
}
