/* The Accelerator: configuration, device and process-group selection, prepare, backward with bucketed gradient all-reduce, accumulation, and the distributed helpers. */
#include "accelerator/accelerator_impl.h"
#include "comm/comm_impl.h"
#include "config/config_impl.h"
#include "core/registry_impl.h"
#include <caccel/xla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ creation */

static ca_status load_config(ca_accelerator *acc, const ca_options *o) {
    ca_status s = ca_config_create(&acc->cfg);
    if (s != CA_OK) return s;
    /* typed programmatic options become settings of the lowest layer */
    const char *extra[8];
    char mp[64], cpu[32], ga[64], cf[4096];
    int n = 0;
    if (o && o->mixed_precision) { snprintf(mp, sizeof mp, "mixed_precision=%s", o->mixed_precision); extra[n++] = mp; }
    if (o && o->use_cpu != CA_UNSET) { snprintf(cpu, sizeof cpu, "use_cpu=%s", o->use_cpu == CA_YES ? "true" : "false"); extra[n++] = cpu; }
    if (o && o->gradient_accumulation_steps) {
        snprintf(ga, sizeof ga, "gradient_accumulation_steps=%d", o->gradient_accumulation_steps);
        extra[n++] = ga;
    }
    if (o && o->config_file) { snprintf(cf, sizeof cf, "config_file=%s", o->config_file); extra[n++] = cf; }
    char lw[512];
    if (o && o->log_with) { snprintf(lw, sizeof lw, "log_with=%s", o->log_with); extra[n++] = lw; }
    int nuser = 0;
    while (o && o->settings && o->settings[nuser]) nuser++;
    const char **all = calloc((size_t)(nuser + n + 1), sizeof *all);
    if (!all) return ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int i = 0; i < nuser; i++) all[i] = o->settings[i];
    for (int i = 0; i < n; i++) all[nuser + i] = extra[i];
    s = ca_config_load(acc->cfg, all, o ? o->argc : 0, o ? o->argv : NULL);
    free(all);
    if (s == CA_OK) s = ca_config_settings(acc->cfg, &acc->st);
    return s;
}

static ca_status check_supported(const ca_accelerator *acc) {
    const ca_settings *st = &acc->st;
    switch (st->distributed_type) {
    case CA_DIST_NO: case CA_DIST_MULTI_CPU: case CA_DIST_MULTI_GPU: case CA_DIST_XLA: break;
    case CA_DIST_FSDP: case CA_DIST_DEEPSPEED: break;   /* sharded data parallelism (zero.c) */
    default:
        return ca_error(CA_ERR_UNSUPPORTED, "distributed_type %s (from %s) is not supported by this build of caccel; "
                        "supported: NO, MULTI_CPU, MULTI_GPU, XLA, FSDP, DEEPSPEED", st->distributed_type_name,
                        ca_config_origin(acc->cfg, "distributed_type"));
    }
    if (st->mixed_precision == CA_MP_FP8)
        return ca_error(CA_ERR_UNSUPPORTED, "mixed_precision fp8 (from %s) is not supported by this build; "
                        "supported: no, fp16, bf16", ca_config_origin(acc->cfg, "mixed_precision"));
    return ca_config_check_parallelism(acc->cfg);
}

/* The kind of device the configuration asks for: lazy for XLA, a GPU unless use_cpu, else the host. */
static ca_device_kind wanted_kind(const ca_settings *st) {
    if (st->use_cpu) return CA_DEVICE_HOST;
    return st->distributed_type == CA_DIST_XLA ? CA_DEVICE_LAZY : CA_DEVICE_GPU;
}

/* One lazy device per process; bf16 on it is Accelerate's on a TPU: storage in bf16
 * (XLA_USE_BF16), no autocast. */
static ca_status open_lazy(ca_accelerator *acc, const ca_backend_info *bi) {
    ca_device_open_args args = {.struct_size = sizeof args, .local_rank = acc->local_rank};
    ca_status s = ca_device_open(bi->name, 0, &args, &acc->device);
    if (s == CA_OK && acc->st.mixed_precision == CA_MP_BF16 && !ca_xla_bf16_storage(acc->device)) {
        s = ca_xla_set_bf16_storage(acc->device, true);
        acc->bf16_storage_set = s == CA_OK;
    }
    return s;
}

/* Why no device of `kind` is usable: the first such backend's reason, or what to install. */
static void why_none(ca_device_kind kind, const ca_backend_info *bi, char *buf, size_t len) {
    const ca_plugin_hint *h = ca_registry_hint(CA_BACKEND_DEVICE, NULL, kind);
    if (bi->name)
        snprintf(buf, len, "%s", bi->reason && bi->reason[0] ? bi->reason : "no device visible");
    else if (h)
        snprintf(buf, len, "the %s plugin is not installed (%s, built with %s)", h->name, h->file, h->package);
    else
        snprintf(buf, len, "no plugin provides such a device");
}

/* The best usable device of the kind the configuration asks for (registry score); a GPU run
 * without one trains on the CPU with a one-line notice, except MULTI_GPU, which demands a GPU. */
