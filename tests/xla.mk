# tests/xla.mk: the lazy xla device (backends/xla_stub). Every op on it against the CPU, bit for bit, is
# a column of tests/test_ops (tests/core.mk); test_xla checks the graph, the compiler's cache and
# dead-code elimination, fusion (bit-identical to eager, in training too), the buffer plan and the
# placement of intermediates, device addresses, and the metrics.
check_PROGRAMS += tests/test_xla
TESTS += tests/test_xla
VALGRIND_TESTS += tests/test_xla
tests_test_xla_SOURCES = tests/test_xla.c tests/test_util.h
tests_test_xla_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_xla_LDADD = $(CA_TEST_LIBS)
TESTS += tests/test_xla_train.sh
EXTRA_DIST += tests/test_xla_train.sh
