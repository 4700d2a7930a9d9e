# tools/: the caccel command. Its subcommands are rows of the table in tools/caccel.c. The store, the
# file opener and the CPU binding (comm/store_*.c, base/file.c, comm/affinity.c) are hidden in the
# library, so the command links them itself.
bin_PROGRAMS += tools/caccel
tools_caccel_SOURCES = \
	tools/cli_impl.h \
	tools/caccel.c \
	tools/cmd_env.c \
	tools/cmd_config.c tools/config_ask.c tools/config_update.c tools/config_fsdp2.c tools/config_doc.c \
	tools/cmd_launch.c tools/launch_hosts.c tools/cmd_merge_weights.c comm/store_server.c comm/store_client.c comm/store_wire_impl.h comm/store_impl.h base/file.c base/file_impl.h \
	tools/cmd_estimate_memory.c tools/estimate_run.c tools/cmd_test.c tools/cmd_trace.c tools/cmd_trace_analyze.c core/json.c core/json_impl.h \
	comm/affinity.c comm/affinity_impl.h
tools_caccel_CFLAGS = $(AM_CFLAGS) $(JSONC_CFLAGS) $(HWLOC_CFLAGS)
tools_caccel_LDADD = libcaccel.la $(JSONC_LIBS) $(HWLOC_LIBS)

# Scripts: the README's commands, CI's dependencies, the layer checks, measurement helpers.
EXTRA_DIST += tools/quickstart.sh tools/test.sh tools/install-deps.sh tools/gpu-bundle.sh \
	tools/layers.sh tools/check-layers.sh tools/check-symbols.sh tools/check-headers.sh tools/check-names.sh tools/accuracy-spread.sh \
	tools/fetch-minilm.sh tools/check-file-cycles.sh tools/count-mode-tests.sh

# Manual pages (caccel(1): the command; caccel(3): the C API) and bash completion for the command.
dist_man_MANS = docs/man/caccel.1 docs/man/caccel.3
bashcompletiondir = $(datadir)/bash-completion/completions
dist_bashcompletion_DATA = tools/completion/caccel
