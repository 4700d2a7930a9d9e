/* Tests of the configuration API: defaults, the merge rule, env and flag mappings, provenance, errors, the typed view. */
#include "tests/config_test_util.h"

#include <ctype.h>
#include <math.h>
#include <strings.h>

static ca_config *new_config(void) {
    ca_config *c = NULL;
    assert_ok(ca_config_create(&c));
    assert_non_null(c);
    return c;
}

static int setup(void **state) {
    (void)state;
    ct_clean_env();
    ca_clear_error();
    return 0;
}

/* ------------------------------------------------------------------ defaults */

static void test_defaults(void **state) {
    (void)state;
    ca_config *c = new_config();
    static const struct { const char *key, *value; } defs[] = {
        {"compute_environment", "LOCAL_MACHINE"}, {"distributed_type", "NO"}, {"mixed_precision", "no"},
        {"use_cpu", "false"}, {"debug", "false"}, {"num_processes", "-1"}, {"machine_rank", "0"},
        {"num_machines", "1"}, {"gpu_ids", "null"}, {"main_process_ip", "null"}, {"main_process_port", "null"},
        {"rdzv_backend", "static"}, {"same_network", "false"}, {"main_training_function", "main"},
        {"enable_cpu_affinity", "false"}, {"downcast_bf16", "false"}, {"tpu_use_cluster", "false"},
        {"region", "us-east-1"}, {"backend", "null"}, {"timeout", "1800"}, {"bucket_cap_mb", "25"}, {"allow_tf32", "false"},
        {"comm_hook", "no"}, {"even_batches", "true"}, {"split_batches", "false"}, {"dispatch_batches", "false"},
        {"use_seedable_sampler", "false"}, {"data_seed", "null"}, {"non_blocking", "false"},
        {"gradient_accumulation_steps", "1"}, {"gradient_clipping", "null"},
        {"allow_unknown_keys", "false"}, {"fsdp_config.fsdp_sharding_strategy", "FULL_SHARD"},
        {"fsdp_config.fsdp_use_orig_params", "true"}, {"deepspeed_config.zero_stage", "2"},
        {"dynamo_config.dynamo_backend", "no"}, {"fsdp_config", "{}"},
        {"comm_state_option.matrix_approximation_rank", "1"}, {"comm_state_option.start_powerSGD_iter", "1000"},
        {"comm_state_option.min_compression_rate", "2"}, {"comm_state_option.use_error_feedback", "true"},
        {"comm_state_option.warm_start", "true"}, {"comm_state_option.orthogonalization_epsilon", "0"},
        {"comm_state_option.random_seed", "0"},
    };
    for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++) {
        const char *v = ca_config_get(c, defs[i].key);
        if (!v || strcmp(v, defs[i].value) != 0)
            fail_msg("default of %s is '%s', expected '%s'", defs[i].key, v ? v : "(null)", defs[i].value);
        assert_string_equal(ca_config_origin(c, defs[i].key), "default");
        assert_int_equal(ca_config_source_of(c, defs[i].key), CA_SRC_DEFAULT);
    }
    assert_null(ca_config_get(c, "no_such_key"));
    assert_null(ca_config_origin(c, "no_such_key"));
    assert_null(ca_config_file(c));

    ca_settings st;
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.distributed_type, CA_DIST_NO);
    assert_string_equal(st.distributed_type_name, "NO");
    assert_int_equal(st.mixed_precision, CA_MP_NO);
    assert_false(st.use_cpu);
    assert_int_equal(st.num_processes, -1);
    assert_int_equal(st.num_machines, 1);
    assert_int_equal(st.machine_rank, 0);
    assert_null(st.main_process_ip);
    assert_int_equal(st.main_process_port, 0);
    assert_null(st.gpu_ids);
    assert_int_equal(st.gradient_accumulation_steps, 1);
    assert_true(st.gradient_clipping == 0.0);
    assert_null(st.backend);
    assert_int_equal(st.timeout_ms, 1800000);
    assert_true(st.bucket_cap_mb == 25.0);
    assert_false(st.allow_tf32);
    assert_true(st.even_batches);
    assert_false(st.split_batches);
    assert_false(st.dispatch_batches);
    assert_false(st.use_seedable_sampler);
    assert_int_equal(st.data_seed, -1);
    assert_false(st.non_blocking);
    assert_int_equal(st.num_cpu_threads_per_process, 0);
    assert_string_equal(st.rdzv_backend, "static");
    ca_config_destroy(c);
    ca_config_destroy(NULL);
}

static void test_names(void **state) {
    (void)state;
    assert_string_equal(ca_distributed_type_name(CA_DIST_MULTI_CPU), "MULTI_CPU");
    assert_string_equal(ca_distributed_type_name(CA_DIST_DEEPSPEED), "DEEPSPEED");
    assert_string_equal(ca_mixed_precision_name(CA_MP_BF16), "bf16");
    assert_string_equal(ca_mixed_precision_name(CA_MP_FP8), "fp8");
}

/* ------------------------------------------------------------------ precedence */

/* For several keys: each layer beats the one below, and a value from a lower
 * layer arriving later is ignored. */
static void test_each_layer_beats_the_one_below(void **state) {
    (void)state;
    static const struct { const char *key, *v[5]; } cases[] = {
        {"mixed_precision", {"no", "fp16", "bf16", "fp8", "no"}},
        {"num_processes", {"-1", "2", "3", "4", "5"}},
        {"use_cpu", {"false", "true", "false", "true", "false"}},
        {"gradient_accumulation_steps", {"1", "2", "4", "8", "16"}},
        {"backend", {"null", "gloo", "mpi", "nccl", "gloo"}},
        {"fsdp_config.fsdp_sharding_strategy", {"FULL_SHARD", "NO_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD",
                                                "FULL_SHARD"}},
        {"main_process_port", {"null", "1000", "2000", "3000", "4000"}},
    };
    static const char *const origins[] = {"default", "program", "cfg.yaml:7", "env X", "--x"};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ca_config *c = new_config();
        for (int s = CA_SRC_PROGRAM; s <= CA_SRC_CLI; s++) {
            assert_ok(ca_config_set(c, cases[k].key, cases[k].v[s], (ca_config_source)s, origins[s]));
            assert_string_equal(ca_config_get(c, cases[k].key), cases[k].v[s]);
            assert_string_equal(ca_config_origin(c, cases[k].key), origins[s]);
            assert_int_equal(ca_config_source_of(c, cases[k].key), s);
            /* every lower layer, set afterwards, is ignored */
            for (int lower = CA_SRC_DEFAULT; lower < s; lower++) {
                assert_ok(ca_config_set(c, cases[k].key, cases[k].v[lower], (ca_config_source)lower, "late"));
                assert_string_equal(ca_config_get(c, cases[k].key), cases[k].v[s]);
                assert_string_equal(ca_config_origin(c, cases[k].key), origins[s]);
            }
        }
        /* the same layer replaces */
        assert_ok(ca_config_set(c, cases[k].key, cases[k].v[1], CA_SRC_CLI, "--again"));
        assert_string_equal(ca_config_get(c, cases[k].key), cases[k].v[1]);
        ca_config_destroy(c);
    }
}

/* The same rule through the real entry points: file, env, argv. */
static void test_layers_through_loaders(void **state) {
    (void)state;
    const char *path = ct_write("layers.yaml", "distributed_type: MULTI_CPU\n"
                                               "mixed_precision: fp16\n"
                                               "num_processes: 4\n"
                                               "gradient_accumulation_steps: 2\n"
                                               "fsdp_config:\n  fsdp_offload_params: true\n");
    ca_config *c = new_config();
    assert_ok(ca_config_set(c, "mixed_precision", "bf16", CA_SRC_PROGRAM, NULL));
    assert_ok(ca_config_set(c, "debug", "true", CA_SRC_PROGRAM, NULL));
    assert_ok(ca_config_load_file(c, path));
    assert_string_equal(ca_config_get(c, "mixed_precision"), "fp16");     /* file > program */
    assert_string_equal(ca_config_get(c, "debug"), "true");               /* program kept */
    assert_string_equal(ca_config_origin(c, "debug"), "program");
    char *env[] = {"ACCELERATE_MIXED_PRECISION=bf16", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS=8",
                   "FSDP_OFFLOAD_PARAMS=false", "UNRELATED=1", NULL};
    assert_ok(ca_config_apply_env(c, env));
    assert_string_equal(ca_config_get(c, "mixed_precision"), "bf16");     /* env > file */
    assert_string_equal(ca_config_get(c, "gradient_accumulation_steps"), "8");
    assert_string_equal(ca_config_get(c, "fsdp_config.fsdp_offload_params"), "false");
    assert_string_equal(ca_config_get(c, "num_processes"), "4");          /* file kept */
    char *argv[] = {"prog", "--mixed_precision", "no", "--gradient_accumulation_steps=3", "--my-own-flag", NULL};
    assert_ok(ca_config_apply_args(c, 5, argv));
    assert_string_equal(ca_config_get(c, "mixed_precision"), "no");       /* CLI > env */
    assert_string_equal(ca_config_get(c, "gradient_accumulation_steps"), "3");
    assert_string_equal(ca_config_origin(c, "mixed_precision"), "--mixed_precision");
    assert_string_equal(ca_config_origin(c, "fsdp_config.fsdp_offload_params"), "env FSDP_OFFLOAD_PARAMS");
    /* a file loaded after the environment does not undo it */
    assert_ok(ca_config_load_file(c, path));
    assert_string_equal(ca_config_get(c, "gradient_accumulation_steps"), "3");
    assert_string_equal(ca_config_get(c, "fsdp_config.fsdp_offload_params"), "false");
    ca_config_destroy(c);
}

/* ca_config_load: program < file < env < CLI in one call, with real variables. */
static void test_load_all_layers(void **state) {
    (void)state;
    const char *path = ct_write("all.yaml", "distributed_type: MULTI_CPU\n"
                                            "mixed_precision: fp16\n"
                                            "num_processes: 4\n"
                                            "main_process_port: 1234\n"
                                            "use_cpu: true\n");
    char file[512];
    snprintf(file, sizeof file, "%s", path);
    setenv("ACCELERATE_MIXED_PRECISION", "bf16", 1);
    setenv("MASTER_PORT", "2345", 1);
    setenv("CACCEL_TIMEOUT", "60", 1);
    const char *settings[] = {"mixed_precision=no", "bucket_cap_mb=50", "num_processes=2", "timeout=10", NULL};
    char *argv[] = {"prog", "--config_file", file, "--timeout", "5", "data.bin", NULL};
    ca_config *c = new_config();
    assert_ok(ca_config_load(c, settings, 6, argv));
    assert_string_equal(ca_config_file(c), file);
    assert_string_equal(ca_config_get(c, "mixed_precision"), "bf16");
    assert_string_equal(ca_config_origin(c, "mixed_precision"), "env ACCELERATE_MIXED_PRECISION");
    assert_string_equal(ca_config_get(c, "bucket_cap_mb"), "50");
    assert_string_equal(ca_config_origin(c, "bucket_cap_mb"), "program");
    assert_string_equal(ca_config_get(c, "num_processes"), "4");
    char want[600];
    snprintf(want, sizeof want, "%s:3", file);
    assert_string_equal(ca_config_origin(c, "num_processes"), want);
    assert_string_equal(ca_config_get(c, "main_process_port"), "2345");
    assert_string_equal(ca_config_origin(c, "main_process_port"), "env MASTER_PORT");
    assert_string_equal(ca_config_get(c, "timeout"), "5");
    assert_string_equal(ca_config_origin(c, "timeout"), "--timeout");
    ca_settings st;
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.timeout_ms, 5000);
    assert_true(st.bucket_cap_mb == 50.0);
    assert_int_equal(st.mixed_precision, CA_MP_BF16);
    assert_int_equal(st.distributed_type, CA_DIST_MULTI_CPU);
    assert_true(st.use_cpu);
    assert_int_equal(st.main_process_port, 2345);
    ca_config_destroy(c);
    ct_clean_env();
}

static void test_program_settings_errors(void **state) {
    (void)state;
    ca_config *c = new_config();
    const char *bad[] = {"mixed_precision", NULL};
    assert_status(ca_config_load(c, bad, 0, NULL), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "key=value");
    const char *bad2[] = {"mixed_precison=fp16", NULL};
    assert_status(ca_config_load(c, bad2, 0, NULL), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "program: unknown key 'mixed_precison'");
    assert_contains(ca_last_error(), "did you mean 'mixed_precision'");
    const char *bad3[] = {"num_processes=many", NULL};
    assert_status(ca_config_load(c, bad3, 0, NULL), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "program: invalid value 'many' for key 'num_processes'");
    ca_config_destroy(c);
}

