/* The configuration schema: every Accelerate key with its type, default and allowed values; the env and flag maps. */
#include "config/config_impl.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define END NULL
#define NOLIMIT 1, 0            /* min > max: unbounded */
#define BIG 1e15

/* Values Accelerate enumerates (utils/dataclasses.py, utils/constants.py). */
static const char *const v_compute_env[] = {"LOCAL_MACHINE", "AMAZON_SAGEMAKER", END};
/* DistributedType, plus SageMakerDistributedType (checked against compute_environment
 * once the file is read) and the old name TPU, which Accelerate renamed XLA. */
static const char *const v_dist[] = {
    "NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA",
    "MULTI_XPU", "MULTI_HPU", "MULTI_NEURON", "DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM", "TP",
    "TPU", "DATA_PARALLEL", "MODEL_PARALLEL", END};
static const char *const v_mp[] = {"no", "fp16", "bf16", "fp8", END};
static const char *const v_backend[] = {"gloo", "mpi", "nccl", END};
static const char *const v_fp8_backend[] = {"TE", "MSAMP", "AO", END};
static const char *const v_fp8_format[] = {"HYBRID", "E4M3", "E5M2", END};
static const char *const v_amax_algo[] = {"max", "most_recent", END};
static const char *const v_opt_level[] = {"O1", "O2", END};
static const char *const v_offload[] = {"none", "cpu", "nvme", END};
static const char *const v_ds_launcher[] = {"pdsh", "standard", "openmpi", "mvapich", "mpich",
                                            "nossh", "slurm", END};
