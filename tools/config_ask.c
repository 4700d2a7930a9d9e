/* `caccel config`: Accelerate's questionnaire (`accelerate config`), in its order, for a terminal.
 * Every answer goes through the configuration's own checks, so a bad answer is refused with
 * the message a bad value in a file gets, and asked again. */
#include "tools/cli_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ORIGIN "your answer"

typedef struct ask {
    ca_config *cfg;   /* the answers so far, checked as a file's values are */
    ca_cli_doc *doc;  /* what will be written */
    bool dry;         /* answers are checked, not recorded */
    bool eof;
} ask;

/* ------------------------------------------------------------------ asking */

/* Prints `prompt` and reads one line, trimmed; false when the input ended. */
static bool read_answer(ask *a, const char *prompt, char *buf, size_t n) {
    fputs(prompt, stdout);
    fflush(stdout);
    if (!fgets(buf, (int)n, stdin)) {
        a->eof = true;
        putchar('\n');
        return false;
    }
    size_t len = strlen(buf);
    while (len && strchr(" \t\r\n", buf[len - 1])) buf[--len] = '\0';
    size_t lead = strspn(buf, " \t");
    memmove(buf, buf + lead, len - lead + 1);
    return true;
}

/* True when the configuration accepts `value` for `key`; otherwise prints
 * the configuration's message. */
static bool check(ask *a, const char *key, const char *value) {
    if (ca_config_set(a->cfg, key, value, CA_SRC_CLI, ORIGIN) == CA_OK) return true;
    printf("  %s\n", ca_last_error());
    if (ca_last_hint()[0]) printf("  hint: %s\n", ca_last_hint());
    ca_clear_error();
    return false;
}

/* Checks `value` and, unless the caller writes its own form (dry), records
 * it: a number or boolean as the loader reads it ("010" is 10 for caccel but
 * 8 for a YAML 1.1 reader, so "10" is written). */
static bool accept(ask *a, const char *key, const char *value, bool plain) {
    if (!check(a, key, value)) return false;
    if (!a->dry) ca_cli_doc_put(a->doc, key, plain ? ca_config_get(a->cfg, key) : value, plain);
    return true;
}

/* Sets a value the questionnaire decides without asking. */
static void decide(ask *a, const char *key, const char *value, bool plain) {
    if (!accept(a, key, value, plain)) a->eof = true;
}

/* A numbered menu; `def` is the default. Returns the index, or -1 when the input ended. */
static int choose(ask *a, const char *question, const char *const *opts, int def) {
    int n = 0;
    printf("%s\n", question);
    for (; opts[n]; n++) printf("  %s %d) %s\n", n == def ? "*" : " ", n, opts[n]);
    char prompt[64], buf[256];
    snprintf(prompt, sizeof prompt, "Enter a number from 0 to %d [%d]: ", n - 1, def);
    while (read_answer(a, prompt, buf, sizeof buf)) {
        if (!buf[0]) return def;
        char *end;
        long v = strtol(buf, &end, 10);
        if (*end == '\0' && v >= 0 && v < n) return (int)v;
        printf("  Please enter a number from 0 to %d.\n", n - 1);
    }
    return -1;
}

/* A menu whose choice is the value of `key`; the value is written as `values[i]`. */
static int choose_value(ask *a, const char *question, const char *key, const char *const *opts,
                        const char *const *values, int def, bool plain) {
    int i = choose(a, question, opts, def);
    if (i >= 0 && !accept(a, key, values ? values[i] : opts[i], plain)) a->eof = true;
    return i;
}

/* The configuration's rule for a boolean (yes, no, true, false, on, off, ...). */
static bool parse_yes_no(const char *v, bool *out) {
    ca_config *s = NULL;
    bool ok = ca_config_create(&s) == CA_OK && ca_config_set(s, "debug", v, CA_SRC_CLI, ORIGIN) == CA_OK &&
              ca_config_get_bool(s, "debug", out) == CA_OK;
    ca_config_destroy(s);
    ca_clear_error();
    return ok;
}

/* A yes/no question for `key` (NULL: an answer that only steers the
 * questionnaire). The key's own check speaks first, naming the key; the
 * answer must also be a boolean (some keys, fsdp_reshard_after_forward,
 * take text), and is written as true or false. */
static bool yes_no(ask *a, const char *question, const char *key, bool def) {
    char buf[256];
    while (read_answer(a, question, buf, sizeof buf)) {
        const char *v = buf[0] ? buf : def ? "true" : "false";
        bool b = false;
        if (key && !check(a, key, v)) continue;
        if (!parse_yes_no(v, &b)) {
            printf("  Please enter yes or no.\n");
            continue;
        }
        if (key && !accept(a, key, b ? "true" : "false", true)) a->eof = true;
        return b;
    }
    return def;
}

/* A free answer for `key`; `def` (may be NULL: an answer is required) when
 * the line is empty. The accepted text goes to out (may be NULL). */
