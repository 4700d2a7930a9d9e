/* Tests of config files: Accelerate's own files behave as their README says; YAML and JSON details; file:line errors. */
#include "tests/config_test_util.h"

#include <dirent.h>
#include <time.h>

static ca_config *new_config(void) {
    ca_config *c = NULL;
    assert_ok(ca_config_create(&c));
    return c;
}

static int setup(void **state) {
    (void)state;
    ct_clean_env();
    ca_clear_error();
    ca_log_set_level(CA_LOG_WARNING);
    return 0;
}

static ca_config *load(const char *path) {
    ca_config *c = new_config();
    assert_ok(ca_config_load_file(c, path));
    assert_string_equal(ca_config_file(c), path);
    return c;
}

static void expect(const ca_config *c, const char *key, const char *want) {
    const char *got = ca_config_get(c, key);
    if (!got || strcmp(got, want) != 0)
        fail_msg("%s: %s is '%s', expected '%s'", ca_config_file(c), key, got ? got : "(null)", want);
}

/* ------------------------------------------------------------------ Accelerate's files */

/* Every file in the folder loads, except tests_invalid_keys.yaml, which
 * fails naming both of its unknown keys and the file. */
static void test_every_file_in_folder(void **state) {
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", ct_data(""));
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot open %s (is CACCEL_TEST_SRCDIR the source root?)", dir);
    int loaded = 0, refused = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 6 || (strcmp(de->d_name + n - 5, ".yaml") != 0 && strcmp(de->d_name + n - 5, ".json") != 0))
            continue;
        char path[2048];
        snprintf(path, sizeof path, "%s%s", dir, de->d_name);
        ca_config *c = new_config();
        ca_status s = ca_config_load_file(c, path);
        if (strcmp(de->d_name, "tests_invalid_keys.yaml") == 0) {
            if (s != CA_ERR_CONFIG) fail_msg("%s loaded; it must fail", path);
            assert_contains(ca_last_error(), path);
            assert_contains(ca_last_error(), "'invalid_key' (line 14");
            assert_contains(ca_last_error(), "'another_invalid_key' (line 15");
            /* no known key is near them: no far-fetched suggestion ('image_uri') */
            assert_not_contains(ca_last_error(), "did you mean");
            assert_contains(ca_last_hint(), "CACCEL_ALLOW_UNKNOWN_KEYS");
            refused++;
        } else {
            if (s != CA_OK) fail_msg("%s: %s", path, ca_last_error());
            ca_settings st;
            assert_ok(ca_config_settings(c, &st));
            loaded++;
        }
        ca_config_destroy(c);
    }
    closedir(d);
    assert_int_equal(refused, 1);
    assert_true(loaded >= 9);
}

/* distributed_type, num_processes, num_machines, mixed_precision, use_cpu
 * read back as written; missing keys take Accelerate's defaults. */
static void test_values_read_back(void **state) {
    (void)state;
    static const struct {
        const char *file, *dist, *np, *nm, *mp, *cpu;
        ca_distributed_type dt;
        ca_mixed_precision m;
    } cases[] = {
        {"template_deepspeed.yaml", "DEEPSPEED", "2", "1", "no", "false", CA_DIST_DEEPSPEED, CA_MP_NO},
        {"template_fsdp.yaml", "FSDP", "2", "1", "bf16", "false", CA_DIST_FSDP, CA_MP_BF16},
        {"template_multi_gpu.yaml", "MULTI_GPU", "2", "1", "bf16", "false", CA_DIST_MULTI_GPU, CA_MP_BF16},
        {"template_multi_node.yaml", "MULTI_GPU", "8", "2", "no", "false", CA_DIST_MULTI_GPU, CA_MP_NO},
        {"tests_0_11_0.yaml", "NO", "1", "1", "no", "false", CA_DIST_NO, CA_MP_NO},
        {"tests_0_28_0_mpi.yaml", "MULTI_CPU", "16", "4", "no", "true", CA_DIST_MULTI_CPU, CA_MP_NO},
        {"tests_0_34_0_fp8.yaml", "MULTI_GPU", "2", "1", "fp8", "false", CA_DIST_MULTI_GPU, CA_MP_FP8},
        {"tests_latest.yaml", "NO", "1", "1", "no", "false", CA_DIST_NO, CA_MP_NO},
        {"tests_latest_fsdp.yaml", "FSDP", "1", "1", "no", "false", CA_DIST_FSDP, CA_MP_NO},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s", ct_data(cases[i].file));
        ca_config *c = load(path);
        expect(c, "distributed_type", cases[i].dist);
        expect(c, "num_processes", cases[i].np);
        expect(c, "num_machines", cases[i].nm);
        expect(c, "mixed_precision", cases[i].mp);
        expect(c, "use_cpu", cases[i].cpu);
        ca_settings st;
        assert_ok(ca_config_settings(c, &st));
        assert_int_equal(st.distributed_type, cases[i].dt);
        assert_int_equal(st.mixed_precision, cases[i].m);
        assert_string_equal(st.distributed_type_name, cases[i].dist);
        ca_config_destroy(c);
    }
}

