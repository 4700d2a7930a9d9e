/* The Accelerator: configuration, device and process-group selection, the choice of the gradient
 * synchronisation strategy (sync_impl.h), prepare, backward and the optimizer step (unscale, clip,
 * the strategy's update), clipping. Process state is process_state.c's, accumulation accumulate.c's. */
#include "accelerator/accelerator_impl.h"
#include "accelerator/mesh_impl.h"
#include "accelerator/sync_impl.h"
#include "comm/affinity_impl.h"
#include "comm/comm_impl.h"
#include "config/config_impl.h"
#include "core/device_impl.h"
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

/* Whether this run is `caccel estimate-memory --run`'s estimate (CACCEL_MEMORY_REPORT with
 * CACCEL_MEMORY_ESTIMATE): the lazy device then stands in for the eager one whatever distributed_type
 * says, so that DeepSpeed's and FSDP's sharding run on it as they would on the device they model. */
static bool estimating(void) {
    const char *r = getenv("CACCEL_MEMORY_REPORT"), *e = getenv("CACCEL_MEMORY_ESTIMATE");
    return r && *r && e && *e && strcmp(e, "0") != 0;
}

/* The kind of device the configuration asks for: lazy for XLA (and for a memory estimate), a GPU
 * unless use_cpu, else the host. */
static ca_device_kind wanted_kind(const ca_settings *st) {
    if (estimating()) return CA_DEVICE_LAZY;
    if (st->use_cpu) return CA_DEVICE_HOST;
    return st->distributed_type == CA_DIST_XLA ? CA_DEVICE_LAZY : CA_DEVICE_GPU;
}

/* One lazy device per process; bf16 on it is Accelerate's on a TPU: storage in bf16
 * (XLA_USE_BF16), no autocast. Except where the device stands in for an eager one (the memory
 * estimate, CACCEL_MEMORY_REPORT): there bf16 is the eager device's autocast (own_model), whose
 * bf16 weight copies and activations are what the estimate must count. */
