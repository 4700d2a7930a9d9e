# tests/: one fragment per area, each listing its programs and scripts.
EXTRA_DIST += tests/data tests/valgrind.sh tests/valgrind.supp
include tests/core.mk
include tests/config.mk
include tests/cpu.mk
include tests/data.mk
include tests/text.mk
include tests/gpt.mk
include tests/dist.mk
include tests/ddp.mk
include tests/cuda.mk
include tests/xla.mk
include tests/fuzz.mk

# Unit tests (single process) also run under valgrind: `make check-valgrind`
# writes test-suite-valgrind.log. Areas add their programs to VALGRIND_TESTS.
check-valgrind: all
	@for t in $(VALGRIND_TESTS); do rm -f $$t.log $$t.trs; done
	$(MAKE) $(AM_MAKEFLAGS) check TESTS="$(VALGRIND_TESTS)" \
	  LOG_COMPILER="$(abs_top_srcdir)/tests/valgrind.sh" TEST_SUITE_LOG=test-suite-valgrind.log \
	  AM_TESTS_ENVIRONMENT='$(AM_TESTS_ENVIRONMENT) CACCEL_LIBTOOL="$(abs_top_builddir)/libtool"; export CACCEL_LIBTOOL; OPENBLAS_NUM_THREADS=1; export OPENBLAS_NUM_THREADS;'
.PHONY: check-valgrind