static void test_template_details(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s", ct_data("template_multi_node.yaml"));
    ca_config *c = load(path);
    expect(c, "machine_rank", "0");
    expect(c, "main_process_ip", "1234");   /* quoted in the file: text */
    expect(c, "main_process_port", "9999");
    expect(c, "rdzv_backend", "static");
    expect(c, "same_network", "false");
    char want[1100];
    snprintf(want, sizeof want, "%s:8", path);
    assert_string_equal(ca_config_origin(c, "main_process_port"), want);
    /* absent keys: Accelerate's defaults */
    expect(c, "use_cpu", "false");
    expect(c, "gpu_ids", "null");
    assert_string_equal(ca_config_origin(c, "gpu_ids"), "default");
    ca_settings st;
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.num_machines, 2);
    assert_int_equal(st.main_process_port, 9999);
    assert_string_equal(st.main_process_ip, "1234");
    ca_config_destroy(c);

    /* DeepSpeed: its JSON file is absent; loading keeps the name and succeeds */
    snprintf(path, sizeof path, "%s", ct_data("template_deepspeed.yaml"));
    c = load(path);
    expect(c, "deepspeed_config.deepspeed_config_file", "../deepspeed_config_templates/zero_stage1_config.json");
    expect(c, "deepspeed_config.zero3_init_flag", "false");
    expect(c, "mixed_precision", "no");   /* commented out in the file */
    ca_config_destroy(c);

    snprintf(path, sizeof path, "%s", ct_data("template_fsdp.yaml"));
    c = load(path);
    expect(c, "fsdp_config.fsdp_sharding_strategy", "FULL_SHARD");
    expect(c, "fsdp_config.fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP");
    expect(c, "fsdp_config.fsdp_state_dict_type", "SHARDED_STATE_DICT");
    expect(c, "fsdp_config.fsdp_cpu_ram_efficient_loading", "true");
    expect(c, "fsdp_config.fsdp_version", "1");   /* default */
    ca_config_destroy(c);
}

/* Keys of features caccel does not run are kept and reported (supported =
 * false), never misread. */
static void test_reported_keys(void **state) {
    (void)state;
    static const struct { const char *file, *key, *value; } cases[] = {
        {"tests_latest.yaml", "tpu_name", "test-tpu"},
        {"tests_latest.yaml", "tpu_zone", "us-central1-a"},
        {"tests_latest.yaml", "command_file", "tests/test_samples/test_command_file.sh"},
        {"tests_latest.yaml", "command", "null"},
        {"tests_latest.yaml", "megatron_lm_config", "{}"},
        {"tests_0_28_0_mpi.yaml", "ipex_config.ipex", "true"},
        {"tests_0_28_0_mpi.yaml", "mpirun_config.mpirun_ccl", "1"},
        {"tests_0_28_0_mpi.yaml", "tpu_env", "[]"},
        {"tests_0_28_0_mpi.yaml", "downcast_bf16", "false"},
        {"tests_0_34_0_fp8.yaml", "fp8_config.backend", "TE"},
        {"tests_0_34_0_fp8.yaml", "fp8_config.amax_history_len", "1024"},
        {"tests_0_34_0_fp8.yaml", "fp8_config.amax_compute_algo", "max"},
        {"tests_0_34_0_fp8.yaml", "fp8_config.override_linear_precision", "(false, false, false)"},
        {"tests_0_34_0_fp8.yaml", "fp8_config.fp8_format", "E4M3"},
        {"tests_latest_fsdp.yaml", "fsdp_config.fsdp_transformer_layer_cls_to_wrap", "BertLayer"},
        {"tests_0_11_0.yaml", "deepspeed_config", "{}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s", ct_data(cases[i].file));
        ca_config *c = load(path);
        expect(c, cases[i].key, cases[i].value);
        assert_int_equal(ca_config_source_of(c, cases[i].key), CA_SRC_FILE);
        bool listed = false;
        for (int k = 0; k < ca_config_count(c); k++) {
            ca_config_entry e;
            assert_ok(ca_config_entry_at(c, k, &e));
            if (strcmp(e.key, cases[i].key) == 0) {
                listed = true;
                if (e.supported) fail_msg("%s: %s is reported as acted on", cases[i].file, e.key);
                assert_contains(e.origin, cases[i].file);
            }
        }
        if (!listed) fail_msg("%s: %s is not listed", cases[i].file, cases[i].key);
        ca_config_destroy(c);
    }
}

/* fp8 loads; the run that needs it fails later. The typed view says fp8. */
static void test_fp8_is_kept(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s", ct_data("tests_0_34_0_fp8.yaml"));
    ca_config *c = load(path);
    ca_settings st;
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.mixed_precision, CA_MP_FP8);
    assert_string_equal(st.gpu_ids, "all");
    ca_config_destroy(c);
}

static void test_invalid_keys_with_switch(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s", ct_data("tests_invalid_keys.yaml"));
    ca_config *c = new_config();
    assert_ok(ca_config_set(c, "allow_unknown_keys", "true", CA_SRC_PROGRAM, NULL));
    ct_capture_begin();
    ca_status s = ca_config_load_file(c, path);
    char *log = ct_capture_end();
    assert_ok(s);
    assert_contains(log, "invalid_key");
    assert_contains(log, "another_invalid_key");
    /* one warning for all of them */
    assert_null(strstr(strstr(log, "warning") + 1, "warning"));
    free(log);
    expect(c, "invalid_key", "invalid_value");
    expect(c, "another_invalid_key", "another_invalid_value");
    expect(c, "distributed_type", "NO");
    ca_config_entry e;
    for (int k = 0; k < ca_config_count(c); k++) {
        assert_ok(ca_config_entry_at(c, k, &e));
        if (strstr(e.key, "invalid_key")) assert_false(e.supported);
    }
    ca_config_destroy(c);
}

/* ------------------------------------------------------------------ YAML details */