/* ------------------------------------------------------------------ values */

static void test_bad_values(void **state) {
    (void)state;
    static const struct { const char *key, *value, *want[3]; } cases[] = {
        {"mixed_precision", "fp17", {"'fp17'", "'mixed_precision'", "allowed: no, fp16, bf16, fp8"}},
        {"use_cpu", "maybe", {"'maybe'", "'use_cpu'", "true, false, yes, no"}},
        {"num_processes", "0", {"'0'", "'num_processes'", "other than 0"}},
        {"num_processes", "2.5", {"'2.5'", "'num_processes'", "an integer"}},
        {"main_process_port", "70000", {"'70000'", "'main_process_port'", "from 0 to 65535"}},
        {"distributed_type", "MULTI_TPU", {"'MULTI_TPU'", "'distributed_type'", "NO, MULTI_CPU, MULTI_GPU"}},
        {"distributed_type", "multi_gpu", {"'multi_gpu'", "'distributed_type'", "MULTI_GPU"}},
        {"timeout", "-3", {"'-3'", "'timeout'", "a number from 0.001 to 1e+09"}},
        {"timeout", "nan", {"'nan'", "'timeout'", "a number from 0.001 to 1e+09"}},
        {"gradient_clipping", "abc", {"'abc'", "'gradient_clipping'", "a number >= 0"}},
        {"backend", "tcp", {"'tcp'", "'backend'", "gloo, mpi, nccl"}},
        {"deepspeed_config.zero_stage", "4", {"'4'", "'deepspeed_config.zero_stage'", "from 0 to 3"}},
        {"fsdp_config.fsdp_sharding_strategy", "HALF", {"'HALF'", "fsdp_sharding_strategy", "FULL_SHARD"}},
        {"comm_state_option.matrix_approximation_rank", "0",
         {"'0'", "'comm_state_option.matrix_approximation_rank'", "from 1"}},
        {"dynamo_config.dynamo_mode", "fast", {"'fast'", "dynamo_mode", "reduce-overhead"}},
        {"fsdp_config", "x", {"fsdp_config", "section", "fsdp_config.<key>"}},
    };
    ca_config *c = new_config();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ca_clear_error();
        ca_status s = ca_config_set(c, cases[i].key, cases[i].value, CA_SRC_ENV, "env SOMETHING");
        if (s != CA_ERR_CONFIG) fail_msg("%s=%s was accepted", cases[i].key, cases[i].value);
        assert_contains(ca_last_error(), "env SOMETHING: ");
        for (int w = 0; w < 3; w++) assert_contains(ca_last_error(), cases[i].want[w]);
        /* the old value stays */
        assert_int_equal(ca_config_source_of(c, cases[i].key), CA_SRC_DEFAULT);
    }
    ca_config_destroy(c);
}

static void test_value_forms(void **state) {
    (void)state;
    ca_config *c = new_config();
    /* booleans in every YAML 1.1 spelling, stored as true/false */
    static const struct { const char *in, *out; } bools[] = {
        {"yes", "true"}, {"No", "false"}, {"ON", "true"}, {"off", "false"}, {"1", "true"},
        {"0", "false"}, {"T", "true"}, {"f", "false"}, {"TRUE", "true"},
    };
    for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
        assert_ok(ca_config_set(c, "debug", bools[i].in, CA_SRC_PROGRAM, NULL));
        assert_string_equal(ca_config_get(c, "debug"), bools[i].out);
    }
    /* enums: Accelerate lowercases mixed_precision, uppercases FSDP names */
    assert_ok(ca_config_set(c, "mixed_precision", "BF16", CA_SRC_PROGRAM, NULL));
    assert_string_equal(ca_config_get(c, "mixed_precision"), "bf16");
    assert_ok(ca_config_set(c, "fsdp_config.fsdp_sharding_strategy", "shard_grad_op", CA_SRC_PROGRAM, NULL));
    assert_string_equal(ca_config_get(c, "fsdp_config.fsdp_sharding_strategy"), "SHARD_GRAD_OP");
    assert_ok(ca_config_set(c, "fsdp_config.fsdp_sharding_strategy", "1", CA_SRC_PROGRAM, NULL));
    assert_ok(ca_config_set(c, "dynamo_config.dynamo_backend", "INDUCTOR", CA_SRC_PROGRAM, NULL));
    assert_string_equal(ca_config_get(c, "dynamo_config.dynamo_backend"), "inductor");
    /* integers are normalised, text is kept */
    assert_ok(ca_config_set(c, "num_processes", " 08", CA_SRC_PROGRAM, NULL));
    assert_string_equal(ca_config_get(c, "num_processes"), "8");
    assert_ok(ca_config_set(c, "gpu_ids", "0,1", CA_SRC_PROGRAM, NULL));
    assert_string_equal(ca_config_get(c, "gpu_ids"), "0,1");
    /* null in its spellings */
    assert_ok(ca_config_set(c, "gpu_ids", "~", CA_SRC_PROGRAM, NULL));
    assert_string_equal(ca_config_get(c, "gpu_ids"), "null");
    assert_ok(ca_config_set(c, "num_processes", NULL, CA_SRC_PROGRAM, NULL));
    assert_string_equal(ca_config_get(c, "num_processes"), "null");
    /* a section accepts only "{}" or null */
    assert_ok(ca_config_set(c, "deepspeed_config", "{}", CA_SRC_PROGRAM, NULL));
    assert_string_equal(ca_config_get(c, "deepspeed_config"), "{}");
    assert_ok(ca_config_set(c, "deepspeed_config.zero_stage", "3", CA_SRC_PROGRAM, NULL));
    assert_string_equal(ca_config_get(c, "deepspeed_config"), "{zero_stage: 3}");
    ca_config_destroy(c);
}

static void test_typed_getters(void **state) {
    (void)state;
    ca_config *c = new_config();
    bool b = true;
    int64_t i = 0;
    double d = 0;
    assert_ok(ca_config_get_bool(c, "use_cpu", &b));
    assert_false(b);
    assert_ok(ca_config_get_int(c, "num_machines", &i));
    assert_int_equal(i, 1);
    assert_ok(ca_config_get_double(c, "timeout", &d));
    assert_true(d == 1800.0);
    assert_status(ca_config_get_int(c, "main_process_port", &i), CA_ERR_NOT_FOUND);
    assert_contains(ca_last_error(), "main_process_port");
    assert_contains(ca_last_error(), "null");
    assert_status(ca_config_get_bool(c, "use_cpo", &b), CA_ERR_NOT_FOUND);
    assert_contains(ca_last_error(), "did you mean 'use_cpu'");
    assert_status(ca_config_get_int(c, "mixed_precision", &i), CA_ERR_CONFIG);
    assert_status(ca_config_get_double(c, "gpu_ids", &d), CA_ERR_NOT_FOUND);
    assert_ok(ca_config_set(c, "gpu_ids", "0,1", CA_SRC_PROGRAM, NULL));
    assert_status(ca_config_get_double(c, "gpu_ids", &d), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "'gpu_ids' = '0,1' is not a number");
    ca_config_destroy(c);
}

/* ------------------------------------------------------------------ unknown keys */

static void test_unknown_keys_set(void **state) {
    (void)state;
    ca_config *c = new_config();
    assert_status(ca_config_set(c, "mixed_precison", "fp16", CA_SRC_PROGRAM, NULL), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "program: unknown key 'mixed_precison' (did you mean 'mixed_precision'?)");
    assert_contains(ca_last_hint(), "CACCEL_ALLOW_UNKNOWN_KEYS");
    assert_status(ca_config_set(c, "fsdp_confg.fsdp_version", "2", CA_SRC_PROGRAM, NULL), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "did you mean 'fsdp_config'");
    /* only near keys are suggested: within max(2, len/3) edits */
    assert_status(ca_config_set(c, "invalid_key", "1", CA_SRC_PROGRAM, NULL), CA_ERR_CONFIG);
    assert_string_equal(ca_last_error(), "program: unknown key 'invalid_key'");
    assert_status(ca_config_set(c, "gradient_acumulation_stpes", "1", CA_SRC_PROGRAM, NULL), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "did you mean 'gradient_accumulation_steps'");
    /* inside a known section: kept, reported, not acted on */
    ca_log_set_level(CA_LOG_OFF);
    assert_ok(ca_config_set(c, "fsdp_config.fsdp_backward_prefetch_policy", "BACKWARD_PRE", CA_SRC_PROGRAM, NULL));
    assert_string_equal(ca_config_get(c, "fsdp_config.fsdp_backward_prefetch_policy"), "BACKWARD_PRE");
    assert_contains(ca_config_get(c, "fsdp_config"), "fsdp_backward_prefetch_policy: BACKWARD_PRE");
    bool found = false;
    for (int i = 0; i < ca_config_count(c); i++) {
        ca_config_entry e;
        assert_ok(ca_config_entry_at(c, i, &e));
        if (strcmp(e.key, "fsdp_config.fsdp_backward_prefetch_policy") == 0) {
            found = true;
            assert_false(e.supported);
            assert_string_equal(e.origin, "program");
        }
    }
    assert_true(found);
    /* with the switch, unknown top-level keys are kept too */
    assert_ok(ca_config_set(c, "allow_unknown_keys", "true", CA_SRC_PROGRAM, NULL));
    assert_ok(ca_config_set(c, "brand_new_key", "1", CA_SRC_PROGRAM, NULL));
    assert_string_equal(ca_config_get(c, "brand_new_key"), "1");
    ca_log_set_level(CA_LOG_WARNING);
    ca_config_destroy(c);
}

static void test_legacy_keys(void **state) {
    (void)state;
    ca_config *c = new_config();
    assert_ok(ca_config_set(c, "fp16", "false", CA_SRC_PROGRAM, NULL));
    assert_string_equal(ca_config_get(c, "mixed_precision"), "no");
    assert_ok(ca_config_set(c, "fp16", "true", CA_SRC_PROGRAM, "old.yaml:3"));
    assert_string_equal(ca_config_get(c, "mixed_precision"), "fp16");
    assert_contains(ca_config_origin(c, "mixed_precision"), "old.yaml:3 (fp16: true)");
    assert_null(ca_config_get(c, "fp16"));
    assert_ok(ca_config_set(c, "dynamo_backend", "INDUCTOR", CA_SRC_PROGRAM, "old.yaml:4"));
    assert_string_equal(ca_config_get(c, "dynamo_config.dynamo_backend"), "inductor");
    assert_contains(ca_config_origin(c, "dynamo_config.dynamo_backend"), "old.yaml:4");
    assert_status(ca_config_set(c, "fp16", "sometimes", CA_SRC_PROGRAM, NULL), CA_ERR_CONFIG);
    ca_config_destroy(c);
}

/* ------------------------------------------------------------------ environment */

