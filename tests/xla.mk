# tests/xla.mk: the lazy xla device (backends/xla_stub). The kernel parity and gradient checks are
# the CUDA tests' cases compiled for the xla device (TC_XLA: exact comparisons); test_xla checks the
# graph, the compiler's cache and dead-code elimination, fusion (bit-identical to eager, in training
# too), the buffer plan and the placement of intermediates, device addresses, and the metrics.
EXTRA_DIST += tests/test_cuda_kernels.c tests/test_cuda_autograd.c tests/test_cuda_util.h
ca_xla_tests = tests/test_xla_kernels tests/test_xla_autograd
check_PROGRAMS += $(ca_xla_tests)
TESTS += $(ca_xla_tests)
VALGRIND_TESTS += $(ca_xla_tests)
tests_test_xla_kernels_SOURCES = tests/test_xla_kernels.c tests/test_cuda_util.h
tests_test_xla_kernels_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_xla_kernels_LDADD = $(CA_TEST_LIBS)
tests_test_xla_autograd_SOURCES = tests/test_xla_autograd.c tests/test_cuda_util.h tests/gradcheck_util.h
tests_test_xla_autograd_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_xla_autograd_LDADD = $(CA_TEST_LIBS)
check_PROGRAMS += tests/test_xla
TESTS += tests/test_xla
VALGRIND_TESTS += tests/test_xla
tests_test_xla_SOURCES = tests/test_xla.c tests/test_util.h
tests_test_xla_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_xla_LDADD = $(CA_TEST_LIBS)
TESTS += tests/test_xla_train.sh
EXTRA_DIST += tests/test_xla_train.sh