static bool field(ask *a, const char *question, const char *key, const char *def, bool plain, char *out,
                  size_t n) {
    char buf[1024];
    while (read_answer(a, question, buf, sizeof buf)) {
        const char *v = buf[0] ? buf : def;
        if (!v) {
            printf("  Please enter a value.\n");
            continue;
        }
        if (!accept(a, key, v, plain)) continue;
        if (out) snprintf(out, n, "%s", v);
        return true;
    }
    return false;
}

static int64_t get_int(const ask *a, const char *key) {
    int64_t v = 0;
    ca_config_get_int(a->cfg, key, &v);
    return v;
}

static bool is(const char *a, const char *b) { return strcmp(a, b) == 0; }

/* ------------------------------------------------------------------ the sections */

/* Accelerate's machine types, in its order, and the distributed_type each gives. */
static const char *const machine_opts[] = {"No distributed training", "multi-CPU", "multi-XPU", "multi-HPU",
                                           "multi-GPU", "multi-NPU", "multi-MLU", "multi-SDAA", "multi-MUSA",
                                           "multi-NEURON", "TPU", NULL};
static const char *const machine_dist[] = {"NO", "MULTI_CPU", "MULTI_XPU", "MULTI_HPU", "MULTI_GPU", "MULTI_NPU",
                                           "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_NEURON", "XLA", NULL};

static bool is_multi(const char *d) { return strncmp(d, "MULTI_", 6) == 0; }
static bool is_multi_device(const char *d) { return is_multi(d) && !is(d, "MULTI_CPU"); }

static void ask_machines(ask *a) {
    if (!field(a, "How many different machines will you use (use more than 1 for multi-node training)? [1]: ",
               "num_machines", "1", true, NULL, 0))
        return;
    int64_t nm = get_int(a, "num_machines");
    if (nm > 1) {
        char q[160], buf[64];
        snprintf(q, sizeof q, "What is the rank of this machine? (0 to %lld) [0]: ", (long long)nm - 1);
        for (;;) {
            if (!field(a, q, "machine_rank", "0", true, buf, sizeof buf)) return;
            if (get_int(a, "machine_rank") < nm) break;
            printf("  machine_rank %s (%s) must be less than num_machines %lld (%s)\n", buf, ORIGIN, (long long)nm,
                   ORIGIN);
        }
        if (!field(a, "What is the IP address of the machine that will host the main process? ", "main_process_ip",
                   NULL, false, NULL, 0) ||
            !field(a, "What is the port you will use to communicate with the main process? ", "main_process_port",
                   NULL, true, NULL, 0))
            return;
        if (!yes_no(a, "Are all the machines on the same local network? Answer `no` if nodes are on the cloud "
                       "and/or on different network hosts [YES/no]: ", "same_network", true) && !a->eof)
            field(a, "What rendezvous backend will you use? ('static', 'c10d', ...): ", "rdzv_backend", "static",
                  false, NULL, 0);
    }
    if (a->eof) return;
    yes_no(a, "Should distributed operations be checked while running for errors? This can avoid timeout issues "
              "but will be slower. [yes/NO]: ", "debug", false);
}

static void ask_mpirun(ask *a) {
    if (!yes_no(a, "Do you want accelerate to launch mpirun? [yes/NO]: ", NULL, false) || a->eof) return;
    char path[1024];
    a->dry = true;   /* the expanded path is written, not the answer */
    bool ok = field(a, "Please enter the path to the hostfile to use with mpirun [~/hostfile]: ",
                    "mpirun_config.mpirun_hostfile", "~/hostfile", false, path, sizeof path);
    a->dry = false;
    if (!ok) return;
    const char *home = getenv("HOME");
    char full[1100];
    if (path[0] == '~' && (path[1] == '/' || !path[1]) && home)
        snprintf(full, sizeof full, "%s%s", home, path + 1);
    else
        snprintf(full, sizeof full, "%s", path);
    decide(a, "mpirun_config.mpirun_hostfile", full, false);
}

static const char *const dynamo_opts[] = {"eager", "aot_eager", "inductor", "aot_ts_nvfuser", "nvprims_nvfuser",
                                          "cudagraphs", "ofi", "fx2trt", "onnxrt", "tensorrt",
                                          "aot_torchxla_trace_once", "torchxla_trace_once", "tvm", NULL};
static const char *const dynamo_vals[] = {"EAGER", "AOT_EAGER", "INDUCTOR", "AOT_TS_NVFUSER", "NVPRIMS_NVFUSER",
                                          "CUDAGRAPHS", "OFI", "FX2TRT", "ONNXRT", "TENSORRT",
                                          "AOT_TORCHXLA_TRACE_ONCE", "TORCHXLA_TRACE_ONCE", "TVM", NULL};
static const char *const dynamo_modes[] = {"default", "reduce-overhead", "max-autotune", NULL};