static void test_env_mappings(void **state) {
    (void)state;
    static const struct { const char *var, *value, *key, *want; } cases[] = {
        {"ACCELERATE_USE_CPU", "True", "use_cpu", "true"},
        {"ACCELERATE_MIXED_PRECISION", "fp16", "mixed_precision", "fp16"},
        {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4", "gradient_accumulation_steps", "4"},
        {"ACCELERATE_GRADIENT_CLIPPING", "1.5", "gradient_clipping", "1.5"},
        {"ACCELERATE_DEBUG_MODE", "true", "debug", "true"},
        {"ACCELERATE_CPU_AFFINITY", "1", "enable_cpu_affinity", "true"},
        {"ACCELERATE_DOWNCAST_BF16", "yes", "downcast_bf16", "true"},
        {"ACCELERATE_NUM_PROCESSES", "6", "num_processes", "6"},
        {"ACCELERATE_USE_DEEPSPEED", "true", "distributed_type", "DEEPSPEED"},
        {"ACCELERATE_USE_FSDP", "true", "distributed_type", "FSDP"},
        {"ACCELERATE_USE_MEGATRON_LM", "true", "distributed_type", "MEGATRON_LM"},
        {"ACCELERATE_DYNAMO_BACKEND", "INDUCTOR", "dynamo_config.dynamo_backend", "inductor"},
        {"ACCELERATE_DYNAMO_MODE", "max-autotune", "dynamo_config.dynamo_mode", "max-autotune"},
        {"ACCELERATE_DYNAMO_USE_FULLGRAPH", "True", "dynamo_config.dynamo_use_fullgraph", "true"},
        {"ACCELERATE_DYNAMO_USE_DYNAMIC", "False", "dynamo_config.dynamo_use_dynamic", "false"},
        {"ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "true", "dynamo_config.dynamo_use_regional_compilation",
         "true"},
        {"FSDP_SHARDING_STRATEGY", "HYBRID_SHARD", "fsdp_config.fsdp_sharding_strategy", "HYBRID_SHARD"},
        {"FSDP_TRANSFORMER_CLS_TO_WRAP", "BertLayer", "fsdp_config.fsdp_transformer_layer_cls_to_wrap",
         "BertLayer"},
        {"FSDP_VERSION", "2", "fsdp_config.fsdp_version", "2"},
        {"FSDP_MIN_NUM_PARAMS", "1000", "fsdp_config.fsdp_min_num_params", "1000"},
        {"ACCELERATE_DEEPSPEED_ZERO_STAGE", "3", "deepspeed_config.zero_stage", "3"},
        {"ACCELERATE_DEEPSPEED_CONFIG_FILE", "ds.json", "deepspeed_config.deepspeed_config_file", "ds.json"},
        {"ACCELERATE_DEEPSPEED_ZERO3_INIT", "true", "deepspeed_config.zero3_init_flag", "true"},
        {"ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "cpu", "deepspeed_config.offload_param_device", "cpu"},
        {"ACCELERATE_FP8_BACKEND", "te", "fp8_config.backend", "TE"},
        {"MEGATRON_LM_TP_DEGREE", "2", "megatron_lm_config.megatron_lm_tp_degree", "2"},
        {"PET_NNODES", "2:4", "num_machines", "2:4"},
        {"PET_NNODES", "3", "num_machines", "3"},
        {"PET_NODE_RANK", "1", "machine_rank", "1"},
        {"MASTER_ADDR", "10.0.0.1", "main_process_ip", "10.0.0.1"},
        {"MASTER_PORT", "29501", "main_process_port", "29501"},
        {"CACCEL_BACKEND", "gloo", "backend", "gloo"},
        {"CACCEL_TIMEOUT", "90", "timeout", "90"},
        {"CACCEL_BUCKET_CAP_MB", "8", "bucket_cap_mb", "8"},
        {"CACCEL_COMM_HOOK", "bf16", "comm_hook", "bf16"},
        {"CACCEL_ALLOW_UNKNOWN_KEYS", "1", "allow_unknown_keys", "true"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ca_config *c = new_config();
        char var[256];
        snprintf(var, sizeof var, "%s=%s", cases[i].var, cases[i].value);
        char *env[] = {var, NULL};
        assert_ok(ca_config_apply_env(c, env));
        const char *got = ca_config_get(c, cases[i].key);
        if (!got || strcmp(got, cases[i].want) != 0)
            fail_msg("%s gave %s='%s', expected '%s'", var, cases[i].key, got ? got : "(null)", cases[i].want);
        char origin[256];
        snprintf(origin, sizeof origin, "env %s", cases[i].var);
        assert_string_equal(ca_config_origin(c, cases[i].key), origin);
        assert_int_equal(ca_config_source_of(c, cases[i].key), CA_SRC_ENV);
        ca_config_destroy(c);
    }
}

static void test_env_settings_and_errors(void **state) {
    (void)state;
    ca_config *c = new_config();
    char *env[] = {"CACCEL_TIMEOUT=2.5", "CACCEL_BUCKET_CAP_MB=0.5", "ACCELERATE_USE_FSDP=false",
                   "ACCELERATE_MIXED_PRECISION=", "CACCEL_COMM_HOOK=BF16", NULL};
    assert_ok(ca_config_apply_env(c, env));
    ca_settings st;
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.timeout_ms, 2500);
    assert_true(st.bucket_cap_mb == 0.5);
    assert_int_equal(st.comm_hook, CA_COMM_HOOK_BF16);
    /* false selects nothing; empty counts as unset */
    assert_string_equal(ca_config_get(c, "distributed_type"), "NO");
    assert_int_equal(ca_config_source_of(c, "mixed_precision"), CA_SRC_DEFAULT);

    char *bad[] = {"ACCELERATE_USE_CPU=maybe", NULL};
    assert_status(ca_config_apply_env(c, bad), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "env ACCELERATE_USE_CPU");
    assert_contains(ca_last_error(), "'maybe'");
    assert_contains(ca_last_error(), "true, false");
    char *bad2[] = {"CACCEL_TIMEOUT=soon", NULL};
    assert_status(ca_config_apply_env(c, bad2), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "env CACCEL_TIMEOUT");
    char *bad3[] = {"ACCELERATE_USE_DEEPSPEED=perhaps", NULL};
    assert_status(ca_config_apply_env(c, bad3), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "env ACCELERATE_USE_DEEPSPEED");
    /* a value's newline and control characters are escaped: the error stays one line */
    char *nl[] = {"ACCELERATE_MIXED_PRECISION=fp16\nrank 1: ok\x1b[2J", NULL};
    assert_status(ca_config_apply_env(c, nl), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "env ACCELERATE_MIXED_PRECISION: invalid value 'fp16\\nrank 1: ok\\x1b[2J' for key");
    assert_null(strchr(ca_last_error(), '\n'));
    char *nl2[] = {"ACCELERATE_USE_DEEPSPEED=yes\n", NULL};
    assert_status(ca_config_apply_env(c, nl2), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "env ACCELERATE_USE_DEEPSPEED: invalid value 'yes\\n' (allowed:");
    char *two[] = {"ACCELERATE_USE_DEEPSPEED=1", "ACCELERATE_USE_FSDP=1", NULL};
    assert_status(ca_config_apply_env(c, two), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "ACCELERATE_USE_DEEPSPEED");
    assert_contains(ca_last_error(), "ACCELERATE_USE_FSDP");
    ca_config_destroy(c);

    /* NULL envp: the process environment */
    setenv("ACCELERATE_NUM_PROCESSES", "3", 1);
    c = new_config();
    assert_ok(ca_config_apply_env(c, NULL));
    assert_string_equal(ca_config_get(c, "num_processes"), "3");
    ca_config_destroy(c);
    unsetenv("ACCELERATE_NUM_PROCESSES");
}

/* torchrun's rendezvous endpoint, --rdzv_endpoint HOST[:PORT] or PET_RDZV_ENDPOINT: main_process_ip and
 * main_process_port, at the flag's or the environment's precedence; a bad value or a second, different
 * address names the flag or the variable. */
static void test_rdzv_endpoint(void **state) {
    (void)state;
    static const struct { const char *value, *ip, *port; } good[] = {
        {"10.0.0.1:29555", "10.0.0.1", "29555"}, {"node-a", "node-a", NULL}, {"[fd00::1]:29501", "fd00::1", "29501"},
        {"[fd00::2]", "fd00::2", NULL},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        setenv("PET_RDZV_ENDPOINT", good[i].value, 1);
        ca_config *c = new_config();
        char *a[] = {"prog", NULL};
        assert_ok(ca_config_load(c, NULL, 1, a));
        assert_string_equal(ca_config_get(c, "main_process_ip"), good[i].ip);
        assert_string_equal(ca_config_origin(c, "main_process_ip"), "env PET_RDZV_ENDPOINT");
        if (good[i].port) assert_string_equal(ca_config_get(c, "main_process_port"), good[i].port);
        else assert_int_equal(ca_config_source_of(c, "main_process_port"), CA_SRC_DEFAULT);
        ca_config_destroy(c);
    }
    /* the flag beats the variable, as --main_process_ip beats MASTER_ADDR */
    setenv("PET_RDZV_ENDPOINT", "10.0.0.1:29555", 1);
    char *a2[] = {"prog", "--rdzv_endpoint", "10.0.0.2:29600", NULL};
    ca_config *c = new_config();
    assert_ok(ca_config_load(c, NULL, 3, a2));
    assert_string_equal(ca_config_get(c, "main_process_ip"), "10.0.0.2");
    assert_string_equal(ca_config_get(c, "main_process_port"), "29600");
    assert_string_equal(ca_config_origin(c, "main_process_port"), "--rdzv_endpoint");
    ca_config_destroy(c);
    ct_clean_env();

    static const struct { const char *var, *value, *flag, *want; } bad[] = {
        {"PET_RDZV_ENDPOINT", "node:abc", NULL,
         "env PET_RDZV_ENDPOINT: invalid value 'abc' for key 'main_process_port' (allowed: an integer from 0 to 65535)"},
        {"PET_RDZV_ENDPOINT", "node:70000", NULL, "env PET_RDZV_ENDPOINT: invalid value '70000' for key 'main_process_port'"},
        {"PET_RDZV_ENDPOINT", ":29500", NULL, "env PET_RDZV_ENDPOINT: invalid value ':29500' (allowed: HOST or HOST:PORT"},
        {"PET_RDZV_ENDPOINT", "fd00::1:29500", NULL, "env PET_RDZV_ENDPOINT: invalid value 'fd00::1:29500' (allowed: "},
        {"PET_RDZV_ENDPOINT", "[fd00::1", NULL, "env PET_RDZV_ENDPOINT: invalid value '[fd00::1' (allowed: "},
        {"PET_RDZV_ENDPOINT", "node:", NULL, "env PET_RDZV_ENDPOINT: invalid value 'node:' (allowed: "},
        {NULL, NULL, "--rdzv_endpoint=node:x", "--rdzv_endpoint: invalid value 'x' for key 'main_process_port'"},
        {"MASTER_ADDR", "10.0.0.3", NULL, "env PET_RDZV_ENDPOINT sets main_process_ip to '10.0.0.1', but env "
                                          "MASTER_ADDR set it to '10.0.0.3': give the rendezvous address once"},
        {"MASTER_PORT", "29501", NULL, "env PET_RDZV_ENDPOINT sets main_process_port to '29555', but env MASTER_PORT "
                                       "set it to '29501'"},
        {NULL, NULL, "--main_process_ip=10.0.0.4", "--rdzv_endpoint sets main_process_ip to '10.0.0.5', but "
                                                   "--main_process_ip set it to '10.0.0.4'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bool conflict = strstr(bad[i].want, "give the") || strstr(bad[i].want, "but ");
        if (bad[i].var) setenv(bad[i].var, bad[i].value, 1);
        if (conflict && bad[i].var) setenv("PET_RDZV_ENDPOINT", "10.0.0.1:29555", 1);
        /* the flag after --main_process_ip or before it: the same refusal */
        char *a[] = {"prog", (char *)(bad[i].flag ? bad[i].flag : "--cpu"),
                     conflict && bad[i].flag ? "--rdzv_endpoint=10.0.0.5" : "--cpu", NULL};
        c = new_config();
        assert_status(ca_config_load(c, NULL, 3, a), CA_ERR_CONFIG);
        assert_contains(ca_last_error(), bad[i].want);
        ca_config_destroy(c);
        ct_clean_env();
    }
}

/* num_machines MIN:MAX (torchrun's --nnodes form: elastic membership) from the flag, PET_NNODES or a file:
 * the flag beats the environment, which beats the file; MAX is what the integer readers see. */
static void test_elastic_num_machines(void **state) {
    (void)state;
    const char *path = ct_write("elastic.yaml", "distributed_type: MULTI_CPU\nnum_machines: '2:3'\nnum_processes: 6\n");
    char file[512];
    snprintf(file, sizeof file, "%s", path);
    char *argv[] = {"prog", "--config_file", file, "--machine_rank", "2", NULL};
    ca_config *c = new_config();
    assert_ok(ca_config_load(c, NULL, 5, argv));
    assert_string_equal(ca_config_get(c, "num_machines"), "2:3");
    int64_t v = 0;
    assert_ok(ca_config_get_int(c, "num_machines", &v));
    assert_int_equal(v, 3);
    ca_settings st;
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.num_machines, 3);
    assert_int_equal(st.min_machines, 2);
    ca_config_destroy(c);

    setenv("PET_NNODES", "1:2", 1);   /* the environment beats the file */
    char *argv2[] = {"prog", "--config_file", file, NULL};
    c = new_config();
    assert_ok(ca_config_load(c, NULL, 3, argv2));
    assert_string_equal(ca_config_origin(c, "num_machines"), "env PET_NNODES");
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.num_machines, 2);
    assert_int_equal(st.min_machines, 1);
    ca_config_destroy(c);
    /* the processes of an elastic job at fewer machines: only MIN bounds the count they see */
    setenv("ACCELERATE_NUM_PROCESSES", "2", 1);
    setenv("PET_NNODES", "2:3", 1);
    c = new_config();
    assert_ok(ca_config_load(c, NULL, 3, argv2));
    ca_config_destroy(c);
    setenv("ACCELERATE_NUM_PROCESSES", "1", 1);
    c = new_config();
    assert_status(ca_config_load(c, NULL, 3, argv2), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "num_processes 1 (env ACCELERATE_NUM_PROCESSES) is the total over all machines "
                                     "and cannot be less than num_machines 2:3 (env PET_NNODES)");
    ca_config_destroy(c);
    ct_clean_env();
    char *argv3[] = {"prog", "--config_file", file, "--num_machines", "4", NULL};   /* the flag beats both */
    c = new_config();
    assert_ok(ca_config_load(c, NULL, 5, argv3));
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.num_machines, 4);
    assert_int_equal(st.min_machines, 0);
    ca_config_destroy(c);
    ct_clean_env();

    /* refusals name the origin, the key and the value */
    static const struct { const char *value, *want; } bad[] = {
        {"3:2", "--num_machines: invalid value '3:2' for key 'num_machines': the minimum 3 is larger than the maximum 2"},
        {"1:0", "--num_machines: invalid value '1:0' for key 'num_machines' (allowed: an integer from 1 to 1000000, or "
                "MIN:MAX (two of those, MIN <= MAX))"},
        {"0:2", "invalid value '0:2' for key 'num_machines'"},
        {"1:x", "invalid value '1:x' for key 'num_machines'"},
        {"1:2:3", "invalid value '1:2:3' for key 'num_machines'"},
        {":2", "invalid value ':2' for key 'num_machines'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *a[] = {"prog", "--num_machines", (char *)bad[i].value, NULL};
        c = new_config();
        assert_status(ca_config_load(c, NULL, 3, a), CA_ERR_CONFIG);
        assert_contains(ca_last_error(), bad[i].want);
        ca_config_destroy(c);
    }
    setenv("PET_NNODES", "4:2", 1);
    c = new_config();
    char *a4[] = {"prog", NULL};
    assert_status(ca_config_load(c, NULL, 1, a4), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "env PET_NNODES: invalid value '4:2' for key 'num_machines': the minimum 4");
    ca_config_destroy(c);
    ct_clean_env();
    /* machine_rank is checked against MAX */
    char *a5[] = {"prog", "--num_machines", "1:3", "--machine_rank", "3", NULL};
    c = new_config();
    assert_status(ca_config_load(c, NULL, 5, a5), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "machine_rank 3 (--machine_rank) must be less than num_machines 3 (--num_machines)");
    ca_config_destroy(c);
}

/* ------------------------------------------------------------------ command line */

static void test_flag_mappings(void **state) {
    (void)state;
    static const struct { const char *flag, *value, *key, *want; } cases[] = {
        {"--cpu", NULL, "use_cpu", "true"},
        {"--use_cpu", NULL, "use_cpu", "true"},
        {"--multi_gpu", NULL, "distributed_type", "MULTI_GPU"},
        {"--tpu", NULL, "distributed_type", "XLA"},
        {"--use_deepspeed", NULL, "distributed_type", "DEEPSPEED"},
        {"--use_fsdp", NULL, "distributed_type", "FSDP"},
        {"--use_megatron_lm", NULL, "distributed_type", "MEGATRON_LM"},
        {"--mixed_precision", "bf16", "mixed_precision", "bf16"},
        {"--num_processes", "4", "num_processes", "4"},
        {"--num_machines", "2", "num_machines", "2"},
        {"--machine_rank", "0", "machine_rank", "0"},
        {"--main_process_ip", "10.1.2.3", "main_process_ip", "10.1.2.3"},
        {"--main_process_port", "29400", "main_process_port", "29400"},
        {"--gpu_ids", "0,1", "gpu_ids", "0,1"},
        {"--gradient_accumulation_steps", "4", "gradient_accumulation_steps", "4"},
        {"--gradient_clipping", "1.0", "gradient_clipping", "1.0"},
        {"--debug", NULL, "debug", "true"},
        {"--downcast_bf16", NULL, "downcast_bf16", "true"},
        {"--rdzv_backend", "c10d", "rdzv_backend", "c10d"},
        {"--same_network", NULL, "same_network", "true"},
        {"--enable_cpu_affinity", NULL, "enable_cpu_affinity", "true"},
        {"--num_cpu_threads_per_process", "3", "num_cpu_threads_per_process", "3"},
        {"--dynamo_backend", "inductor", "dynamo_config.dynamo_backend", "inductor"},
        {"--dynamo_mode", "reduce-overhead", "dynamo_config.dynamo_mode", "reduce-overhead"},
        {"--dynamo_use_fullgraph", NULL, "dynamo_config.dynamo_use_fullgraph", "true"},
        {"--zero_stage", "1", "deepspeed_config.zero_stage", "1"},
        {"--deepspeed_config_file", "ds.json", "deepspeed_config.deepspeed_config_file", "ds.json"},
        {"--offload_optimizer_device", "cpu", "deepspeed_config.offload_optimizer_device", "cpu"},
        {"--zero3_init_flag", "true", "deepspeed_config.zero3_init_flag", "true"},
        {"--fsdp_sharding_strategy", "NO_SHARD", "fsdp_config.fsdp_sharding_strategy", "NO_SHARD"},
        {"--fsdp_offload_params", "true", "fsdp_config.fsdp_offload_params", "true"},
        {"--fsdp_version", "2", "fsdp_config.fsdp_version", "2"},
        {"--fsdp_transformer_layer_cls_to_wrap", "GPTJBlock", "fsdp_config.fsdp_transformer_layer_cls_to_wrap",
         "GPTJBlock"},
        {"--mpirun_hostfile", "hosts", "mpirun_config.mpirun_hostfile", "hosts"},
        {"--fp8_backend", "msamp", "fp8_config.backend", "MSAMP"},
        {"--megatron_lm_pp_degree", "2", "megatron_lm_config.megatron_lm_pp_degree", "2"},
        {"--backend", "mpi", "backend", "mpi"},
        {"--timeout", "30", "timeout", "30"},
        {"--bucket_cap_mb", "10", "bucket_cap_mb", "10"},
        {"--comm_hook", "FP16", "comm_hook", "fp16"},
        {"--allow_unknown_keys", NULL, "allow_unknown_keys", "true"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int form = 0; form < 3; form++) {
            if (!cases[i].value && form == 1) continue;
            char a1[256], a2[256];
            char *argv[5] = {"prog", a1, NULL, NULL, NULL};
            int argc = 2;
            const char *flag = cases[i].flag;
            char hyph[128];
            if (form == 2) {
                /* Accelerate also takes --num-processes */
                snprintf(hyph, sizeof hyph, "--%s", flag + 2);
                for (char *p = hyph + 2; *p; p++)
                    if (*p == '_') *p = '-';
                flag = hyph;
            }
            if (cases[i].value && form != 1) {
                snprintf(a1, sizeof a1, "%s", flag);
                snprintf(a2, sizeof a2, "%s", cases[i].value);
                argv[2] = a2;
                argc = 3;
            } else if (cases[i].value) {
                snprintf(a1, sizeof a1, "%s=%s", flag, cases[i].value);
            } else {
                snprintf(a1, sizeof a1, "%s", flag);
            }
            ca_config *c = new_config();
            assert_ok(ca_config_apply_args(c, argc, argv));
            const char *got = ca_config_get(c, cases[i].key);
            if (!got || strcmp(got, cases[i].want) != 0)
                fail_msg("%s %s gave %s='%s', expected '%s'", a1, argc == 3 ? a2 : "", cases[i].key,
                         got ? got : "(null)", cases[i].want);
            assert_string_equal(ca_config_origin(c, cases[i].key), cases[i].flag);
            assert_int_equal(ca_config_source_of(c, cases[i].key), CA_SRC_CLI);
            ca_config_destroy(c);
        }
    }
}

static void test_flags_program_args_and_errors(void **state) {
    (void)state;
    ca_config *c = new_config();
    /* the program's own arguments are skipped, "--" ends ours, bool flags take =false */
    char *argv[] = {"prog", "--epochs", "3", "input.txt", "--use_cpu=false", "-v", "--debug", "--",
                    "--mixed_precision", "fp16", NULL};
    assert_ok(ca_config_apply_args(c, 10, argv));
    assert_string_equal(ca_config_get(c, "use_cpu"), "false");
    assert_int_equal(ca_config_source_of(c, "use_cpu"), CA_SRC_CLI);
    assert_string_equal(ca_config_get(c, "debug"), "true");
    assert_string_equal(ca_config_get(c, "mixed_precision"), "no");
    /* --config_file is consumed with its value but sets no key */
    char *argv2[] = {"prog", "--config_file", "x.yaml", "--num_processes", "2", NULL};
    assert_ok(ca_config_apply_args(c, 5, argv2));
    assert_string_equal(ca_config_get(c, "num_processes"), "2");

    char *bad[] = {"prog", "--mixed_precision", "fp9", NULL};
    assert_status(ca_config_apply_args(c, 3, bad), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "--mixed_precision: invalid value 'fp9' for key 'mixed_precision'");
    assert_contains(ca_last_error(), "no, fp16, bf16, fp8");
    char *bad2[] = {"prog", "--num_processes=", NULL};
    assert_ok(ca_config_apply_args(c, 2, bad2));   /* empty = null, like an unset value */
    assert_string_equal(ca_config_get(c, "num_processes"), "null");
    char *bad3[] = {"prog", "--num_processes", NULL};
    assert_status(ca_config_apply_args(c, 2, bad3), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "--num_processes needs a value");
    char *bad4[] = {"prog", "--num_processes", "--cpu", NULL};
    assert_status(ca_config_apply_args(c, 3, bad4), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "--num_processes needs a value");
    char *bad5[] = {"prog", "--cpu", "--multi_gpu", NULL};
    assert_status(ca_config_apply_args(c, 3, bad5), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "--cpu and --multi_gpu cannot be used together");
    char *bad6[] = {"prog", "--debug=perhaps", NULL};
    assert_status(ca_config_apply_args(c, 2, bad6), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "--debug");
    char *ok[] = {"prog", "--cpu", "--use_cpu", NULL};
    assert_ok(ca_config_apply_args(c, 3, ok));
    ca_config_destroy(c);
}

static void test_flag_arity(void **state) {
    (void)state;
    assert_int_equal(ca_config_flag_arity("--mixed_precision"), 1);
    assert_int_equal(ca_config_flag_arity("--mixed_precision=bf16"), 0);
    assert_int_equal(ca_config_flag_arity("--mixed-precision"), 1);
    assert_int_equal(ca_config_flag_arity("--config_file"), 1);
    assert_int_equal(ca_config_flag_arity("--num_processes"), 1);
    assert_int_equal(ca_config_flag_arity("--cpu"), 0);
    assert_int_equal(ca_config_flag_arity("--use_cpu=true"), 0);
    assert_int_equal(ca_config_flag_arity("--multi_gpu"), 0);
    assert_int_equal(ca_config_flag_arity("--allow_unknown_keys"), 0);
    assert_int_equal(ca_config_flag_arity("--fsdp_offload_params"), 1);
    assert_int_equal(ca_config_flag_arity("--epochs"), -1);
    assert_int_equal(ca_config_flag_arity("-v"), -1);
    assert_int_equal(ca_config_flag_arity("--"), -1);
    assert_int_equal(ca_config_flag_arity("mixed_precision"), -1);
    assert_int_equal(ca_config_flag_arity(""), -1);
    assert_int_equal(ca_config_flag_arity(NULL), -1);
}

/* ------------------------------------------------------------------ combinations */

static void test_contradictions(void **state) {
    (void)state;
    /* one layer: an error naming both origins */
    const char *path = ct_write("contra.yaml", "distributed_type: MULTI_GPU\nnum_processes: 2\nuse_cpu: true\n");
    char file[512];
    snprintf(file, sizeof file, "%s", path);
    char *argv[] = {"prog", "--config_file", file, NULL};
    ca_config *c = new_config();
    assert_status(ca_config_load(c, NULL, 3, argv), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "use_cpu: true");
    assert_contains(ca_last_error(), "contra.yaml:3");
    assert_contains(ca_last_error(), "distributed_type: MULTI_GPU");
    assert_contains(ca_last_error(), "contra.yaml:1");
    ca_config_destroy(c);

    /* a higher layer settles it: --cpu over the file's MULTI_GPU gives MULTI_CPU */
    path = ct_write("gpu.yaml", "distributed_type: MULTI_GPU\nnum_processes: 2\n");
    snprintf(file, sizeof file, "%s", path);
    char *argv2[] = {"prog", "--config_file", file, "--cpu", NULL};
    c = new_config();
    ca_log_set_level(CA_LOG_OFF);
    assert_ok(ca_config_load(c, NULL, 4, argv2));
    ca_settings st;
    assert_ok(ca_config_settings(c, &st));
    assert_true(st.use_cpu);
    assert_int_equal(st.distributed_type, CA_DIST_MULTI_CPU);
    assert_string_equal(st.distributed_type_name, "MULTI_CPU");
    ca_config_destroy(c);

    /* ... with one process it is NO */
    c = new_config();
    assert_ok(ca_config_set(c, "distributed_type", "MULTI_GPU", CA_SRC_FILE, "f.yaml:1"));
    assert_ok(ca_config_set(c, "use_cpu", "true", CA_SRC_ENV, "env ACCELERATE_USE_CPU"));
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.distributed_type, CA_DIST_NO);
    assert_true(st.use_cpu);
    /* sharded data parallelism runs on CPUs too: FSDP with use_cpu stays FSDP */
    assert_ok(ca_config_set(c, "distributed_type", "FSDP", CA_SRC_ENV, "env ACCELERATE_USE_FSDP"));
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.distributed_type, CA_DIST_FSDP);
    assert_true(st.use_cpu);
    /* --multi_gpu over ACCELERATE_USE_CPU: the GPUs */
    assert_ok(ca_config_set(c, "distributed_type", "MULTI_GPU", CA_SRC_CLI, "--multi_gpu"));
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.distributed_type, CA_DIST_MULTI_GPU);
    assert_false(st.use_cpu);
    ca_log_set_level(CA_LOG_WARNING);
    ca_config_destroy(c);

    /* use_cpu with MULTI_CPU is no contradiction */
    c = new_config();
    assert_ok(ca_config_set(c, "distributed_type", "MULTI_CPU", CA_SRC_FILE, "f.yaml:1"));
    assert_ok(ca_config_set(c, "use_cpu", "true", CA_SRC_FILE, "f.yaml:2"));
    assert_ok(ca_config_set(c, "num_processes", "4", CA_SRC_FILE, "f.yaml:3"));
    assert_ok(ca_config_load(c, NULL, 0, NULL));
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.distributed_type, CA_DIST_MULTI_CPU);
    assert_int_equal(st.num_processes, 4);
    ca_config_destroy(c);

    /* machine_rank must be below num_machines; num_processes at least num_machines */
    c = new_config();
    char *argv3[] = {"prog", "--num_machines", "2", "--machine_rank", "2", NULL};
    assert_status(ca_config_load(c, NULL, 5, argv3), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "machine_rank 2 (--machine_rank)");
    assert_contains(ca_last_error(), "num_machines 2 (--num_machines)");
    ca_config_destroy(c);
    c = new_config();
    char *argv4[] = {"prog", "--num_machines", "4", "--num_processes", "2", NULL};
    assert_status(ca_config_load(c, NULL, 5, argv4), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "num_processes 2 (--num_processes)");
    ca_config_destroy(c);

    /* SageMaker's distributed types need the SageMaker environment */
    c = new_config();
    char *argv5[] = {"prog", NULL};
    assert_ok(ca_config_set(c, "distributed_type", "DATA_PARALLEL", CA_SRC_PROGRAM, NULL));
    assert_status(ca_config_load(c, NULL, 1, argv5), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "compute_environment");
    assert_ok(ca_config_set(c, "compute_environment", "AMAZON_SAGEMAKER", CA_SRC_PROGRAM, NULL));
    assert_ok(ca_config_load(c, NULL, 1, argv5));
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.distributed_type, CA_DIST_OTHER);
    ca_config_destroy(c);
}