/* Accelerate's FSDP plugin also takes the 1-based index of the strategy. */
static const char *const v_sharding[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                         "HYBRID_SHARD_ZERO2", "1", "2", "3", "4", "5", END};
static const char *const v_wrap[] = {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP", END};
static const char *const v_prefetch[] = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH", END};
static const char *const v_state_dict[] = {"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT",
                                           "1", "2", "3", END};
static const char *const v_cp_comm[] = {"allgather", "alltoall", END};
static const char *const v_activities[] = {"cpu", "cuda", "cpu,cuda", "cuda,cpu", END};
static const char *const v_cp_backend[] = {"torch", END};
static const char *const v_sp_backend[] = {"deepspeed", END};
static const char *const v_dynamo_backend[] = {
    "no", "eager", "aot_eager", "inductor", "aot_ts_nvfuser", "nvprims_nvfuser", "cudagraphs",
    "ofi", "fx2trt", "onnxrt", "tensorrt", "aot_torchxla_trace_once", "torchxla_trace_once",
    "ipex", "tvm", "hpu_backend", END};
/* DDPCommunicationHookType's values (Accelerate's DistributedDataParallelKwargs(comm_hook=...)). */
static const char *const v_comm_hook[] = {"no", "fp16", "bf16", "power_sgd", "batched_power_sgd", END};
static const char *const v_dynamo_mode[] = {"default", "reduce-overhead", "max-autotune", END};

#define S CA_KF_SUPPORTED
#define CF CA_KF_CASEFOLD
#define CL CA_KF_CLUSTER
#define SM CA_KF_SAGEMAKER
#define BA CA_KF_BASE
#define EX (CA_KF_CACCEL | CA_KF_BASE)
#define LG (CA_KF_LEGACY | CA_KF_BASE)

#define KB(n, d, f, doc) {n, CA_KT_BOOL, d, NULL, f, NOLIMIT, doc}
#define KI(n, d, lo, hi, f, doc) {n, CA_KT_INT, d, NULL, f, lo, hi, doc}
#define KF(n, d, lo, hi, f, doc) {n, CA_KT_FLOAT, d, NULL, f, lo, hi, doc}
#define KS(n, d, f, doc) {n, CA_KT_STRING, d, NULL, f, NOLIMIT, doc}
#define KE(n, d, v, f, doc) {n, CA_KT_ENUM, d, v, f, NOLIMIT, doc}
#define KL(n, f, doc) {n, CA_KT_LIST, NULL, NULL, f, NOLIMIT, doc}
#define KM(n, f, doc) {n, CA_KT_MAP, "{}", NULL, f, NOLIMIT, doc}

/* Order: Accelerate's BaseConfig, ClusterConfig, SageMakerConfig fields, the
 * legacy keys, then caccel's extensions. A section's sub-keys follow it. This
 * order is the order of `caccel env`. */
const ca_key_def ca_config_keys[] = {
    KE("compute_environment", "LOCAL_MACHINE", v_compute_env, BA,
       "LOCAL_MACHINE, or AMAZON_SAGEMAKER (then SageMaker's keys apply)"),
    KE("distributed_type", "NO", v_dist, BA | S,
       "how processes cooperate: NO, MULTI_CPU, MULTI_GPU, XLA, FSDP, DEEPSPEED, ..."),
    KE("mixed_precision", "no", v_mp, BA | S | CF, "compute precision: no, fp16, bf16 (fp8 is reported, not run)"),
    KB("use_cpu", "false", BA | S, "run on the CPU even when an accelerator is present"),
    KB("debug", "false", BA | S, "check that every rank calls the same collective with the same shapes"),

    KI("num_processes", "-1", -1, 1e6, CL | S, "total number of processes (-1: not given)"),
    KI("machine_rank", "0", 0, 1e6, CL | S, "rank of this machine (0 .. num_machines-1)"),
    KI("num_machines", "1", 1, 1e6, BA | S | CA_KF_RANGE, "number of machines; MIN:MAX: elastic membership, MIN to MAX machines (caccel launch)"),
    KS("gpu_ids", NULL, BA | S, "accelerators to use on this machine: \"all\" or \"0,1\""),
    KS("main_process_ip", NULL, CL | S, "address of the machine of rank 0"),
    KI("main_process_port", NULL, 0, 65535, CL | S, "port of the rendezvous on rank 0 (0: any free port)"),
    KS("rdzv_backend", "static", CL, "torchrun rendezvous (static, c10d, ...)"),
    KB("same_network", "false", CL, "all machines on one local network"),
    KS("main_training_function", "main", CL, "Python function run on TPUs"),
    KB("enable_cpu_affinity", "false", BA | S, "bind each local rank to its own cores of one NUMA node"),
    KB("downcast_bf16", "false", CL, "on XLA with bf16, keep float64 as float32"),

    KM("fp8_config", CL, "FP8 recipe (Transformer Engine, MS-AMP, torchao)"),
    KE("fp8_config.backend", NULL, v_fp8_backend, CL | CF, "FP8 library"),
    KE("fp8_config.fp8_format", "HYBRID", v_fp8_format, CL | CF, "FP8 format"),
    KI("fp8_config.margin", "0", 1, 0, CL, "scaling margin"),
    KI("fp8_config.interval", "1", 1, BIG, CL, "steps between scale updates"),
    KI("fp8_config.amax_history_len", "1024", 1, BIG, CL, "amax history length (launcher name)"),
    KI("fp8_config.amax_history_length", "1024", 1, BIG, CL, "amax history length (wizard name)"),
    KE("fp8_config.amax_compute_algo", "most_recent", v_amax_algo, CL, "amax algorithm (launcher name)"),
    KE("fp8_config.amax_compute_algorithm", "most_recent", v_amax_algo, CL, "amax algorithm (wizard name)"),
    KS("fp8_config.override_linear_precision", "(false, false, false)", CL,
       "fprop, dgrad, wgrad in higher precision"),
    KB("fp8_config.use_autocast_during_eval", "false", CL, "FP8 autocast in evaluation"),
    KE("fp8_config.optimization_level", "O2", v_opt_level, CL | CF, "MS-AMP level"),
    KB("fp8_config.enable_fsdp_float8_all_gather", "true", CL, "torchao: FP8 all-gather under FSDP2"),
    KB("fp8_config.pad_inner_dim", "true", CL, "torchao: pad inner dimensions"),

    KM("deepspeed_config", CL, "DeepSpeed plugin"),
    KS("deepspeed_config.deepspeed_config_file", NULL, CL, "DeepSpeed JSON file (checked when a run needs it)"),
    KI("deepspeed_config.zero_stage", "2", 0, 3, CL, "ZeRO stage"),
    KE("deepspeed_config.offload_optimizer_device", "none", v_offload, CL | CF, "where optimizer state lives"),
    KE("deepspeed_config.offload_param_device", "none", v_offload, CL | CF, "where parameters live"),
    KS("deepspeed_config.offload_optimizer_nvme_path", NULL, CL, "NVMe path for optimizer state"),
    KS("deepspeed_config.offload_param_nvme_path", NULL, CL, "NVMe path for parameters"),
    KI("deepspeed_config.gradient_accumulation_steps", "1", 1, BIG, CL,
       "micro-steps per optimizer step (used when distributed_type is DEEPSPEED)"),
    KF("deepspeed_config.gradient_clipping", NULL, 0, BIG, CL,
       "global-norm clipping (used when distributed_type is DEEPSPEED)"),
    KB("deepspeed_config.zero3_init_flag", NULL, CL, "deepspeed.zero.Init for ZeRO-3"),
    KB("deepspeed_config.zero3_save_16bit_model", "false", CL, "save 16-bit weights under ZeRO-3"),
    KS("deepspeed_config.deepspeed_hostfile", NULL, CL | S, "hostfile: caccel launch starts every machine over ssh"),
    KS("deepspeed_config.deepspeed_inclusion_filter", NULL, CL, "hosts to include"),
    KS("deepspeed_config.deepspeed_exclusion_filter", NULL, CL, "hosts to exclude"),
    KE("deepspeed_config.deepspeed_multinode_launcher", "pdsh", v_ds_launcher, CL, "multi-node launcher"),
    KS("deepspeed_config.deepspeed_moe_layer_cls_names", NULL, CL, "MoE layer classes"),

    KM("fsdp_config", CL, "Fully Sharded Data Parallel plugin"),
    KI("fsdp_config.fsdp_version", "1", 1, 2, CL, "FSDP 1 or 2"),
    KB("fsdp_config.fsdp_offload_params", "false", CL, "offload parameters and gradients to the CPU"),
    KI("fsdp_config.fsdp_min_num_params", "100000000", 0, BIG, CL, "size for SIZE_BASED_WRAP"),
    KE("fsdp_config.fsdp_sharding_strategy", "FULL_SHARD", v_sharding, CL | CF, "sharding strategy"),
    KS("fsdp_config.fsdp_reshard_after_forward", NULL, CL, "FSDP2: true/false; FSDP1: a strategy"),
    KE("fsdp_config.fsdp_auto_wrap_policy", NULL, v_wrap, CL | CF, "auto wrap policy"),
    KL("fsdp_config.fsdp_transformer_layer_cls_to_wrap", CL, "layer classes to wrap"),
    KE("fsdp_config.fsdp_backward_prefetch", NULL, v_prefetch, CL | CF, "backward prefetch"),
    KE("fsdp_config.fsdp_state_dict_type", NULL, v_state_dict, CL | CF, "state dict type"),
    KB("fsdp_config.fsdp_forward_prefetch", "false", CL, "forward prefetch"),
    KB("fsdp_config.fsdp_use_orig_params", "true", CL, "use_orig_params"),
    KB("fsdp_config.fsdp_cpu_ram_efficient_loading", "true", CL, "load weights on rank 0 only"),
    KB("fsdp_config.fsdp_sync_module_states", "true", CL, "broadcast modules from rank 0"),
    KB("fsdp_config.fsdp_activation_checkpointing", "false", CL | S,
       "recompute each layer's activations in backward (under any distributed_type)"),
    KS("fsdp_config.fsdp_ignored_modules", NULL, CL, "modules FSDP ignores"),

    KM("tp_config", CL, "tensor parallelism"),
    KI("tp_config.tp_size", "1", 1, BIG, CL, "tensor-parallel degree"),

    /* Accelerate 1.10+ (FSDP2's N-d parallelism): its files and its launcher spell every key with the
     * parallelism_config_ prefix; the field names alone are read too (ca_config_key_find). */
    KM("parallelism_config", CL, "ParallelismConfig: sizes of the data, tensor, context and sequence parallel dimensions"),
    KI("parallelism_config.parallelism_config_dp_replicate_size", "1", 1, BIG, CL,
       "replicated data-parallel size (HSDP's replicas under FSDP; with tp_size or cp_size above 1, the data-parallel "
       "groups)"),
    KI("parallelism_config.parallelism_config_dp_shard_size", "1", 1, BIG, CL,
       "sharded data-parallel size (FSDP's shard group, under FSDP)"),
    KI("parallelism_config.parallelism_config_tp_size", "1", 1, BIG, CL | S,
       "tensor-parallel size: the Linear layers a ca_tp_plan names are split over it (docs/DISTRIBUTED.md)"),
    KI("parallelism_config.parallelism_config_cp_size", "1", 1, BIG, CL | S,
       "context-parallel size: every sequence split over it (ca_maybe_context_parallel; docs/DISTRIBUTED.md)"),
    KE("parallelism_config.parallelism_config_cp_backend", "torch", v_cp_backend, CL, "context-parallel backend"),
    KE("parallelism_config.parallelism_config_cp_comm_strategy", "allgather", v_cp_comm, CL | S,
       "context-parallel exchange of keys and values (alltoall: ring attention by sendrecv round the cp ranks)"),
    KI("parallelism_config.parallelism_config_sp_size", "1", 1, BIG, CL, "sequence-parallel size (above 1: refused)"),
    KE("parallelism_config.parallelism_config_sp_backend", "deepspeed", v_sp_backend, CL,
       "sequence-parallel backend (ALST/Ulysses)"),
    KS("parallelism_config.parallelism_config_sp_seq_length", NULL, CL,
       "sequence length when every batch has the same (None: unset)"),
    KB("parallelism_config.parallelism_config_sp_seq_length_is_variable", "true", CL,
       "the sequence length may change between batches"),
    KS("parallelism_config.parallelism_config_sp_attn_implementation", NULL, CL,
       "attention under sequence parallelism (sdpa, flash_attention_2, ...)"),

    KM("megatron_lm_config", CL, "Megatron-LM plugin"),
    KI("megatron_lm_config.megatron_lm_tp_degree", "1", 1, BIG, CL, "tensor-parallel degree"),
    KI("megatron_lm_config.megatron_lm_pp_degree", "1", 1, BIG, CL, "pipeline-parallel degree"),
    KI("megatron_lm_config.megatron_lm_num_micro_batches", NULL, 1, BIG, CL, "micro-batches"),
    KB("megatron_lm_config.megatron_lm_sequence_parallelism", NULL, CL, "sequence parallelism"),
    KB("megatron_lm_config.megatron_lm_recompute_activations", NULL, CL, "selective recomputation"),
    KB("megatron_lm_config.megatron_lm_use_distributed_optimizer", NULL, CL, "distributed optimizer"),
    KF("megatron_lm_config.megatron_lm_gradient_clipping", "1.0", 0, BIG, CL, "clipping (0: off)"),

    KM("ipex_config", CL, "Intel Extension for PyTorch"),
    KB("ipex_config.ipex", "false", CL, "use IPEX"),
    KB("ipex_config.use_xpu", "false", CL, "use Intel XPUs"),

    KM("mpirun_config", CL, "Accelerate's mpirun launch"),
    KS("mpirun_config.mpirun_hostfile", NULL, CL | S, "hostfile: caccel launch starts the processes through mpirun"),
    KI("mpirun_config.mpirun_ccl", "1", 0, BIG, CL, "oneCCL worker threads"),

    KM("dynamo_config", BA, "torch.compile"),
    KE("dynamo_config.dynamo_backend", "no", v_dynamo_backend, BA | CF, "torch.compile backend"),
    KE("dynamo_config.dynamo_mode", "default", v_dynamo_mode, BA, "torch.compile mode"),
    KB("dynamo_config.dynamo_use_fullgraph", "false", BA, "fullgraph"),
    KB("dynamo_config.dynamo_use_dynamic", "false", BA, "dynamic shapes"),
    KB("dynamo_config.dynamo_use_regional_compilation", "false", BA, "regional compilation"),

    KS("tpu_name", NULL, CL, "TPU pod name"),
    KS("tpu_zone", NULL, CL, "TPU pod zone"),
    KB("tpu_use_cluster", "false", CL, "TPU pod"),
    KB("tpu_use_sudo", "false", CL, "sudo on TPU pods"),
    KS("command_file", NULL, CL, "tpu-config: script of setup commands"),
    KL("commands", CL, "tpu-config: setup commands"),
    KL("command", CL, "tpu-config's --command name, found in Accelerate's own latest.yaml"),
    KL("tpu_vm", CL, "TPU VM names"),
    KL("tpu_env", CL, "environment variables on TPU VMs"),

    KS("ec2_instance_type", NULL, SM, "SageMaker instance type"),
    KS("iam_role_name", NULL, SM, "SageMaker IAM role"),
    KS("image_uri", NULL, SM, "SageMaker image"),
    KS("profile", NULL, SM, "AWS profile"),
    KS("region", "us-east-1", SM, "AWS region"),
    KS("base_job_name", "accelerate-sagemaker-1", SM, "SageMaker job name"),
    KS("pytorch_version", "1.10.2", SM, "SageMaker PyTorch version"),
    KS("transformers_version", "4.17.0", SM, "SageMaker Transformers version"),
    KS("py_version", "py38", SM, "SageMaker Python version"),
    KS("sagemaker_inputs_file", NULL, SM, "SageMaker inputs (TSV)"),
    KS("sagemaker_metrics_file", NULL, SM, "SageMaker metrics (TSV)"),
    {"additional_args", CA_KT_MAP, "{}", NULL, SM | CA_KF_FREEFORM, NOLIMIT, "extra SageMaker estimator arguments"},

    KB("fp16", NULL, LG, "old name: fp16: true means mixed_precision: fp16"),
    KS("dynamo_backend", NULL, LG, "old name of dynamo_config.dynamo_backend"),

    KE("backend", NULL, v_backend, EX | S | CF, "collective backend (null: gloo for CPUs, nccl for GPUs, mpi under mpirun)"),
    KF("timeout", "1800", 0.001, 1e9, EX | S, "seconds before a collective or the rendezvous gives up"),
    KF("bucket_cap_mb", "25", 0.001, 1e6, EX | S, "gradient bucket size in MiB for the all-reduce"),
    KS("flight_recorder_dir", NULL, EX | S,
       "on a communicator failure or SIGTERM each rank writes its last collectives and kernel calls to "
       "DIR/rank_<r>.json (null: off; `caccel trace analyze DIR` reads them; docs/PROFILING.md)"),
    KI("flight_recorder_entries", "2000", 1, 1e5, EX | S, "collectives and kernel calls the flight recorder keeps"),
    KB("allow_tf32", "false", EX | S, "f32 matmuls on a GPU's TF32 tensor cores (torch's allow_tf32 for matmul)"),
    KE("comm_hook", "no", v_comm_hook, EX | S | CF,
       "DDP communication hook: fp16/bf16 send the gradients in 16 bits, power_sgd/batched_power_sgd as low-rank "
       "factors"),
    KM("comm_state_option", EX | S, "PowerSGD's state (DistributedDataParallelKwargs(comm_state_option=...))"),
    KI("comm_state_option.matrix_approximation_rank", "1", 1, 1e6, EX | S, "rank of the low-rank factors"),
    KI("comm_state_option.start_powerSGD_iter", "1000", 0, BIG, EX | S,
       "steps all-reduced uncompressed before PowerSGD starts"),
    KF("comm_state_option.min_compression_rate", "2", 0, BIG, EX | S,
       "a gradient is compressed when its size / (rows + columns) * rank exceeds this"),
    KB("comm_state_option.use_error_feedback", "true", EX | S, "add what compression lost to the next step's gradient"),
    KB("comm_state_option.warm_start", "true", EX | S, "start each step's power iteration from the last step's Q"),
    KF("comm_state_option.orthogonalization_epsilon", "0", 0, BIG, EX | S,
       "added to the column norms in Gram-Schmidt (0: none; a zero column stays zero)"),
    KI("comm_state_option.random_seed", "0", 0, BIG, EX | S, "seed of the initial Q (the same on every rank)"),
    KI("comm_state_option.compression_stats_logging_frequency", "10000", 1, BIG, EX | S,
       "steps between the INFO lines on the compression rate"),
    KB("comm_state_option.batch_tensors_with_same_shape", "false", EX | S,
       "PyTorch: one batched GEMM per shape; here each gradient has its own (the same numbers)"),
    KB("even_batches", "true", EX | S, "every rank gets the same number of batches (wraps around)"),
    KB("split_batches", "false", EX | S, "a loader's batch_size is the global batch; each process gets its slice"),
    KB("dispatch_batches", "false", EX | S,
       "rank 0 alone reads the data and broadcasts each global batch; every process keeps its slice"),
    KB("use_seedable_sampler", "false", EX | S, "the shuffle's seed is data_seed when that is set"),
    KI("data_seed", NULL, 0, BIG, EX | S, "seed of every loader's shuffle with use_seedable_sampler (null: set_seed's)"),
    KB("non_blocking", "false", EX, "asynchronous host-to-device copies of the batches"),
    KI("gradient_accumulation_steps", "1", 1, 1e9, EX | S, "micro-steps per optimizer step"),
    KF("gradient_clipping", NULL, 0, BIG, EX | S, "clip the global gradient norm to this (null: off)"),
    KI("num_cpu_threads_per_process", NULL, 1, 1e6, EX | S, "threads per process (null: cores / local processes)"),
    KB("allow_unknown_keys", "false", EX | S, "unknown top-level keys warn instead of failing"),
    KS("project_dir", NULL, EX | S, "directory of the run: save_state/load_state without a directory use <project_dir>/checkpoints (null: the current directory)"),
    KS("logging_dir", NULL, EX | S, "trackers write to <logging_dir>/<project> (null: project_dir, else the current directory)"),
    KS("log_with", NULL, EX | S, "experiment trackers, comma-separated: json, csv, mlflow, tensorboard, all (wandb, comet_ml, ...: refused by ca_init_trackers)"),
    KB("progress", "true", EX | S, "progress bars (caccel/progress.h) on the main process's stderr"),
    KB("automatic_checkpoint_naming", "false", EX | S, "save_state without a directory writes checkpoints/checkpoint_<iteration>"),
    KI("total_limit", NULL, 1, 1e9, EX | S, "keep at most this many complete checkpoints under checkpoints/ (null: all)"),
    KB("async_save", "false", EX | S, "save_state copies the state to host memory and writes it on a background thread (docs/CHECKPOINTS.md)"),
    KI("iteration", "0", 0, 1e15, EX | S, "number of the next automatically named checkpoint (load_state continues after the one it loads)"),
    KB("deterministic", "false", EX | S, "parameters bit-identical for any process and BLAS thread count (docs/DETERMINISM.md)"),
    KI("deterministic_shards", "4", 1, 1e6, EX | S, "virtual shards per global batch in deterministic mode (a multiple of the process count)"),
    /* the profiler: Accelerate's ProfileKwargs (docs/PROFILING.md) */
    KB("profiling", "false", EX | S, "write a Chrome trace of the run per rank (flag --profile; docs/PROFILING.md; `profile` is SageMaker's AWS profile)"),
    KS("output_trace_dir", NULL, EX | S, "where the profiler writes trace_rank<r>.json (null: the current directory)"),
    KE("profile_activities", "cpu,cuda", v_activities, EX | S, "ProfileKwargs.activities: cpu, cuda or cpu,cuda"),
    KI("profile_wait", "0", 0, 1e9, EX | S, "schedule_option.wait: optimizer steps skipped first in each cycle"),
    KI("profile_warmup", "0", 0, 1e9, EX | S, "schedule_option.warmup: steps not recorded after wait"),
    KI("profile_active", "0", 0, 1e9, EX | S, "schedule_option.active: steps recorded per cycle (0 with no wait/warmup/repeat: every step)"),
    KI("profile_repeat", "0", 0, 1e9, EX | S, "schedule_option.repeat: cycles (0: until the end)"),
    KB("profile_record_shapes", "false", EX | S, "ProfileKwargs.record_shapes: kernel slices carry shapes"),
    KB("profile_memory", "false", EX | S, "ProfileKwargs.profile_memory: the allocator's live and reserved bytes as a counter track"),
    KB("profile_with_flops", "false", EX | S, "ProfileKwargs.with_flops: kernel slices carry FLOPs"),
    /* the throughput meter (caccel/throughput.h; docs/PROFILING.md) */
    KI("throughput_interval", "0", 0, 1e9, EX | S, "ca_throughput_step prints the throughput/MFU line and logs it to the trackers every N steps (0: only when the program asks)"),
    KF("peak_flops", "0", 0, 1e21, EX | S, "the device's peak FLOP/s for MFU (0: a GEMM probe measures it once per machine and caches it)"),
};
const size_t ca_config_nkeys = sizeof ca_config_keys / sizeof ca_config_keys[0];

/* ACCELERATE_* variables (what Accelerate's launcher sets and its workers
 * read), the torchrun/launcher ones, and caccel's own. */
const ca_env_def ca_config_envs[] = {
    {"ACCELERATE_CONFIG_FILE", CA_ENV_CONFIG_FILE, NULL},
    {"ACCELERATE_USE_CPU", CA_ENV_KEY, "use_cpu"},
    {"ACCELERATE_MIXED_PRECISION", CA_ENV_KEY, "mixed_precision"},
    {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS", CA_ENV_KEY, "gradient_accumulation_steps"},
    {"ACCELERATE_GRADIENT_CLIPPING", CA_ENV_KEY, "gradient_clipping"},
    {"ACCELERATE_DEBUG_MODE", CA_ENV_KEY, "debug"},
    {"ACCELERATE_CPU_AFFINITY", CA_ENV_KEY, "enable_cpu_affinity"},
    {"ACCELERATE_DOWNCAST_BF16", CA_ENV_KEY, "downcast_bf16"},
    {"ACCELERATE_NUM_PROCESSES", CA_ENV_KEY, "num_processes"},
    {"ACCELERATE_USE_DEEPSPEED", CA_ENV_DIST_TYPE, "DEEPSPEED"},
    {"ACCELERATE_USE_FSDP", CA_ENV_DIST_TYPE, "FSDP"},
    {"ACCELERATE_USE_MEGATRON_LM", CA_ENV_DIST_TYPE, "MEGATRON_LM"},
    /* caccel's: Accelerate's workers find the TPU through torch_xla; caccel launch --tpu sets this */
    {"CACCEL_USE_XLA", CA_ENV_DIST_TYPE, "XLA"},
    {"ACCELERATE_DYNAMO_BACKEND", CA_ENV_KEY, "dynamo_config.dynamo_backend"},
    {"ACCELERATE_DYNAMO_MODE", CA_ENV_KEY, "dynamo_config.dynamo_mode"},
    {"ACCELERATE_DYNAMO_USE_FULLGRAPH", CA_ENV_KEY, "dynamo_config.dynamo_use_fullgraph"},
    {"ACCELERATE_DYNAMO_USE_DYNAMIC", CA_ENV_KEY, "dynamo_config.dynamo_use_dynamic"},
    {"ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", CA_ENV_KEY, "dynamo_config.dynamo_use_regional_compilation"},
    {"ACCELERATE_FP8_BACKEND", CA_ENV_KEY, "fp8_config.backend"},
    {"ACCELERATE_FP8_FORMAT", CA_ENV_KEY, "fp8_config.fp8_format"},
    {"ACCELERATE_FP8_MARGIN", CA_ENV_KEY, "fp8_config.margin"},
    {"ACCELERATE_FP8_INTERVAL", CA_ENV_KEY, "fp8_config.interval"},
    {"ACCELERATE_FP8_AMAX_HISTORY_LEN", CA_ENV_KEY, "fp8_config.amax_history_len"},
    {"ACCELERATE_FP8_AMAX_COMPUTE_ALGO", CA_ENV_KEY, "fp8_config.amax_compute_algo"},
    {"ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL", CA_ENV_KEY, "fp8_config.use_autocast_during_eval"},
    {"ACCELERATE_FP8_OPT_LEVEL", CA_ENV_KEY, "fp8_config.optimization_level"},
    {"ACCELERATE_DEEPSPEED_ZERO_STAGE", CA_ENV_KEY, "deepspeed_config.zero_stage"},
    {"ACCELERATE_DEEPSPEED_CONFIG_FILE", CA_ENV_KEY, "deepspeed_config.deepspeed_config_file"},
    {"ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", CA_ENV_KEY, "deepspeed_config.offload_optimizer_device"},
    {"ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", CA_ENV_KEY, "deepspeed_config.offload_param_device"},
    {"ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH", CA_ENV_KEY, "deepspeed_config.offload_optimizer_nvme_path"},
    {"ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH", CA_ENV_KEY, "deepspeed_config.offload_param_nvme_path"},
    {"ACCELERATE_DEEPSPEED_ZERO3_INIT", CA_ENV_KEY, "deepspeed_config.zero3_init_flag"},
    {"ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", CA_ENV_KEY, "deepspeed_config.zero3_save_16bit_model"},
    {"ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", CA_ENV_KEY, "deepspeed_config.deepspeed_moe_layer_cls_names"},
    {"FSDP_VERSION", CA_ENV_KEY, "fsdp_config.fsdp_version"},
    {"FSDP_OFFLOAD_PARAMS", CA_ENV_KEY, "fsdp_config.fsdp_offload_params"},
    {"FSDP_MIN_NUM_PARAMS", CA_ENV_KEY, "fsdp_config.fsdp_min_num_params"},
    {"FSDP_SHARDING_STRATEGY", CA_ENV_KEY, "fsdp_config.fsdp_sharding_strategy"},
    {"FSDP_RESHARD_AFTER_FORWARD", CA_ENV_KEY, "fsdp_config.fsdp_reshard_after_forward"},
    {"FSDP_AUTO_WRAP_POLICY", CA_ENV_KEY, "fsdp_config.fsdp_auto_wrap_policy"},
    {"FSDP_TRANSFORMER_CLS_TO_WRAP", CA_ENV_KEY, "fsdp_config.fsdp_transformer_layer_cls_to_wrap"},
    {"FSDP_BACKWARD_PREFETCH", CA_ENV_KEY, "fsdp_config.fsdp_backward_prefetch"},
    {"FSDP_STATE_DICT_TYPE", CA_ENV_KEY, "fsdp_config.fsdp_state_dict_type"},
    {"FSDP_FORWARD_PREFETCH", CA_ENV_KEY, "fsdp_config.fsdp_forward_prefetch"},
    {"FSDP_USE_ORIG_PARAMS", CA_ENV_KEY, "fsdp_config.fsdp_use_orig_params"},
    {"FSDP_CPU_RAM_EFFICIENT_LOADING", CA_ENV_KEY, "fsdp_config.fsdp_cpu_ram_efficient_loading"},
    {"FSDP_SYNC_MODULE_STATES", CA_ENV_KEY, "fsdp_config.fsdp_sync_module_states"},
    {"FSDP_ACTIVATION_CHECKPOINTING", CA_ENV_KEY, "fsdp_config.fsdp_activation_checkpointing"},
    {"FSDP_IGNORED_MODULES", CA_ENV_KEY, "fsdp_config.fsdp_ignored_modules"},
    {"MEGATRON_LM_TP_DEGREE", CA_ENV_KEY, "megatron_lm_config.megatron_lm_tp_degree"},
    {"MEGATRON_LM_PP_DEGREE", CA_ENV_KEY, "megatron_lm_config.megatron_lm_pp_degree"},
    {"MEGATRON_LM_NUM_MICRO_BATCHES", CA_ENV_KEY, "megatron_lm_config.megatron_lm_num_micro_batches"},
    {"MEGATRON_LM_SEQUENCE_PARALLELISM", CA_ENV_KEY, "megatron_lm_config.megatron_lm_sequence_parallelism"},
    {"MEGATRON_LM_RECOMPUTE_ACTIVATIONS", CA_ENV_KEY, "megatron_lm_config.megatron_lm_recompute_activations"},
    {"MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER", CA_ENV_KEY, "megatron_lm_config.megatron_lm_use_distributed_optimizer"},
    {"MEGATRON_LM_GRADIENT_CLIPPING", CA_ENV_KEY, "megatron_lm_config.megatron_lm_gradient_clipping"},
    /* what Accelerate's launcher sets (utils/launch.py) and ParallelismConfig reads */
    {"PARALLELISM_CONFIG_DP_REPLICATE_SIZE", CA_ENV_KEY, "parallelism_config.parallelism_config_dp_replicate_size"},
    {"PARALLELISM_CONFIG_DP_SHARD_SIZE", CA_ENV_KEY, "parallelism_config.parallelism_config_dp_shard_size"},
    {"PARALLELISM_CONFIG_TP_SIZE", CA_ENV_KEY, "parallelism_config.parallelism_config_tp_size"},
    {"PARALLELISM_CONFIG_CP_SIZE", CA_ENV_KEY, "parallelism_config.parallelism_config_cp_size"},
    {"PARALLELISM_CONFIG_CP_BACKEND", CA_ENV_KEY, "parallelism_config.parallelism_config_cp_backend"},
    {"PARALLELISM_CONFIG_CP_COMM_STRATEGY", CA_ENV_KEY, "parallelism_config.parallelism_config_cp_comm_strategy"},
    {"PARALLELISM_CONFIG_SP_SIZE", CA_ENV_KEY, "parallelism_config.parallelism_config_sp_size"},
    {"PARALLELISM_CONFIG_SP_BACKEND", CA_ENV_KEY, "parallelism_config.parallelism_config_sp_backend"},
    {"PARALLELISM_CONFIG_SP_SEQ_LENGTH", CA_ENV_KEY, "parallelism_config.parallelism_config_sp_seq_length"},
    {"PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", CA_ENV_KEY, "parallelism_config.parallelism_config_sp_seq_length_is_variable"},
    {"PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION", CA_ENV_KEY, "parallelism_config.parallelism_config_sp_attn_implementation"},
    /* torchrun's agent reads its flags from PET_<FLAG> (--nnodes, --node_rank); PET_MAX_RESTARTS and
     * PET_RDZV_CONF set launcher flags that are no keys (tools/cmd_launch.c) */
    {"PET_NNODES", CA_ENV_KEY, "num_machines"},
    {"PET_NODE_RANK", CA_ENV_KEY, "machine_rank"},
    {"MASTER_ADDR", CA_ENV_KEY, "main_process_ip"},
    {"MASTER_PORT", CA_ENV_KEY, "main_process_port"},
    /* torchrun's rendezvous endpoint is machine 0's store: after MASTER_ADDR/MASTER_PORT, which it must agree with */
    {"PET_RDZV_ENDPOINT", CA_ENV_ENDPOINT, NULL},
    {"CACCEL_BACKEND", CA_ENV_KEY, "backend"},
    {"CACCEL_TIMEOUT", CA_ENV_KEY, "timeout"},
    {"CACCEL_BUCKET_CAP_MB", CA_ENV_KEY, "bucket_cap_mb"},
    {"CACCEL_FLIGHT_RECORDER_DIR", CA_ENV_KEY, "flight_recorder_dir"},
    {"CACCEL_FLIGHT_RECORDER_ENTRIES", CA_ENV_KEY, "flight_recorder_entries"},
    {"CACCEL_ALLOW_TF32", CA_ENV_KEY, "allow_tf32"},
    {"CACCEL_COMM_HOOK", CA_ENV_KEY, "comm_hook"},
    {"CACCEL_ALLOW_UNKNOWN_KEYS", CA_ENV_KEY, "allow_unknown_keys"},
    {"CACCEL_EVEN_BATCHES", CA_ENV_KEY, "even_batches"},
    {"CACCEL_SPLIT_BATCHES", CA_ENV_KEY, "split_batches"},
    {"CACCEL_DISPATCH_BATCHES", CA_ENV_KEY, "dispatch_batches"},
    {"CACCEL_USE_SEEDABLE_SAMPLER", CA_ENV_KEY, "use_seedable_sampler"},
    {"CACCEL_DATA_SEED", CA_ENV_KEY, "data_seed"},
    {"CACCEL_NON_BLOCKING", CA_ENV_KEY, "non_blocking"},
    {"CACCEL_PROJECT_DIR", CA_ENV_KEY, "project_dir"},
    {"CACCEL_LOGGING_DIR", CA_ENV_KEY, "logging_dir"},
    {"CACCEL_LOG_WITH", CA_ENV_KEY, "log_with"},
    {"CACCEL_PROGRESS", CA_ENV_KEY, "progress"},
    {"CACCEL_AUTOMATIC_CHECKPOINT_NAMING", CA_ENV_KEY, "automatic_checkpoint_naming"},
    {"CACCEL_TOTAL_LIMIT", CA_ENV_KEY, "total_limit"},
    {"CACCEL_ASYNC_SAVE", CA_ENV_KEY, "async_save"},
    {"CACCEL_ITERATION", CA_ENV_KEY, "iteration"},
    {"CACCEL_DETERMINISTIC", CA_ENV_KEY, "deterministic"},
    {"CACCEL_DETERMINISTIC_SHARDS", CA_ENV_KEY, "deterministic_shards"},
    {"CACCEL_PROFILE", CA_ENV_KEY, "profiling"},
    {"CACCEL_OUTPUT_TRACE_DIR", CA_ENV_KEY, "output_trace_dir"},
    {"CACCEL_PROFILE_ACTIVITIES", CA_ENV_KEY, "profile_activities"},
    {"CACCEL_PROFILE_WAIT", CA_ENV_KEY, "profile_wait"},
    {"CACCEL_PROFILE_WARMUP", CA_ENV_KEY, "profile_warmup"},
    {"CACCEL_PROFILE_ACTIVE", CA_ENV_KEY, "profile_active"},
    {"CACCEL_PROFILE_REPEAT", CA_ENV_KEY, "profile_repeat"},
    {"CACCEL_PROFILE_RECORD_SHAPES", CA_ENV_KEY, "profile_record_shapes"},
    {"CACCEL_PROFILE_MEMORY", CA_ENV_KEY, "profile_memory"},
    {"CACCEL_PROFILE_WITH_FLOPS", CA_ENV_KEY, "profile_with_flops"},
    {"CACCEL_THROUGHPUT_INTERVAL", CA_ENV_KEY, "throughput_interval"},
    {"CACCEL_PEAK_FLOPS", CA_ENV_KEY, "peak_flops"},
};
const size_t ca_config_nenvs = sizeof ca_config_envs / sizeof ca_config_envs[0];

/* `accelerate launch` flags that map onto keys, and caccel's own. */
const ca_flag_def ca_config_flags[] = {
    {"config_file", CA_FLAG_CONFIG_FILE, NULL},
    {"cpu", CA_FLAG_TRUE, "use_cpu"},
    {"use_cpu", CA_FLAG_TRUE, "use_cpu"},
    {"multi_gpu", CA_FLAG_DIST_TYPE, "MULTI_GPU"},
    {"tpu", CA_FLAG_DIST_TYPE, "XLA"},
    {"use_deepspeed", CA_FLAG_DIST_TYPE, "DEEPSPEED"},
    {"use_fsdp", CA_FLAG_DIST_TYPE, "FSDP"},
    {"use_megatron_lm", CA_FLAG_DIST_TYPE, "MEGATRON_LM"},
    {"mixed_precision", CA_FLAG_VALUE, "mixed_precision"},
    {"num_processes", CA_FLAG_VALUE, "num_processes"},
    {"num_machines", CA_FLAG_VALUE, "num_machines"},
    {"machine_rank", CA_FLAG_VALUE, "machine_rank"},
    {"main_process_ip", CA_FLAG_VALUE, "main_process_ip"},
    {"main_process_port", CA_FLAG_VALUE, "main_process_port"},
    {"rdzv_endpoint", CA_FLAG_ENDPOINT, NULL},
    {"gpu_ids", CA_FLAG_VALUE, "gpu_ids"},
    {"gradient_accumulation_steps", CA_FLAG_VALUE, "gradient_accumulation_steps"},
    {"gradient_clipping", CA_FLAG_VALUE, "gradient_clipping"},
    {"debug", CA_FLAG_TRUE, "debug"},
    {"downcast_bf16", CA_FLAG_TRUE, "downcast_bf16"},
    {"rdzv_backend", CA_FLAG_VALUE, "rdzv_backend"},
    {"same_network", CA_FLAG_TRUE, "same_network"},
    {"enable_cpu_affinity", CA_FLAG_TRUE, "enable_cpu_affinity"},
    {"num_cpu_threads_per_process", CA_FLAG_VALUE, "num_cpu_threads_per_process"},
    {"main_training_function", CA_FLAG_VALUE, "main_training_function"},
    {"dynamo_backend", CA_FLAG_VALUE, "dynamo_config.dynamo_backend"},
    {"dynamo_mode", CA_FLAG_VALUE, "dynamo_config.dynamo_mode"},
    {"dynamo_use_fullgraph", CA_FLAG_TRUE, "dynamo_config.dynamo_use_fullgraph"},
    {"dynamo_use_dynamic", CA_FLAG_TRUE, "dynamo_config.dynamo_use_dynamic"},
    {"dynamo_use_regional_compilation", CA_FLAG_TRUE, "dynamo_config.dynamo_use_regional_compilation"},
    {"ipex", CA_FLAG_TRUE, "ipex_config.ipex"},
    {"use_xpu", CA_FLAG_TRUE, "ipex_config.use_xpu"},
    {"mpirun_hostfile", CA_FLAG_VALUE, "mpirun_config.mpirun_hostfile"},
    {"mpirun_ccl", CA_FLAG_VALUE, "mpirun_config.mpirun_ccl"},
    {"tpu_cluster", CA_FLAG_TRUE, "tpu_use_cluster"},
    {"tpu_use_sudo", CA_FLAG_TRUE, "tpu_use_sudo"},
    {"deepspeed_config_file", CA_FLAG_VALUE, "deepspeed_config.deepspeed_config_file"},
    {"zero_stage", CA_FLAG_VALUE, "deepspeed_config.zero_stage"},
    {"offload_optimizer_device", CA_FLAG_VALUE, "deepspeed_config.offload_optimizer_device"},
    {"offload_param_device", CA_FLAG_VALUE, "deepspeed_config.offload_param_device"},
    {"offload_optimizer_nvme_path", CA_FLAG_VALUE, "deepspeed_config.offload_optimizer_nvme_path"},
    {"offload_param_nvme_path", CA_FLAG_VALUE, "deepspeed_config.offload_param_nvme_path"},
    {"zero3_init_flag", CA_FLAG_VALUE, "deepspeed_config.zero3_init_flag"},
    {"zero3_save_16bit_model", CA_FLAG_VALUE, "deepspeed_config.zero3_save_16bit_model"},
    {"deepspeed_hostfile", CA_FLAG_VALUE, "deepspeed_config.deepspeed_hostfile"},
    {"hostfile", CA_FLAG_VALUE, "deepspeed_config.deepspeed_hostfile"},   /* DeepSpeed's launcher's name */
    {"deepspeed_exclusion_filter", CA_FLAG_VALUE, "deepspeed_config.deepspeed_exclusion_filter"},
    {"deepspeed_inclusion_filter", CA_FLAG_VALUE, "deepspeed_config.deepspeed_inclusion_filter"},
    {"deepspeed_multinode_launcher", CA_FLAG_VALUE, "deepspeed_config.deepspeed_multinode_launcher"},
    {"deepspeed_moe_layer_cls_names", CA_FLAG_VALUE, "deepspeed_config.deepspeed_moe_layer_cls_names"},
    {"fsdp_version", CA_FLAG_VALUE, "fsdp_config.fsdp_version"},
    {"fsdp_offload_params", CA_FLAG_VALUE, "fsdp_config.fsdp_offload_params"},
    {"fsdp_min_num_params", CA_FLAG_VALUE, "fsdp_config.fsdp_min_num_params"},
    {"fsdp_sharding_strategy", CA_FLAG_VALUE, "fsdp_config.fsdp_sharding_strategy"},
    {"fsdp_reshard_after_forward", CA_FLAG_VALUE, "fsdp_config.fsdp_reshard_after_forward"},
    {"fsdp_auto_wrap_policy", CA_FLAG_VALUE, "fsdp_config.fsdp_auto_wrap_policy"},
    {"fsdp_transformer_layer_cls_to_wrap", CA_FLAG_VALUE, "fsdp_config.fsdp_transformer_layer_cls_to_wrap"},
    {"fsdp_backward_prefetch", CA_FLAG_VALUE, "fsdp_config.fsdp_backward_prefetch"},
    {"fsdp_state_dict_type", CA_FLAG_VALUE, "fsdp_config.fsdp_state_dict_type"},
    {"fsdp_forward_prefetch", CA_FLAG_VALUE, "fsdp_config.fsdp_forward_prefetch"},
    {"fsdp_use_orig_params", CA_FLAG_VALUE, "fsdp_config.fsdp_use_orig_params"},
    {"fsdp_cpu_ram_efficient_loading", CA_FLAG_VALUE, "fsdp_config.fsdp_cpu_ram_efficient_loading"},
    {"fsdp_sync_module_states", CA_FLAG_VALUE, "fsdp_config.fsdp_sync_module_states"},
    {"fsdp_activation_checkpointing", CA_FLAG_VALUE, "fsdp_config.fsdp_activation_checkpointing"},
    {"megatron_lm_tp_degree", CA_FLAG_VALUE, "megatron_lm_config.megatron_lm_tp_degree"},
    {"megatron_lm_pp_degree", CA_FLAG_VALUE, "megatron_lm_config.megatron_lm_pp_degree"},
    {"megatron_lm_num_micro_batches", CA_FLAG_VALUE, "megatron_lm_config.megatron_lm_num_micro_batches"},
    {"megatron_lm_sequence_parallelism", CA_FLAG_VALUE, "megatron_lm_config.megatron_lm_sequence_parallelism"},
    {"megatron_lm_recompute_activations", CA_FLAG_VALUE, "megatron_lm_config.megatron_lm_recompute_activations"},
    {"megatron_lm_use_distributed_optimizer", CA_FLAG_VALUE, "megatron_lm_config.megatron_lm_use_distributed_optimizer"},
    {"megatron_lm_gradient_clipping", CA_FLAG_VALUE, "megatron_lm_config.megatron_lm_gradient_clipping"},
    {"parallelism_config_dp_replicate_size", CA_FLAG_VALUE, "parallelism_config.parallelism_config_dp_replicate_size"},
    {"parallelism_config_dp_shard_size", CA_FLAG_VALUE, "parallelism_config.parallelism_config_dp_shard_size"},
    {"parallelism_config_tp_size", CA_FLAG_VALUE, "parallelism_config.parallelism_config_tp_size"},
    {"parallelism_config_cp_size", CA_FLAG_VALUE, "parallelism_config.parallelism_config_cp_size"},
    {"parallelism_config_cp_backend", CA_FLAG_VALUE, "parallelism_config.parallelism_config_cp_backend"},
    {"parallelism_config_cp_comm_strategy", CA_FLAG_VALUE, "parallelism_config.parallelism_config_cp_comm_strategy"},
    {"parallelism_config_sp_size", CA_FLAG_VALUE, "parallelism_config.parallelism_config_sp_size"},
    {"parallelism_config_sp_backend", CA_FLAG_VALUE, "parallelism_config.parallelism_config_sp_backend"},
    {"parallelism_config_sp_seq_length", CA_FLAG_VALUE, "parallelism_config.parallelism_config_sp_seq_length"},
    {"parallelism_config_sp_seq_length_is_variable", CA_FLAG_VALUE, "parallelism_config.parallelism_config_sp_seq_length_is_variable"},
    {"parallelism_config_sp_attn_implementation", CA_FLAG_VALUE, "parallelism_config.parallelism_config_sp_attn_implementation"},
    /* the sizes apply whenever set: nothing to switch on */
    {"use_parallelism_config", CA_FLAG_IMPLIED, NULL},
    {"fp8_backend", CA_FLAG_VALUE, "fp8_config.backend"},
    {"fp8_use_autocast_during_eval", CA_FLAG_TRUE, "fp8_config.use_autocast_during_eval"},
    {"fp8_margin", CA_FLAG_VALUE, "fp8_config.margin"},
    {"fp8_interval", CA_FLAG_VALUE, "fp8_config.interval"},
    {"fp8_format", CA_FLAG_VALUE, "fp8_config.fp8_format"},
    {"fp8_amax_history_len", CA_FLAG_VALUE, "fp8_config.amax_history_len"},
    {"fp8_amax_compute_algo", CA_FLAG_VALUE, "fp8_config.amax_compute_algo"},
    {"fp8_override_linear_precision", CA_FLAG_VALUE, "fp8_config.override_linear_precision"},
    {"fp8_opt_level", CA_FLAG_VALUE, "fp8_config.optimization_level"},
    {"backend", CA_FLAG_VALUE, "backend"},
    {"timeout", CA_FLAG_VALUE, "timeout"},
    {"bucket_cap_mb", CA_FLAG_VALUE, "bucket_cap_mb"},
    {"flight_recorder_dir", CA_FLAG_VALUE, "flight_recorder_dir"},
    {"flight_recorder_entries", CA_FLAG_VALUE, "flight_recorder_entries"},
    {"comm_hook", CA_FLAG_VALUE, "comm_hook"},
    {"allow_unknown_keys", CA_FLAG_TRUE, "allow_unknown_keys"},
    {"even_batches", CA_FLAG_VALUE, "even_batches"},
    {"split_batches", CA_FLAG_VALUE, "split_batches"},
    {"dispatch_batches", CA_FLAG_VALUE, "dispatch_batches"},
    {"use_seedable_sampler", CA_FLAG_VALUE, "use_seedable_sampler"},
    {"data_seed", CA_FLAG_VALUE, "data_seed"},
    {"non_blocking", CA_FLAG_VALUE, "non_blocking"},
    {"project_dir", CA_FLAG_VALUE, "project_dir"},
    {"logging_dir", CA_FLAG_VALUE, "logging_dir"},
    {"log_with", CA_FLAG_VALUE, "log_with"},
    {"progress", CA_FLAG_VALUE, "progress"},
    {"automatic_checkpoint_naming", CA_FLAG_TRUE, "automatic_checkpoint_naming"},
    {"total_limit", CA_FLAG_VALUE, "total_limit"},
    {"async_save", CA_FLAG_TRUE, "async_save"},
    {"iteration", CA_FLAG_VALUE, "iteration"},
    {"deterministic", CA_FLAG_TRUE, "deterministic"},
    {"deterministic_shards", CA_FLAG_VALUE, "deterministic_shards"},
    {"profile", CA_FLAG_TRUE, "profiling"},
    {"output_trace_dir", CA_FLAG_VALUE, "output_trace_dir"},
    {"profile_activities", CA_FLAG_VALUE, "profile_activities"},
    {"profile_wait", CA_FLAG_VALUE, "profile_wait"},
    {"profile_warmup", CA_FLAG_VALUE, "profile_warmup"},
    {"profile_active", CA_FLAG_VALUE, "profile_active"},
    {"profile_repeat", CA_FLAG_VALUE, "profile_repeat"},
    {"profile_record_shapes", CA_FLAG_VALUE, "profile_record_shapes"},
    {"profile_memory", CA_FLAG_VALUE, "profile_memory"},
    {"profile_with_flops", CA_FLAG_VALUE, "profile_with_flops"},
    {"throughput_interval", CA_FLAG_VALUE, "throughput_interval"},
    {"peak_flops", CA_FLAG_VALUE, "peak_flops"},
};
const size_t ca_config_nflags = sizeof ca_config_flags / sizeof ca_config_flags[0];

/* ------------------------------------------------------------------ lookups */

/* Other spellings of keys, read as the key itself (the origin names the spelling): ParallelismConfig's
 * field names, which caccel read before Accelerate's files and launcher settled on the prefixed ones. */
static const struct { const char *alias, *key; } aliases[] = {
    {"parallelism_config.dp_replicate_size", "parallelism_config.parallelism_config_dp_replicate_size"},
    {"parallelism_config.dp_shard_size", "parallelism_config.parallelism_config_dp_shard_size"},
    {"parallelism_config.tp_size", "parallelism_config.parallelism_config_tp_size"},
    {"parallelism_config.cp_size", "parallelism_config.parallelism_config_cp_size"},
    {"parallelism_config.cp_backend", "parallelism_config.parallelism_config_cp_backend"},
    {"parallelism_config.cp_comm_strategy", "parallelism_config.parallelism_config_cp_comm_strategy"},
    {"parallelism_config.sp_size", "parallelism_config.parallelism_config_sp_size"},
    {"parallelism_config.sp_backend", "parallelism_config.parallelism_config_sp_backend"},
    {"parallelism_config.sp_seq_length", "parallelism_config.parallelism_config_sp_seq_length"},
    {"parallelism_config.sp_seq_length_is_variable", "parallelism_config.parallelism_config_sp_seq_length_is_variable"},
    {"parallelism_config.sp_attn_implementation", "parallelism_config.parallelism_config_sp_attn_implementation"},
};

static const ca_key_def *key_named(const char *name) {
    for (size_t i = 0; i < ca_config_nkeys; i++)
        if (strcmp(ca_config_keys[i].name, name) == 0) return &ca_config_keys[i];
    return NULL;
}

const ca_key_def *ca_config_key_find(const char *name) {
    if (!name) return NULL;
    const ca_key_def *d = key_named(name);
    for (size_t i = 0; !d && i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(aliases[i].alias, name) == 0) d = key_named(aliases[i].key);
    return d;
}

size_t ca_config_key_index(const ca_key_def *d) { return (size_t)(d - ca_config_keys); }

const ca_key_def *ca_config_section_of(const char *name) {
    const char *dot = name ? strchr(name, '.') : NULL;
    if (!dot || dot == name) return NULL;
    for (size_t i = 0; i < ca_config_nkeys; i++) {
        const ca_key_def *d = &ca_config_keys[i];
        if (d->type == CA_KT_MAP && strlen(d->name) == (size_t)(dot - name) &&
            strncmp(d->name, name, (size_t)(dot - name)) == 0)
            return d;
    }
    return NULL;
}

const ca_flag_def *ca_config_flag_find(const char *arg, const char **value) {
    if (value) *value = NULL;
    if (!arg || arg[0] != '-' || arg[1] != '-' || arg[2] == '\0') return NULL;
    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    char norm[96];
    if (len == 0 || len >= sizeof norm) return NULL;
    /* Accelerate accepts --num-processes as well as --num_processes. */
    for (size_t i = 0; i < len; i++) norm[i] = name[i] == '-' ? '_' : name[i];
    norm[len] = '\0';
    for (size_t i = 0; i < ca_config_nflags; i++) {
        if (strcmp(ca_config_flags[i].flag, norm) == 0) {
            if (value && eq) *value = eq + 1;
            return &ca_config_flags[i];
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ string map */

static size_t str_hash(const char *s) {
    size_t h = 1469598103934665603u;   /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}

static size_t strmap_slot(const ca_strmap *m, const char *key) {
    size_t i = str_hash(key) & (m->cap - 1);
    while (m->keys[i] && strcmp(m->keys[i], key) != 0) i = (i + 1) & (m->cap - 1);
    return i;
}

static ca_status strmap_grow(ca_strmap *m) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    ca_strmap bigger = {calloc(cap, sizeof *bigger.keys), calloc(cap, sizeof *bigger.vals), cap, 0};
    if (!bigger.keys || !bigger.vals) {
        ca_strmap_free(&bigger);
        return ca_error(CA_ERR_NOMEM, "out of memory in the configuration");
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = strmap_slot(&bigger, m->keys[i]);
        bigger.keys[j] = m->keys[i];
        bigger.vals[j] = m->vals[i];
        bigger.n++;
    }
    ca_strmap_free(m);
    *m = bigger;
    return CA_OK;
}

ca_status ca_strmap_put(ca_strmap *m, const char *key, size_t val) {
    if (2 * (m->n + 1) > m->cap) {
        ca_status s = strmap_grow(m);
        if (s != CA_OK) return s;
    }
    size_t i = strmap_slot(m, key);
    if (!m->keys[i]) m->n++;
    m->keys[i] = key;
    m->vals[i] = val;
    return CA_OK;
}

bool ca_strmap_get(const ca_strmap *m, const char *key, size_t *val) {
    if (!m->cap) return false;
    size_t i = strmap_slot(m, key);
    if (!m->keys[i]) return false;
    *val = m->vals[i];
    return true;
}

void ca_strmap_free(ca_strmap *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------ suggestions */

size_t ca_config_edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 64 || m > 64) return n > m ? n : m;
    size_t d[65][65];
    for (size_t i = 0; i <= n; i++) d[i][0] = i;
    for (size_t j = 0; j <= m; j++) d[0][j] = j;
    for (size_t i = 1; i <= n; i++) {
        for (size_t j = 1; j <= m; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            size_t cost = ca == cb ? 0 : 1;
            size_t best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < best) best = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;   /* transposition */
            d[i][j] = best;
        }
    }
    return d[n][m];
}

const char *ca_config_closest_key(const char *name, const ca_key_def *section) {
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    size_t plen = section ? strlen(section->name) : 0;
    for (size_t i = 0; i < ca_config_nkeys; i++) {
        const ca_key_def *d = &ca_config_keys[i];
        const char *cand;
        if (section) {
            if (strncmp(d->name, section->name, plen) != 0 || d->name[plen] != '.') continue;
            cand = d->name + plen + 1;
        } else {
            if (strchr(d->name, '.') || (d->flags & CA_KF_LEGACY)) continue;
            cand = d->name;
        }
        size_t dist = ca_config_edit_distance(name, cand);
        if (dist < best_d) { best_d = dist; best = cand; }
    }
    /* A far key is no suggestion ('invalid_key' is not 'image_uri'). */
    size_t len = strlen(name), limit = len / 3 > 2 ? len / 3 : 2;
    return best_d <= limit ? best : NULL;
}

/* ------------------------------------------------------------------ values */

bool ca_config_is_null_text(const char *s) {
    return !s || !*s || strcmp(s, "null") == 0 || strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0 ||
           strcmp(s, "~") == 0;
}

bool ca_config_parse_bool(const char *s, bool *out) {
    static const char *const yes[] = {"true", "yes", "on", "y", "t", "1"};
    static const char *const no[] = {"false", "no", "off", "n", "f", "0"};
    if (!s) return false;
    for (size_t i = 0; i < 6; i++) {
        if (strcasecmp(s, yes[i]) == 0) { *out = true; return true; }
        if (strcasecmp(s, no[i]) == 0) { *out = false; return true; }
    }
    return false;
}

bool ca_config_parse_int(const char *s, int64_t *out) {
    if (!s || !*s) return false;
    while (isspace((unsigned char)*s)) s++;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno == ERANGE) return false;
    while (isspace((unsigned char)*end)) end++;
    if (*end) return false;
    *out = (int64_t)v;
    return true;
}

bool ca_config_parse_double(const char *s, double *out) {
    if (!s || !*s) return false;
    while (isspace((unsigned char)*s)) s++;
    /* Only decimal notation: strtod would also take "nan", "inf" and hex. */
    for (const char *p = s; *p; p++)
        if (!(isdigit((unsigned char)*p) || strchr("+-.eE \t", *p))) return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno == ERANGE || !isfinite(v)) return false;
    while (isspace((unsigned char)*end)) end++;
    if (*end) return false;
    *out = v;
    return true;
}