static ca_status select_device(ca_accelerator *acc) {
    const ca_settings *st = &acc->st;
    ca_device_kind kind = wanted_kind(st);
    if (kind != CA_DEVICE_HOST) {
        ca_backend_info bi;
        ca_status found = ca_registry_best_device(kind, &bi);
        if (found == CA_OK && kind == CA_DEVICE_LAZY) return open_lazy(acc, &bi);
        if (found == CA_OK) {
            ca_device_open_args args = {.struct_size = sizeof args, .local_rank = acc->local_rank,
                                        .gpu_ids = st->gpu_ids};
            /* more local processes than GPUs share them (Gloo/MPI stage through the host; NCCL refuses) */
            int index = acc->world > 1 ? acc->local_rank % bi.device_count : 0;
            return ca_device_open(bi.name, index, &args, &acc->device);
        }
        char reason[300];
        why_none(kind, &bi, reason, sizeof reason);
        if (kind == CA_DEVICE_LAZY)
            return ca_error(CA_ERR_UNSUPPORTED, "distributed_type XLA (from %s) needs a lazy device: %s",
                            ca_config_origin(acc->cfg, "distributed_type"), reason);
        if (st->distributed_type == CA_DIST_MULTI_GPU && acc->infer_type) {
            acc->st.distributed_type = CA_DIST_MULTI_CPU;
        } else if (st->distributed_type == CA_DIST_MULTI_GPU)
            return ca_error(CA_ERR_UNSUPPORTED, "distributed_type MULTI_GPU (from %s) needs a GPU: %s",
                            ca_config_origin(acc->cfg, "distributed_type"), reason);
        /* one line, where a GPU build finds no GPU; a CPU-only install stays quiet */
        if (acc->rank <= 0)
            ca_log_printf(bi.name ? CA_LOG_WARNING : CA_LOG_INFO,
                          "use_cpu is false but no GPU is usable (%s): training on the CPU", reason);
    }
    acc->device = ca_cpu_device();
    return acc->device ? CA_OK : ca_last_status();
}

/* Rank and world from how the process was started (caccel launch, mpirun,
 * srun, or nothing). Started as several processes with distributed_type NO,
 * the run is data parallel anyway, as Accelerate does. */
static ca_status setup_processes(ca_accelerator *acc) {
    ca_status s = ca_procenv_detect(&acc->pe);
    if (s != CA_OK) return s;
    acc->rank = acc->pe.rank;
    acc->world = acc->pe.world_size;
    acc->local_rank = acc->pe.local_rank;
    acc->local_world = acc->pe.local_world_size;
    if (acc->world > 1) {
        ca_log_set_rank(acc->rank);
        if (acc->st.distributed_type == CA_DIST_NO) {
            acc->st.distributed_type = acc->st.use_cpu ? CA_DIST_MULTI_CPU : CA_DIST_MULTI_GPU;
            acc->infer_type = true;
        }
    }
    return CA_OK;
}

static ca_status create_comm(ca_accelerator *acc) {
    if (acc->world > 1) {
        ca_status s = ca_comm_create_from_env(&acc->pe, acc->st.backend, acc->device, acc->st.timeout_ms,
                                             acc->st.debug, &acc->comm);
        if (s == CA_OK && acc->rank == 0)
            ca_log_printf(CA_LOG_INFO, "%d processes started by %s, collectives through %s", acc->world,
                          acc->pe.launcher_name, ca_comm_backend(acc->comm));
        return s;
    }
    ca_comm_options co = {
        .backend = "single", .rank = 0, .world_size = 1, .local_rank = 0, .local_world_size = 1,
        .device = acc->device, .timeout_ms = acc->st.timeout_ms, .debug = acc->st.debug,
    };
    return ca_comm_create(&co, &acc->comm);
}

ca_status ca_accelerator_create(const ca_options *opts, ca_accelerator **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_accelerator_create: out is NULL");
    *out = NULL;
    ca_accelerator *acc = calloc(1, sizeof *acc);
    if (!acc) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ca_status s = load_config(acc, opts);
    if (s == CA_OK) s = check_supported(acc);
    if (s == CA_OK) s = setup_processes(acc);
    if (s == CA_OK && acc->rank <= 0) s = ca_config_warn_ignored(acc->cfg, NULL);   /* once per run */
    if (s == CA_OK) s = select_device(acc);
    if (s == CA_OK) s = ca_zero_configure(acc);
    if (s == CA_OK && acc->st.deterministic) s = ca_det_configure(acc);
    if (s == CA_OK) s = create_comm(acc);
    if (s == CA_OK) s = ca_grad_scaler_configure(acc, &(ca_grad_scaler_opts){0});   /* Accelerate's defaults */
    if (s == CA_OK && acc->zero.scaler_set) s = ca_grad_scaler_configure(acc, &acc->zero.scaler);
    if (s != CA_OK) {
        ca_accelerator_destroy(acc);
        return s;
    }
    *out = acc;
    return CA_OK;
}

void ca_accelerator_destroy(ca_accelerator *acc) {
    if (!acc) return;
    /* prepared objects that outlive the accelerator go back to plain use */
    for (int i = 0; i < acc->nopts; i++) ca_optimizer_set_owner(acc->opts[i], NULL);
    for (int i = 0; i < acc->nloaders; i++) {
        ca_dataloader_set_owner(acc->loaders[i], NULL, NULL);
        ca_dataloader_set_dispatch(acc->loaders[i], NULL, NULL);   /* the hook's context is acc */
        if (acc->st.deterministic) ca_dataloader_set_parts(acc->loaders[i], 0);   /* whole batches again */
    }
    for (int k = -1; k < acc->nextra; k++) {
        ca_module *m = k < 0 ? acc->model : acc->extra[k];
        if (!m) continue;
        m->owner = NULL;
        m->autocast = CA_F32;
        for (int i = 0; i < ca_module_num_params(m); i++) ca_tensor_set_grad_hook(m->flat[i], NULL, NULL);
    }
    ca_end_training(acc);
    /* the device outlives the accelerator: its storage goes back to f32 (a failure of the graph still
     * pending was the program's to see at its last synchronisation) */
    if (acc->bf16_storage_set && ca_xla_set_bf16_storage(acc->device, false) != CA_OK) ca_clear_error();
    ca_progress_detach(acc->progress);
    free(acc->extra);
    ca_ddp_free_buckets(acc);
    ca_zero_free(acc);
    ca_state_free(acc);
    ca_det_free(acc);
    ca_comm_destroy(acc->comm);
    ca_config_destroy(acc->cfg);
    free(acc->opts);
    free(acc->loaders);
    free(acc);
}