static void test_settings_view(void **state) {
    (void)state;
    ca_config *c = new_config();
    assert_ok(ca_config_set(c, "mixed_precision", "fp8", CA_SRC_FILE, "f.yaml:1"));
    assert_ok(ca_config_set(c, "distributed_type", "DEEPSPEED", CA_SRC_FILE, "f.yaml:2"));
    assert_ok(ca_config_set(c, "deepspeed_config.gradient_accumulation_steps", "4", CA_SRC_FILE, "f.yaml:4"));
    assert_ok(ca_config_set(c, "deepspeed_config.gradient_clipping", "0.5", CA_SRC_FILE, "f.yaml:5"));
    assert_ok(ca_config_set(c, "gpu_ids", "all", CA_SRC_FILE, "f.yaml:6"));
    assert_ok(ca_config_set(c, "main_process_ip", "127.0.0.1", CA_SRC_FILE, "f.yaml:7"));
    assert_ok(ca_config_set(c, "backend", "NCCL", CA_SRC_FILE, "f.yaml:8"));
    assert_ok(ca_config_set(c, "even_batches", "false", CA_SRC_FILE, "f.yaml:9"));
    assert_ok(ca_config_set(c, "num_cpu_threads_per_process", "4", CA_SRC_FILE, "f.yaml:10"));
    ca_settings st;
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.mixed_precision, CA_MP_FP8);
    assert_int_equal(st.distributed_type, CA_DIST_DEEPSPEED);
    assert_int_equal(st.gradient_accumulation_steps, 4);
    assert_true(fabs(st.gradient_clipping - 0.5) < 1e-12);
    assert_string_equal(st.gpu_ids, "all");
    assert_string_equal(st.main_process_ip, "127.0.0.1");
    assert_string_equal(st.backend, "nccl");
    assert_false(st.even_batches);
    assert_int_equal(st.num_cpu_threads_per_process, 4);
    /* the top-level key, once set, wins over deepspeed_config's */
    assert_ok(ca_config_set(c, "gradient_accumulation_steps", "2", CA_SRC_ENV, NULL));
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.gradient_accumulation_steps, 2);
    /* the old name TPU is XLA */
    assert_ok(ca_config_set(c, "distributed_type", "TPU", CA_SRC_CLI, NULL));
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.distributed_type, CA_DIST_XLA);
    assert_string_equal(st.distributed_type_name, "XLA");
    assert_ok(ca_config_set(c, "distributed_type", "MULTI_NPU", CA_SRC_CLI, NULL));
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.distributed_type, CA_DIST_OTHER);
    assert_string_equal(st.distributed_type_name, "MULTI_NPU");
    ca_config_destroy(c);
}