static void test_yaml_scalars_are_text(void **state) {
    (void)state;
    /* YAML 1.1 reads plain no/yes/off as booleans; the key's type decides here */
    const char *p = ct_write("scalars.yaml", "distributed_type: NO\n"
                                             "mixed_precision: no\n"
                                             "downcast_bf16: 'no'\n"
                                             "use_cpu: yes\n"
                                             "debug: off\n"
                                             "same_network: On\n"
                                             "gpu_ids: 0,1\n"
                                             "main_process_ip: ~\n"
                                             "main_process_port:\n"
                                             "main_training_function: 'null'\n"
                                             "num_processes: 1\n");
    ca_config *c = load(p);
    expect(c, "distributed_type", "NO");
    expect(c, "mixed_precision", "no");
    expect(c, "downcast_bf16", "false");
    expect(c, "use_cpu", "true");
    expect(c, "debug", "false");
    expect(c, "same_network", "true");
    expect(c, "gpu_ids", "0,1");
    expect(c, "main_process_ip", "null");
    expect(c, "main_process_port", "null");
    assert_int_equal(ca_config_source_of(c, "main_process_port"), CA_SRC_FILE);
    ca_settings st;
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.mixed_precision, CA_MP_NO);
    assert_false(st.downcast_bf16);
    assert_true(st.use_cpu);
    ca_config_destroy(c);

    /* a boolean key given an enum word fails with file:line */
    p = ct_write("badbool.yaml", "distributed_type: NO\nuse_cpu: fp16\n");
    c = new_config();
    assert_status(ca_config_load_file(c, p), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "badbool.yaml:2: invalid value 'fp16' for key 'use_cpu'");
    assert_contains(ca_last_error(), "allowed: true, false");
    ca_config_destroy(c);
}

static void test_bad_values_in_file(void **state) {
    (void)state;
    static const struct { const char *text, *want[3]; } cases[] = {
        {"distributed_type: NO\nmixed_precision: fp32\n",
         {":2: invalid value 'fp32' for key 'mixed_precision'", "allowed: no, fp16, bf16, fp8", ""}},
        {"distributed_type: MULTI-GPU\n",
         {":1: invalid value 'MULTI-GPU' for key 'distributed_type'", "MULTI_GPU", "MEGATRON_LM"}},
        {"distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 3\n",
         {":3: invalid value '3' for key 'fsdp_config.fsdp_version'", "from 1 to 2", ""}},
        {"distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: ALL\n",
         {":3:", "fsdp_config.fsdp_sharding_strategy", "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD"}},
        {"distributed_type: NO\nnum_processes: [1, 2]\n",
         {":2: key 'num_processes' takes one value, not a list", "", ""}},
        {"distributed_type: NO\nuse_cpu:\n  x: 1\n", {":2: key 'use_cpu' takes one value, not a mapping", "", ""}},
        {"distributed_type: NO\nfsdp_config: FULL_SHARD\n", {":2: key 'fsdp_config' is a section", "", ""}},
        {"distributed_type: NO\ncommands:\n  - {a: 1}\n", {":3: key 'commands': a list may only hold", "", ""}},
        {"num_processes: 1\n", {"a `distributed_type` must be specified", "allowed: NO, MULTI_CPU", ""}},
        {"", {"the file is empty", "", ""}},
        {"- a\n- b\n", {":1: expected a mapping of keys", "", ""}},
        {"distributed_type: NO\n  bad: indent\n", {"YAML syntax error", "", ""}},
        /* libyaml's reader reports a byte offset, not a line: the line is counted from it */
        {"distributed_type: NO\nuse_cpu: true\nmixed_precision: \"no\xff\xfe\"\n",
         {":3: YAML syntax error: invalid leading UTF-8 octet", "(byte 56 of the file)", ""}},
        {"distributed_type: DATA_PARALLEL\n", {":1: distributed_type 'DATA_PARALLEL' needs compute_environment "
                                               "AMAZON_SAGEMAKER", "", ""}},
        {"compute_environment: AMAZON_SAGEMAKER\ndistributed_type: MULTI_GPU\n",
         {":2: distributed_type 'MULTI_GPU' needs compute_environment LOCAL_MACHINE", "", ""}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "bad%zu.yaml", i);
        char path[512];
        snprintf(path, sizeof path, "%s", ct_write(name, cases[i].text));
        ca_config *c = new_config();
        assert_ok(ca_config_set(c, "num_machines", "3", CA_SRC_PROGRAM, "program"));
        ca_status s = ca_config_load_file(c, path);
        if (s == CA_OK) fail_msg("case %zu (%s) loaded", i, cases[i].text);
        assert_contains(ca_last_error(), name);
        for (int w = 0; w < 3; w++)
            if (cases[i].want[w][0]) assert_contains(ca_last_error(), cases[i].want[w]);
        /* nothing of a refused file is applied */
        for (int k = 0; k < ca_config_count(c); k++) {
            ca_config_entry e;
            assert_ok(ca_config_entry_at(c, k, &e));
            if (e.source == CA_SRC_FILE) fail_msg("case %zu applied %s", i, e.key);
        }
        assert_null(ca_config_file(c));
        expect(c, "num_machines", "3");
        ca_config_destroy(c);
    }
    ca_config *c = new_config();
    assert_status(ca_config_load_file(c, "/nonexistent/dir/cfg.yaml"), CA_ERR_IO);
    assert_contains(ca_last_error(), "/nonexistent/dir/cfg.yaml");
    ca_config_destroy(c);
}