/* ------------------------------------------------------------------ queries */

ca_device *ca_accelerator_device(const ca_accelerator *acc) { return acc->device; }
const ca_config *ca_accelerator_config(const ca_accelerator *acc) { return acc->cfg; }
const ca_settings *ca_accelerator_settings(const ca_accelerator *acc) { return &acc->st; }
ca_mixed_precision ca_accelerator_mixed_precision(const ca_accelerator *acc) { return acc->st.mixed_precision; }
ca_distributed_type ca_accelerator_distributed_type(const ca_accelerator *acc) { return acc->st.distributed_type; }
int ca_process_index(const ca_accelerator *acc) { return acc->rank; }
int ca_local_process_index(const ca_accelerator *acc) { return acc->local_rank; }
int ca_num_processes(const ca_accelerator *acc) { return acc->world; }
bool ca_is_main_process(const ca_accelerator *acc) { return acc->rank == 0; }
bool ca_is_local_main_process(const ca_accelerator *acc) { return acc->local_rank == 0; }
bool ca_is_last_process(const ca_accelerator *acc) { return acc->rank == acc->world - 1; }
ca_comm *ca_accelerator_comm(const ca_accelerator *acc) { return acc->comm; }

void ca_print(const ca_accelerator *acc, const char *fmt, ...) {
    if (acc && acc->rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* The shuffle seed of prepared loaders: data_seed with use_seedable_sampler (as
 * Accelerate's SeedableRandomSampler), else set_seed's. */
static bool loader_seed(const ca_accelerator *acc, uint64_t *seed) {
    if (acc->st.use_seedable_sampler && acc->st.data_seed >= 0) {
        *seed = (uint64_t)acc->st.data_seed;
        return true;
    }
    *seed = acc->seed;
    return acc->seeded;
}

ca_status ca_set_seed(ca_accelerator *acc, uint64_t seed) {
    ca_manual_seed(seed);
    acc->seed = seed;
    acc->seeded = true;
    loader_seed(acc, &seed);
    for (int i = 0; i < acc->nloaders; i++) {
        ca_status s = ca_dataloader_set_seed(acc->loaders[i], seed);
        if (s != CA_OK) return s;
    }
    return CA_OK;
}

/* ------------------------------------------------------------------ prepare */

/* A prepared object is being destroyed before the accelerator: drop every reference to it. */
/* The buckets of model group g reduce nothing any more (their parameters are gone). */
static void drop_group(ca_accelerator *acc, int g) {
    for (int b = 0; b < acc->nbuckets; b++)
        if (acc->buckets[b].group == g) acc->buckets[b].nparams = 0;
}

static void forget(void *owner, const void *obj) {
    ca_accelerator *acc = owner;
    for (int i = 0; i < acc->nextra; i++)
        if (acc->extra[i] == obj) {
            drop_group(acc, i + 1);
            acc->extra[i] = NULL;   /* kept as a hole: the group numbers stay */
        }
    if (obj == acc->model && acc->nextra) {
        drop_group(acc, 0);
        acc->model = NULL;
    } else if (obj == acc->model) {
        for (int b = 0; b < acc->nbuckets; b++) acc->buckets[b].nparams = 0;
        ca_ddp_free_buckets(acc);
        acc->zero.nparams = 0;   /* the parameters go with the model */
        ca_zero_free(acc);
        acc->det.nparams = 0;
        acc->model = NULL;
    }
    for (int i = 0; i < acc->nopts; i++)
        if (acc->opts[i] == obj) acc->opts[i] = acc->opts[--acc->nopts];
    for (int i = 0; i < acc->nloaders; i++)
        if (acc->loaders[i] == obj) acc->loaders[i] = acc->loaders[--acc->nloaders];
}

static ca_status optimizer_step(void *owner, ca_optimizer *o);
static bool should_zero_grad(const void *owner);

/* fsdp_activation_checkpointing: the model's layers recompute their activations in backward. */
static ca_status apply_checkpointing(ca_accelerator *acc, ca_module *m) {
    const char *key = "fsdp_config.fsdp_activation_checkpointing", *v = ca_config_get(acc->cfg, key);
    if (!v || strcmp(v, "true") != 0) return CA_OK;
    int n = 0;
    ca_status s = ca_module_checkpoint_layers(m, true, &n);
    if (s == CA_OK && acc->rank <= 0)
        ca_log_printf(n ? CA_LOG_INFO : CA_LOG_WARNING, "%s (from %s): %d layer%s of %s checkpointed", key,
                      ca_config_origin(acc->cfg, key), n, n == 1 ? "" : "s", ca_module_type(m));
    return s;
}

/* What every prepared model gets: the owner, the autocast of mixed_precision. */
static void own_model(ca_accelerator *acc, ca_module *m) {
    m->owner = acc;
    m->owner_forget = forget;
    /* bf16 storage on xla replaces autocast there, as Accelerate's native_amp is off on a TPU */
    bool bf16_storage = ca_xla_bf16_storage(acc->device);
    m->autocast = acc->st.mixed_precision == CA_MP_BF16 && !bf16_storage ? CA_BF16
                  : acc->st.mixed_precision == CA_MP_FP16 ? CA_F16 : CA_F32;
    for (int i = 0; i < ca_module_num_params(m); i++) m->flat[i]->version++;
}

/* A second, third, ... model (GANs, teacher/student): its own buckets; plain data parallelism only. */
static ca_status prepare_extra_model(ca_accelerator *acc, ca_module *m) {
    for (int i = 0; i < acc->nextra; i++)
        if (acc->extra[i] == m) return CA_OK;
    if (acc->zero.stage || acc->st.deterministic || acc->joining)
        return ca_error(CA_ERR_UNSUPPORTED, "ca_prepare: several models need plain data parallelism; %s (from %s) "
                        "takes one model per accelerator", acc->st.deterministic ? "deterministic" : "distributed_type",
                        ca_config_origin(acc->cfg, acc->st.deterministic ? "deterministic" : "distributed_type"));
    if (acc->world > 1 && !acc->nbuckets)
        return ca_error(CA_ERR_STATE, "ca_prepare: the first model has no gradient buckets (rank %d)", acc->rank);
    ca_module **ne = realloc(acc->extra, (size_t)(acc->nextra + 1) * sizeof *ne);
    if (!ne) return ca_error(CA_ERR_NOMEM, "out of host memory");
    acc->extra = ne;
    ca_status s = ca_module_to(m, acc->device);
    if (s == CA_OK && acc->world > 1) s = ca_ddp_broadcast_params(acc, m);
    if (s == CA_OK && acc->world > 1) s = ca_ddp_build_buckets(acc, m);
    if (s != CA_OK) return s;
    acc->extra[acc->nextra++] = m;
    own_model(acc, m);
    return apply_checkpointing(acc, m);
}

static ca_status prepare_model(ca_accelerator *acc, ca_module *m) {
    if (acc->model && acc->model != m) return prepare_extra_model(acc, m);
    if (acc->model == m) return CA_OK;
    if (acc->nextra) return ca_error(CA_ERR_STATE, "ca_prepare: the first prepared model was destroyed");
    ca_status s = acc->world > 1 ? ca_ddp_check_hook(acc) : CA_OK;
    if (s == CA_OK) s = ca_module_to(m, acc->device);
    if (s == CA_OK && acc->world > 1) s = ca_ddp_broadcast_params(acc, m);
    if (s == CA_OK && acc->st.deterministic) s = ca_det_build(acc, m);
    else if (s == CA_OK && acc->zero.stage) s = ca_zero_build(acc, m);
    else if (s == CA_OK && acc->world > 1) s = ca_ddp_build_buckets(acc, m);
    if (s == CA_OK) {
        acc->model = m;
        own_model(acc, m);
        s = apply_checkpointing(acc, m);
    }
    return s;
}

static ca_status prepare_optimizer(ca_accelerator *acc, ca_optimizer *o) {
    for (int i = 0; i < acc->nopts; i++)
        if (acc->opts[i] == o) return CA_OK;
    int n = ca_optimizer_num_params(o);
    for (int i = 0; i < n; i++) {
        ca_tensor *p = ca_optimizer_param_at(o, i);
        if (ca_tdev(p) != acc->device) {
            ca_status s = ca_tensor_move_(p, acc->device);
            if (s != CA_OK) return s;
        }
    }
    ca_optimizer **no = realloc(acc->opts, (size_t)(acc->nopts + 1) * sizeof *no);
    if (!no) return ca_error(CA_ERR_NOMEM, "out of host memory");
    acc->opts = no;
    acc->opts[acc->nopts++] = o;
    ca_optimizer_set_owner(o, &(ca_optimizer_owner){.owner = acc, .step = optimizer_step,
                                                    .should_zero_grad = should_zero_grad,
                                                    .forget = forget});
    /* Accelerate's AcceleratedScheduler.step: num_processes scheduler steps per optimizer step when
     * each process reads whole batches (the global batch grew N times), one with split_batches (the
     * global batch is the loader's batch_size on any number of processes) */
    ca_optimizer_set_schedule_stride(o, acc->world > 1 && !acc->st.split_batches ? acc->world : 1);
    ca_status s = ca_optimizer_init_state(o);
    if (s == CA_OK && acc->zero.stage) s = ca_zero_add_optimizer(acc, o);
    return s;
}

/*
 * dispatch_batches: the loader's broadcast of host bytes from rank 0. The
 * communicator's buffers live on the training device, so the bytes go through
 * a device buffer (a plain copy on the CPU): the same path serves Gloo, MPI and
 * NCCL. It runs on the thread that calls ca_dataloader_next.
 */
static ca_status dispatch_bcast(void *ctx, void *buf, size_t bytes) {
    ca_accelerator *acc = ctx;
    ca_tensor *t = ca_tensor_keep(ca_empty(acc->device, CA_U8, 1, (int64_t[]){(int64_t)bytes}));
    if (!t) return ca_error_context("dispatch_batches: a device buffer of %zu bytes on rank %d", bytes, acc->rank);
    ca_status s = acc->rank == 0 ? ca_device_copy_from_host(acc->device, ca_tptr(t), buf, bytes) : CA_OK;
    if (s == CA_OK) s = ca_comm_broadcast(acc->comm, ca_tptr(t), bytes, CA_U8, 0, NULL);
    if (s == CA_OK && acc->rank != 0) s = ca_device_copy_to_host(acc->device, buf, ca_tptr(t), bytes);
    ca_tensor_free(t);
    return s;
}

ca_status ca_prepare_dataloader(ca_accelerator *acc, ca_dataloader *dl) {
    if (!acc || !dl) return ca_error(CA_ERR_INVALID, "ca_prepare_dataloader: accelerator and loader are required");
    for (int i = 0; i < acc->nloaders; i++)
        if (acc->loaders[i] == dl) return CA_OK;
    ca_status s = ca_dataloader_set_device(dl, acc->device);
    if (s == CA_OK) s = ca_dataloader_set_split_batches(dl, acc->st.split_batches);
    if (s == CA_OK) s = ca_dataloader_shard(dl, acc->rank, acc->world, acc->st.even_batches);
    static const ca_dispatch_ops dispatch = {.bcast = dispatch_bcast};
    if (s == CA_OK && acc->st.dispatch_batches && acc->world > 1) s = ca_dataloader_set_dispatch(dl, &dispatch, acc);
    /* a loader that cannot split (an evaluation loader, say) stays whole; ca_backward refuses its batches */
    if (s == CA_OK && acc->st.deterministic && ca_dataloader_set_parts(dl, acc->det.parts) != CA_OK) ca_clear_error();
    uint64_t seed;
    if (s == CA_OK && loader_seed(acc, &seed)) s = ca_dataloader_set_seed(dl, seed);
    if (s != CA_OK) return s;
    ca_dataloader **nl = realloc(acc->loaders, (size_t)(acc->nloaders + 1) * sizeof *nl);
    if (!nl) return ca_error(CA_ERR_NOMEM, "out of host memory");
    acc->loaders = nl;
    acc->loaders[acc->nloaders++] = dl;
    ca_dataloader_set_owner(dl, acc, forget);
    return CA_OK;
}

ca_status ca_prepare(ca_accelerator *acc, ca_module *model, ca_optimizer *opt, ca_dataloader *dl) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_prepare: accelerator is NULL");
    ca_status s = CA_OK;
    if (model) s = prepare_model(acc, model);
    if (s == CA_OK && opt) s = prepare_optimizer(acc, opt);
    if (s == CA_OK && dl) s = ca_prepare_dataloader(acc, dl);
    return s;
}

/* ------------------------------------------------------------------ accumulation */

/* End of the dataloader being iterated: of the prepared loaders with a pass in
 * flight, the one that handed out the newest batch (as Accelerate tracks the
 * active loader), so an inner loader run inside an outer loop's step neither
 * hides nor fakes the outer loader's end. */
static const ca_dataloader *active_loader(const ca_accelerator *acc) {
    const ca_dataloader *active = NULL;
    uint64_t newest = 0;
    for (int i = 0; i < acc->nloaders; i++) {
        uint64_t seq = ca_dataloader_handed_seq(acc->loaders[i]);
        if (seq > newest) newest = seq, active = acc->loaders[i];
    }
    return active;
}

static bool loader_at_end(const ca_accelerator *acc) {
    const ca_dataloader *active = active_loader(acc);
    return active && ca_dataloader_handed_last(active);
}

/* Deterministic mode: the micro-batch (virtual shard of this rank) the active loader handed out. */
static void det_part(const ca_accelerator *acc, int *part, int *parts) {
    ca_dataloader_handed_part(active_loader(acc), part, parts);
}

/* Deterministic mode: false on every micro-batch of a batch but its last. */
static bool det_batch_done(const ca_accelerator *acc) {
    if (!acc->st.deterministic) return true;
    int part, parts;
    det_part(acc, &part, &parts);
    return parts <= 1 || part == parts - 1;
}

int ca_accumulate_begin(ca_accelerator *acc, ca_module *model) {
    acc->in_accumulate = true;
    if (!det_batch_done(acc)) {   /* a virtual shard before the batch's last: accumulate only */
        acc->sync = false;
        return 1;
    }
    int64_t k = acc->st.gradient_accumulation_steps > 0 ? acc->st.gradient_accumulation_steps : 1;
    acc->micro_step++;
    acc->sync = acc->micro_step % k == 0 || loader_at_end(acc);
    if (acc->sync) acc->micro_step = 0;
    return 1;
}

void ca_accumulate_end(ca_accelerator *acc) { acc->in_accumulate = false; }

bool ca_sync_gradients(const ca_accelerator *acc) {
    return det_batch_done(acc) && (acc->in_accumulate ? acc->sync : acc->sync_set != CA_NO);
}

static bool should_zero_grad(const void *owner) { return ca_sync_gradients(owner); }

/* ------------------------------------------------------------------ gradients as kernel lists */

/* Every parameter with a gradient: those of the optimizer `o`, or of every
 * prepared optimizer (o NULL), or of the model when no optimizer is prepared. */
typedef struct grad_set {
    int n, cap;
    ca_tensor **t;
} grad_set;

static ca_status set_add(grad_set *gs, ca_tensor *p) {
    if (!p->grad_defined || !p->grad) return CA_OK;
    for (int i = 0; i < gs->n; i++)
        if (gs->t[i] == p) return CA_OK;
    if (gs->n == gs->cap) {
        int cap = gs->cap ? 2 * gs->cap : 64;
        ca_tensor **t = realloc(gs->t, (size_t)cap * sizeof *t);
        if (!t) return ca_error(CA_ERR_NOMEM, "out of host memory");
        gs->t = t;
        gs->cap = cap;
    }
    gs->t[gs->n++] = p;
    return CA_OK;
}

/* Sharded: once reduced, the gradient of every optimizer is this rank's shard. */
static bool sharded_grads(const ca_accelerator *acc) { return acc->zero.stage && acc->zero.reduced; }

static ca_status collect_grads(const ca_accelerator *acc, const ca_optimizer *o, grad_set *gs) {
    if (sharded_grads(acc)) return set_add(gs, acc->zero.view);
    ca_status s = CA_OK;
    for (int k = 0; s == CA_OK && k < acc->nopts; k++) {
        if (o && acc->opts[k] != o) continue;
        for (int i = 0; s == CA_OK && i < ca_optimizer_num_params(acc->opts[k]); i++)
            s = set_add(gs, ca_optimizer_param_at(acc->opts[k], i));
    }
    for (int k = -1; !o && !acc->nopts && k < acc->nextra; k++) {
        ca_module *m = k < 0 ? acc->model : acc->extra[k];
        for (int i = 0; s == CA_OK && m && i < ca_module_num_params(m); i++) s = set_add(gs, m->flat[i]);
    }
    return s;
}

/* Runs fn over the gradients in lists of up to 256 tensors per kernel call. */
static ca_status for_grads(const grad_set *gs, ca_device *dev,
                           ca_status (*fn)(ca_device *, const ca_tensor_list *, void *), void *ctx) {
    enum { MAXN = 256 };
    void *x[MAXN];
    int64_t numel[MAXN];
    for (int i = 0; i < gs->n; i += MAXN) {
        int k = 0;
        for (; k < MAXN && i + k < gs->n; k++) {
            x[k] = ca_tptr(gs->t[i + k]->grad);
            numel[k] = gs->t[i + k]->numel;
        }
        ca_tensor_list tl = {.count = k, .param = x, .numel = numel, .grad_dtype = CA_F32};
        ca_status s = fn(dev, &tl, ctx);
        if (s != CA_OK) return s;
    }
    return CA_OK;
}

typedef struct sumsq_ctx { float *out; bool first; } sumsq_ctx;
static ca_status sumsq_fn(ca_device *dev, const ca_tensor_list *tl, void *ctx) {
    sumsq_ctx *c = ctx;
    ca_status s = CA_KCALL(dev, sum_squares, .t = tl, .out = c->out, .beta = c->first ? 0.0f : 1.0f);
    c->first = false;
    return s;
}
static ca_status clamp_fn(ca_device *dev, const ca_tensor_list *tl, void *ctx) {
    float v = *(float *)ctx;
    return CA_KCALL(dev, clamp_list, .t = tl, .lo = -v, .hi = v);
}
typedef struct unscale_ctx { float inv; float *found; } unscale_ctx;
static ca_status unscale_fn(ca_device *dev, const ca_tensor_list *tl, void *ctx) {
    unscale_ctx *c = ctx;
    return CA_KCALL(dev, unscale_check, .t = tl, .inv_scale = c->inv, .found_inf = c->found);
}

/* ------------------------------------------------------------------ fp16 loss scaling */

static bool scaling(const ca_accelerator *acc) { return acc->st.mixed_precision == CA_MP_FP16; }

/* Unscales the gradients of o (NULL: all) once per step and decides, on every
 * rank together, whether any of them overflowed. */
static ca_status unscale(ca_accelerator *acc, ca_optimizer *o) {
    if (!scaling(acc)) return CA_OK;
    grad_set gs = {0};
    ca_status s = CA_OK;
    for (int k = 0; s == CA_OK && k < acc->nopts; k++) {
        /* sharded: one shard holds every optimizer's gradients, unscaled together */
        if ((o && acc->opts[k] != o && !sharded_grads(acc)) || acc->opts[k]->amp_unscaled) continue;
        s = collect_grads(acc, acc->opts[k], &gs);
        acc->opts[k]->amp_unscaled = true;
    }
    if (s == CA_OK && !acc->nopts && !acc->model_unscaled) {
        s = collect_grads(acc, NULL, &gs);
        acc->model_unscaled = true;
    }
    ca_tensor *found = s == CA_OK ? ca_zeros(acc->device, CA_F32, 0, NULL) : NULL;
    if (!found) s = ca_last_status();
    unscale_ctx c = {.inv = (float)(1.0 / acc->scaler.scale), .found = found ? ca_tptr(found) : NULL};
    if (s == CA_OK) s = for_grads(&gs, acc->device, unscale_fn, &c);
    if (s == CA_OK && acc->world > 1) s = ca_reduce(acc, found, CA_OP_MAX);   /* all ranks skip, or none */
    double v = 0;
    if (s == CA_OK) s = ca_tensor_item(found, &v);
    if (s == CA_OK && v != 0) acc->found_inf = true;
    free(gs.t);
    return s;
}

/* After a step (applied or skipped): GradScaler's update rule. */
static void update_scale(ca_accelerator *acc) {
    ca_grad_scaler_opts *g = &acc->scaler_opts;
    if (acc->found_inf) {
        acc->scaler.scale *= g->backoff_factor;
        acc->scaler.growth_tracker = 0;
    } else if (++acc->scaler.growth_tracker >= g->growth_interval) {
        acc->scaler.scale *= g->growth_factor;
        acc->scaler.growth_tracker = 0;
    }
    acc->found_inf = false;
    acc->model_unscaled = false;
}

ca_status ca_grad_scaler_get(const ca_accelerator *acc, ca_grad_scaler_state *out) {
    if (!acc || !out) return ca_error(CA_ERR_INVALID, "ca_grad_scaler_get: NULL argument");
    *out = acc->scaler;
    return CA_OK;
}

ca_status ca_grad_scaler_set(ca_accelerator *acc, const ca_grad_scaler_state *st) {
    if (!acc || !st || !(st->scale > 0) || st->growth_tracker < 0)
        return ca_error(CA_ERR_INVALID, "grad scaler state: the scale must be > 0 and the tracker >= 0");
    acc->scaler = *st;
    return CA_OK;
}

ca_status ca_grad_scaler_configure(ca_accelerator *acc, const ca_grad_scaler_opts *opts) {
    if (!acc || !opts) return ca_error(CA_ERR_INVALID, "ca_grad_scaler_configure: NULL argument");
    /* a field left 0 keeps Accelerate's default (GradScalerKwargs) */
    ca_grad_scaler_opts o = *opts;
    if (o.init_scale == 0) o.init_scale = 65536.0;
    if (o.growth_factor == 0) o.growth_factor = 2.0;
    if (o.backoff_factor == 0) o.backoff_factor = 0.5;
    if (o.growth_interval == 0) o.growth_interval = 2000;
    if (!(o.init_scale > 0) || !(o.growth_factor > 1) || !(o.backoff_factor > 0) || !(o.backoff_factor < 1) ||
        o.growth_interval < 1)
        return ca_error(CA_ERR_INVALID, "grad scaler options: init_scale > 0, growth_factor > 1, "
                        "0 < backoff_factor < 1, growth_interval >= 1 (0: the default)");
    acc->scaler_opts = o;
    acc->scaler = (ca_grad_scaler_state){.scale = o.init_scale};
    return CA_OK;
}

/* ------------------------------------------------------------------ backward and step */

/* Deterministic mode, a batch that is not a virtual shard: why. */
static ca_status det_refuse(const ca_accelerator *acc) {
    const ca_dataloader *dl = active_loader(acc);
    if (dl && ca_dataloader_check_parts(dl, acc->det.parts) != CA_OK)
        return ca_error_context("ca_backward: this batch's dataloader cannot hand out virtual shards");
    return ca_error(CA_ERR_STATE, "deterministic mode: ca_backward needs a batch from a dataloader prepared by "
                    "this accelerator (it hands each process its %d virtual shards as micro-batches)",
                    acc->det.parts);
}

ca_status ca_backward(ca_accelerator *acc, ca_tensor *loss) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_backward: accelerator is NULL");
    if (!loss) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_INVALID, "ca_backward: loss is NULL");
    int64_t k = acc->in_accumulate && acc->st.gradient_accumulation_steps > 1 ? acc->st.gradient_accumulation_steps : 1;
    double seed = scaling(acc) ? acc->scaler.scale / (double)k : 1.0 / (double)k;
    int part = 0, parts = 0;
    if (acc->st.deterministic) det_part(acc, &part, &parts);
    if (acc->st.deterministic && acc->model && parts != acc->det.parts) return det_refuse(acc);
    bool sync = ca_backward_syncs(acc), step_sync = acc->sync;
    ca_status s = acc->joining ? ca_join_notify(acc, sync) : CA_OK;
    if (s != CA_OK) return s;
    acc->sync = sync;   /* what the bucket hooks read during this backward */
    acc->in_backward = true;
    s = acc->zero.stage && acc->model ? ca_zero_before_backward(acc) : CA_OK;
    if (s != CA_OK) {
        acc->in_backward = false;
        acc->sync = step_sync;
        return s;
    }
    if (seed == 1.0) {
        s = ca_autograd_backward(loss);
    } else {   /* d(loss * scale / k): seed backward instead of changing the user's loss */
        ca_tensor *g = ca_full(ca_tdev(loss), loss->dtype, loss->ndim, loss->shape, seed);
        s = g ? ca_autograd_backward_with(loss, g) : ca_last_status();
    }
    acc->in_backward = false;
    if (acc->in_accumulate) acc->sync = step_sync;   /* no_sync / trigger do not change the step */
    if (acc->nbuckets && sync) {
        ca_status f = ca_ddp_finish_buckets(acc);
        if (s == CA_OK) s = f;
    }
    if (s == CA_OK && acc->zero.stage && acc->model && sync) s = ca_zero_reduce(acc);
    if (s == CA_OK && acc->st.deterministic && acc->model) {
        s = ca_det_collect(acc, part);
        if (s == CA_OK && sync) s = ca_det_reduce(acc);
    }
    return s;
}

