# tests/profile.mk: the profiler (docs/PROFILING.md): its recorder, and the traces of training runs
# at one and two ranks, checked as Chrome trace-event JSON.
check_PROGRAMS += tests/test_profiler
TESTS += tests/test_profiler tests/test_profiler.sh
VALGRIND_TESTS += tests/test_profiler
tests_test_profiler_SOURCES = tests/test_profiler.c tests/test_util.h
tests_test_profiler_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_profiler_LDADD = $(CA_TEST_LIBS)
EXTRA_DIST += tests/test_profiler.sh tests/profile_check.py