static void test_legacy_keys_in_file(void **state) {
    (void)state;
    const char *p = ct_write("legacy.yaml", "compute_environment: LOCAL_MACHINE\n"
                                            "distributed_type: MULTI_GPU\n"
                                            "fp16: true\n"
                                            "dynamo_backend: INDUCTOR\n"
                                            "num_processes: 2\n");
    ca_config *c = load(p);
    expect(c, "mixed_precision", "fp16");
    assert_contains(ca_config_origin(c, "mixed_precision"), "legacy.yaml:3 (fp16: true)");
    expect(c, "dynamo_config.dynamo_backend", "inductor");
    assert_contains(ca_config_origin(c, "dynamo_config.dynamo_backend"), "legacy.yaml:4");
    assert_null(ca_config_get(c, "fp16"));
    ca_config_destroy(c);

    /* mixed_precision in the same file wins over fp16, as in Accelerate */
    p = ct_write("legacy2.yaml", "distributed_type: NO\nfp16: true\nmixed_precision: bf16\n");
    c = load(p);
    expect(c, "mixed_precision", "bf16");
    ca_config_destroy(c);
    /* dynamo_config's own key wins over the old one */
    p = ct_write("legacy3.yaml", "distributed_type: NO\ndynamo_backend: EAGER\n"
                                 "dynamo_config:\n  dynamo_backend: INDUCTOR\n");
    c = load(p);
    expect(c, "dynamo_config.dynamo_backend", "inductor");
    ca_config_destroy(c);
    /* distributed_type NO without num_processes means 1 (config_args.py) */
    p = ct_write("implied.yaml", "distributed_type: NO\n");
    c = load(p);
    expect(c, "num_processes", "1");
    assert_contains(ca_config_origin(c, "num_processes"), "implied.yaml:1");
    ca_config_destroy(c);
    p = ct_write("implied2.yaml", "distributed_type: MULTI_CPU\n");
    c = load(p);
    expect(c, "num_processes", "-1");
    ca_config_destroy(c);
}

static void test_sections_and_lists(void **state) {
    (void)state;
    const char *p = ct_write("sections.yaml",
                             "distributed_type: XLA\n"
                             "tpu_use_cluster: true\n"
                             "commands:\n  - echo \"hello\"\n  - ls -l\n"
                             "tpu_vm: [vm-1, vm-2]\n"
                             "tpu_env: []\n"
                             "fsdp_config:\n"
                             "  fsdp_sharding_strategy: 2\n"
                             "  fsdp_backward_prefetch_policy: BACKWARD_PRE\n"
                             "  fsdp_transformer_layer_cls_to_wrap: [BertLayer, BertEmbeddings]\n"
                             "  nested:\n    deeper: 1\n"
                             "deepspeed_config: null\n"
                             "additional_args: {}\n");
    ca_config *c = new_config();
    /* additional_args is SageMaker's: an unknown key in a LOCAL_MACHINE file */
    assert_status(ca_config_load_file(c, p), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "'additional_args' (line 15, only in AMAZON_SAGEMAKER files)");
    ca_config_destroy(c);
    p = ct_write("sections.yaml",
                 "distributed_type: XLA\n"
                 "tpu_use_cluster: true\n"
                 "commands:\n  - echo \"hello\"\n  - ls -l\n"
                 "tpu_vm: [vm-1, vm-2]\n"
                 "tpu_env: []\n"
                 "fsdp_config:\n"
                 "  fsdp_sharding_strategy: 2\n"
                 "  fsdp_backward_prefetch_policy: BACKWARD_PRE\n"
                 "  fsdp_transformer_layer_cls_to_wrap: [BertLayer, BertEmbeddings]\n"
                 "  nested:\n    deeper: 1\n"
                 "deepspeed_config: null\n");
    c = new_config();
    ct_capture_begin();
    ca_status s = ca_config_load_file(c, p);
    char *log = ct_capture_end();
    assert_ok(s);
    /* unknown keys inside a section: kept, reported with a suggestion */
    assert_contains(log, "fsdp_config.fsdp_backward_prefetch_policy");
    assert_contains(log, "did you mean 'fsdp_backward_prefetch'");
    assert_contains(log, "sections.yaml:10");
    free(log);
    expect(c, "commands", "[\"echo \\\"hello\\\"\", \"ls -l\"]");
    expect(c, "tpu_vm", "[\"vm-1\", \"vm-2\"]");
    expect(c, "tpu_env", "[]");
    expect(c, "fsdp_config.fsdp_sharding_strategy", "2");
    expect(c, "fsdp_config.fsdp_backward_prefetch_policy", "BACKWARD_PRE");
    expect(c, "fsdp_config.fsdp_transformer_layer_cls_to_wrap", "[\"BertLayer\", \"BertEmbeddings\"]");
    expect(c, "fsdp_config.nested.deeper", "1");
    expect(c, "deepspeed_config", "{}");
    assert_contains(ca_config_get(c, "fsdp_config"), "fsdp_sharding_strategy: 2");
    assert_contains(ca_config_origin(c, "fsdp_config"), "sections.yaml:8");
    ca_settings st;
    assert_ok(ca_config_settings(c, &st));
    assert_int_equal(st.distributed_type, CA_DIST_XLA);
    ca_config_destroy(c);
}

/* num_machines MIN:MAX in a file: quoted (what PyYAML, which reads an unquoted 2:3 as the base-60
 * number 123, and so Accelerate, keep as text) or not, and in JSON; a bad one names the file's line. */
