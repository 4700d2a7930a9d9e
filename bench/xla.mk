# bench/xla.mk: the lazy xla device against the eager CPU backend in the same run
# (`make bench-xla`; BENCH_XLA_ARGS passes e.g. "--steps 500 --reps 5 --batch-sizes 16,32,128").
EXTRA_PROGRAMS += bench/bench_xla
ca_bench_programs += bench/bench_xla$(EXEEXT)
CLEANFILES += bench/bench_xla
bench_bench_xla_SOURCES = bench/bench_xla.c bench/bench_util.h
bench_bench_xla_CFLAGS = $(AM_CFLAGS)
bench_bench_xla_LDADD = libcaccel.la -lm

.PHONY: bench-xla
bench: bench-xla
bench-xla: bench/bench_xla$(EXEEXT)
	OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1} ./bench/bench_xla$(EXEEXT) $(BENCH_XLA_ARGS)