static void ask_dynamo(ask *a) {
    if (!yes_no(a, "Do you wish to optimize your script with torch dynamo?[yes/NO]:", NULL, false) || a->eof) return;
    if (choose_value(a, "Which dynamo backend would you like to use?", "dynamo_config.dynamo_backend", dynamo_opts,
                     dynamo_vals, 2, false) < 0)
        return;
    if (!yes_no(a, "Do you want to customize the defaults sent to torch.compile? [yes/NO]: ", NULL, false) || a->eof)
        return;
    if (choose_value(a, "Which mode do you want to use?", "dynamo_config.dynamo_mode", dynamo_modes, NULL, 0,
                     false) < 0)
        return;
    yes_no(a, "Do you want the fullgraph mode or it is ok to break model into several subgraphs? [yes/NO]: ",
           "dynamo_config.dynamo_use_fullgraph", false);
    if (!a->eof)
        yes_no(a, "Do you want to enable dynamic shape tracing? [yes/NO]: ", "dynamo_config.dynamo_use_dynamic",
               false);
    if (!a->eof)
        yes_no(a, "Do you want to enable regional compilation? [yes/NO]: ",
               "dynamo_config.dynamo_use_regional_compilation", false);
}

static const char *const offload_opts[] = {"none", "cpu", "nvme", NULL};

static void ask_zero_offload(ask *a) {
    int opt = choose_value(a, "Where to offload optimizer states?", "deepspeed_config.offload_optimizer_device",
                           offload_opts, NULL, 0, false);
    if (opt < 0) return;
    int par = choose_value(a, "Where to offload parameters?", "deepspeed_config.offload_param_device", offload_opts,
                           NULL, 0, false);
    if (par < 0) return;
    if (par == 2 && !field(a, "Nvme Path to offload parameters?", "deepspeed_config.offload_param_nvme_path",
                           "/nvme", false, NULL, 0))
        return;
    if (opt == 2)
        field(a, "Nvme Path to offload optimizer states?", "deepspeed_config.offload_optimizer_nvme_path", "/nvme",
              false, NULL, 0);
}

/* ZeRO's own settings, when no DeepSpeed JSON file holds them. */
static void ask_zero(ask *a) {
    static const char *const stages[] = {"0", "1", "2", "3", NULL};
    int stage = choose_value(a, "What should be your DeepSpeed's ZeRO optimization stage?",
                             "deepspeed_config.zero_stage", stages, NULL, 2, true);
    if (stage < 0) return;
    if (stage >= 2) ask_zero_offload(a);
    if (a->eof || !field(a, "How many gradient accumulation steps you're passing in your script? [1]: ",
                         "deepspeed_config.gradient_accumulation_steps", "1", true, NULL, 0))
        return;
    if (yes_no(a, "Do you want to use gradient clipping? [yes/NO]: ", NULL, false) && !a->eof &&
        !field(a, "What is the gradient clipping value? [1.0]: ", "deepspeed_config.gradient_clipping", "1.0", true,
               NULL, 0))
        return;
    if (stage == 3 && !a->eof)
        yes_no(a, "Do you want to save 16-bit model weights when using ZeRO Stage-3? [yes/NO]: ",
               "deepspeed_config.zero3_save_16bit_model", false);
}

static void ask_deepspeed_multinode(ask *a) {
    static const char *const launchers[] = {"pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm",
                                            NULL};
    int l = choose_value(a, "Which Type of launcher do you want to use?",
                         "deepspeed_config.deepspeed_multinode_launcher", launchers, NULL, 0, false);
    if (l < 0 || l == 1) return;
    if (!field(a, "DeepSpeed configures multi-node compute resources with hostfile. Each row is of the format "
                  "`hostname slots=[num_gpus]`, e.g., `localhost slots=2`. Please specify the location of hostfile: ",
               "deepspeed_config.deepspeed_hostfile", NULL, false, NULL, 0))
        return;
    if (yes_no(a, "Do you want to specify exclusion filter string? [yes/NO]: ", NULL, false) && !a->eof &&
        !field(a, "DeepSpeed exclusion filter string: ", "deepspeed_config.deepspeed_exclusion_filter", NULL, false,
               NULL, 0))
        return;
    if (!a->eof && yes_no(a, "Do you want to specify inclusion filter string? [yes/NO]: ", NULL, false) && !a->eof)
        field(a, "DeepSpeed inclusion filter string: ", "deepspeed_config.deepspeed_inclusion_filter", NULL, false,
              NULL, 0);
}