static void test_elastic_num_machines_file(void **state) {
    (void)state;
    static const struct { const char *name, *text; } ok[] = {
        {"nm_quoted.yaml", "distributed_type: MULTI_CPU\nnum_machines: \"2:3\"\nnum_processes: 6\n"},
        {"nm_plain.yaml", "distributed_type: MULTI_CPU\nnum_machines: 2:3\nnum_processes: 6\n"},
        {"nm.json", "{\"distributed_type\": \"MULTI_CPU\", \"num_machines\": \"2:3\", \"num_processes\": 6}"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        ca_config *c = load(ct_write(ok[i].name, ok[i].text));
        expect(c, "num_machines", "2:3");
        ca_settings st;
        assert_ok(ca_config_settings(c, &st));
        assert_int_equal(st.num_machines, 3);
        assert_int_equal(st.min_machines, 2);
        ca_config_destroy(c);
    }
    const char *p = ct_write("nm_bad.yaml", "distributed_type: MULTI_CPU\nnum_machines: '0:2'\n");
    char where[600];
    snprintf(where, sizeof where, "%s:2: invalid value '0:2' for key 'num_machines'", p);
    ca_config *c = new_config();
    assert_status(ca_config_load_file(c, p), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), where);
    ca_config_destroy(c);
}

static void test_sagemaker_file(void **state) {
    (void)state;
    const char *p = ct_write("sm.yaml", "compute_environment: AMAZON_SAGEMAKER\n"
                                        "distributed_type: DATA_PARALLEL\n"
                                        "ec2_instance_type: ml.p3.2xlarge\n"
                                        "iam_role_name: role\n"
                                        "region: eu-west-1\n"
                                        "num_machines: 2\n"
                                        "mixed_precision: fp16\n"
                                        "use_cpu: false\n"
                                        "additional_args:\n  max_run: 3600\n");
    ca_config *c = new_config();
    ct_capture_begin();
    ca_status s = ca_config_load_file(c, p);
    char *log = ct_capture_end();
    assert_ok(s);
    /* additional_args is free-form: no warning */
    assert_not_contains(log, "additional_args");
    free(log);
    expect(c, "ec2_instance_type", "ml.p3.2xlarge");
    expect(c, "region", "eu-west-1");
    expect(c, "additional_args.max_run", "3600");
    expect(c, "num_processes", "-1");
    ca_config_destroy(c);

    /* ClusterConfig's keys are unknown to a SageMaker file, as in Accelerate */
    p = ct_write("sm2.yaml", "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: NO\n"
                             "num_processes: 2\nfsdp_config: {}\n");
    c = new_config();
    assert_status(ca_config_load_file(c, p), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "'num_processes' (line 3, not a key of AMAZON_SAGEMAKER files)");
    assert_contains(ca_last_error(), "'fsdp_config' (line 4");
    ca_config_destroy(c);
}

static void test_unknown_keys_all_named(void **state) {
    (void)state;
    const char *p = ct_write("typos.yaml", "distributed_type: NO\n"
                                           "mixed_precison: fp16\n"
                                           "num_proceses: 2\n"
                                           "use_cpu: true\n"
                                           "gpu_id: all\n");
    ca_config *c = new_config();
    assert_status(ca_config_load_file(c, p), CA_ERR_CONFIG);
    const char *m = ca_last_error();
    assert_contains(m, "typos.yaml: unknown keys");
    assert_contains(m, "'mixed_precison' (line 2, did you mean 'mixed_precision'?)");
    assert_contains(m, "'num_proceses' (line 3, did you mean 'num_processes'?)");
    assert_contains(m, "'gpu_id' (line 5, did you mean 'gpu_ids'?)");
    expect(c, "use_cpu", "false");
    ca_config_destroy(c);

    /* the file may carry the switch itself */
    p = ct_write("typos2.yaml", "allow_unknown_keys: true\ndistributed_type: NO\nfuture: 1\n");
    c = new_config();
    ca_log_set_level(CA_LOG_OFF);
    assert_ok(ca_config_load_file(c, p));
    ca_log_set_level(CA_LOG_WARNING);
    expect(c, "future", "1");
    ca_config_destroy(c);
}

/* ------------------------------------------------------------------ JSON */

static void test_json(void **state) {
    (void)state;
    /* by extension, with tabs (YAML refuses tabs; JSON allows them) */
    const char *text = "{\n"
                       "\t\"compute_environment\": \"LOCAL_MACHINE\",\n"
                       "\t\"distributed_type\": \"MULTI_CPU\",\n"
                       "\t\"mixed_precision\": \"no\",\n"
                       "\t\"num_processes\":4,\n"
                       "\t\"use_cpu\": true,\n"
                       "\t\"downcast_bf16\": \"no\",\n"
                       "\t\"main_process_ip\": null,\n"
                       "\t\"fsdp_config\": {},\n"
                       "\t\"deepspeed_config\": {\"zero_stage\": 1, \"offload_param_device\": \"cpu\"},\n"
                       "\t\"tpu_env\": [],\n"
                       "\t\"commands\": [\"a\", \"b\"]\n"
                       "}\n";
    const char *p = ct_write("cfg.json", text);
    char path[512];
    snprintf(path, sizeof path, "%s", p);
    ca_config *c = load(path);
    expect(c, "distributed_type", "MULTI_CPU");
    expect(c, "mixed_precision", "no");
    expect(c, "num_processes", "4");
    expect(c, "use_cpu", "true");
    expect(c, "downcast_bf16", "false");
    expect(c, "main_process_ip", "null");
    expect(c, "deepspeed_config.zero_stage", "1");
    expect(c, "deepspeed_config.offload_param_device", "cpu");
    expect(c, "commands", "[\"a\", \"b\"]");
    char want[600];
    snprintf(want, sizeof want, "%s:5", path);
    assert_string_equal(ca_config_origin(c, "num_processes"), want);
    snprintf(want, sizeof want, "%s:10", path);
    assert_string_equal(ca_config_origin(c, "deepspeed_config.zero_stage"), want);
    ca_config_destroy(c);

    /* by content, under a .yaml name (what `accelerate config default` writes) */
    p = ct_write("json_in_yaml.yaml", text);
    c = load(p);
    expect(c, "num_processes", "4");
    ca_config_destroy(c);

    /* bad values and syntax errors name file:line */
    p = ct_write("bad.json", "{\n  \"distributed_type\": \"NO\",\n  \"mixed_precision\": \"fp64\"\n}\n");
    c = new_config();
    assert_status(ca_config_load_file(c, p), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "bad.json:3: invalid value 'fp64' for key 'mixed_precision'");
    ca_config_destroy(c);
    p = ct_write("broken.json", "{\n  \"distributed_type\": \"NO\",\n  \"use_cpu\": true,,\n}\n");
    c = new_config();
    assert_status(ca_config_load_file(c, p), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "broken.json:3: JSON syntax error");
    ca_config_destroy(c);
    p = ct_write("unknown.json", "{\"distributed_type\": \"NO\", \"use_cpus\": true}");
    c = new_config();
    assert_status(ca_config_load_file(c, p), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "unknown.json: unknown key 'use_cpus' (line 1, did you mean 'use_cpu'?)");
    ca_config_destroy(c);
}

