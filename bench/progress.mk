# bench/progress.mk: MLP training steps with and without a progress bar, and the bare cost of
# ca_progress_update (`make bench-progress`; BENCH_PROGRESS_ARGS: samples, steps per sample, batch,
# e.g. "9 200 128").
EXTRA_PROGRAMS += bench/bench_progress
ca_bench_programs += bench/bench_progress$(EXEEXT)
CLEANFILES += bench/bench_progress
bench_bench_progress_SOURCES = bench/bench_progress.c bench/bench_util.h
bench_bench_progress_LDADD = libcaccel.la -lm

.PHONY: bench-progress
bench: bench-progress
bench-progress: bench/bench_progress$(EXEEXT)
	./bench/bench_progress$(EXEEXT) $(BENCH_PROGRESS_ARGS)