/* ------------------------------------------------------------------ iteration */

static void test_iteration(void **state) {
    (void)state;
    ca_config *c = new_config();
    int n0 = ca_config_count(c);
    assert_true(n0 > 30);
    ca_config_entry e;
    assert_ok(ca_config_entry_at(c, 0, &e));
    assert_string_equal(e.key, "compute_environment");
    assert_status(ca_config_entry_at(c, n0, &e), CA_ERR_INVALID);
    assert_status(ca_config_entry_at(c, -1, &e), CA_ERR_INVALID);
    /* unset sub-keys are not listed; set ones are, after their section's known keys */
    for (int i = 0; i < n0; i++) {
        assert_ok(ca_config_entry_at(c, i, &e));
        assert_null(strchr(e.key, '.'));
        assert_int_equal(e.source, CA_SRC_DEFAULT);
        if (strcmp(e.key, "mixed_precision") == 0 || strcmp(e.key, "backend") == 0) assert_true(e.supported);
        if (strcmp(e.key, "tpu_name") == 0 || strcmp(e.key, "main_training_function") == 0)
            assert_false(e.supported);
        assert_true(strcmp(e.key, "fp16") != 0 && strcmp(e.key, "dynamo_backend") != 0);
    }
    assert_ok(ca_config_set(c, "fsdp_config.fsdp_version", "2", CA_SRC_ENV, "env FSDP_VERSION"));
    assert_int_equal(ca_config_count(c), n0 + 1);
    int at = -1, at_ip = -1;
    for (int i = 0; i < ca_config_count(c); i++) {
        assert_ok(ca_config_entry_at(c, i, &e));
        if (strcmp(e.key, "fsdp_config.fsdp_version") == 0) {
            at = i;
            assert_string_equal(e.value, "2");
            assert_string_equal(e.origin, "env FSDP_VERSION");
            assert_int_equal(e.source, CA_SRC_ENV);
            assert_false(e.supported);
        }
        if (strcmp(e.key, "main_process_ip") == 0) {
            at_ip = i;
            assert_string_equal(e.value, "null");
        }
    }
    assert_true(at > at_ip && at_ip >= 0);
    /* a written, empty section is listed as {} */
    assert_ok(ca_config_set(c, "megatron_lm_config", NULL, CA_SRC_FILE, "f.yaml:9"));
    assert_int_equal(ca_config_count(c), n0 + 2);
    assert_string_equal(ca_config_get(c, "megatron_lm_config"), "{}");
    assert_string_equal(ca_config_origin(c, "megatron_lm_config"), "f.yaml:9");
    assert_status(ca_config_entry_at(NULL, 0, &e), CA_ERR_INVALID);
    assert_int_equal(ca_config_count(NULL), 0);
    ca_config_destroy(c);
}

static void test_api_misuse(void **state) {
    (void)state;
    assert_status(ca_config_create(NULL), CA_ERR_INVALID);
    ca_config *c = new_config();
    assert_status(ca_config_set(NULL, "debug", "true", CA_SRC_CLI, NULL), CA_ERR_INVALID);
    assert_status(ca_config_set(c, NULL, "true", CA_SRC_CLI, NULL), CA_ERR_INVALID);
    assert_status(ca_config_set(c, "debug", "true", (ca_config_source)9, NULL), CA_ERR_INVALID);
    assert_status(ca_config_load_file(c, NULL), CA_ERR_INVALID);
    assert_status(ca_config_apply_env(NULL, NULL), CA_ERR_INVALID);
    assert_status(ca_config_apply_args(NULL, 0, NULL), CA_ERR_INVALID);
    assert_status(ca_config_settings(c, NULL), CA_ERR_INVALID);
    assert_status(ca_config_load(NULL, NULL, 0, NULL), CA_ERR_INVALID);
    /* a NULL origin names the source */
    assert_ok(ca_config_set(c, "debug", "true", CA_SRC_CLI, NULL));
    assert_string_equal(ca_config_origin(c, "debug"), "command line");
    assert_ok(ca_config_set(c, "use_cpu", "true", CA_SRC_PROGRAM, NULL));
    assert_string_equal(ca_config_origin(c, "use_cpu"), "program");
    ca_config_destroy(c);
}

/* ------------------------------------------------------------------ file search */

