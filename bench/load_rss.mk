# bench/load_rss.mk: peak resident memory per rank while loading and preparing a model of 1 GB f32,
# eager and deferred (ca_init_empty_weights), DDP and ZeRO-3, at 1, 2 and 4 processes
# (`make bench-load-rss`; BENCH_LOAD_RSS_ARGS passes e.g. "--layers 4 --width 1024").
EXTRA_PROGRAMS += bench/bench_load_rss
ca_bench_programs += bench/bench_load_rss$(EXEEXT)
CLEANFILES += bench/bench_load_rss
bench_bench_load_rss_SOURCES = bench/bench_load_rss.c
bench_bench_load_rss_LDADD = libcaccel.la -lm -lpthread
EXTRA_DIST += bench/run_load_rss.sh

.PHONY: bench-load-rss
bench: bench-load-rss
bench-load-rss: bench/bench_load_rss$(EXEEXT) tools/caccel$(EXEEXT)
	CACCEL_PLUGIN_PATH='$(abs_top_builddir)/collectives/.libs' bash $(top_srcdir)/bench/run_load_rss.sh \
	  --bench ./bench/bench_load_rss$(EXEEXT) --caccel ./tools/caccel$(EXEEXT) $(BENCH_LOAD_RSS_ARGS)

# Loading under tensor parallelism (bench/run_load_tp.sh): bytes read, peak RSS and seconds per rank at
# tp 1, 2 and 4, beside PyTorch's safetensors get_slice (`make bench-load-tp`).
EXTRA_DIST += bench/run_load_tp.sh bench/peers/torch_load_tp.py
.PHONY: bench-load-tp
bench-load-tp: bench/bench_load_rss$(EXEEXT) tools/caccel$(EXEEXT)
	CACCEL_PLUGIN_PATH='$(abs_top_builddir)/collectives/.libs' TORCH_PYTHON='$(TORCH_PYTHON)' bash \
	  $(top_srcdir)/bench/run_load_tp.sh --bench ./bench/bench_load_rss$(EXEEXT) --caccel ./tools/caccel$(EXEEXT)
