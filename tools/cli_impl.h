/* cli_impl.h: the caccel command's subcommand table, the handlers and helpers they share. */
#ifndef CACCEL_CLI_IMPL_H
#define CACCEL_CLI_IMPL_H

#include <caccel/caccel.h>

#include <stddef.h>

/* A subcommand: `caccel <name> ...` calls run(argc, argv) with argv[0] ==
 * name; the return value is the exit status (0 ok, 1 failed, 2 bad usage).
 * To add one: declare its handler below, define it in tools/cmd_<name>.c,
 * add a row to ca_cli_commands in tools/caccel.c and the file to
 * tools/local.mk. */
typedef struct ca_cli_command {
    const char *name;
    const char *summary;     /* one line for `caccel --help` */
    int (*run)(int argc, char **argv);
} ca_cli_command;

extern const ca_cli_command ca_cli_commands[];
extern const size_t ca_cli_ncommands;

/* `caccel env`: versions, backends and devices, the merged configuration. */
int ca_cmd_env(int argc, char **argv);
/* `caccel config default`: writes a basic config file. */
int ca_cmd_config(int argc, char **argv);
/* `caccel launch`: spawns and supervises the processes of a job (tools/cmd_launch.c). */
int ca_cmd_launch(int argc, char **argv);
/* `caccel merge-weights DIR OUT`: a sharded checkpoint into one model.safetensors. */
int ca_cmd_merge_weights(int argc, char **argv);
/* `caccel estimate-memory MODEL`: memory for inference and training per dtype and ZeRO stage. */
int ca_cmd_estimate_memory(int argc, char **argv);
/* `caccel test`: the self-check under the configured launch (tools/cmd_test.c). */
int ca_cmd_test(int argc, char **argv);

/* Prints "caccel <cmd>: error: <last error>" and its hint to stderr; returns 1. */
int ca_cli_fail(const char *cmd);

/* caccel's default config file: $XDG_CONFIG_HOME/caccel/default_config.yaml
 * (XDG_CONFIG_HOME defaults to ~/.config). "" when neither is known. */
void ca_cli_default_config_path(char *buf, size_t size);
/* Accelerate's: $HF_HOME/accelerate/default_config.yaml (HF_HOME defaults to
 * $XDG_CACHE_HOME/huggingface, i.e. ~/.cache/huggingface). */
void ca_cli_accelerate_config_path(char *buf, size_t size);

/* When `arg` is "--name" or "--name=value" (also spelled with '-' for '_'):
 * true, with *value set to the text after '=' or NULL. */
int ca_cli_match_flag(const char *arg, const char *name, const char **value);

#endif