static void test_default_file_search(void **state) {
    (void)state;
    char home[400], p[600];
    snprintf(home, sizeof home, "%s", getenv("HOME"));
    ca_config *c = new_config();
    /* nothing anywhere: fine */
    assert_ok(ca_config_load(c, NULL, 0, NULL));
    assert_null(ca_config_file(c));
    ca_config_destroy(c);

    /* Accelerate's default under ~/.cache/huggingface (a JSON file, as
     * `accelerate config default` writes it, under a .yaml name) */
    snprintf(p, sizeof p, "%s/.cache/huggingface/accelerate/default_config.yaml", home + strlen(ct_tmpdir()) + 1);
    ct_write(p, "{\n\t\"compute_environment\": \"LOCAL_MACHINE\",\n\t\"distributed_type\": \"NO\",\n"
                "\t\"mixed_precision\": \"fp16\",\n\t\"num_processes\": 1,\n\t\"use_cpu\": false\n}\n");
    c = new_config();
    assert_ok(ca_config_load(c, NULL, 0, NULL));
    assert_non_null(ca_config_file(c));
    assert_contains(ca_config_file(c), "huggingface/accelerate/default_config.yaml");
    assert_string_equal(ca_config_get(c, "mixed_precision"), "fp16");
    assert_contains(ca_config_origin(c, "mixed_precision"), "default_config.yaml:4");
    ca_config_destroy(c);

    /* HF_HOME moves it */
    snprintf(p, sizeof p, "%s/hf", ct_tmpdir());
    setenv("HF_HOME", p, 1);
    c = new_config();
    assert_ok(ca_config_load(c, NULL, 0, NULL));
    assert_null(ca_config_file(c));
    ca_config_destroy(c);
    ct_write("hf/accelerate/default_config.yaml", "distributed_type: NO\nmixed_precision: bf16\n");
    c = new_config();
    assert_ok(ca_config_load(c, NULL, 0, NULL));
    assert_string_equal(ca_config_get(c, "mixed_precision"), "bf16");
    ca_config_destroy(c);

    /* caccel's own default comes first */
    snprintf(p, sizeof p, "%s/xdg", ct_tmpdir());
    setenv("XDG_CONFIG_HOME", p, 1);
    ct_write("xdg/caccel/default_config.yaml", "distributed_type: NO\nmixed_precision: 'no'\n");
    c = new_config();
    assert_ok(ca_config_load(c, NULL, 0, NULL));
    assert_contains(ca_config_file(c), "xdg/caccel/default_config.yaml");
    assert_string_equal(ca_config_get(c, "mixed_precision"), "no");
    ca_config_destroy(c);

    /* then ACCELERATE_CONFIG_FILE, then --config_file */
    const char *envfile = ct_write("envfile.yaml", "distributed_type: MULTI_CPU\nnum_processes: 2\n");
    setenv("ACCELERATE_CONFIG_FILE", envfile, 1);
    c = new_config();
    assert_ok(ca_config_load(c, NULL, 0, NULL));
    assert_contains(ca_config_file(c), "envfile.yaml");
    ca_config_destroy(c);
    char cli[512];
    snprintf(cli, sizeof cli, "%s", ct_write("cli.yaml", "distributed_type: MULTI_CPU\nnum_processes: 3\n"));
    char *argv[] = {"prog", "--config_file=", cli, NULL};
    char arg[600];
    snprintf(arg, sizeof arg, "--config_file=%s", cli);
    argv[1] = arg;
    c = new_config();
    assert_ok(ca_config_load(c, NULL, 2, argv));
    assert_string_equal(ca_config_file(c), cli);
    assert_string_equal(ca_config_get(c, "num_processes"), "3");
    ca_config_destroy(c);

    /* the program's config_file setting: below ACCELERATE_CONFIG_FILE and --config_file */
    char prog[512];
    snprintf(prog, sizeof prog, "%s", ct_write("prog.yaml", "distributed_type: MULTI_CPU\nnum_processes: 5\n"));
    char setting[600];
    snprintf(setting, sizeof setting, "config_file=%s", prog);
    const char *settings[] = {setting, "debug=true", NULL};
    c = new_config();
    assert_ok(ca_config_load(c, settings, 0, NULL));
    assert_contains(ca_config_file(c), "envfile.yaml");
    ca_config_destroy(c);
    unsetenv("ACCELERATE_CONFIG_FILE");
    c = new_config();
    assert_ok(ca_config_load(c, settings, 0, NULL));
    assert_string_equal(ca_config_file(c), prog);
    assert_string_equal(ca_config_get(c, "num_processes"), "5");
    assert_string_equal(ca_config_get(c, "debug"), "true");
    assert_null(ca_config_get(c, "config_file"));
    ca_config_destroy(c);
    c = new_config();
    assert_ok(ca_config_load(c, settings, 2, argv));
    assert_string_equal(ca_config_file(c), cli);
    ca_config_destroy(c);
    const char *missing[] = {"config_file=/nonexistent/prog.yaml", NULL};
    c = new_config();
    assert_status(ca_config_load(c, missing, 0, NULL), CA_ERR_IO);
    assert_contains(ca_last_error(), "/nonexistent/prog.yaml");
    assert_contains(ca_last_error(), "config_file setting");
    ca_config_destroy(c);

    /* a missing explicit file is an error naming it */
    char *argv2[] = {"prog", "--config_file", "/nonexistent/cfg.yaml", NULL};
    c = new_config();
    assert_status(ca_config_load(c, NULL, 3, argv2), CA_ERR_IO);
    assert_contains(ca_last_error(), "/nonexistent/cfg.yaml");
    assert_contains(ca_last_error(), "--config_file");
    ca_config_destroy(c);
    setenv("ACCELERATE_CONFIG_FILE", "/nonexistent/env.yaml", 1);
    c = new_config();
    assert_status(ca_config_load(c, NULL, 0, NULL), CA_ERR_IO);
    assert_contains(ca_last_error(), "/nonexistent/env.yaml");
    assert_contains(ca_last_error(), "ACCELERATE_CONFIG_FILE");
    ca_config_destroy(c);
    ct_clean_env();
}

/* ------------------------------------------------------------------ unknown-key switch */

static void test_unknown_key_switch(void **state) {
    (void)state;
    char file[512];
    snprintf(file, sizeof file, "%s", ct_write("newer.yaml", "distributed_type: NO\n"
                                                             "mixed_precision: bf16\n"
                                                             "future_key: 3\n"));
    char *argv[] = {"prog", "--config_file", file, NULL};
    ca_config *c = new_config();
    assert_status(ca_config_load(c, NULL, 3, argv), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "newer.yaml");
    assert_contains(ca_last_error(), "'future_key' (line 3");
    ca_config_destroy(c);

    /* the variable: read before the file */
    setenv("CACCEL_ALLOW_UNKNOWN_KEYS", "1", 1);
    c = new_config();
    ct_capture_begin();
    ca_status s = ca_config_load(c, NULL, 3, argv);
    char *log = ct_capture_end();
    assert_ok(s);
    assert_contains(log, "future_key");
    assert_contains(log, "warning");
    free(log);
    assert_string_equal(ca_config_get(c, "future_key"), "3");
    assert_string_equal(ca_config_get(c, "mixed_precision"), "bf16");
    assert_string_equal(ca_config_origin(c, "allow_unknown_keys"), "env CACCEL_ALLOW_UNKNOWN_KEYS");
    ca_config_destroy(c);
    unsetenv("CACCEL_ALLOW_UNKNOWN_KEYS");

    /* the flag, anywhere in argv */
    char *argv2[] = {"prog", "--config_file", file, "--allow_unknown_keys", NULL};
    c = new_config();
    ca_log_set_level(CA_LOG_OFF);
    assert_ok(ca_config_load(c, NULL, 4, argv2));
    assert_string_equal(ca_config_origin(c, "allow_unknown_keys"), "--allow_unknown_keys");
    ca_config_destroy(c);
    char *argv3[] = {"prog", "--allow-unknown-keys=true", "--config_file", file, NULL};
    c = new_config();
    assert_ok(ca_config_load(c, NULL, 4, argv3));
    ca_config_destroy(c);

    /* the program setting */
    const char *settings[] = {"allow_unknown_keys=true", NULL};
    c = new_config();
    assert_ok(ca_config_load(c, settings, 3, argv));
    ca_config_entry e;
    bool found = false;
    for (int i = 0; i < ca_config_count(c); i++) {
        assert_ok(ca_config_entry_at(c, i, &e));
        if (strcmp(e.key, "future_key") == 0) {
            found = true;
            assert_false(e.supported);
            assert_contains(e.origin, "newer.yaml:3");
            assert_int_equal(e.source, CA_SRC_FILE);
        }
    }
    assert_true(found);
    ca_config_destroy(c);

    /* a higher layer saying false beats the program's true */
    setenv("CACCEL_ALLOW_UNKNOWN_KEYS", "0", 1);
    c = new_config();
    assert_status(ca_config_load(c, settings, 3, argv), CA_ERR_CONFIG);
    ca_config_destroy(c);
    unsetenv("CACCEL_ALLOW_UNKNOWN_KEYS");
    setenv("CACCEL_ALLOW_UNKNOWN_KEYS", "perhaps", 1);
    c = new_config();
    assert_status(ca_config_load(c, NULL, 3, argv), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "env CACCEL_ALLOW_UNKNOWN_KEYS");
    ca_config_destroy(c);
    unsetenv("CACCEL_ALLOW_UNKNOWN_KEYS");
    ca_log_set_level(CA_LOG_WARNING);
}

/* ------------------------------------------------------------------ default report */

static void test_defaults_logged_once(void **state) {
    (void)state;
    char file[512];
    snprintf(file, sizeof file, "%s", ct_write("few.yaml", "distributed_type: MULTI_CPU\nnum_processes: 2\n"));
    char *argv[] = {"prog", "--config_file", file, "--mixed_precision", "bf16", NULL};
    ca_config *c = new_config();
    ca_log_set_level(CA_LOG_INFO);
    ct_capture_begin();
    ca_status s = ca_config_load(c, NULL, 5, argv);
    char *log = ct_capture_end();
    ca_log_set_level(CA_LOG_WARNING);
    assert_ok(s);
    assert_contains(log, "info");
    assert_contains(log, "using defaults");
    assert_contains(log, "use_cpu=false");
    assert_contains(log, "timeout=1800");
    assert_contains(log, "gradient_accumulation_steps=1");
    assert_not_contains(log, "mixed_precision=");
    assert_not_contains(log, "num_processes=");
    assert_not_contains(log, "distributed_type=");
    /* one line, not one per key */
    const char *first = strstr(log, "using defaults");
    assert_null(strstr(first + 1, "using defaults"));
    free(log);
    /* at the default level (WARNING) nothing is printed */
    ca_config_destroy(c);
    c = new_config();
    ct_capture_begin();
    s = ca_config_load(c, NULL, 5, argv);
    log = ct_capture_end();
    assert_ok(s);
    assert_string_equal(log, "");
    free(log);
    ca_config_destroy(c);
}

/* ------------------------------------------------------------------ keys without effect */

/* Logs the warnings for `c` and returns them (malloc'd); *n gets their number. */
static char *warnings_of(const ca_config *c, int *n) {
    ca_log_set_level(CA_LOG_WARNING);
    ct_capture_begin();
    ca_status s = ca_config_warn_ignored(c, n);
    char *log = ct_capture_end();
    assert_ok(s);
    return log;
}

/* The examples of settings that used to pass in silence: each warns once,
 * naming the key, where it came from and why. */
static void test_ignored_settings_warn(void **state) {
    (void)state;
    static const struct {
        const char *argv1, *argv2, *env, *file, *want, *want2;
    } cases[] = {
        {"--zero_stage", "3", NULL, NULL,
         "--zero_stage: deepspeed_config.zero_stage = 3 has no effect: no effect with distributed_type NO (", NULL},
        {"--fsdp_sharding_strategy", "FULL_SHARD", NULL, "distributed_type: MULTI_CPU\nnum_processes: 2\n",
         "--fsdp_sharding_strategy: fsdp_config.fsdp_sharding_strategy = FULL_SHARD has no effect: sharded data "
         "parallelism (FSDP) acts only under distributed_type FSDP; with distributed_type MULTI_CPU (",
         "ign.yaml:1) training is plain data parallel"},
        {"--fsdp_sharding_strategy", "FULL_SHARD", NULL, "distributed_type: NO\n", "no effect with distributed_type NO (",
         "ign.yaml:1)"},
        {"--dynamo_backend", "inductor", NULL, NULL,
         "--dynamo_backend: dynamo_config.dynamo_backend = inductor has no effect: torch.compile has no counterpart", NULL},
        {NULL, NULL, NULL, "distributed_type: NO\ndynamo_backend: INDUCTOR\n",
         "ign.yaml:2 (dynamo_backend): dynamo_config.dynamo_backend = inductor has no effect", NULL},
        /* tensor parallelism runs (the device mesh), and with it the data-parallel sizes lay out its groups */
        {NULL, NULL, "PARALLELISM_CONFIG_TP_SIZE", NULL, NULL, NULL},
        {"--parallelism_config_dp_replicate_size", "2", NULL,
         "distributed_type: MULTI_CPU\nparallelism_config:\n  parallelism_config_tp_size: 2\n", NULL, NULL},
        /* context parallelism runs too (the device mesh's cp dimension) */
        {NULL, NULL, NULL, "distributed_type: NO\nparallelism_config:\n  cp_size: 2\n", NULL, NULL},
        /* sizes of 1 ask for nothing */
        {NULL, NULL, NULL, "distributed_type: MULTI_CPU\nnum_processes: 2\nparallelism_config:\n"
         "  parallelism_config_dp_replicate_size: 1\n  parallelism_config_tp_size: 1\n  sp_size: 1\n", NULL, NULL},
        {"--parallelism_config_dp_shard_size", "2", NULL, "distributed_type: MULTI_CPU\nnum_processes: 2\n",
         "--parallelism_config_dp_shard_size: parallelism_config.parallelism_config_dp_shard_size = 2 has no "
         "effect: sharded data parallelism (FSDP) acts only under distributed_type FSDP", NULL},
        {"--parallelism_config_sp_attn_implementation", "sdpa", NULL, NULL,
         "parallelism_config_sp_attn_implementation = sdpa has no effect: it tunes sequence parallelism", NULL},
        {"--enable_cpu_affinity", NULL, NULL, NULL, NULL, NULL},   /* binds each local rank (comm/affinity.c) */
        {"--mpirun_hostfile", "hosts", NULL, NULL, NULL, NULL},   /* caccel launch runs mpirun with it */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ct_clean_env();
        char file[512] = "";
        if (cases[i].file) snprintf(file, sizeof file, "%s", ct_write("ign.yaml", cases[i].file));
        char *argv[8] = {"prog"};
        int argc = 1;
        if (cases[i].file) { argv[argc++] = "--config_file"; argv[argc++] = file; }
        if (cases[i].argv1) argv[argc++] = (char *)cases[i].argv1;
        if (cases[i].argv2) argv[argc++] = (char *)cases[i].argv2;
        if (cases[i].env) setenv(cases[i].env, "2", 1);
        ca_config *c = new_config();
        ca_log_set_level(CA_LOG_OFF);   /* the unknown sub-key's own warning */
        assert_ok(ca_config_load(c, NULL, argc, argv));
        int n = -1;
        char *log = warnings_of(c, &n);
        if (!cases[i].want) {
            assert_int_equal(n, 0);   /* an unknown sub-key is reported when set, not here */
        } else {
            if (n != 1) fail_msg("case %zu: %d warnings, expected 1:\n%s", i, n, log);
            assert_contains(log, cases[i].want);
            if (cases[i].want2) assert_contains(log, cases[i].want2);
        }
        free(log);
        ca_config_destroy(c);
    }
}