/* The order unscale -> clip -> step belongs to the runtime, so a gradient is
 * never unscaled twice (Accelerate #641). */
static ca_status optimizer_step(void *owner, ca_optimizer *o) {
    ca_accelerator *acc = owner;
    if (!ca_sync_gradients(acc)) return CA_OK;     /* accumulation micro-step: no update */
    ca_status s = unscale(acc, o);
    if (s == CA_OK && acc->st.gradient_clipping > 0 && !acc->found_inf)
        s = ca_clip_grad_norm(acc, acc->st.gradient_clipping, NULL);   /* the norm stays on the device */
    if (s != CA_OK) return s;
    if (acc->found_inf) {
        o->skipped = true;     /* no parameter, no optimizer state changes */
        ca_log_printf(CA_LOG_INFO, "fp16: gradients overflowed at loss scale %g; step skipped",
                      acc->scaler.scale);
        for (int b = 0; b < acc->nbuckets && s == CA_OK; b++) s = ca_psgd_reset(acc->buckets[b].psgd);
    } else {
        s = acc->zero.stage ? ca_zero_step(acc, o) : ca_optimizer_apply(o, 1.0f);
    }
    o->amp_unscaled = false;
    if (scaling(acc)) update_scale(acc);
    return s;
}

/* ------------------------------------------------------------------ clipping */

