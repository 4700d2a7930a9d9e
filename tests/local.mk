# tests/: one fragment per area, each listing its programs and scripts.
EXTRA_DIST += tests/data tests/valgrind.sh tests/valgrind.supp
include tests/core.mk
include tests/config.mk
include tests/cpu.mk
include tests/data.mk
include tests/text.mk
include tests/lora.mk
include tests/decoder.mk
include tests/gpt.mk
include tests/dist.mk
include tests/ddp.mk
include tests/profile.mk
include tests/cuda.mk
include tests/xla.mk
include tests/fuzz.mk
include tests/checks.mk

# `make check-slowest-first`: the same tests, the longest-running first, so that with -jN none of
# them starts last and runs alone while the other slots are idle (tools/test.sh uses it). The list is
# measured (docs/TESTING.md, "How long CI takes"); a name not in TESTS is ignored.
ca_slowest_tests = tests/test_bert_classifier.sh tests/test_resume.sh tests/test_zero.sh tests/dist/netns.sh tests/dist/hostfile_netns.sh \
	tests/dist/mpi.sh tests/dist/gloo.sh tests/dist/restarts.sh tests/test_determinism.sh tests/test_ddp.sh \
	tests/dist/exits.sh tests/test_examples.sh tests/dist/slurm.sh tests/dist/faults.sh tests/test_xla_train.sh \
	tests/test_frozen_ranks.sh tests/test_llm_finetune.sh tests/test_causal_lm_parity.sh
check-slowest-first: all
	$(MAKE) $(AM_MAKEFLAGS) check \
	  TESTS="$(foreach t,$(ca_slowest_tests),$(filter $(t),$(TESTS))) $(filter-out $(ca_slowest_tests),$(TESTS))"
.PHONY: check-slowest-first

# Unit tests (single process) also run under valgrind: `make check-valgrind`
# writes test-suite-valgrind.log. Areas add their programs to VALGRIND_TESTS.
check-valgrind: all
	@for t in $(VALGRIND_TESTS); do rm -f $$t.log $$t.trs; done
	$(MAKE) $(AM_MAKEFLAGS) check TESTS="$(VALGRIND_TESTS)" \
	  LOG_COMPILER="$(abs_top_srcdir)/tests/valgrind.sh" TEST_SUITE_LOG=test-suite-valgrind.log \
	  AM_TESTS_ENVIRONMENT='$(AM_TESTS_ENVIRONMENT) CACCEL_LIBTOOL="$(abs_top_builddir)/libtool"; export CACCEL_LIBTOOL; OPENBLAS_NUM_THREADS=1; export OPENBLAS_NUM_THREADS;'
.PHONY: check-valgrind