/* Accelerate's own files: a plain multi-GPU or multi-node file sets nothing
 * that goes unused (their default-valued TPU and network keys ask for nothing). */
static void test_plain_files_do_not_warn(void **state) {
    (void)state;
    static const char *const files[] = {"template_multi_gpu.yaml", "template_multi_node.yaml", "tests_0_11_0.yaml"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        ca_config *c = new_config();
        ca_log_set_level(CA_LOG_OFF);
        assert_ok(ca_config_load_file(c, ct_data(files[i])));
        int n = -1;
        char *log = warnings_of(c, &n);
        if (n != 0) fail_msg("%s: %d warnings:\n%s", files[i], n, log);
        free(log);
        ca_config_destroy(c);
    }
}

/* A value that asks for something, for a key of the documented type. */
/* A value other than the default for a key of `type`; false when there is none (an enumeration of
 * one value, such as parallelism_config_cp_backend's torch, cannot ask for anything else). */
static bool value_for(const char *type, const char *def, char *out, size_t size) {
    if (strncmp(type, "bool", 4) == 0) {
        snprintf(out, size, "%s", strcmp(def, "true") == 0 ? "false" : "true");
    } else if (strncmp(type, "int", 3) == 0 || strncmp(type, "float", 5) == 0) {
        long d = strcmp(def, "null") == 0 ? 1 : strtol(def, NULL, 10);
        const char *dots = strstr(type, "..");
        long v = d + 1;
        if (dots && v > strtol(dots + 2, NULL, 10)) v = d - 1;
        snprintf(out, size, "%ld", v);
    } else if (strncmp(type, "one of: ", 8) == 0) {
        for (const char *p = type + 8; *p && *p != '(';) {
            size_t n = strcspn(p, ", (");
            snprintf(out, size, "%.*s", (int)n, p);
            if (strcasecmp(out, def) != 0) return true;
            p += n;
            p += strspn(p, ", ");
        }
        return false;
    } else {
        snprintf(out, size, "x");   /* string, list */
    }
    return true;
}

/* Every key the documentation marks "reports" (accepted, not acted on)
 * warns once when set to a value that asks for something, with its origin:
 * a key added to the schema without a reason fails here. */
static void test_every_reported_key_warns(void **state) {
    (void)state;
    char doc[1024];
    const char *src = getenv("CACCEL_TEST_SRCDIR");
    snprintf(doc, sizeof doc, "%s/docs/CONFIGURATION.md", src && *src ? src : ".");
    FILE *f = fopen(doc, "r");
    if (!f) fail_msg("cannot open %s", doc);
    char line[1024];
    int checked = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "| `", 3) != 0 || !strstr(line, "| reports |")) continue;
        char key[128], type[512], def[128], value[128];
        if (sscanf(line, "| `%127[^`]` | %511[^|]| `%127[^`]`", key, type, def) != 3) continue;
        /* sections hold the keys; old keys become the keys checked here */
        if (strncmp(type, "section", 7) == 0 || strcmp(key, "fp16") == 0 || strcmp(key, "dynamo_backend") == 0)
            continue;
        if (!value_for(type, def, value, sizeof value)) continue;
        ca_config *c = new_config();
        ca_log_set_level(CA_LOG_OFF);
        assert_ok(ca_config_set(c, key, value, CA_SRC_CLI, "--origin-of-it"));
        int n = -1;
        char *log = warnings_of(c, &n);
        char want[300];
        snprintf(want, sizeof want, "--origin-of-it: %s = ", key);
        if (strcmp(key, "same_network") == 0) {
            /* describes the machines; caccel's launcher needs nothing from it */
            assert_int_equal(n, 0);
        } else {
            if (n != 1) fail_msg("%s = %s: %d warnings, expected 1:\n%s", key, value, n, log);
            assert_contains(log, want);
            assert_contains(log, "has no effect: ");
        }
        free(log);
        ca_config_destroy(c);
        checked++;
    }
    fclose(f);
    assert_true(checked >= 85);   /* the table parsed: most keys still only report */
}

/* The accelerator warns at creation (rank 0, once). */
static void test_accelerator_warns_ignored(void **state) {
    (void)state;
    char *argv[] = {"prog", "--cpu", "--zero_stage", "3", NULL};
    ca_options o = {.argc = 4, .argv = argv};
    ca_accelerator *acc = NULL;
    ca_log_set_level(CA_LOG_WARNING);
    ct_capture_begin();
    ca_status s = ca_accelerator_create(&o, &acc);
    char *log = ct_capture_end();
    assert_ok(s);
    assert_contains(log, "--zero_stage: deepspeed_config.zero_stage = 3 has no effect");
    const char *first = strstr(log, "zero_stage = 3");
    assert_null(strstr(first + 1, "zero_stage = 3"));
    free(log);
    ca_accelerator_destroy(acc);
}

/* Accelerate's ParallelismConfig keys (1.10+): every variable its launcher sets and every flag it
 * takes, with its origin; the field names alone are the same keys, the origin naming the spelling. */
static void test_parallelism_config_keys(void **state) {
    (void)state;
    static const struct { const char *name, *value, *want; } keys[] = {
        {"dp_replicate_size", "2", "2"}, {"dp_shard_size", "4", "4"}, {"tp_size", "2", "2"},
        {"cp_size", "1", "1"}, {"cp_backend", "torch", "torch"}, {"cp_comm_strategy", "alltoall", "alltoall"},
        {"sp_size", "2", "2"}, {"sp_backend", "deepspeed", "deepspeed"}, {"sp_seq_length", "4096", "4096"},
        {"sp_seq_length_is_variable", "False", "false"}, {"sp_attn_implementation", "sdpa", "sdpa"},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char key[128], var[128], env[160], flag[128], alias[128], origin[160];
        snprintf(key, sizeof key, "parallelism_config.parallelism_config_%s", keys[i].name);
        snprintf(var, sizeof var, "PARALLELISM_CONFIG_%s", keys[i].name);
        for (char *p = var; *p; p++) *p = (char)toupper((unsigned char)*p);
        /* the environment */
        snprintf(env, sizeof env, "%s=%s", var, keys[i].value);
        char *envp[] = {env, NULL};
        ca_config *c = new_config();
        assert_ok(ca_config_apply_env(c, envp));
        assert_string_equal(ca_config_get(c, key), keys[i].want);
        snprintf(origin, sizeof origin, "env %s", var);
        assert_string_equal(ca_config_origin(c, key), origin);
        ca_config_destroy(c);
        /* the flag, as accelerate launch takes it */
        snprintf(flag, sizeof flag, "--parallelism_config_%s=%s", keys[i].name, keys[i].value);
        char *argv[] = {"prog", "--use_parallelism_config", flag, NULL};
        c = new_config();
        assert_ok(ca_config_apply_args(c, 3, argv));
        assert_string_equal(ca_config_get(c, key), keys[i].want);
        snprintf(origin, sizeof origin, "--parallelism_config_%s", keys[i].name);
        assert_string_equal(ca_config_origin(c, key), origin);
        assert_int_equal(ca_config_flag_arity(flag), 0);
        ca_config_destroy(c);
        /* the other spelling: the same key; read back under either name */
        snprintf(alias, sizeof alias, "parallelism_config.%s", keys[i].name);
        c = new_config();
        assert_ok(ca_config_set(c, alias, keys[i].value, CA_SRC_PROGRAM, "program"));
        assert_string_equal(ca_config_get(c, key), keys[i].want);
        assert_string_equal(ca_config_get(c, alias), keys[i].want);
        snprintf(origin, sizeof origin, "program (%s)", alias);
        assert_string_equal(ca_config_origin(c, key), origin);
        ca_config_destroy(c);
    }
    assert_int_equal(ca_config_flag_arity("--use_parallelism_config"), 0);
    assert_int_equal(ca_config_flag_arity("--parallelism_config_tp_size"), 1);
    /* Accelerate's values are checked */
    ca_config *c = new_config();
    assert_status(ca_config_set(c, "parallelism_config.parallelism_config_cp_backend", "ring", CA_SRC_CLI, "--x"),
                  CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "(allowed: torch)");
    assert_status(ca_config_set(c, "parallelism_config.tp_size", "0", CA_SRC_CLI, "--x"), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "--x (parallelism_config.tp_size): invalid value '0' for key "
                                     "'parallelism_config.parallelism_config_tp_size'");
    ca_config_destroy(c);
}

/* What caccel cannot run yet is refused by ca_accelerator_create, every dimension named with its key,
 * value and origin; sizes of 1 and the data-parallel sizes run. */
static void test_parallelism_refused(void **state) {
    (void)state;
    char *argv[] = {"prog", "--cpu", "--parallelism_config_tp_size", "2", "--parallelism_config_sp_size=4", NULL};
    setenv("PARALLELISM_CONFIG_CP_SIZE", "1", 1);
    ca_options o = {.argc = 5, .argv = argv};
    ca_accelerator *acc = NULL;
    ca_log_set_level(CA_LOG_OFF);
    assert_status(ca_accelerator_create(&o, &acc), CA_ERR_UNSUPPORTED);
    assert_null(acc);
    assert_not_contains(ca_last_error(), "asks for tensor parallelism");   /* the device mesh runs it */
    assert_contains(ca_last_error(), "--parallelism_config_sp_size: parallelism_config.parallelism_config_sp_size "
                                     "= 4 asks for sequence parallelism");
    assert_contains(ca_last_error(), "not supported yet");
    assert_not_contains(ca_last_error(), "asks for context parallelism");   /* the device mesh runs it too */
    setenv("PARALLELISM_CONFIG_CP_SIZE", "3", 1);   /* the device mesh runs it: 3 processes are needed */
    char *argv2[] = {"prog", "--cpu", NULL};
    ca_options o2 = {.argc = 2, .argv = argv2};
    assert_status(ca_accelerator_create(&o2, &acc), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "x parallelism_config_cp_size 3 (env PARALLELISM_CONFIG_CP_SIZE) x "
                                     "parallelism_config_tp_size 1 (default) = 3 processes, but the job has 1");
    assert_not_contains(ca_last_error(), "asks for context parallelism");
    unsetenv("PARALLELISM_CONFIG_CP_SIZE");
    /* the mesh's sizes multiply to the number of processes */
    char *argv_tp[] = {"prog", "--cpu", "--parallelism_config_tp_size", "2", NULL};
    ca_options o_tp = {.argc = 4, .argv = argv_tp};
    assert_status(ca_accelerator_create(&o_tp, &acc), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "x parallelism_config_tp_size 2 (--parallelism_config_tp_size) = 2 processes, "
                                     "but the job has 1");
    char *argv3[] = {"prog", "--cpu", "--use_parallelism_config", "--parallelism_config_tp_size", "1",
                     "--parallelism_config_dp_replicate_size", "1", NULL};
    ca_options o3 = {.argc = 7, .argv = argv3};
    assert_ok(ca_accelerator_create(&o3, &acc));
    ca_accelerator_destroy(acc);
    acc = NULL;
    /* Accelerate's FSDP over dp_shard_size processes: every process, or it is refused (it was ignored) */
    char *argv4[] = {"prog", "--use_fsdp", "--parallelism_config_dp_shard_size", "2", NULL};
    ca_options o4 = {.argc = 4, .argv = argv4};
    assert_status(ca_accelerator_create(&o4, &acc), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "--parallelism_config_dp_shard_size: parallelism_config.parallelism_config_"
                                     "dp_shard_size = 2: 1 processes are not one shard group of 2");
    char *argv5[] = {"prog", "--use_fsdp", "--parallelism_config_dp_shard_size", "1", NULL};
    ca_options o5 = {.argc = 4, .argv = argv5};
    assert_ok(ca_accelerator_create(&o5, &acc));
    ca_accelerator_destroy(acc);
}