/* Every gradient multiplied by the device scalar at coef (one broadcasting kernel each). */
static ca_status scale_grads_by(const grad_set *gs, ca_device *dev, const void *coef) {
    ca_status s = CA_OK;
    for (int i = 0; i < gs->n && s == CA_OK; i++) {
        void *g = ca_tptr(gs->t[i]->grad);
        ca_bcast_args b = {.ndim = 1, .shape = {gs->t[i]->numel}, .a_stride = {1}, .b_stride = {0}};
        s = CA_KCALL(dev, binary, .op = CA_BINARY_MUL, .dt = CA_F32, .shape = b, .a = g, .b = coef, .y = g);
    }
    return s;
}

/* torch.nn.utils.clip_grad_norm_'s arithmetic, on the device in f32: total = sqrt(sum of squares),
 * coef = min(max_norm / (total + 1e-6), 1), every gradient multiplied by coef (by 1 when it is
 * already small enough: exact, and skipped on host memory, where reading coef is free). Nothing else
 * is read back unless the caller asks for the norm, so a lazy device keeps the step in one graph and
 * a GPU does not wait for it. */
ca_status ca_clip_grad_norm(ca_accelerator *acc, double max_norm, double *total_norm) {
    if (!acc || max_norm <= 0) return ca_error(CA_ERR_INVALID, "clip_grad_norm: max_norm must be > 0");
    ca_status s = unscale(acc, NULL);
    grad_set gs = {0};
    if (s == CA_OK) s = collect_grads(acc, NULL, &gs);
    CA_SCOPE {
        ca_tensor *sq = s == CA_OK ? ca_zeros(acc->device, CA_F32, 0, NULL) : NULL;
        if (s == CA_OK && !sq) s = ca_last_status();
        sumsq_ctx c = {.out = sq ? ca_tptr(sq) : NULL, .first = true};
        if (s == CA_OK) s = for_grads(&gs, acc->device, sumsq_fn, &c);
        /* data parallel: gradients are already averaged, so every rank holds the same norm; sharded:
         * the norm of all shards is the square root of the sum over ranks of each shard's sum of
         * squares */
        if (s == CA_OK && sharded_grads(acc) && acc->zero.world > 1)   /* over the shard group */
            s = ca_comm_all_reduce(acc->zero.comm, ca_tptr(sq), ca_tptr(sq), 1, CA_F32, CA_OP_SUM, NULL);
        ca_tensor *total = s == CA_OK ? ca_sqrt(sq) : NULL;
        ca_tensor *coef = total ? ca_div(ca_full(acc->device, CA_F32, 0, NULL, max_norm), ca_add_scalar(total, 1e-6))
                                : NULL;
        if (s == CA_OK && !coef) s = ca_last_status();
        void *cp = coef ? ca_tptr(coef) : NULL;
        int64_t one = 1;
        ca_tensor_list tl = {.count = 1, .param = &cp, .numel = &one, .grad_dtype = CA_F32};
        if (s == CA_OK) s = CA_KCALL(acc->device, clamp_list, .t = &tl, .lo = 0.0f, .hi = 1.0f);
        /* on host memory the coefficient costs nothing to read: a pass multiplying by 1 is skipped */
        double cv = 0;
        if (s == CA_OK && ca_device_is_host(acc->device)) s = ca_tensor_item(coef, &cv);
        if (s == CA_OK && cv < 1.0) s = scale_grads_by(&gs, acc->device, cp);
        if (s == CA_OK && total_norm) s = ca_tensor_item(total, total_norm);
    }
    free(gs.t);
    return s;
}

