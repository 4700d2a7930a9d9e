# bench/det.mk: the cost of deterministic mode, Fashion-MNIST training with and without it on 1 and
# 2 processes (`make bench-det`; BENCH_DET_ARGS passes e.g. "--reps 3 --shards 8").
EXTRA_DIST += bench/run_det.sh
.PHONY: bench-det
bench: bench-det
bench-det: examples/fashion_mnist$(EXEEXT) tools/caccel$(EXEEXT)
	CACCEL_PLUGIN_PATH='$(abs_top_builddir)/collectives/.libs' bash $(top_srcdir)/bench/run_det.sh \
	  --example ./examples/fashion_mnist$(EXEEXT) --caccel ./tools/caccel$(EXEEXT) $(BENCH_DET_ARGS)