/* Megatron-LM's degrees and options (multi-GPU only). */
static void ask_megatron(ask *a) {
    const char *tp = "megatron_lm_config.megatron_lm_tp_degree", *pp = "megatron_lm_config.megatron_lm_pp_degree";
    if (!field(a, "What is the Tensor Parallelism degree/size? [1]:", tp, "1", true, NULL, 0)) return;
    if (get_int(a, tp) > 1)
        yes_no(a, "Do you want to enable Sequence Parallelism? [YES/no]: ",
               "megatron_lm_config.megatron_lm_sequence_parallelism", true);
    if (a->eof || !field(a, "What is the Pipeline Parallelism degree/size? [1]:", pp, "1", true, NULL, 0)) return;
    if (get_int(a, pp) > 1 && !field(a, "What is the number of micro-batches? [1]:",
                                     "megatron_lm_config.megatron_lm_num_micro_batches", "1", true, NULL, 0))
        return;
    yes_no(a, "Do you want to enable selective activation recomputation? [YES/no]: ",
           "megatron_lm_config.megatron_lm_recompute_activations", true);
    if (!a->eof)
        yes_no(a, "Do you want to use distributed optimizer which shards optimizer state and gradients across data "
                  "parallel ranks? [YES/no]: ", "megatron_lm_config.megatron_lm_use_distributed_optimizer", true);
    if (!a->eof)
        field(a, "What is the gradient clipping value based on global L2 Norm (0 to disable)? [1.0]: ",
              "megatron_lm_config.megatron_lm_gradient_clipping", "1.0", true, NULL, 0);
}

/* Returns true when a DeepSpeed JSON file was given (mixed precision is then its business). */
static bool ask_deepspeed(ask *a) {
    bool json = yes_no(a, "Do you want to specify a json file to a DeepSpeed config? [yes/NO]: ", NULL, false);
    if (a->eof) return false;
    if (json) {
        if (!field(a, "Please enter the path to the json DeepSpeed config file: ",
                   "deepspeed_config.deepspeed_config_file", "none", false, NULL, 0))
            return json;
    } else {
        ask_zero(a);
    }
    if (a->eof) return json;
    yes_no(a, "Do you want to enable `deepspeed.zero.Init` when using ZeRO Stage-3 for constructing massive "
              "models? [yes/NO]: ", "deepspeed_config.zero3_init_flag", false);
    if (!a->eof && yes_no(a, "Do you want to enable Mixture-of-Experts training (MoE)? [yes/NO]: ", NULL, false) &&
        !a->eof &&
        !field(a, "Specify the comma-separated list of transformers MoE layer class names (case-sensitive), e.g : "
                  " `MixtralSparseMoeBlock`, `Qwen2MoeSparseMoeBlock`, `JetMoEAttention,JetMoEBlock` ... : ",
               "deepspeed_config.deepspeed_moe_layer_cls_names", NULL, false, NULL, 0))
        return json;
    if (!a->eof && get_int(a, "num_machines") > 1) ask_deepspeed_multinode(a);
    return json;
}