/* FSDP2's fsdp_reshard_after_forward in any spelling Accelerate's str_to_bool reads (a YAML True is the
 * text "True" here): the accelerator runs it (it refused "True" as no sharding strategy). */
static void test_fsdp2_reshard_spellings(void **state) {
    (void)state;
    static const char *const spellings[] = {"True", "yes", "FALSE", "off", "1", "SHARD_GRAD_OP"};
    ca_log_set_level(CA_LOG_OFF);
    for (size_t i = 0; i < sizeof spellings / sizeof spellings[0]; i++) {
        char *argv[] = {"prog", "--use_fsdp", "--fsdp_version", "2", "--fsdp_reshard_after_forward",
                        (char *)spellings[i], NULL};
        ca_options o = {.argc = 6, .argv = argv};
        ca_accelerator *acc = NULL;
        if (ca_accelerator_create(&o, &acc) != CA_OK)
            fail_msg("fsdp_reshard_after_forward %s: %s", spellings[i], ca_last_error());
        ca_accelerator_destroy(acc);
    }
    char *argv[] = {"prog", "--use_fsdp", "--fsdp_version", "2", "--fsdp_reshard_after_forward", "maybe", NULL};
    ca_options o = {.argc = 6, .argv = argv};
    ca_accelerator *acc = NULL;
    assert_status(ca_accelerator_create(&o, &acc), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "fsdp_config.fsdp_reshard_after_forward = maybe is not a sharding strategy");
}

/* allow_tf32 (torch's allow_tf32 for matmul, off by default) from a file or CACCEL_ALLOW_TF32 reaches
 * the settings the accelerator opens its device with. */
static void test_allow_tf32(void **state) {
    (void)state;
    ca_config *c = new_config();
    assert_ok(ca_config_set(c, "allow_tf32", "true", CA_SRC_FILE, "f.yaml:3"));
    ca_settings st;
    assert_ok(ca_config_settings(c, &st));
    assert_true(st.allow_tf32);
    ca_config_destroy(c);
    setenv("CACCEL_ALLOW_TF32", "1", 1);
    c = new_config();
    assert_ok(ca_config_load(c, NULL, 0, NULL));
    assert_string_equal(ca_config_origin(c, "allow_tf32"), "env CACCEL_ALLOW_TF32");
    assert_ok(ca_config_settings(c, &st));
    assert_true(st.allow_tf32);
    ca_config_destroy(c);
    unsetenv("CACCEL_ALLOW_TF32");
}

/* even_batches has a flag and a variable, and reaches the accelerator (its
 * dataloaders are sharded with it). */
static void test_even_batches(void **state) {
    (void)state;
    char *argv[] = {"prog", "--cpu", "--even_batches", "false", NULL};
    ca_config *c = new_config();
    assert_ok(ca_config_load(c, NULL, 4, argv));
    assert_string_equal(ca_config_get(c, "even_batches"), "false");
    assert_string_equal(ca_config_origin(c, "even_batches"), "--even_batches");
    ca_config_destroy(c);
    assert_int_equal(ca_config_flag_arity("--even_batches"), 1);

    setenv("CACCEL_EVEN_BATCHES", "0", 1);
    c = new_config();
    assert_ok(ca_config_load(c, NULL, 0, NULL));
    assert_string_equal(ca_config_get(c, "even_batches"), "false");
    assert_string_equal(ca_config_origin(c, "even_batches"), "env CACCEL_EVEN_BATCHES");
    ca_config_destroy(c);
    unsetenv("CACCEL_EVEN_BATCHES");

    ca_options o = {.argc = 4, .argv = argv};
    ca_accelerator *acc = NULL;
    assert_ok(ca_accelerator_create(&o, &acc));
    assert_false(ca_accelerator_settings(acc)->even_batches);
    ca_accelerator_destroy(acc);
    char *argv2[] = {"prog", "--cpu", NULL};
    o = (ca_options){.argc = 2, .argv = argv2};
    assert_ok(ca_accelerator_create(&o, &acc));
    assert_true(ca_accelerator_settings(acc)->even_batches);
    ca_accelerator_destroy(acc);
}

/* Accelerate's DataLoaderConfiguration: each key from a flag, a CACCEL_ variable
 * and the program, reaching the settings; data_seed seeds the shuffle only with
 * use_seedable_sampler; non_blocking warns that it does nothing. */
static void shuffled_order(const char *const *settings, bool set_seed, int64_t *ids, int64_t n) {
    char *argv[] = {"prog", "--cpu", NULL};
    ca_options o = {.argc = 2, .argv = argv, .settings = settings};
    ca_accelerator *acc = NULL;
    assert_ok(ca_accelerator_create(&o, &acc));
    int64_t y[16];
    float x[16] = {0};
    for (int64_t i = 0; i < n; i++) y[i] = i;
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 0}, ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds = NULL;
    assert_ok(ca_dataset_from_memory(&xs, x, &ys, y, n, &ds));
    ca_dataloader *dl = NULL;
    assert_ok(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = n, .shuffle = true}, &dl));
    assert_ok(ca_prepare(acc, NULL, NULL, dl));
    if (set_seed) assert_ok(ca_set_seed(acc, 1234));
    ca_batch b;
    assert_true(ca_dataloader_next(dl, &b));
    assert_ok(ca_tensor_to_host(b.y, ids, sizeof *ids * (size_t)n));
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_accelerator_destroy(acc);
}

static void test_dataloader_config(void **state) {
    (void)state;
    static const struct { const char *key, *flag_value, *var; } keys[] = {
        {"split_batches", "true", "CACCEL_SPLIT_BATCHES"},
        {"dispatch_batches", "true", "CACCEL_DISPATCH_BATCHES"},
        {"use_seedable_sampler", "true", "CACCEL_USE_SEEDABLE_SAMPLER"},
        {"data_seed", "42", "CACCEL_DATA_SEED"},
        {"non_blocking", "true", "CACCEL_NON_BLOCKING"},
    };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        char flag[64], origin[64];
        snprintf(flag, sizeof flag, "--%s", keys[i].key);
        char *argv[] = {"prog", "--cpu", flag, (char *)keys[i].flag_value, NULL};
        ca_config *c = new_config();
        assert_ok(ca_config_load(c, NULL, 4, argv));
        assert_string_equal(ca_config_get(c, keys[i].key), keys[i].flag_value);
        assert_string_equal(ca_config_origin(c, keys[i].key), flag);
        ca_config_destroy(c);
        assert_int_equal(ca_config_flag_arity(flag), 1);
        setenv(keys[i].var, keys[i].flag_value, 1);
        c = new_config();
        assert_ok(ca_config_load(c, NULL, 0, NULL));
        snprintf(origin, sizeof origin, "env %s", keys[i].var);
        assert_string_equal(ca_config_origin(c, keys[i].key), origin);
        ca_config_destroy(c);
        unsetenv(keys[i].var);
    }
    const char *prog[] = {"split_batches=true", "dispatch_batches=true", "use_seedable_sampler=true",
                          "data_seed=42", "non_blocking=true", NULL};
    char *argv[] = {"prog", "--cpu", NULL};
    ca_options o = {.argc = 2, .argv = argv, .settings = prog};
    ca_accelerator *acc = NULL;
    assert_ok(ca_accelerator_create(&o, &acc));
    const ca_settings *st = ca_accelerator_settings(acc);
    assert_true(st->split_batches && st->dispatch_batches && st->use_seedable_sampler && st->non_blocking);
    assert_int_equal(st->data_seed, 42);
    ca_accelerator_destroy(acc);

    /* non_blocking, which caccel does not act on, warns naming the origin; dispatch_batches acts */
    ca_config *c = new_config();
    ca_log_set_level(CA_LOG_OFF);
    assert_ok(ca_config_set(c, "dispatch_batches", "true", CA_SRC_CLI, "--dispatch_batches"));
    assert_ok(ca_config_set(c, "non_blocking", "true", CA_SRC_CLI, "--non_blocking"));
    int n = -1;
    char *log = warnings_of(c, &n);
    assert_int_equal(n, 1);
    assert_null(strstr(log, "dispatch_batches"));
    assert_non_null(strstr(log, "--non_blocking: non_blocking = true has no effect"));
    free(log);
    ca_config_destroy(c);

    /* data_seed: the shuffle of set_seed(1234) unless use_seedable_sampler takes data_seed */
    enum { N = 12 };
    int64_t a[N], b[N], d[N], e[N];
    const char *plain[] = {NULL};
    const char *seed_only[] = {"data_seed=99", NULL};
    const char *seedable[] = {"use_seedable_sampler=true", "data_seed=99", NULL};
    const char *as_1234[] = {"use_seedable_sampler=true", "data_seed=1234", NULL};
    shuffled_order(plain, true, a, N);
    shuffled_order(seed_only, true, b, N);
    assert_memory_equal(a, b, sizeof a);          /* without use_seedable_sampler, data_seed is unused */
    shuffled_order(seedable, true, d, N);
    assert_true(memcmp(a, d, sizeof a) != 0);     /* data_seed wins over set_seed */
    shuffled_order(as_1234, false, e, N);
    assert_memory_equal(a, e, sizeof a);          /* data_seed 1234 = set_seed(1234), no set_seed needed */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults, setup),
        cmocka_unit_test_setup(test_names, setup),
        cmocka_unit_test_setup(test_each_layer_beats_the_one_below, setup),
        cmocka_unit_test_setup(test_layers_through_loaders, setup),
        cmocka_unit_test_setup(test_load_all_layers, setup),
        cmocka_unit_test_setup(test_program_settings_errors, setup),
        cmocka_unit_test_setup(test_bad_values, setup),
        cmocka_unit_test_setup(test_value_forms, setup),
        cmocka_unit_test_setup(test_typed_getters, setup),
        cmocka_unit_test_setup(test_unknown_keys_set, setup),
        cmocka_unit_test_setup(test_legacy_keys, setup),
        cmocka_unit_test_setup(test_env_mappings, setup),
        cmocka_unit_test_setup(test_env_settings_and_errors, setup),
        cmocka_unit_test_setup(test_elastic_num_machines, setup),
        cmocka_unit_test_setup(test_rdzv_endpoint, setup),
        cmocka_unit_test_setup(test_flag_mappings, setup),
        cmocka_unit_test_setup(test_flags_program_args_and_errors, setup),
        cmocka_unit_test_setup(test_flag_arity, setup),
        cmocka_unit_test_setup(test_contradictions, setup),
        cmocka_unit_test_setup(test_settings_view, setup),
        cmocka_unit_test_setup(test_iteration, setup),
        cmocka_unit_test_setup(test_api_misuse, setup),
        cmocka_unit_test_setup(test_default_file_search, setup),
        cmocka_unit_test_setup(test_unknown_key_switch, setup),
        cmocka_unit_test_setup(test_defaults_logged_once, setup),
        cmocka_unit_test_setup(test_ignored_settings_warn, setup),
        cmocka_unit_test_setup(test_plain_files_do_not_warn, setup),
        cmocka_unit_test_setup(test_every_reported_key_warns, setup),
        cmocka_unit_test_setup(test_accelerator_warns_ignored, setup),
        cmocka_unit_test_setup(test_parallelism_config_keys, setup),
        cmocka_unit_test_setup(test_parallelism_refused, setup),
        cmocka_unit_test_setup(test_fsdp2_reshard_spellings, setup),
        cmocka_unit_test_setup(test_allow_tf32, setup),
        cmocka_unit_test_setup(test_even_batches, setup),
        cmocka_unit_test_setup(test_dataloader_config, setup),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ct_cleanup();
    return rc;
}
