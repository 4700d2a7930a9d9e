# tests/config.mk: the configuration tests (keys, merge rule, env, flags, Accelerate's own files).
check_PROGRAMS += tests/test_config tests/test_config_files
TESTS += tests/test_config tests/test_config_files

tests_test_config_SOURCES = tests/test_config.c tests/config_test_util.h
tests_test_config_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_config_LDADD = $(CA_TEST_LIBS)

tests_test_config_files_SOURCES = tests/test_config_files.c tests/config_test_util.h
tests_test_config_files_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_config_files_LDADD = $(CA_TEST_LIBS)

VALGRIND_TESTS += tests/test_config tests/test_config_files

# The caccel command: `caccel env` shows every value with its origin; `caccel config default`.
TESTS += tests/test_cli_env.sh
EXTRA_DIST += tests/test_cli_env.sh tests/cli_lib.sh

# `caccel config`: the questionnaire driven through a terminal (tmux; skipped without it), `config update`.
TESTS += tests/test_cli_config.sh
EXTRA_DIST += tests/test_cli_config.sh

# `caccel config update` without a terminal: files of any size, the read-back check, --to-fsdp2.
TESTS += tests/test_cli_config_update.sh
EXTRA_DIST += tests/test_cli_config_update.sh

# `caccel estimate-memory`: figures against the parameter counts of files the test writes.
TESTS += tests/test_cli_estimate.sh
EXTRA_DIST += tests/test_cli_estimate.sh
# estimate-memory --run: one step of the MLP on the lazy device, within 10% of the measured peak
TESTS += tests/test_estimate_run.sh
EXTRA_DIST += tests/test_estimate_run.sh

# `caccel test`: the self-check at 1 and 2 processes, and a broken setup.
TESTS += tests/test_cli_test.sh
EXTRA_DIST += tests/test_cli_test.sh
# The bash completion and the manual pages (tools/completion/caccel, docs/man).
TESTS += tests/test_man_completion.sh
EXTRA_DIST += tests/test_man_completion.sh
