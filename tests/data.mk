# tests/data.mk: datasets, the IDX reader and the dataloader.
check_PROGRAMS += tests/test_data tests/test_data_sampler tests/test_data_loader
TESTS += tests/test_data tests/test_data_sampler tests/test_data_loader
VALGRIND_TESTS += tests/test_data tests/test_data_sampler tests/test_data_loader

tests_test_data_SOURCES = tests/test_data.c
tests_test_data_CFLAGS = $(CA_TEST_CFLAGS) $(ZLIB_CFLAGS)
tests_test_data_LDADD = $(CA_TEST_LIBS) $(ZLIB_LIBS)

# The shuffle generator and the shard plan are pure functions, tested alone by
# linking data/sampler.c into the test.
tests_test_data_sampler_SOURCES = tests/test_data_sampler.c tests/accelerate_shards.h data/sampler.c
EXTRA_DIST += tests/accelerate_shards.py
tests_test_data_sampler_CFLAGS = $(CA_TEST_CFLAGS) $(ZLIB_CFLAGS)
tests_test_data_sampler_LDADD = $(CA_TEST_LIBS) $(ZLIB_LIBS)

tests_test_data_loader_SOURCES = tests/test_data_loader.c
tests_test_data_loader_CFLAGS = $(CA_TEST_CFLAGS) $(ZLIB_CFLAGS)
tests_test_data_loader_LDADD = $(CA_TEST_LIBS) $(ZLIB_LIBS)

# Iterable data and custom batch samplers across real processes.
check_PROGRAMS += tests/data_check
tests_data_check_SOURCES = tests/data_check.c
tests_data_check_LDADD = libcaccel.la -lm
TESTS += tests/test_data_dist.sh
EXTRA_DIST += tests/test_data_dist.sh

# dispatch_batches across real processes: rank 0 alone reads.
check_PROGRAMS += tests/dispatch_check
tests_dispatch_check_SOURCES = tests/dispatch_check.c
tests_dispatch_check_LDADD = libcaccel.la -lm
TESTS += tests/test_dispatch.sh
EXTRA_DIST += tests/test_dispatch.sh