/* ------------------------------------------------------------------ limits */

/* The process's CPU time: what the load itself costs, whatever else runs on a busy machine (wall
 * time there grows with the load average and made these checks fail on a loaded 2-CPU machine). */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds a load may take before the test calls it a hang: generous, and
 * more under valgrind. */
static double bound_s(double s) { return getenv("CACCEL_UNDER_VALGRIND") ? s * 60 : s; }

/* `head`, then `open` n times, `mid`, `close` n times, then `tail`: a file
 * built at run time. Returns its path (static buffer). */
static const char *write_nested(const char *name, const char *head, const char *open, const char *mid,
                                const char *close, size_t n, const char *tail) {
    size_t len = strlen(head) + n * (strlen(open) + strlen(close)) + strlen(mid) + strlen(tail) + 1;
    char *text = malloc(len), *w = text;
    assert_non_null(text);
    w += sprintf(w, "%s", head);
    for (size_t i = 0; i < n; i++) w += sprintf(w, "%s", open);
    w += sprintf(w, "%s", mid);
    for (size_t i = 0; i < n; i++) w += sprintf(w, "%s", close);
    sprintf(w, "%s", tail);
    const char *p = ct_write(name, text);
    free(text);
    return p;
}

/* Loads `path`, which must fail within `limit_s` with a message that names
 * the file and line and says `what`. */
static void expect_refused(const char *path, int line, const char *what, double limit_s) {
    char where[600];
    snprintf(where, sizeof where, "%s:%d: ", path, line);
    ca_config *c = new_config();
    double t0 = now_s();
    ca_status s = ca_config_load_file(c, path);
    double took = now_s() - t0;
    if (s != CA_ERR_CONFIG) fail_msg("%s: %s, expected CA_ERR_CONFIG", path, ca_status_name(s));
    assert_contains(ca_last_error(), where);
    assert_contains(ca_last_error(), what);
    if (took > bound_s(limit_s)) fail_msg("%s was refused after %.2f s, not within %.1f s", path, took, limit_s);
    /* a refused file changes nothing */
    expect(c, "mixed_precision", "no");
    ca_config_destroy(c);
}

/* Deep nesting used to crash the loader (recursion) or run for minutes
 * inside libyaml: now the depth is checked as each level opens. */
static void test_nesting_limit(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s", write_nested("nest15k.yaml", "mixed_precision: fp16\ndistributed_type: NO\nx: ",
                                                   "{a: ", "1", "}", 15000, "\n"));
    expect_refused(path, 3, "nesting deeper than 32 levels, the limit for a config file", 1.0);
    snprintf(path, sizeof path, "%s", write_nested("nest100k.yaml", "distributed_type: NO\nfsdp_config:\n  x: ", "[",
                                                   "", "]", 100000, "\n"));
    expect_refused(path, 3, "nesting deeper than 32 levels", 1.0);
    /* JSON goes through the same loader */
    snprintf(path, sizeof path, "%s", write_nested("nest100k.json", "{\"distributed_type\": \"NO\",\n\"x\": ",
                                                   "{\"a\": ", "1", "}", 100000, "}\n"));
    expect_refused(path, 2, "nesting deeper than 32 levels", 1.0);
    /* a block mapping, the indented kind */
    char text[8192];
    size_t len = (size_t)sprintf(text, "distributed_type: NO\nfsdp_config:\n");
    for (int i = 0; i < 40; i++) len += (size_t)sprintf(text + len, "%*sk%d:\n", 2 * (i + 1), "", i);
    snprintf(path, sizeof path, "%s", ct_write("deep_block.yaml", text));
    expect_refused(path, 34, "nesting deeper than 32 levels", 1.0);
    /* 32 levels are fine */
    snprintf(path, sizeof path, "%s", write_nested("nest32.yaml", "distributed_type: NO\nfsdp_config: ", "{a: ", "1",
                                                   "}", 31, "\n"));
    ca_config *c = new_config();
    ca_log_set_level(CA_LOG_OFF);
    assert_ok(ca_config_load_file(c, path));
    ca_config_destroy(c);
}

/* An alias bomb (each list repeats the previous one nine times: 9^8 values
 * from 400 bytes) is refused at the alias that crosses the limit; a few
 * aliases are fine. */
