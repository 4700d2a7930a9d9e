# tests/cpu.mk: the CPU backend (device vtable, every kernel) against naive references.
# The programs compile the backend's sources themselves (the library keeps
# them hidden) and call them through ca_cpu_plugin()->devices[0].
ca_cpu_tests = tests/test_cpu_device tests/test_cpu_gemm tests/test_cpu_cast tests/test_cpu_kernels \
	tests/test_cpu_fpmode tests/test_cpu_parallel tests/test_cpu_nn_threads tests/test_cpu_threads_attn \
	tests/test_cpu_threads
check_PROGRAMS += $(ca_cpu_tests)
TESTS += $(ca_cpu_tests)

tests_test_cpu_device_SOURCES = tests/test_cpu_device.c $(ca_cpu_sources)
tests_test_cpu_device_CFLAGS = $(CA_TEST_CFLAGS) $(OPENBLAS_CFLAGS)
tests_test_cpu_device_LDADD = $(CA_TEST_LIBS) $(OPENBLAS_LIBS)
tests_test_cpu_device_LDFLAGS = $(OPENMP_CFLAGS)

tests_test_cpu_gemm_SOURCES = tests/test_cpu_gemm.c tests/test_cpu_util.h $(ca_cpu_sources)
tests_test_cpu_gemm_CFLAGS = $(CA_TEST_CFLAGS) $(OPENBLAS_CFLAGS)
tests_test_cpu_gemm_LDADD = $(CA_TEST_LIBS) $(OPENBLAS_LIBS)
tests_test_cpu_gemm_LDFLAGS = $(OPENMP_CFLAGS)

tests_test_cpu_cast_SOURCES = tests/test_cpu_cast.c tests/test_cpu_util.h $(ca_cpu_sources)
tests_test_cpu_cast_CFLAGS = $(CA_TEST_CFLAGS) $(OPENBLAS_CFLAGS)
tests_test_cpu_cast_LDADD = $(CA_TEST_LIBS) $(OPENBLAS_LIBS)
tests_test_cpu_cast_LDFLAGS = $(OPENMP_CFLAGS)

tests_test_cpu_kernels_SOURCES = tests/test_cpu_kernels.c tests/test_cpu_util.h $(ca_cpu_sources)
tests_test_cpu_kernels_CFLAGS = $(CA_TEST_CFLAGS) $(OPENBLAS_CFLAGS)
tests_test_cpu_kernels_LDADD = $(CA_TEST_LIBS) $(OPENBLAS_LIBS)
tests_test_cpu_kernels_LDFLAGS = $(OPENMP_CFLAGS)

tests_test_cpu_fpmode_SOURCES = tests/test_cpu_fpmode.c tests/test_cpu_util.h $(ca_cpu_sources)
tests_test_cpu_fpmode_CFLAGS = $(CA_TEST_CFLAGS) $(OPENBLAS_CFLAGS)
tests_test_cpu_fpmode_LDADD = $(CA_TEST_LIBS) $(OPENBLAS_LIBS)
tests_test_cpu_fpmode_LDFLAGS = $(OPENMP_CFLAGS)

tests_test_cpu_parallel_SOURCES = tests/test_cpu_parallel.c tests/test_cpu_util.h $(ca_cpu_sources)
tests_test_cpu_parallel_CFLAGS = $(CA_TEST_CFLAGS) $(OPENBLAS_CFLAGS)
tests_test_cpu_parallel_LDADD = $(CA_TEST_LIBS) $(OPENBLAS_LIBS)
tests_test_cpu_parallel_LDFLAGS = $(OPENMP_CFLAGS)

tests_test_cpu_nn_threads_SOURCES = tests/test_cpu_nn_threads.c tests/test_cpu_util.h $(ca_cpu_sources)
tests_test_cpu_nn_threads_CFLAGS = $(CA_TEST_CFLAGS) $(OPENBLAS_CFLAGS)
tests_test_cpu_nn_threads_LDADD = $(CA_TEST_LIBS) $(OPENBLAS_LIBS)
tests_test_cpu_nn_threads_LDFLAGS = $(OPENMP_CFLAGS)

tests_test_cpu_threads_attn_SOURCES = tests/test_cpu_threads_attn.c tests/test_cpu_util.h $(ca_cpu_sources)
tests_test_cpu_threads_attn_CFLAGS = $(CA_TEST_CFLAGS) $(OPENBLAS_CFLAGS)
tests_test_cpu_threads_attn_LDADD = $(CA_TEST_LIBS) $(OPENBLAS_LIBS)
tests_test_cpu_threads_attn_LDFLAGS = $(OPENMP_CFLAGS)

# The kernels' bits at 1, 2 and 3 threads (reductions, random draws, split elementwise ranges).
tests_test_cpu_threads_SOURCES = tests/test_cpu_threads.c tests/test_cpu_util.h $(ca_cpu_sources)
tests_test_cpu_threads_CFLAGS = $(CA_TEST_CFLAGS) $(OPENBLAS_CFLAGS)
tests_test_cpu_threads_LDADD = $(CA_TEST_LIBS) $(OPENBLAS_LIBS)
tests_test_cpu_threads_LDFLAGS = $(OPENMP_CFLAGS)

# Both bf16 GEMM paths (oneDNN, conversion) pass the GEMM tests.
TESTS += tests/test_cpu_gemm_paths.sh
EXTRA_DIST += tests/test_cpu_gemm_paths.sh

# The kernels' threads (docs/ARCHITECTURE.md, "Threads on the CPU"): the conformance and equivalence
# tests at 1, 2 and 3 threads with every loop split, deterministic training bit-identical at 1, 2 and
# 3 threads (examples/gpt), and the clamp of a count above the CPUs allowed (taskset).
TESTS += tests/test_threads.sh tests/test_threads_det.sh tests/test_threads_clamp.sh tests/test_launch_coretype.sh
EXTRA_DIST += tests/test_threads.sh tests/test_threads_det.sh tests/test_threads_clamp.sh tests/test_launch_coretype.sh