ca_status ca_clip_grad_value(ca_accelerator *acc, double clip_value) {
    if (!acc || clip_value <= 0) return ca_error(CA_ERR_INVALID, "clip_grad_value: clip_value must be > 0");
    ca_status s = unscale(acc, NULL);
    grad_set gs = {0};
    if (s == CA_OK) s = collect_grads(acc, NULL, &gs);
    float v = (float)clip_value;
    if (s == CA_OK) s = for_grads(&gs, acc->device, clamp_fn, &v);
    free(gs.t);
    return s;
}

/* ------------------------------------------------------------------ collectives */

ca_status ca_wait_for_everyone(ca_accelerator *acc) { return ca_comm_barrier(acc->comm, NULL); }

ca_status ca_mark_step(ca_accelerator *acc) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_mark_step: accelerator is NULL");
    return ca_device_mark_step(acc->device);
}

static ca_status need_contiguous(const ca_tensor *t, const char *op) {
    if (!t) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_INVALID, "%s: tensor is NULL", op);
    if (!ca_tensor_is_contiguous(t)) return ca_error(CA_ERR_INVALID, "%s: tensor must be contiguous", op);
    return CA_OK;
}

ca_status ca_reduce(ca_accelerator *acc, ca_tensor *t, ca_reduce_op op) {
    ca_status s = need_contiguous(t, "reduce");
    if (s != CA_OK) return s;
    return ca_comm_all_reduce(acc->comm, ca_tptr(t), ca_tptr(t), (size_t)t->numel, t->dtype, op, NULL);
}