static void append(char *buf, size_t size, size_t *len, const char *s) {
    if (*len >= size) return;
    int n = snprintf(buf + *len, size - *len, "%s", s);
    if (n > 0) *len += (size_t)n;
    if (*len >= size) *len = size - 1;
}

void ca_config_describe_allowed(const ca_key_def *d, char *buf, size_t size) {
    size_t len = 0;
    char tmp[128];
    buf[0] = '\0';
    switch (d->type) {
    case CA_KT_BOOL:
        append(buf, size, &len, "true, false, yes, no, on, off, 1, 0");
        break;
    case CA_KT_INT:
        if (d->min <= d->max) {
            if (d->max >= BIG)
                snprintf(tmp, sizeof tmp, "an integer >= %.0f", d->min);
            else
                snprintf(tmp, sizeof tmp, "an integer from %.0f to %.0f", d->min, d->max);
            append(buf, size, &len, tmp);
        } else {
            append(buf, size, &len, "an integer");
        }
        if (strcmp(d->name, "num_processes") == 0) append(buf, size, &len, " other than 0 (-1: not given)");
        if (d->flags & CA_KF_RANGE) append(buf, size, &len, ", or MIN:MAX (two of those, MIN <= MAX)");
        break;
    case CA_KT_FLOAT:
        if (d->min <= d->max) {
            if (d->max < BIG)
                snprintf(tmp, sizeof tmp, "a number from %g to %g", d->min, d->max);
            else
                snprintf(tmp, sizeof tmp, "a number >= %g", d->min);
            append(buf, size, &len, tmp);
        } else {
            append(buf, size, &len, "a number");
        }
        break;
    case CA_KT_STRING: append(buf, size, &len, "any text"); break;
    case CA_KT_LIST: append(buf, size, &len, "a list, or one text"); break;
    case CA_KT_MAP: append(buf, size, &len, "a mapping of sub-keys, or null"); break;
    case CA_KT_ENUM:
        for (size_t i = 0; d->allowed[i]; i++) {
            if (i) append(buf, size, &len, ", ");
            append(buf, size, &len, d->allowed[i]);
        }
        break;
    }
}
