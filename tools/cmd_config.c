/* `caccel config`: dispatches to the questionnaire, `update`; `config default` writes a basic file non-interactively. */
#include "tools/cli_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void config_usage(FILE *f) {
    fprintf(f, "usage: caccel config default [--config_file FILE] [--mixed_precision no|fp16|bf16|fp8]\n\n"
               "Writes a basic configuration for this machine (like `accelerate config default`):\n"
               "one process per GPU when GPUs and their plugin are present (MULTI_GPU when there are\n"
               "several), otherwise one CPU process. The file is Accelerate's format; Accelerate reads\n"
               "it too. Default location: $XDG_CONFIG_HOME/caccel/default_config.yaml. An existing\n"
               "file is never overwritten.\n");
}

/* The GPUs (devices of the usable GPU backend the accelerator would pick) a plugin reports here. */
static int accelerator_count(void) {
    if (ca_registry_load_plugins() != CA_OK) ca_clear_error();
    ca_backend_info b;
    if (ca_registry_best_device(CA_DEVICE_GPU, &b) != CA_OK) {
        ca_clear_error();
        return 0;
    }
    return b.device_count;
}

static int config_default(int argc, char **argv) {
    const char *path_arg = NULL, *mp = "no";
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            config_usage(stdout);
            return 0;
        }
        const char *which = ca_cli_match_flag(argv[i], "config_file", &v)       ? "--config_file"
                            : ca_cli_match_flag(argv[i], "mixed_precision", &v) ? "--mixed_precision"
                                                                                : NULL;
        if (!which) {
            fprintf(stderr, "caccel config default: error: unknown argument '%s'\n", argv[i]);
            config_usage(stderr);
            return 2;
        }
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "caccel config default: error: %s needs a value\n", which);
                return 2;
            }
            v = argv[++i];
        }
        if (which[2] == 'c')
            path_arg = v;
        else
            mp = v;
    }
    /* The value is checked by the configuration itself: same message as everywhere. */
    ca_config *c = NULL;
    if (ca_config_create(&c) != CA_OK) return ca_cli_fail("config default");
    if (ca_config_set(c, "mixed_precision", mp, CA_SRC_CLI, "--mixed_precision") != CA_OK) {
        ca_config_destroy(c);
        return ca_cli_fail("config default");
    }
    char mixed[16];
    snprintf(mixed, sizeof mixed, "%s", ca_config_get(c, "mixed_precision"));
    ca_config_destroy(c);

    char path[4096];
    if (ca_cli_config_target(path_arg, path, sizeof path, "config default")) return 1;
    struct stat st;
    if (stat(path, &st) == 0) {
        fprintf(stderr, "caccel config default: error: configuration already exists at %s, will not override it\n"
                        "  hint: remove it, or pass another --config_file\n", path);
        return 1;
    }

    int gpus = accelerator_count();
    char text[2048];
    /* Sorted keys, as Accelerate writes them; 'NO' and 'no' quoted, since
     * YAML 1.1 readers (PyYAML) would take them for false. */
    snprintf(text, sizeof text,
             "# Written by `caccel config default` (caccel %s). Accelerate reads this file too.\n"
             "compute_environment: LOCAL_MACHINE\n"
             "debug: false\n"
             "distributed_type: %s\n"
             "downcast_bf16: false\n"
             "enable_cpu_affinity: false\n"
             "machine_rank: 0\n"
             "main_training_function: main\n"
             "mixed_precision: %s%s%s\n"
             "num_machines: 1\n"
             "num_processes: %d\n"
             "rdzv_backend: static\n"
             "same_network: false\n"
             "tpu_use_cluster: false\n"
             "tpu_use_sudo: false\n"
             "use_cpu: %s\n",
             CA_VERSION, gpus > 1 ? "MULTI_GPU" : "'NO'", strcmp(mixed, "no") == 0 ? "'" : "", mixed,
             strcmp(mixed, "no") == 0 ? "'" : "", gpus > 0 ? gpus : 1, gpus > 0 ? "false" : "true");
    if (ca_cli_make_parents(path) != 0 || ca_cli_write_atomic(path, text, false) != 0) {
        fprintf(stderr, "caccel config default: error: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    /* What was written must load: the same loader every program uses. */
    if (ca_config_create(&c) != CA_OK) return ca_cli_fail("config default");
    ca_status s = ca_config_load_file(c, path);
    ca_config_destroy(c);
    if (s != CA_OK) return ca_cli_fail("config default");
    printf("caccel configuration saved at %s\n", path);
    return 0;
}

int ca_cmd_config(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "default") == 0) return config_default(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "update") == 0) return ca_cmd_config_update(argc - 1, argv + 1);
    if (argc >= 2 && argv[1][0] != '-') {
        fprintf(stderr, "caccel config: error: unknown subcommand '%s' (known: default, update)\n", argv[1]);
        return 2;
    }
    return ca_cmd_config_ask(argc, argv);
}
