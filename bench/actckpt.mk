# bench/actckpt.mk: activation checkpointing: saved-activation and peak memory (allocator
# statistics) and step time of a deep residual MLP with and without it (`make bench-actckpt`;
# BENCH_ACTCKPT_ARGS passes e.g. "--depth 24 --width 512 --batch 128 --reps 5").
EXTRA_PROGRAMS += bench/bench_actckpt
ca_bench_programs += bench/bench_actckpt$(EXEEXT)
CLEANFILES += bench/bench_actckpt
bench_bench_actckpt_SOURCES = bench/bench_actckpt.c bench/bench_util.h
bench_bench_actckpt_LDADD = libcaccel.la -lm

.PHONY: bench-actckpt
bench: bench-actckpt
bench-actckpt: bench/bench_actckpt$(EXEEXT)
	./bench/bench_actckpt$(EXEEXT) $(BENCH_ACTCKPT_ARGS)