static const char *const sharding_opts[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                            "HYBRID_SHARD_ZERO2", NULL};
static const char *const wrap_opts[] = {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP", NULL};
static const char *const prefetch_opts[] = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH", NULL};
static const char *const state_dict_v1[] = {"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT", NULL};
static const char *const state_dict_v2[] = {"SHARDED_STATE_DICT", "FULL_STATE_DICT", NULL};

/* FSDP1 names its sharding strategy in fsdp_reshard_after_forward, as
 * Accelerate writes it; the strategy is checked as fsdp_sharding_strategy. */
static bool ask_sharding(ask *a, int version) {
    if (version == 2) {
        yes_no(a, "Do you want to enable resharding after forward? [YES/no]: ",
               "fsdp_config.fsdp_reshard_after_forward", true);
        return !a->eof;
    }
    int s = choose(a, "What should be your sharding strategy?", sharding_opts, 0);
    if (s < 0) return false;
    if (!check(a, "fsdp_config.fsdp_sharding_strategy", sharding_opts[s])) a->eof = true;
    decide(a, "fsdp_config.fsdp_reshard_after_forward", sharding_opts[s], false);
    return !a->eof;
}

static bool ask_wrap(ask *a) {
    int w = choose_value(a, "What should be your auto wrap policy?", "fsdp_config.fsdp_auto_wrap_policy", wrap_opts,
                         NULL, 0, false);
    if (w == 0) {
        bool no_split = yes_no(a, "Do you want to use the model's `_no_split_modules` to wrap. Only applicable for "
                                  "Transformers [yes/NO]: ", NULL, false);
        if (!no_split && !a->eof)
            field(a, "Specify the comma-separated list of transformer layer class names (case-sensitive) to wrap "
                     ",e.g, :`BertLayer`, `GPTJBlock`, `T5Block`, `BertLayer,BertEmbeddings,BertSelfOutput` ...? : ",
                  "fsdp_config.fsdp_transformer_layer_cls_to_wrap", NULL, false, NULL, 0);
    } else if (w == 1) {
        field(a, "What should be your FSDP's minimum number of parameters for Default Auto Wrapping Policy? [1e8]: ",
              "fsdp_config.fsdp_min_num_params", "100000000", true, NULL, 0);
    }
    return w >= 0 && !a->eof;
}

static void ask_fsdp_tail(ask *a, int version) {
    if (version == 1) {
        yes_no(a, "Do you want to enable FSDP's forward prefetch policy? [yes/NO]: ",
               "fsdp_config.fsdp_forward_prefetch", false);
        if (!a->eof)
            yes_no(a, "Do you want to enable FSDP's `use_orig_params` feature? [YES/no]: ",
                   "fsdp_config.fsdp_use_orig_params", true);
    }
    if (a->eof) return;
    bool ram = yes_no(a, "Do you want to enable CPU RAM efficient model loading? Only applicable for Transformers "
                         "models. [YES/no]: ", "fsdp_config.fsdp_cpu_ram_efficient_loading", true);
    if (a->eof) return;
    if (version == 1 && ram)
        decide(a, "fsdp_config.fsdp_sync_module_states", "true", true);
    else if (version == 1)
        yes_no(a, "Do you want each individually wrapped FSDP unit to broadcast module parameters from rank 0 at "
                  "the start? [YES/no]: ", "fsdp_config.fsdp_sync_module_states", true);
    if (!a->eof)
        yes_no(a, "Do you want to enable FSDP activation checkpointing? [yes/NO]: ",
               "fsdp_config.fsdp_activation_checkpointing", false);
}

static void ask_fsdp(ask *a) {
    static const char *const versions[] = {"1", "2", NULL};
    int v = choose_value(a, "What should be your FSDP version? [2]: ", "fsdp_config.fsdp_version", versions, NULL, 1,
                         true);
    if (v < 0) return;
    int version = v + 1;
    if (!ask_sharding(a, version)) return;
    if (!yes_no(a, "Do you want to offload parameters and gradients to CPU? [yes/NO]: ",
                "fsdp_config.fsdp_offload_params", false) && a->eof)
        return;
    if (!ask_wrap(a)) return;
    if (version == 1 && choose_value(a, "What should be your FSDP's backward prefetch policy?",
                                     "fsdp_config.fsdp_backward_prefetch", prefetch_opts, NULL, 0, false) < 0)
        return;
    if (choose_value(a, "What should be your FSDP's state dict type?", "fsdp_config.fsdp_state_dict_type",
                     version == 1 ? state_dict_v1 : state_dict_v2, NULL, 0, false) < 0)
        return;
    ask_fsdp_tail(a, version);
}

/* The number of processes, re-asked while it contradicts the machines. */
static void ask_processes(ask *a, const char *dist) {
    char q[160];
    /* Accelerate's words: the type without MULTI_, "(s)" added ("XLA(s)", "GPU(s)") */
    const char *what = is(dist, "MULTI_CPU") ? "processes" : is(dist, "MULTI_NEURON") ? "NEURON cores" : NULL;
    char unit[32];
    if (!what) {
        snprintf(unit, sizeof unit, "%s(s)", is_multi(dist) ? dist + 6 : dist);
        what = unit;
    }
    snprintf(q, sizeof q, "How many %s should be used for distributed training? [1]:", what);
    int64_t nm = get_int(a, "num_machines");
    while (field(a, q, "num_processes", "1", true, NULL, 0)) {
        int64_t np = get_int(a, "num_processes");
        if (np < nm)
            printf("  num_processes %lld (%s) is the total over all machines and cannot be less than num_machines "
                   "%lld (%s)\n", (long long)np, ORIGIN, (long long)nm, ORIGIN);
        else if (is(dist, "MULTI_GPU") && nm == 1 && np == 1)
            printf("  distributed_type MULTI_GPU with 1 process on 1 machine: answer more than 1, or choose `No "
                   "distributed training` for the type of machine\n");
        else
            return;
    }
}

static const char *const fp8_opts[] = {"ao", "te", "msamp", NULL};
static const char *const fp8_vals[] = {"AO", "TE", "MSAMP", NULL};

/* Transformer Engine's recipe. */
static void ask_te(ask *a) {
    static const char *const formats[] = {"HYBRID", "E4M3", "E5M2", NULL};
    static const char *const algos[] = {"max", "most_recent", NULL};
    yes_no(a, "Do you want to use FP8 autocast during eval mode? Generally better metrics are found when this is "
              "disabled [yes/NO]: ", "fp8_config.use_autocast_during_eval", false);
    if (a->eof || !field(a, "What margin should be used for gradient scaling? [0]: ", "fp8_config.margin", "0", true,
                         NULL, 0) ||
        !field(a, "What interval should be used for how often the scaling factor is recomputed? [1]: ",
               "fp8_config.interval", "1", true, NULL, 0) ||
        choose_value(a, "Which weight format should be used?", "fp8_config.fp8_format", formats, NULL, 0, false) < 0 ||
        !field(a, "What length of history should be used for the amax scaling factor computation? [1024]: ",
               "fp8_config.amax_history_length", "1024", true, NULL, 0) ||
        choose_value(a, "Which algorithm should be used for the amax scaling factor computation?",
                     "fp8_config.amax_compute_algorithm", algos, NULL, 0, false) < 0)
        return;
    bool g[3] = {false, false, false};
    static const char *const gemm[] = {"fprop", "dgrad", "wgrad"};
    if (yes_no(a, "Do you want to execute `fprop`, `dgrad`, and `wgrad` GEMMS in higher precision? [yes/NO]: ", NULL,
               false))
        for (int i = 0; i < 3 && !a->eof; i++) {
            char q[96];
            snprintf(q, sizeof q, "Should `%s` be executed in higher precision? [yes/NO]: ", gemm[i]);
            g[i] = yes_no(a, q, NULL, false);
        }
    if (a->eof) return;
    /* the loader's text for Accelerate's (fprop, dgrad, wgrad) tuple */
    char v[64];
    snprintf(v, sizeof v, "(%s, %s, %s)", g[0] ? "true" : "false", g[1] ? "true" : "false", g[2] ? "true" : "false");
    decide(a, "fp8_config.override_linear_precision", v, false);
}

static void ask_precision(ask *a) {
    static const char *const mp[] = {"no", "fp16", "bf16", "fp8", NULL};
    int m = choose_value(a, "Do you wish to use mixed precision?", "mixed_precision", mp, NULL, 0, false);
    if (m != 3) return;
    int b = choose_value(a, "Which FP8 backend do you want to use?", "fp8_config.backend", fp8_opts, fp8_vals, 0,
                         false);
    if (b == 1) {
        ask_te(a);
    } else if (b == 2) {
        static const char *const levels[] = {"O1", "O2", NULL};
        choose_value(a, "Which optimization level should be used?", "fp8_config.optimization_level", levels, NULL, 1,
                     false);
    } else if (b == 0) {
        yes_no(a, "Do you want to enable FSDP2 float8 all gather? This is recommended for better performance if "
                  "using FSDP2. [YES/no]: ", "fp8_config.enable_fsdp_float8_all_gather", true);
        if (!a->eof)
            yes_no(a, "Do you want to pad the inner dimension of weight matrices before float8 matmuls? [YES/no]: ",
                   "fp8_config.pad_inner_dim", true);
    }
}

/* A list as Accelerate's YAML and JSON both read it: ["a", "b"]. */
typedef struct listbuf {
    char text[1024];
    size_t len;
    bool full;
} listbuf;

static void list_add(listbuf *l, const char *item) {
    char esc[1024];
    size_t e = 0;
    for (const char *c = item; *c && e + 2 < sizeof esc; c++) {
        if (*c == '"' || *c == '\\') esc[e++] = '\\';
        esc[e++] = *c;
    }
    esc[e] = '\0';
    size_t room = sizeof l->text - l->len - 1;   /* one byte kept for the closing bracket */
    int w = snprintf(l->text + l->len, room, "%s\"%s\"", l->len ? ", " : "[", esc);
    if (w < 0 || (size_t)w >= room) l->full = true;
    else l->len += (size_t)w;
}

/* Writes the list for `key` once each item passed the key's check. */
static void list_put(ask *a, const char *key, listbuf *l) {
    if (l->full) {
        printf("  too long a list for %s; it is left out\n", key);
        return;
    }
    snprintf(l->text + l->len, sizeof l->text - l->len, "%s]", l->len ? "" : "[");
    ca_cli_doc_put(a->doc, key, l->text, true);
}

/* The commands a TPU pod runs at startup: a script, or commands one by one. */
static void ask_tpu_commands(ask *a) {
    if (!yes_no(a, "Do you have code you wish to run on startup in each pod? [yes/NO]: ", NULL, false) || a->eof)
        return;
    if (yes_no(a, "Is this code located in a bash script? [yes/NO]: ", NULL, false)) {
        if (!a->eof) field(a, "What is the path to your bash script? ", "command_file", NULL, false, NULL, 0);
        return;
    }
    printf("Please enter each command separately you wish to run on startup in each pod.\n");
    listbuf l = {.len = 0};
    char one[512];
    do {
        if (!read_answer(a, "Please enter a single command to be ran ", one, sizeof one)) return;
        if (check(a, "commands", one)) list_add(&l, one);
    } while (yes_no(a, "Do you wish to add another command? [yes/NO]: ", NULL, false) && !a->eof);
    if (!a->eof) list_put(a, "commands", &l);
}

/* A comma-separated list for `key`; an empty answer leaves the key out. */
static void ask_list(ask *a, const char *question, const char *key) {
    char buf[1024], item[1024];
    if (!read_answer(a, question, buf, sizeof buf) || !buf[0]) return;
    listbuf l = {.len = 0};
    for (const char *p = buf; *p; p += *p == ',') {
        size_t n = strcspn(p, ",");
        snprintf(item, sizeof item, "%.*s", (int)n, p);
        p += n;
        if (!check(a, key, item)) return;
        list_add(&l, item);
    }
    list_put(a, key, &l);
}

static void ask_tpu(ask *a) {
    decide(a, "mixed_precision", "no", false);
    if (a->eof || !field(a, "What is the name of the function in your script that should be launched in all "
                            "parallel scripts? [main]: ", "main_training_function", "main", false, NULL, 0))
        return;
    if (!yes_no(a, "Are you using a TPU cluster? [yes/NO]: ", "tpu_use_cluster", false) || a->eof) return;
    if (!field(a, "What is the name of your TPU cluster? ", "tpu_name", NULL, false, NULL, 0) ||
        !field(a, "What is the zone of your TPU cluster? ", "tpu_zone", NULL, false, NULL, 0))
        return;
    yes_no(a, "To run a python script in a TPU pod, should `sudo` be used? [yes/NO]: ", "tpu_use_sudo", false);
    if (!a->eof) ask_tpu_commands(a);
    if (!a->eof)
        ask_list(a, "If not using an instance group, what are the names of the Compute VM instances to be used, "
                    "separated by a comma: ", "tpu_vm");
    if (!a->eof) ask_list(a, "What environment variables do you wish to set in each pod, separated by a comma: ",
                          "tpu_env");
}

/* ------------------------------------------------------------------ the order of cluster.py */

/* The devices this machine offers: gpu ids, NUMA affinity. */
static void ask_devices(ask *a, const char *dist, bool use_cpu) {
    if (!use_cpu && (is_multi_device(dist) || is(dist, "NO")) &&
        !field(a, "What GPU(s) (by id) should be used for training on this machine as a comma-separated list? "
                  "[all]:", "gpu_ids", "all", false, NULL, 0))
        return;
    if (!use_cpu && (is(dist, "NO") || is(dist, "MULTI_GPU")))
        yes_no(a, "Would you like to enable numa efficiency? (Currently only supported on NVIDIA hardware). "
                  "[yes/NO]: ", "enable_cpu_affinity", false);
}

/* Which plugin, if any: may turn `dist` into DEEPSPEED, FSDP or MEGATRON_LM. */
static bool ask_plugins(ask *a, char *dist, size_t n) {
    bool ds_json = false;
    if (is_multi_device(dist) || is(dist, "NO")) {
        if (yes_no(a, "Do you want to use DeepSpeed? [yes/NO]: ", NULL, false) && !a->eof) {
            if (is(dist, "MULTI_NEURON")) {
                printf("  DeepSpeed is not supported on Neuron devices: not using it\n");
            } else {
                snprintf(dist, n, "DEEPSPEED");
                decide(a, "distributed_type", dist, false);
                if (!a->eof) ds_json = ask_deepspeed(a);
            }
        }
    }
    if (!a->eof && is_multi_device(dist)) {
        if (yes_no(a, "Do you want to use FullyShardedDataParallel? [yes/NO]: ", NULL, false) && !a->eof) {
            if (is(dist, "MULTI_NEURON")) {
                printf("  FSDP is not supported on Neuron devices: not using it\n");
            } else {
                snprintf(dist, n, "FSDP");
                decide(a, "distributed_type", dist, false);
                if (!a->eof) ask_fsdp(a);
            }
        }
    }
    if (!a->eof && is(dist, "MULTI_GPU") &&
        yes_no(a, "Do you want to use Megatron-LM ? [yes/NO]: ", NULL, false) && !a->eof) {
        snprintf(dist, n, "MEGATRON_LM");
        decide(a, "distributed_type", dist, false);
        if (!a->eof) ask_megatron(a);
    }
    return ds_json;
}

static void questionnaire(ask *a) {
    static const char *const envs[] = {"This machine", "AWS (Amazon SageMaker)", NULL};
    int e = choose(a, "In which compute environment are you running?", envs, 0);
    if (e < 0) return;
    if (e == 1) {
        fprintf(stderr, "caccel config: error: Amazon SageMaker is not supported: caccel runs on this machine "
                        "(compute_environment LOCAL_MACHINE)\n  hint: answer `This machine`; SageMaker's keys are "
                        "listed in docs/CONFIGURATION.md\n");
        a->eof = true;
        return;
    }
    decide(a, "compute_environment", "LOCAL_MACHINE", false);
    int m = choose(a, "Which type of machine are you using?", machine_opts, 0);
    if (m < 0) return;
    char dist[32];
    snprintf(dist, sizeof dist, "%s", machine_dist[m]);
    decide(a, "distributed_type", dist, false);
    if (!a->eof && is_multi(dist)) ask_machines(a);
    bool use_cpu = is(dist, "MULTI_CPU");
    if (!a->eof && is(dist, "NO"))
        use_cpu = yes_no(a, "Do you want to run your training on CPU only (even if a GPU / Apple Silicon / Ascend "
                            "NPU device is available)? [yes/NO]:", "use_cpu", false);
    if (!a->eof) decide(a, "use_cpu", use_cpu ? "true" : "false", true);
    if (!a->eof && use_cpu && is(dist, "MULTI_CPU")) ask_mpirun(a);
    if (!a->eof) ask_dynamo(a);
    bool ds_json = a->eof ? false : ask_plugins(a, dist, sizeof dist);
    bool plugin = is(dist, "FSDP") || is(dist, "DEEPSPEED") || is(dist, "MEGATRON_LM");
    if (!a->eof && (is_multi(dist) || is(dist, "XLA") || plugin)) ask_processes(a, plugin ? "GPU" : dist);
    if (!a->eof) ask_devices(a, dist, use_cpu);
    if (!a->eof && is(dist, "XLA"))
        ask_tpu(a);
    else if (!a->eof && !ds_json)
        ask_precision(a);
}

/* The keys Accelerate writes whatever the answers (ClusterConfig's defaults). */
static void fixed_keys(ask *a) {
    static const struct { const char *key, *value; bool plain; } keys[] = {
        {"num_processes", "1", true},     {"machine_rank", "0", true},        {"num_machines", "1", true},
        {"rdzv_backend", "static", false}, {"same_network", "true", true},    {"debug", "false", true},
        {"main_training_function", "main", false}, {"enable_cpu_affinity", "false", true},
        {"downcast_bf16", "false", true}, {"tpu_use_cluster", "false", true}, {"tpu_use_sudo", "false", true},
        {"mixed_precision", "no", false},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) decide(a, keys[i].key, keys[i].value, keys[i].plain);
}

/* ------------------------------------------------------------------ the command */

static void ask_usage(FILE *f) {
    fprintf(f, "usage: caccel config [--config_file FILE]\n"
               "       caccel config default [--config_file FILE] [--mixed_precision no|fp16|bf16|fp8]\n"
               "       caccel config update [--config_file FILE]\n\n"
               "Without a subcommand: asks Accelerate's `accelerate config` questions in this terminal and\n"
               "writes the answers as Accelerate's YAML (JSON when FILE ends in .json), which Accelerate\n"
               "reads too. Every answer is checked as the same value in a file would be; a bad one is\n"
               "asked again. Default location: $XDG_CONFIG_HOME/caccel/default_config.yaml. An existing\n"
               "file is replaced only if you say so first. Needs a terminal: for scripts, use\n"
               "`caccel config default`.\n");
}

static int parse_args(int argc, char **argv, const char *cmd, const char **path) {
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 0;
        if (!ca_cli_match_flag(argv[i], "config_file", &v)) {
            fprintf(stderr, "caccel %s: error: unknown argument '%s'\n", cmd, argv[i]);
            return 2;
        }
        if (!v && i + 1 >= argc) {
            fprintf(stderr, "caccel %s: error: --config_file needs a value\n", cmd);
            return 2;
        }
        *path = v ? v : argv[++i];
    }
    return -1;
}

