/* cli_impl.h: the caccel command's subcommand table, the handlers and helpers they share. */
#ifndef CACCEL_CLI_IMPL_H
#define CACCEL_CLI_IMPL_H

#include <caccel/caccel.h>

#include <stdbool.h>
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
/* `caccel config`: the questionnaire; `config default`: a basic file; `config update`: migrates one. */
int ca_cmd_config(int argc, char **argv);
/* The questionnaire (tools/config_ask.c) and `config update` (tools/config_update.c). */
int ca_cmd_config_ask(int argc, char **argv);
int ca_cmd_config_update(int argc, char **argv);
/* `caccel launch`: spawns and supervises the processes of a job (tools/cmd_launch.c). */
int ca_cmd_launch(int argc, char **argv);
/* `caccel launch --hostfile FILE` (tools/launch_hosts.c): starts `caccel launch` on every host of
 * FILE over ssh, streams their output and stops them all on a failure or a signal. Returns the exit
 * status. main_process_ip may be replaced by the first host's address. */
typedef struct ca_launch_hosts_opts {
    const char *cmd_name;
    const char *hostfile;
    const char *config_file;     /* the file the configuration came from, or NULL: its content is sent */
    int ssh_port;                /* 0: ssh's own default */
    const char *ssh_opts;        /* words added to each ssh command, or NULL */
    int num_processes, num_machines;   /* as configured, 0 when not given: checked against the file */
    int min_machines;            /* MIN of --num_machines MIN:MAX (elastic membership), 0: a fixed set */
    const char *main_process_ip; /* NULL: the first host */
    int port;
    bool quiet;
    int argc, prog;              /* argv[1..prog-1]: the launcher's flags, argv[prog..]: the program */
    char **argv;
} ca_launch_hosts_opts;
int ca_launch_hosts(ca_launch_hosts_opts *o);
/* `caccel merge-weights DIR OUT`: a sharded checkpoint into one model.safetensors. */
int ca_cmd_merge_weights(int argc, char **argv);
/* `caccel estimate-memory MODEL`: memory for inference and training per dtype and ZeRO stage. */
int ca_cmd_estimate_memory(int argc, char **argv);
/* `caccel estimate-memory --run PROGRAM [ARGS]` (tools/estimate_run.c): runs one training step of the
 * program on the lazy xla device (measure: on its own device) with nprocs processes and prints
 * each rank's memory by category. Returns the exit status. */
typedef struct ca_em_run {
    int argc;
    char **argv;              /* PROGRAM ARGS */
    int nprocs;
    bool measure, json;
} ca_em_run;
int ca_em_run_program(const ca_em_run *r);
/* `caccel test`: the self-check under the configured launch (tools/cmd_test.c). */
int ca_cmd_test(int argc, char **argv);
/* caccel trace merge DIR (cmd_trace.c) */
int ca_cmd_trace(int argc, char **argv);
/* `caccel trace analyze DIR`: the flight recorder's dumps read together (tools/cmd_trace_analyze.c). */
int ca_cmd_trace_analyze(const char *dir);

/* Prints "caccel <cmd>: error: <last error>" and its hint to stderr; returns 1. */
int ca_cli_fail(const char *cmd);
/* Prints "caccel <cmd>: error: <message>" to stderr; returns 1 (a failed command's exit status). */
int ca_cli_error(const char *cmd, const char *fmt, ...) CA_PRINTF(2, 3);
/* Prints "caccel <cmd>: <message>" to stderr: what a command says of its progress. */
void ca_cli_say(const char *cmd, const char *fmt, ...) CA_PRINTF(2, 3);

/* caccel's default config file: $XDG_CONFIG_HOME/caccel/default_config.yaml
 * (XDG_CONFIG_HOME defaults to ~/.config). "" when neither is known. */
void ca_cli_default_config_path(char *buf, size_t size);
/* The file a config command writes: `arg` when given, else the default above. Prints
 * "caccel <cmd>: error: ..." and returns 1 when there is neither. */
int ca_cli_config_target(const char *arg, char *buf, size_t size, const char *cmd);
/* Accelerate's: $HF_HOME/accelerate/default_config.yaml (HF_HOME defaults to
 * $XDG_CACHE_HOME/huggingface, i.e. ~/.cache/huggingface). */
void ca_cli_accelerate_config_path(char *buf, size_t size);

/* When `arg` is "--name" or "--name=value" (also spelled with '-' for '_'):
 * true, with *value set to the text after '=' or NULL. */
int ca_cli_match_flag(const char *arg, const char *name, const char **value);

/* A configuration file being written (tools/config_doc.c): "key" or
 * "section.key" with its value as text; `plain` values (booleans, numbers,
 * lists) are written as they are, the others as strings. As many keys, and
 * keys and values as long, as the file holds. */
typedef struct ca_cli_doc_item {
    char *key;
    char *value;
    bool plain;
} ca_cli_doc_item;
typedef struct ca_cli_doc {
    ca_cli_doc_item *items;
    size_t n, cap;
    bool nomem;       /* a put ran out of memory: the document is incomplete */
} ca_cli_doc;
/* Adds or replaces `key`; -1 (and d->nomem) when out of memory. */
int ca_cli_doc_put(ca_cli_doc *d, const char *key, const char *value, bool plain);
/* The item called `key`, or NULL. */
const ca_cli_doc_item *ca_cli_doc_find(const ca_cli_doc *d, const char *key);
void ca_cli_doc_drop(ca_cli_doc *d, const char *key);
void ca_cli_doc_free(ca_cli_doc *d);
/* Sorts the keys (as Accelerate writes them) and renders YAML, with `header`
 * as a comment, or JSON: a malloc'd text, NULL when out of memory. */
char *ca_cli_doc_render(ca_cli_doc *d, bool json, const char *header);
/* Writes the document to `path` for `caccel <cmd>`: rendered (JSON when `path`
 * ends in .json), written to a temporary file in the same directory with
 * permissions `mode` and synced, read back by the configuration's loader and
 * compared with the document, and renamed over `path` only when every key
 * reads back with its value and nothing else appears; otherwise the temporary
 * file is removed and `path` is left as it was. `replace` false: an existing
 * `path` is left alone (an error). Prints "caccel <cmd>: error: ..." and
 * returns 1 on failure, 0 when written. */
int ca_cli_doc_save(ca_cli_doc *d, const char *path, const char *header, unsigned mode, bool replace,
                    const char *cmd);
/* `config update --to-fsdp2` (tools/config_fsdp2.c): the document's FSDP1 fsdp_config keys in FSDP2's
 * (Accelerate's to-fsdp2 table), each change printed; `c` is the file as loaded. Returns 1, with the
 * reason printed, where FSDP2 would run something else than the file runs now; 0 otherwise (also
 * when there is no fsdp_config or it is FSDP2 already). */
int ca_cli_to_fsdp2(ca_cli_doc *d, const ca_config *c, const char *path);
/* True when `path` ends in ".json": Accelerate then writes JSON. */
bool ca_cli_path_is_json(const char *path);
/* mkdir -p of the directory part of `path`. */
int ca_cli_make_parents(const char *path);
/* Writes `text` to `path` through a temporary file in the same directory,
 * renamed into place, so a reader never sees half a file. Without `replace`
 * an existing file is left alone (-1, errno EEXIST). */
int ca_cli_write_atomic(const char *path, const char *text, bool replace);

#endif