static void test_alias_limit(void **state) {
    (void)state;
    char text[2048];
    size_t len = (size_t)sprintf(text, "distributed_type: NO\nfsdp_config:\n  a: &a [lol, lol, lol, lol, lol, lol, "
                                       "lol, lol, lol]\n");
    const char *prev = "a";
    static const char *const names[] = {"b", "c", "d", "e", "f", "g", "h", "i"};
    for (int i = 0; i < 8; i++) {
        len += (size_t)sprintf(text + len, "  %s: &%s [", names[i], names[i]);
        for (int k = 0; k < 9; k++) len += (size_t)sprintf(text + len, "%s*%s", k ? ", " : "", prev);
        len += (size_t)sprintf(text + len, "]\n");
        prev = names[i];
    }
    char path[512];
    snprintf(path, sizeof path, "%s", ct_write("bomb.yaml", text));
    /* b copies 90 values, c 819, d 7380: line 7 (e) crosses 10000 */
    expect_refused(path, 7, "aliases expand to more than 10000 values, the limit for a config file", 1.0);

    const char *p = ct_write("alias_ok.yaml", "distributed_type: &d NO\n"
                                              "fsdp_config:\n"
                                              "  fsdp_transformer_layer_cls_to_wrap: &l [BertLayer, Emb]\n"
                                              "  fsdp_ignored_modules: &m x\n"
                                              "deepspeed_config:\n"
                                              "  deepspeed_moe_layer_cls_names: *m\n");
    ca_config *c = new_config();
    ca_log_set_level(CA_LOG_OFF);
    assert_ok(ca_config_load_file(c, p));
    expect(c, "deepspeed_config.deepspeed_moe_layer_cls_names", "x");
    ca_config_destroy(c);
    p = ct_write("alias_bad.yaml", "distributed_type: NO\nmixed_precision: *nothing\n");
    c = new_config();
    assert_status(ca_config_load_file(c, p), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "alias_bad.yaml:2: alias '*nothing' names no anchor defined before it");
    ca_config_destroy(c);
}

/* A file over 1 MiB is refused before it is parsed. */
static void test_file_size_limit(void **state) {
    (void)state;
    size_t n = 1024 * 1024 + 100;
    char *text = malloc(n + 1);
    assert_non_null(text);
    memcpy(text, "distributed_type: NO\n", 21);
    for (size_t i = 21; i < n; i++) text[i] = (i % 100 == 0) ? '\n' : (i % 100 == 1 ? '#' : 'x');
    text[n] = '\0';
    char path[512];
    snprintf(path, sizeof path, "%s", ct_write("big.yaml", text));
    free(text);
    ca_config *c = new_config();
    assert_status(ca_config_load_file(c, path), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), path);
    assert_contains(ca_last_error(), "the file is larger than 1048576 bytes, the limit for a config file");
    ca_config_destroy(c);
}

/* A second document is an error, not ignored. */
static void test_second_document(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s", ct_write("twodocs.yaml", "distributed_type: NO\n---\nmixed_precision: fp16\n"));
    expect_refused(path, 2, "a second YAML document starts here", 1.0);
    /* one document with its markers is fine */
    const char *p = ct_write("onedoc.yaml", "---\ndistributed_type: NO\nmixed_precision: fp16\n...\n");
    ca_config *c = load(p);
    expect(c, "mixed_precision", "fp16");
    ca_config_destroy(c);
}

/* The CPU time of loading a section of n keys, checked whole. */
static double load_keys(int n) {
    size_t cap = 64 + (size_t)n * 32, len = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    len += (size_t)sprintf(text, "distributed_type: NO\nfsdp_config:\n");
    for (int i = 0; i < n; i++) len += (size_t)sprintf(text + len, "  key_%05d: %d\n", i, i);
    char path[512], name[32], last[32], want[48];
    snprintf(name, sizeof name, "keys%d.yaml", n);
    snprintf(path, sizeof path, "%s", ct_write(name, text));
    free(text);
    ca_config *c = new_config();
    ct_capture_begin();   /* one warning per key caccel does not know */
    double t0 = now_s();
    ca_status s = ca_config_load_file(c, path);
    double took = now_s() - t0;
    free(ct_capture_end());
    assert_ok(s);
    snprintf(last, sizeof last, "fsdp_config.key_%05d", n - 1);
    snprintf(want, sizeof want, "%d", n - 1);
    expect(c, last, want);
    const char *sect = ca_config_get(c, "fsdp_config");
    assert_non_null(sect);
    assert_contains(sect, "key_00000: 0, key_00001: 1");
    snprintf(want, sizeof want, "key_%05d: %d}", n - 1, n - 1);
    assert_contains(sect, want);
    ca_config_destroy(c);
    return took;
}

/* Keys in one section load in time linear in the file (10,000 took 18 s when the section's text was
 * rebuilt after each key). Judged by how the CPU time grows from n to 4n keys: 4x when
 * linear, 16x when quadratic; no absolute time, which a slow or busy machine would miss. */
static void test_many_keys_linear(void **state) {
    (void)state;
    int n = getenv("CACCEL_UNDER_VALGRIND") ? 2500 : 10000;   /* the same growth, in valgrind's time */
    double small = load_keys(n), large = load_keys(4 * n);
    print_message("  %d keys %.3f s, %d keys %.3f s of CPU\n", n, small, 4 * n, large);
    if (large > 10 * (small > 0.005 ? small : 0.005))
        fail_msg("%d keys took %.3f s of CPU, %d %.3f s: more than linear growth (x10)", 4 * n, large, n, small);
}