ca_status ca_broadcast(ca_accelerator *acc, ca_tensor *t, int root) {
    ca_status s = need_contiguous(t, "broadcast");
    if (s != CA_OK) return s;
    return ca_comm_broadcast(acc->comm, ca_tptr(t), (size_t)t->numel, t->dtype, root, NULL);
}

ca_tensor *ca_gather(ca_accelerator *acc, ca_tensor *t) {
    if (need_contiguous(t, "gather") != CA_OK) return NULL;
    int64_t shape[CA_MAX_DIMS];
    int nd = t->ndim ? t->ndim : 1;
    memcpy(shape, t->shape, sizeof shape);
    if (!t->ndim) shape[0] = 1;
    shape[0] *= acc->world;
    ca_tensor *out = ca_tensor_new(ca_tdev(t), t->dtype, nd, shape);
    if (!out) return NULL;
    if (ca_comm_all_gather(acc->comm, ca_tptr(t), ca_tptr(out), (size_t)t->numel, t->dtype, NULL) != CA_OK)
        return NULL;
    return out;
}

ca_tensor *ca_gather_for_metrics(ca_accelerator *acc, ca_tensor *t, const ca_batch *b) {
    ca_tensor *all = ca_gather(acc, t);
    if (!all || !b) return all;
    /* padding repeats samples at the end of the global order, which is rank order */
    ca_tensor *pad = ca_full(acc->device, CA_I64, 0, NULL, (double)b->num_padded);
    if (!pad || ca_reduce(acc, pad, CA_OP_SUM) != CA_OK) return NULL;
    double total;
    if (ca_tensor_item(pad, &total) != CA_OK) return NULL;
    int64_t rows = all->shape[0], keep = rows - (int64_t)total;
    if (keep <= 0) keep = 0;
    return keep == rows ? all : ca_narrow(all, 0, 0, keep);
}

void ca_split_between_processes(const ca_accelerator *acc, int64_t n, int64_t *begin, int64_t *end) {
    int64_t w = acc->world, r = acc->rank, base = n / w, extra = n % w;
    *begin = r * base + (r < extra ? r : extra);
    *end = *begin + base + (r < extra ? 1 : 0);
}

ca_status ca_main_process_first_begin(ca_accelerator *acc) {
    return acc->rank == 0 ? CA_OK : ca_comm_barrier(acc->comm, NULL);
}

ca_status ca_main_process_first_end(ca_accelerator *acc) {
    return acc->rank == 0 ? ca_comm_barrier(acc->comm, NULL) : CA_OK;
}
