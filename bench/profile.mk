# bench/profile.mk: MLP training steps with the profiler off and on, alternating
# (`make bench-profile`; BENCH_PROFILE_ARGS: samples, steps per sample, batch, trace directory).
EXTRA_PROGRAMS += bench/bench_profile
ca_bench_programs += bench/bench_profile$(EXEEXT)
CLEANFILES += bench/bench_profile
bench_bench_profile_SOURCES = bench/bench_profile.c bench/bench_util.h
bench_bench_profile_LDADD = libcaccel.la -lm

.PHONY: bench-profile
bench: bench-profile
bench-profile: bench/bench_profile$(EXEEXT)
	./bench/bench_profile$(EXEEXT) $(BENCH_PROFILE_ARGS)