/* Keys and values of any length are read whole: a 1,000-byte key inside a section was cut at 510. */
static void test_long_keys_whole(void **state) {
    (void)state;
    char key[1001], value[5001], text[8000];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = '\0';
    memset(value, 'v', sizeof value - 1);
    value[sizeof value - 1] = '\0';
    snprintf(text, sizeof text, "distributed_type: NO\nfsdp_config:\n  %s: %s\n", key, value);
    char path[512];
    snprintf(path, sizeof path, "%s", ct_write("long_keys.yaml", text));
    ca_config *c = new_config();
    ct_capture_begin();   /* a warning for the key caccel does not know */
    ca_status s = ca_config_load_file(c, path);
    free(ct_capture_end());
    assert_ok(s);
    char full[1100];
    snprintf(full, sizeof full, "fsdp_config.%s", key);
    expect(c, full, value);
    ca_config_destroy(c);
}

/* A file `accelerate config` 1.10+ writes for FSDP2 with N-d parallelism: parallelism_config's keys with
 * their prefix, read with file:line; the field names alone are the same keys, the origin naming the
 * spelling; both spellings in one file must agree. */
static void test_parallelism_config_file(void **state) {
    (void)state;
    const char *path = ct_write("nd.yaml",
                                "compute_environment: LOCAL_MACHINE\n"
                                "distributed_type: FSDP\n"
                                "fsdp_config:\n"
                                "  fsdp_reshard_after_forward: true\n"
                                "  fsdp_version: 2\n"
                                "num_processes: 8\n"
                                "parallelism_config:\n"
                                "  parallelism_config_cp_size: 1\n"
                                "  parallelism_config_dp_replicate_size: 2\n"
                                "  parallelism_config_dp_shard_size: 4\n"
                                "  parallelism_config_tp_size: 1\n"
                                "  parallelism_config_sp_backend: deepspeed\n"
                                "  parallelism_config_sp_seq_length_is_variable: false\n");
    ca_config *c = new_config();
    ct_capture_begin();
    assert_ok(ca_config_load_file(c, path));
    char *log = ct_capture_end();
    assert_not_contains(log, "not a key caccel knows");   /* these keys were unknown */
    free(log);
    expect(c, "parallelism_config.parallelism_config_dp_replicate_size", "2");
    expect(c, "parallelism_config.parallelism_config_dp_shard_size", "4");
    expect(c, "parallelism_config.parallelism_config_sp_seq_length_is_variable", "false");
    char origin[600];
    snprintf(origin, sizeof origin, "%s:10", path);
    assert_string_equal(ca_config_origin(c, "parallelism_config.parallelism_config_dp_shard_size"), origin);
    ca_config_destroy(c);

    path = ct_write("nd_short.yaml", "distributed_type: FSDP\nparallelism_config:\n  dp_shard_size: 4\n"
                                     "  sp_size: 1\n  parallelism_config_sp_size: 1\n");
    c = load(path);
    expect(c, "parallelism_config.parallelism_config_dp_shard_size", "4");
    snprintf(origin, sizeof origin, "%s:3 (parallelism_config.dp_shard_size)", path);
    assert_string_equal(ca_config_origin(c, "parallelism_config.parallelism_config_dp_shard_size"), origin);
    ca_config_destroy(c);

    path = ct_write("nd_both.yaml", "distributed_type: FSDP\nparallelism_config:\n  tp_size: 2\n"
                                    "  parallelism_config_tp_size: 1\n");
    c = new_config();
    assert_status(ca_config_load_file(c, path), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "nd_both.yaml:3: 'parallelism_config.tp_size' = 2 and line 4: "
                                     "'parallelism_config.parallelism_config_tp_size' = 1 are the same key");
    expect(c, "parallelism_config.parallelism_config_tp_size", "1");   /* the file changed nothing */
    assert_int_equal(ca_config_source_of(c, "parallelism_config.parallelism_config_tp_size"), CA_SRC_DEFAULT);
    ca_config_destroy(c);

    path = ct_write("nd_bad.yaml", "distributed_type: FSDP\nparallelism_config:\n"
                                   "  parallelism_config_cp_comm_strategy: ring\n");
    c = new_config();
    assert_status(ca_config_load_file(c, path), CA_ERR_CONFIG);
    assert_contains(ca_last_error(), "nd_bad.yaml:3: invalid value 'ring' for key "
                                     "'parallelism_config.parallelism_config_cp_comm_strategy' (allowed: allgather, "
                                     "alltoall)");
    ca_config_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_every_file_in_folder, setup),
        cmocka_unit_test_setup(test_values_read_back, setup),
        cmocka_unit_test_setup(test_template_details, setup),
        cmocka_unit_test_setup(test_elastic_num_machines_file, setup),
        cmocka_unit_test_setup(test_reported_keys, setup),
        cmocka_unit_test_setup(test_fp8_is_kept, setup),
        cmocka_unit_test_setup(test_invalid_keys_with_switch, setup),
        cmocka_unit_test_setup(test_yaml_scalars_are_text, setup),
        cmocka_unit_test_setup(test_bad_values_in_file, setup),
        cmocka_unit_test_setup(test_legacy_keys_in_file, setup),
        cmocka_unit_test_setup(test_sections_and_lists, setup),
        cmocka_unit_test_setup(test_sagemaker_file, setup),
        cmocka_unit_test_setup(test_unknown_keys_all_named, setup),
        cmocka_unit_test_setup(test_json, setup),
        cmocka_unit_test_setup(test_nesting_limit, setup),
        cmocka_unit_test_setup(test_alias_limit, setup),
        cmocka_unit_test_setup(test_file_size_limit, setup),
        cmocka_unit_test_setup(test_second_document, setup),
        cmocka_unit_test_setup(test_many_keys_linear, setup),
        cmocka_unit_test_setup(test_long_keys_whole, setup),
        cmocka_unit_test_setup(test_parallelism_config_file, setup),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ct_cleanup();
    return rc;
}
