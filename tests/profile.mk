# tests/profile.mk: the profiler (docs/PROFILING.md): its recorder, and the traces of training runs
# at one and two ranks, checked as Chrome trace-event JSON; the throughput meter (its FLOP counts,
# the peak cache, the GPT example's throughput line).
check_PROGRAMS += tests/test_profiler
TESTS += tests/test_profiler tests/test_profiler.sh
VALGRIND_TESTS += tests/test_profiler
tests_test_profiler_SOURCES = tests/test_profiler.c tests/test_util.h
tests_test_profiler_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_profiler_LDADD = $(CA_TEST_LIBS)
EXTRA_DIST += tests/test_profiler.sh tests/profile_check.py
check_PROGRAMS += tests/test_throughput
TESTS += tests/test_throughput
tests_test_throughput_SOURCES = tests/test_throughput.c tests/test_util.h
tests_test_throughput_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_throughput_LDADD = $(CA_TEST_LIBS)
# The examples measure the device's peak once and cache it (docs/PROFILING.md): in the build tree
# during the suite, never in the home directory of whoever runs it.
AM_TESTS_ENVIRONMENT += XDG_CACHE_HOME='$(abs_top_builddir)/tests/xdg-cache'; export XDG_CACHE_HOME;
# The flight recorder's SIGUSR1 dumps while the Fashion-MNIST MLP trains (its handlers' own stack).
TESTS += tests/test_flightrec_train.sh
EXTRA_DIST += tests/test_flightrec_train.sh
# bench/run_threads.sh's serial fraction (bench/serial_profile.py) on a made-up perf profile.
TESTS += tests/test_serial_profile.sh
EXTRA_DIST += tests/test_serial_profile.sh