/* Asks, before any question, whether to replace an existing file; false: leave it. */
static bool may_write(ask *a, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return true;
    char q[4200];
    snprintf(q, sizeof q, "A configuration already exists at %s. Replace it? [yes/NO]: ", path);
    return yes_no(a, q, NULL, false) && !a->eof;
}

static int save(ask *a, const char *path) {
    char header[128];
    snprintf(header, sizeof header, "Written by `caccel config` (caccel %s). Accelerate reads this file too.",
             CA_VERSION);
    if (ca_cli_make_parents(path) != 0) {
        fprintf(stderr, "caccel config: error: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    /* What was written must load, with every answer: the same loader every program uses. */
    if (ca_cli_doc_save(a->doc, path, header, 0644, true, "config") != 0) return 1;
    printf("caccel configuration saved at %s\n", path);
    return 0;
}

static int run_questionnaire(const char *path) {
    ask a = {0};
    a.doc = calloc(1, sizeof *a.doc);
    if (!a.doc || ca_config_create(&a.cfg) != CA_OK) {
        free(a.doc);
        return ca_cli_fail("config");
    }
    int rc = 1;
    if (!may_write(&a, path)) {
        fprintf(stderr, "caccel config: kept the existing %s; nothing was written\n", path);
    } else {
        fixed_keys(&a);
        questionnaire(&a);
        if (a.eof)
            fprintf(stderr, "caccel config: the questionnaire did not finish; nothing was written\n");
        else
            rc = save(&a, path);
    }
    ca_config_destroy(a.cfg);
    ca_cli_doc_free(a.doc);
    free(a.doc);
    return rc;
}

int ca_cmd_config_ask(int argc, char **argv) {
    const char *path_arg = NULL;
    int rc = parse_args(argc, argv, "config", &path_arg);
    if (rc == 0) ask_usage(stdout);
    if (rc == 2) ask_usage(stderr);
    if (rc >= 0) return rc;
    if (!isatty(STDIN_FILENO)) {
        fprintf(stderr, "caccel config: error: the questionnaire needs a terminal, and standard input is not one\n"
                        "  hint: `caccel config default [--config_file FILE] [--mixed_precision ...]` writes a "
                        "basic file without questions\n");
        return 1;
    }
    char path[4096];
    if (ca_cli_config_target(path_arg, path, sizeof path, "config")) return 1;
    return run_questionnaire(path);
}
