# tests/cuda.mk: the CUDA plugin. test_cuda_plugin and test_cuda_cli run on any machine (the plugin
# loads without a driver); the others need a GPU and exit 77 (SKIP) with the driver's reason. The ops on
# the GPU against the CPU are rows of tests/test_ops (tests/core.mk), which runs them when a GPU opens.
EXTRA_DIST += tests/test_cuda_util.h tests/test_cuda_cli.sh tests/test_cuda_train.sh tests/test_cuda_cp.sh
# the attention chunk plan is plain C (backends/cuda/cuda_att_plan.h): checked with or without CUDA
check_PROGRAMS += tests/test_cuda_att_plan
TESTS += tests/test_cuda_att_plan
tests_test_cuda_att_plan_SOURCES = tests/test_cuda_att_plan.c backends/cuda/cuda_att_plan.h
tests_test_cuda_att_plan_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_cuda_att_plan_LDADD = $(CMOCKA_LIBS)
if HAVE_CUDA
ca_cuda_tests = tests/test_cuda_plugin tests/test_cuda_alloc tests/test_cuda_nccl tests/test_cuda_big \
	tests/test_cuda_async_save
check_PROGRAMS += $(ca_cuda_tests)
TESTS += $(ca_cuda_tests) tests/test_cuda_cli.sh tests/test_cuda_train.sh tests/test_cuda_cp.sh
tests_test_cuda_plugin_SOURCES = tests/test_cuda_plugin.c tests/test_cuda_util.h
tests_test_cuda_plugin_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_cuda_plugin_LDADD = $(CA_TEST_LIBS)
tests_test_cuda_alloc_SOURCES = tests/test_cuda_alloc.c tests/test_cuda_util.h
tests_test_cuda_alloc_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_cuda_alloc_LDADD = $(CA_TEST_LIBS)
# the allocator on a mocked CUDA runtime: runs on any machine, links no CUDA library
check_PROGRAMS += tests/test_cuda_alloc_mock
TESTS += tests/test_cuda_alloc_mock
tests_test_cuda_alloc_mock_SOURCES = tests/test_cuda_alloc_mock.c backends/cuda/cuda_alloc.c
tests_test_cuda_alloc_mock_CFLAGS = $(CA_TEST_CFLAGS) $(CUDA_CPPFLAGS)
tests_test_cuda_alloc_mock_LDADD = $(CA_TEST_LIBS)
# the nccl backend on a mocked CUDA runtime and a mocked libnccl (mock_nccl.so, opened through
# CACCEL_NCCL_LIBRARY): streams and events of an op, abort while an enqueue is stuck
check_LTLIBRARIES += tests/mock_nccl.la
tests_mock_nccl_la_SOURCES = tests/mock_nccl.c
tests_mock_nccl_la_CFLAGS = $(AM_CFLAGS) $(CUDA_CPPFLAGS)
tests_mock_nccl_la_LDFLAGS = -module -avoid-version -rpath /nowhere
check_PROGRAMS += tests/test_cuda_nccl_mock
TESTS += tests/test_cuda_nccl_mock
tests_test_cuda_nccl_mock_SOURCES = tests/test_cuda_nccl_mock.c backends/cuda/nccl_coll.c
tests_test_cuda_nccl_mock_CFLAGS = $(CA_TEST_CFLAGS) $(CUDA_CPPFLAGS)
tests_test_cuda_nccl_mock_LDADD = $(CA_TEST_LIBS) -lpthread
tests_test_cuda_nccl_SOURCES = tests/test_cuda_nccl.c tests/test_cuda_util.h
tests_test_cuda_nccl_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_cuda_nccl_LDADD = $(CA_TEST_LIBS)
tests_test_cuda_async_save_SOURCES = tests/test_cuda_async_save.c tests/test_cuda_util.h tests/test_ckpt_util.h
tests_test_cuda_async_save_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_cuda_async_save_LDADD = $(CA_TEST_LIBS)
tests_test_cuda_big_SOURCES = tests/test_cuda_big.c tests/test_cuda_util.h
tests_test_cuda_big_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_cuda_big_LDADD = $(CA_TEST_LIBS)
endif

# What tools/gpu-check.sh runs on a GPU machine (`make print-gpu-tests`) and builds for it beyond `all`
# (`make print-gpu-programs`): the CUDA tests and the conformance table, whose cuda column needs a GPU.
ca_gpu_check_tests = tests/test_ops
ca_gpu_check_programs = tests/test_ops$(EXEEXT)
if HAVE_CUDA
ca_gpu_check_tests += $(ca_cuda_tests) tests/test_cuda_cli.sh tests/test_cuda_train.sh tests/test_cuda_cp.sh
ca_gpu_check_programs += $(ca_cuda_tests:=$(EXEEXT)) bench/bench_cuda$(EXEEXT) tests/cp_check$(EXEEXT)
endif
.PHONY: print-gpu-tests print-gpu-programs
print-gpu-tests:
	@echo $(ca_gpu_check_tests)
print-gpu-programs:
	@echo $(ca_gpu_check_programs)
