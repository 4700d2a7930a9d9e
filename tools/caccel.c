/* The caccel command: --version, --help, and dispatch to the subcommands of a table. */
#include "tools/cli_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const ca_cli_command ca_cli_commands[] = {
    {"env", "print versions, backends, devices and the merged configuration with the origin of every value",
     ca_cmd_env},
    {"config", "write a configuration file: Accelerate's questionnaire, `config default`, `config update`", ca_cmd_config},
    {"launch", "start a program as every process of a job (Accelerate's launcher flags)", ca_cmd_launch},
    {"merge-weights", "merge a sharded checkpoint's weights into one model.safetensors", ca_cmd_merge_weights},
    {"estimate-memory", "memory a model needs for inference and training, per dtype and ZeRO stage",
     ca_cmd_estimate_memory},
    {"trace", "join the profiler's per-rank traces into one timeline (`caccel trace merge DIR`), or read the flight recorder's dumps (`caccel trace analyze DIR`)", ca_cmd_trace},
    {"test", "check the setup: collectives, sync across ranks, sharding, training (under launch)", ca_cmd_test},
};
const size_t ca_cli_ncommands = sizeof ca_cli_commands / sizeof ca_cli_commands[0];

static void cli_line(const char *cmd, const char *kind, const char *fmt, va_list ap) {
    fprintf(stderr, "caccel %s: %s", cmd, kind);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

int ca_cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cli_line(cmd, "error: ", fmt, ap);
    va_end(ap);
    return 1;
}

void ca_cli_say(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cli_line(cmd, "", fmt, ap);
    va_end(ap);
}

int ca_cli_fail(const char *cmd) {
    fprintf(stderr, "caccel %s: error: %s\n", cmd, ca_last_error()[0] ? ca_last_error() : ca_status_name(ca_last_status()));
    if (ca_last_hint()[0]) fprintf(stderr, "  hint: %s\n", ca_last_hint());
    return 1;
}

void ca_cli_default_config_path(char *buf, size_t size) {
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    buf[0] = '\0';
    if (xdg && *xdg)
        snprintf(buf, size, "%s/caccel/default_config.yaml", xdg);
    else if (home && *home)
        snprintf(buf, size, "%s/.config/caccel/default_config.yaml", home);
}

int ca_cli_config_target(const char *arg, char *buf, size_t size, const char *cmd) {
    if (arg)
        snprintf(buf, size, "%s", arg);
    else
        ca_cli_default_config_path(buf, size);
    if (buf[0]) return 0;
    fprintf(stderr, "caccel %s: error: neither HOME nor XDG_CONFIG_HOME is set\n  hint: pass --config_file FILE\n", cmd);
    return 1;
}

void ca_cli_accelerate_config_path(char *buf, size_t size) {
    const char *hf = getenv("HF_HOME"), *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    buf[0] = '\0';
    if (hf && *hf)
        snprintf(buf, size, "%s/accelerate/default_config.yaml", hf);
    else if (cache && *cache)
        snprintf(buf, size, "%s/huggingface/accelerate/default_config.yaml", cache);
    else if (home && *home)
        snprintf(buf, size, "%s/.cache/huggingface/accelerate/default_config.yaml", home);
}

int ca_cli_match_flag(const char *arg, const char *name, const char **value) {
    if (value) *value = NULL;
    if (!arg || strncmp(arg, "--", 2) != 0) return 0;
    const char *a = arg + 2, *n = name;
    for (; *a && *a != '=' && *n; a++, n++) {
        char ca = *a == '-' ? '_' : *a;
        if (ca != *n) return 0;
    }
    if (*n || (*a && *a != '=')) return 0;
    if (*a == '=' && value) *value = a + 1;
    return 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: caccel [--version] [--help] <command> [args]\n\n"
               "caccel %s: a portable training runtime in C that speaks Accelerate's configuration.\n\n"
               "commands:\n", CA_VERSION);
    for (size_t i = 0; i < ca_cli_ncommands; i++)
        fprintf(f, "  %-15s %s\n", ca_cli_commands[i].name, ca_cli_commands[i].summary);
    fprintf(f, "\n`caccel <command> --help` describes a command. Configuration: docs/CONFIGURATION.md.\n");
}

/* Edit distance for "did you mean" on a mistyped command. */
static size_t distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 32 || m > 32) return 99;
    size_t d[33][33];
    for (size_t i = 0; i <= n; i++) d[i][0] = i;
    for (size_t j = 0; j <= m; j++) d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0 || strcmp(cmd, "version") == 0) {
        printf("caccel %s (plugin ABI %d.%d)\n", CA_VERSION, CA_ABI_MAJOR, CA_ABI_MINOR);
        return 0;
    }
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < ca_cli_ncommands; i++) {
        if (strcmp(ca_cli_commands[i].name, cmd) == 0) {
            int rc = ca_cli_commands[i].run(argc - 1, argv + 1);
            ca_shutdown();
            return rc;
        }
    }
    const char *near = NULL;
    size_t best = 3;
    for (size_t i = 0; i < ca_cli_ncommands; i++) {
        size_t d = distance(cmd, ca_cli_commands[i].name);
        if (d < best) { best = d; near = ca_cli_commands[i].name; }
    }
    fprintf(stderr, "caccel: error: unknown command '%s'", cmd);
    if (near) fprintf(stderr, " (did you mean '%s'?)", near);
    fprintf(stderr, "\n  hint: `caccel --help` lists the commands\n");
    return 2;
}