static ca_status open_lazy(ca_accelerator *acc, const ca_backend_info *bi) {
    ca_device_open_args args = {.struct_size = sizeof args, .local_rank = acc->local_rank};
    ca_status s = ca_device_open(bi->name, 0, &args, &acc->device);
    if (s == CA_OK && acc->st.mixed_precision == CA_MP_BF16 && !ca_xla_bf16_storage(acc->device) &&
        !ca_device_models_eager(acc->device)) {
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
                                        .gpu_ids = st->gpu_ids, .allow_tf32 = st->allow_tf32};
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

/* enable_cpu_affinity: this rank bound to its cores before the CPU device opens, so that the kernels' and
 * OpenBLAS's thread count follows the set (comm/affinity.c). */
static ca_status bind_cores(ca_accelerator *acc) {
    if (!acc->st.enable_cpu_affinity) return CA_OK;
    return ca_affinity_bind(&acc->pe, acc->st.num_cpu_threads_per_process,
                            ca_config_origin(acc->cfg, "enable_cpu_affinity"));
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

/* deepspeed_config.zero3_init_flag (DeepSpeed's zero.Init, as Accelerate passes it on): at stage 3 the
 * models this thread builds from here to ca_prepare are made without storage (ca_init_empty_weights),
 * so no rank ever holds a whole one; ca_prepare makes each rank's shard and switches it off again. */
static ca_status zero3_init_begin(ca_accelerator *acc) {
    if (!acc->zero.init_empty || acc->zero.stage != 3) {
        acc->zero.init_empty = false;
        return CA_OK;
    }
    if (acc->rank <= 0)
        ca_log_printf(CA_LOG_INFO, "zero3_init_flag (from %s): the models built on this thread until ca_prepare "
                      "have no storage (ca_init_empty_weights); ca_prepare makes each rank's shard",
                      ca_config_origin(acc->cfg, "deepspeed_config.zero3_init_flag"));
    return ca_init_empty_weights(true);
}

static void zero3_init_end(ca_accelerator *acc) {
    if (!acc->zero.init_empty) return;
    acc->zero.init_empty = false;
    if (ca_init_empty_weights(false) != CA_OK) ca_clear_error();
}

/* An elastic job (caccel launch --num_machines MIN:MAX) keeps the global batch its configuration
 * describes (a warning either way: the run's accumulation is not the configured one), that of MAX machines (CACCEL_ELASTIC_BASE_WORLD_SIZE processes), at whatever size it runs:
 * the accumulation grows or shrinks by the ratio where that divides, else takes the nearest count (at
 * least 1) and says how far the global batch moves. */
static ca_status elastic_accumulation(ca_accelerator *acc) {
    const char *b = getenv("CACCEL_ELASTIC_BASE_WORLD_SIZE");
    long base = b && *b ? strtol(b, NULL, 10) : 0;
    if (base < 1 || base == acc->world || acc->world < 1) return CA_OK;
    long ga = acc->st.gradient_accumulation_steps > 0 ? acc->st.gradient_accumulation_steps : 1;
    long total = ga * base, k = (total + acc->world / 2) / acc->world;
    if (k < 1) k = 1;
    if (acc->rank <= 0) {
        if (total % acc->world == 0)
            ca_log_printf(CA_LOG_WARNING, "elastic: %d processes instead of %ld: gradient_accumulation_steps %ld -> %ld "
                          "keeps the global batch of %ld per-process batches", acc->world, base, ga, k, total);
        else
            ca_log_printf(CA_LOG_WARNING, "elastic: %d processes instead of %ld: %ld per-process batches do not "
                          "divide by %d; gradient_accumulation_steps %ld -> %ld (the nearest): the global batch is "
                          "%ld per-process batches", acc->world, base, total, acc->world, ga, k, k * acc->world);
    }
    acc->st.gradient_accumulation_steps = (int)k;
    return CA_OK;
}

ca_status ca_accelerator_create(const ca_options *opts, ca_accelerator **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_accelerator_create: out is NULL");
    *out = NULL;
    ca_accelerator *acc = calloc(1, sizeof *acc);
    if (!acc) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ca_status s = load_config(acc, opts);
    if (s == CA_OK) s = check_supported(acc);
    if (s == CA_OK) s = setup_processes(acc);
    if (s == CA_OK) s = bind_cores(acc);
    if (s == CA_OK && acc->rank <= 0) s = ca_config_warn_ignored(acc->cfg, NULL);   /* once per run */
    if (s == CA_OK) s = select_device(acc);
    /* Accelerate's defaults, before a strategy's configuration (DeepSpeed's JSON) overrides them */
    if (s == CA_OK) s = ca_grad_scaler_configure(acc, &(ca_grad_scaler_opts){0});
    if (s == CA_OK) s = ca_sync_select(acc);   /* the one place the parallelism is chosen */
    if (s == CA_OK) s = elastic_accumulation(acc);   /* after a DeepSpeed JSON's accumulation */
    if (s == CA_OK) s = create_comm(acc);
    if (s == CA_OK) s = ca_mesh_setup(acc);    /* tensor parallelism's groups, split from the process group */
    if (s == CA_OK) s = zero3_init_begin(acc);
    if (s == CA_OK) s = ca_accelerator_profile_begin(acc);
    if (s != CA_OK) {
        ca_accelerator_destroy(acc);
        return s;
    }
    *out = acc;
    return CA_OK;
}
static void tp_release(ca_accelerator *acc);


void ca_accelerator_destroy(ca_accelerator *acc) {
    if (!acc) return;
    ca_accelerator_profile_end(acc);   /* the trace is written while the ranks are all here */
    zero3_init_end(acc);   /* never prepared: the thread builds with storage again */
    /* prepared objects that outlive the accelerator go back to plain use */
    for (int i = 0; i < acc->nopts; i++) ca_optimizer_set_owner(acc->opts[i], NULL);
    for (int i = 0; i < acc->nloaders; i++) {
        ca_dataloader_set_owner(acc->loaders[i], NULL);
        ca_dataloader_set_dispatch(acc->loaders[i], NULL, NULL);   /* the hook's context is acc */
        if (acc->sync_ops->release_loader) acc->sync_ops->release_loader(acc, acc->loaders[i]);
    }
    tp_release(acc);
    for (int k = -1; k < acc->nextra; k++) {
        ca_module *m = k < 0 ? acc->model : acc->extra[k];
        if (!m) continue;
        ca_module_set_owner(m, NULL);   /* no autocast, no gradient hooks */
    }
    ca_end_training(acc);
    ca_throughput_free(acc);
    /* the device outlives the accelerator: its storage goes back to f32 (a failure of the graph still
     * pending was the program's to see at its last synchronisation) */
    if (acc->bf16_storage_set && ca_xla_set_bf16_storage(acc->device, false) != CA_OK) ca_clear_error();
    ca_progress_detach(acc->progress);
    free(acc->extra);
    ca_trainable_free(acc);
    if (acc->sync_ops && acc->sync_ops->free) acc->sync_ops->free(acc);
    ca_state_free(acc);
    ca_mesh_free(acc);
    ca_comm_destroy(acc->comm);
    ca_config_destroy(acc->cfg);
    free(acc->opts);
    free(acc->loaders);
    free(acc);
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

/* Tensor parallelism lets the model go: a summon the program did not undo first gives each rank its slices
 * and the parameters their gradients back (local), so that they are freed with the model. */
static void tp_release(ca_accelerator *acc) {
    while (acc->mesh && acc->mesh->summons > 0 && acc->model) ca_tp_full_params(acc, false);
    ca_tp_release(acc);
}

/* A prepared object is being destroyed before the accelerator: drop every reference to it. */
static void forget_model(ca_accelerator *acc, int g, bool last) {
    if (acc->sync_ops->forget_model) acc->sync_ops->forget_model(acc, g, last);
}

static void forget(void *owner, const void *obj) {
    ca_accelerator *acc = owner;
    ca_trainable_forget(acc, obj);
    for (int i = 0; i < acc->nextra; i++)
        if (acc->extra[i] == obj) {
            forget_model(acc, i + 1, false);
            acc->extra[i] = NULL;   /* kept as a hole: the group numbers stay */
        }
    if (obj == acc->model) {
        tp_release(acc);
        forget_model(acc, 0, !acc->nextra);
        acc->model = NULL;
    }
    for (int i = 0; i < acc->nopts; i++)
        if (acc->opts[i] == obj) acc->opts[i] = acc->opts[--acc->nopts];
    for (int i = 0; i < acc->nloaders; i++)
        if (acc->loaders[i] == obj) acc->loaders[i] = acc->loaders[--acc->nloaders];
}

static ca_status optimizer_step(void *owner, ca_optimizer *o);
/* Gradients are zeroed on synchronising steps only: accumulation keeps them. */
static bool should_zero_grad(const void *owner) { return ca_sync_gradients(owner); }

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
    /* bf16 storage on xla replaces autocast there, as Accelerate's native_amp is off on a TPU */
    bool bf16_storage = ca_xla_bf16_storage(acc->device);
    ca_dtype autocast = acc->st.mixed_precision == CA_MP_BF16 && !bf16_storage ? CA_BF16
                        : acc->st.mixed_precision == CA_MP_FP16 ? CA_F16 : CA_F32;
    ca_module_set_owner(m, &(ca_module_owner){.owner = acc, .forget = forget, .autocast = autocast});
}

/* Every process starts from rank 0's parameters, whatever the strategy (collective). */
static ca_status dispatch_bcast(void *ctx, void *buf, size_t bytes);

/* A meta parameter has no values to send: rank 0's record of how to make them goes instead (its
 * RNG seed and counters), so every rank materialises rank 0's values, as the eager broadcast gives. */
static ca_status broadcast_meta(ca_accelerator *acc, ca_tensor *p) {
    size_t bytes;
    int64_t count;
    ca_meta_record(p, &bytes, &count);
    ca_status s = dispatch_bcast(acc, &count, sizeof count);
    if (s == CA_OK && acc->rank != 0) s = ca_meta_record_resize(p, count);
    void *rec = s == CA_OK ? ca_meta_record(p, &bytes, &count) : NULL;
    return s == CA_OK && rec ? dispatch_bcast(acc, rec, bytes) : s;
}

/* ZeRO-3 / FULL_SHARD: ca_zero3_build makes each rank's shard of a meta model's values. */
static bool shards_meta(const ca_accelerator *acc) { return acc->sync_ops == &ca_sync_zero && acc->zero.stage == 3; }

/* A meta parameter whose values a deferred load reads from a file (a pretrained loader run under
 * ca_init_empty_weights): under fsdp_cpu_ram_efficient_loading (true by default) rank 0 alone reads it
 * and sends the values, one read of the checkpoint for all the ranks, each other rank giving it memory
 * only; with the key false each rank reads it. At stage 3 each rank reads its shard's bytes later, under
 * tensor parallelism its tp slice (ca_tp_apply; a replicated parameter whole, tp_read_rest). */
static ca_status broadcast_file_values(ca_accelerator *acc, ca_tensor *p) {
    if (shards_meta(acc) || ca_tp_reads_slices(acc)) return CA_OK;
    if (!ca_ram_efficient_loading(acc)) return ca_tensor_materialize_(p);
    ca_status s = acc->rank == 0 ? ca_tensor_materialize_(p) : ca_meta_allocate(p);
    int32_t code = s;   /* rank 0's read failing is every rank's, before a broadcast that would wait */
    ca_status b = dispatch_bcast(acc, &code, sizeof code);
    if (b != CA_OK) return b;
    if (code != CA_OK)
        return acc->rank == 0 ? s : ca_error(CA_ERR_PEER, "rank 0 failed (%s) to read the parameter's values from "
                                             "its file; see rank 0's error", ca_status_name((ca_status)code));
    p->version++;
    return ca_comm_broadcast(acc->comm, ca_tptr(p), (size_t)p->numel, p->dtype, 0, NULL);
}

static ca_status broadcast_params(ca_accelerator *acc, ca_module *m) {
    if (acc->world == 1) return CA_OK;
    int n = ca_module_num_params(m);
    for (int i = 0; i < n; i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        ca_status s = ca_meta_from_file(p) ? broadcast_file_values(acc, p)
                      : ca_tensor_is_meta(p) ? broadcast_meta(acc, p)
                                             : ca_comm_broadcast(acc->comm, ca_tptr(p), (size_t)p->numel, p->dtype, 0, NULL);
        if (s != CA_OK) return ca_error_context("broadcasting parameter %s from rank 0", ca_module_param_name(m, i));
    }
    return CA_OK;
}

/* A model built under ca_init_empty_weights gets its values here: in full, except under ZeRO-3 /
 * FULL_SHARD, where ca_zero3_build makes only this rank's shard of them. */
static ca_status materialize(ca_accelerator *acc, ca_module *m, bool sharded) {
    if (sharded && shards_meta(acc)) return CA_OK;
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && sharded && ca_tp_reads_slices(acc) && i < ca_module_num_params(m); i++) {
        ca_tensor *p = ca_module_param_at(m, i);   /* from a file: ca_tp_apply reads the rank's slice */
        if (!ca_meta_from_file(p) && ca_tensor_materialize_(p) != CA_OK)
            s = ca_error_context("materialising parameter %s", ca_module_param_name(m, i));
    }
    return s != CA_OK || (sharded && ca_tp_reads_slices(acc)) ? s : ca_module_materialize(m);
}

/* Under tensor parallelism a deferred load's files gave each rank its slices of the split parameters
 * (ca_tp_apply); the replicated ones are read whole here (at stage 3 their shard, later). A read that
 * failed on one rank (the file cut short) fails ca_prepare on every rank. */
static ca_status tp_read_rest(ca_accelerator *acc, ca_module *m, bool files, ca_status s) {
    if (!files || !ca_tp_reads_slices(acc)) return s;
    if (s == CA_OK && !shards_meta(acc)) s = ca_module_materialize(m);
    return ca_agree_file_reads(acc, s, "tensor parallelism", "tp slices");
}

static bool from_files(ca_module *m) {
    bool files = false;   /* the same on every rank: every rank ran the same load */
    for (int i = 0; i < ca_module_num_params(m); i++) files = files || ca_meta_from_file(ca_module_param_at(m, i));
    return files;
}

/* A comm_hook compresses DDP's bucket all-reduce; a strategy that reduces its own way sends f32. */
static void warn_unused_hook(const ca_accelerator *acc) {
    if (acc->st.comm_hook == CA_COMM_HOOK_NO || !acc->sync_ops->own_reduction || acc->rank != 0) return;
    ca_log_printf(CA_LOG_WARNING, "comm_hook %s (from %s) compresses plain data parallelism's all-reduce; "
                  "%s reduces its own way and sends f32", ca_config_get(acc->cfg, "comm_hook"),
                  ca_config_origin(acc->cfg, "comm_hook"), acc->sync_ops->own_reduction);
}

/* A second, third, ... model (GANs, teacher/student): its own buckets; plain data parallelism only. */
static ca_status prepare_extra_model(ca_accelerator *acc, ca_module *m) {
    for (int i = 0; i < acc->nextra; i++)
        if (acc->extra[i] == m) return CA_OK;
    const ca_sync_strategy *ops = acc->sync_ops;
    if (acc->mesh)
        return ca_error(CA_ERR_UNSUPPORTED, "ca_prepare: the device mesh (parallelism_config_tp_size %d, from %s; "
                        "cp_size %d, from %s) takes one model per accelerator (not yet several)",
                        acc->mesh->shape.size[CA_MESH_TP],
                        ca_config_origin(acc->cfg, "parallelism_config.parallelism_config_tp_size"),
                        acc->mesh->shape.size[CA_MESH_CP],
                        ca_config_origin(acc->cfg, "parallelism_config.parallelism_config_cp_size"));
    if (!ops->prepare_extra_model || acc->joining) {   /* refused: the strategy takes one model */
        const char *key = ops->prepare_extra_model ? "distributed_type" : ops->key;
        return ca_error(CA_ERR_UNSUPPORTED, "ca_prepare: several models need plain data parallelism; %s (from %s) "
                        "takes one model per accelerator", key, ca_config_origin(acc->cfg, key));
    }
    ca_module **ne = realloc(acc->extra, (size_t)(acc->nextra + 1) * sizeof *ne);
    if (!ne) return ca_error(CA_ERR_NOMEM, "out of host memory");
    acc->extra = ne;
    ca_status s = ca_module_to(m, acc->device);
    if (s == CA_OK) s = materialize(acc, m, false);
    if (s == CA_OK) s = broadcast_params(acc, m);
    if (s == CA_OK) s = ops->prepare_extra_model(acc, m);
    if (s == CA_OK) s = ca_trainable_snapshot(acc, m);
    if (s != CA_OK) return s;
    acc->extra[acc->nextra++] = m;
    own_model(acc, m);
    return apply_checkpointing(acc, m);
}

static ca_status prepare_model(ca_accelerator *acc, ca_module *m) {
    if (acc->model && acc->model != m) return prepare_extra_model(acc, m);
    if (acc->model == m) return CA_OK;
    if (acc->nextra) return ca_error(CA_ERR_STATE, "ca_prepare: the first prepared model was destroyed");
    if (acc->world > 1) warn_unused_hook(acc);
    bool files = from_files(m);
    ca_status s = ca_module_to(m, acc->device);
    if (s == CA_OK) s = broadcast_params(acc, m);   /* a meta parameter: the record of rank 0's values */
    if (s == CA_OK) s = materialize(acc, m, true);
    if (s == CA_OK) s = ca_tp_apply(acc, m);   /* every rank holds the same whole weights: each keeps its part */
    s = tp_read_rest(acc, m, files, s);
    if (s == CA_OK && acc->sync_ops->prepare_model) s = acc->sync_ops->prepare_model(acc, m);
    if (s == CA_OK) s = ca_trainable_snapshot(acc, m);
    if (s == CA_OK) {
        acc->model = m;
        own_model(acc, m);
        zero3_init_end(acc);
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
    int drank, dworld;
    ca_mesh_data_rank(acc, &drank, &dworld);
    ca_optimizer_set_schedule_stride(o, dworld > 1 && !acc->st.split_batches ? dworld : 1);
    /* sharded data parallelism keeps the state of its shard only (ca_zero_add_optimizer drops the
     * optimizer's own): never made whole, it does not raise the rank's peak to the model's size */
    ca_status s = acc->zero.params ? CA_OK : ca_optimizer_init_state(o);
    if (s == CA_OK && acc->sync_ops->prepare_optimizer) s = acc->sync_ops->prepare_optimizer(acc, o);
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
    int drank, dworld;   /* the ranks of one tensor-parallel group read the same batches */
    ca_mesh_data_rank(acc, &drank, &dworld);
    if (s == CA_OK) s = ca_dataloader_shard(dl, drank, dworld, acc->st.even_batches);
    static const ca_dispatch_ops dispatch = {.bcast = dispatch_bcast};
    if (s == CA_OK && acc->st.dispatch_batches && acc->world > 1) s = ca_dataloader_set_dispatch(dl, &dispatch, acc);
    /* a loader that cannot split (an evaluation loader, say) stays whole; ca_backward refuses its batches */
    if (s == CA_OK && acc->sync_ops->prepare_loader) s = acc->sync_ops->prepare_loader(acc, dl);
    uint64_t seed;
    if (s == CA_OK && loader_seed(acc, &seed)) s = ca_dataloader_set_seed(dl, seed);
    if (s != CA_OK) return s;
    ca_dataloader **nl = realloc(acc->loaders, (size_t)(acc->nloaders + 1) * sizeof *nl);
    if (!nl) return ca_error(CA_ERR_NOMEM, "out of host memory");
    acc->loaders = nl;
    acc->loaders[acc->nloaders++] = dl;
    ca_dataloader_set_owner(dl, &(ca_dataloader_owner){.owner = acc, .forget = forget});
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
static ca_tensor *sharded_grads(const ca_accelerator *acc, ca_comm **group) {
    ca_comm *g = NULL;
    ca_tensor *t = acc->sync_ops->shard_grads ? acc->sync_ops->shard_grads(acc, &g) : NULL;
    if (group) *group = g;
    return t;
}

/* A frozen parameter (requires_grad false) is in no sum, unscale or clip, as in torch, where its
 * .grad is None; a gradient it still has (frozen after a backward) is not the optimizer's. */
static ca_status add_param(grad_set *gs, ca_tensor *p) { return p->requires_grad ? set_add(gs, p) : CA_OK; }

static ca_status collect_grads(const ca_accelerator *acc, const ca_optimizer *o, grad_set *gs) {
    ca_tensor *shard = sharded_grads(acc, NULL);
    if (shard) return set_add(gs, shard);
    ca_status s = CA_OK;
    for (int k = 0; s == CA_OK && k < acc->nopts; k++) {
        if (o && acc->opts[k] != o) continue;
        for (int i = 0; s == CA_OK && i < ca_optimizer_num_params(acc->opts[k]); i++)
            s = add_param(gs, ca_optimizer_param_at(acc->opts[k], i));
    }
    for (int k = -1; !o && !acc->nopts && k < acc->nextra; k++) {
        ca_module *m = k < 0 ? acc->model : acc->extra[k];
        for (int i = 0; s == CA_OK && m && i < ca_module_num_params(m); i++) s = add_param(gs, m->flat[i]);
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
/* Every gradient times the host value at ctx: the same f32 products as scale_grads_by's, in one kernel
 * call split over the kernels' threads instead of a call per gradient (most of them one thread's). */
static ca_status scale_fn(ca_device *dev, const ca_tensor_list *tl, void *ctx) {
    return CA_KCALL(dev, scale_list, .t = tl, .alpha = *(float *)ctx);
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
        if ((o && acc->opts[k] != o && !sharded_grads(acc, NULL)) || acc->opts[k]->amp_unscaled) continue;
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

/* ------------------------------------------------------------------ backward and step */

ca_status ca_backward(ca_accelerator *acc, ca_tensor *loss) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_backward: accelerator is NULL");
    if (!loss) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_INVALID, "ca_backward: loss is NULL");
    int64_t k = acc->in_accumulate && acc->st.gradient_accumulation_steps > 1 ? acc->st.gradient_accumulation_steps : 1;
    double seed = scaling(acc) ? acc->scaler.scale / (double)k : 1.0 / (double)k;
    const ca_sync_strategy *ops = acc->sync_ops;
    bool sync = ca_backward_syncs(acc), step_sync = acc->sync;
    ca_status s = ca_trainable_check(acc);   /* the same on every rank: refused before any collective */
    if (s == CA_OK && acc->joining) s = ca_join_notify(acc, sync);
    if (s != CA_OK) return s;
    acc->sync = sync;   /* what the bucket hooks read during this backward */
    acc->in_backward = true;
    s = ops->before_backward ? ops->before_backward(acc) : CA_OK;
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
    /* the strategy's reduction; DDP's buckets also wait for what a failed backward launched */
    ca_status f = ops->after_backward ? ops->after_backward(acc, sync, s != CA_OK) : CA_OK;
    return s != CA_OK ? s : f;
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
        if (acc->sync_ops->skip_step) s = acc->sync_ops->skip_step(acc);
    } else {
        s = acc->sync_ops->step ? acc->sync_ops->step(acc, o) : ca_optimizer_apply(o, 1.0f);
    }
    o->amp_unscaled = false;
    if (scaling(acc)) update_scale(acc);
    if (s == CA_OK) s = ca_memory_report_step(acc, o);
    ca_accelerator_profile_step(acc, o);
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
/* Tensor parallelism: each tp rank holds the gradient of its part of the split layers (and the whole
 * gradient of the others): *sq, this rank's sum of squares, gets the other tp ranks' sums over their
 * parts added, so that every rank holds the norm of the whole model. Sharded (ZeRO under tp), *sq is the
 * sum over the shard group already, and so is the split layers' part, summed over the same group first. */
static ca_status tp_sumsq(ca_accelerator *acc, const grad_set *gs, ca_comm *group, ca_tensor **sq) {
    grad_set sp = {0};
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < gs->n; i++)
        if (ca_tp_is_split(acc, gs->t[i])) s = set_add(&sp, gs->t[i]);
    ca_tensor *part = s == CA_OK ? ca_zeros(acc->device, CA_F32, 0, NULL) : NULL;
    ca_tensor *all = part ? ca_zeros(acc->device, CA_F32, 0, NULL) : NULL;
    if (s == CA_OK && !all) s = ca_last_status();
    sumsq_ctx c = {.out = all ? ca_tptr(part) : NULL, .first = true};
    const ca_sync_strategy *ops = acc->sync_ops;
    bool sharded = sharded_grads(acc, NULL) && ops->shard_split_sumsq;   /* gs: the shard, not the parameters */
    if (s == CA_OK && sharded) s = ops->shard_split_sumsq(acc, ca_tptr(part));
    else if (s == CA_OK && sp.n) s = for_grads(&sp, acc->device, sumsq_fn, &c);
    free(sp.t);
    if (s == CA_OK && sharded && group)
        s = ca_comm_all_reduce(group, ca_tptr(part), ca_tptr(part), 1, CA_F32, CA_OP_SUM, NULL);
    ca_comm *tp = ca_mesh_comm(acc, "tp");
    if (s == CA_OK) s = ca_comm_all_reduce(tp, ca_tptr(part), ca_tptr(all), 1, CA_F32, CA_OP_SUM, NULL);
    ca_tensor *sum = s == CA_OK ? ca_add(*sq, ca_sub(all, part)) : NULL;
    if (s == CA_OK && !sum) s = ca_last_status();
    if (s == CA_OK) *sq = sum;
    if (s != CA_OK) ca_error_context("clip_grad_norm: the norm of the tensor-parallel parts (rank %d)", acc->rank);
    return s;
}

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
        ca_comm *group = NULL;
        if (s == CA_OK && sharded_grads(acc, &group) && group)   /* over the shard group */
            s = ca_comm_all_reduce(group, ca_tptr(sq), ca_tptr(sq), 1, CA_F32, CA_OP_SUM, NULL);
        if (s == CA_OK && acc->mesh) s = tp_sumsq(acc, &gs, group, &sq);
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
        if (s == CA_OK && cv < 1.0 && ca_device_is_host(acc->device)) {   /* one list kernel, as the sum */
            float f = (float)cv;
            s = for_grads(&gs, acc->device, scale_fn, &f);
        } else if (s == CA_OK && cv < 1.0) {
            s = scale_grads_by(&gs, acc->device, cp);
        }
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

