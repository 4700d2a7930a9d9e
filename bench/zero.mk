# bench/zero.mk: per-rank memory (parameters, gradients, optimizer state) and step time of DDP and
# the sharded stages at 1, 2 and 4 processes (`make bench-zero`; BENCH_ZERO_ARGS passes e.g.
# "--layers 16 --width 1024").
EXTRA_PROGRAMS += bench/bench_zero
ca_bench_programs += bench/bench_zero$(EXEEXT)
CLEANFILES += bench/bench_zero
bench_bench_zero_SOURCES = bench/bench_zero.c
bench_bench_zero_LDADD = libcaccel.la -lm
EXTRA_DIST += bench/run_zero.sh

.PHONY: bench-zero
bench: bench-zero
bench-zero: bench/bench_zero$(EXEEXT) tools/caccel$(EXEEXT)
	CACCEL_PLUGIN_PATH='$(abs_top_builddir)/collectives/.libs' bash $(top_srcdir)/bench/run_zero.sh \
	  --bench ./bench/bench_zero$(EXEEXT) --caccel ./tools/caccel$(EXEEXT) $(BENCH_ZERO_ARGS)
