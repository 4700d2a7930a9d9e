# bench/tp_zero.mk: tensor parallelism composed with sharded data parallelism on 4 processes: the GPT example at
# tp 2 x dp_shard 2 (FULL_SHARD) against tp 2 x dp_replicate 2 and dp 4: tokens/s, peak RSS and model states
# per rank, and each communicator's bytes per step against the formula (`make bench-tp-zero`).
# BENCH_TP_ZERO_ARGS passes e.g. "--reps 3 --steps 6 --shape 6,6,384,256,8" ("--set cp": cp 2 x dp_shard 2
# against cp 2 and cp 2 x dp_replicate 2).
EXTRA_DIST += bench/run_tp_zero.sh bench/tp_zero_report.py

.PHONY: bench-tp-zero
bench: bench-tp-zero
bench-tp-zero: examples/gpt$(EXEEXT) tools/caccel$(EXEEXT) $(filter collectives/%,$(pkglib_LTLIBRARIES))
	CACCEL_PLUGIN_PATH='$(abs_top_builddir)/collectives/.libs' bash $(top_srcdir)/bench/run_tp_zero.sh \
	  --gpt ./examples/gpt$(EXEEXT) --caccel ./tools/caccel$(EXEEXT) $(BENCH_TP_ZERO_ARGS)

# Sharded state dicts against full state at tp 2 x FULL_SHARD 2: save and load time and bytes per rank
# (`make bench-tp-sharded-state`; BENCH_TP_SHARDED_ARGS passes e.g. "--reps 3 --hidden 262144").
EXTRA_DIST += bench/run_tp_sharded_state.sh
.PHONY: bench-tp-sharded-state
bench: bench-tp-sharded-state
bench-tp-sharded-state: tests/tp_check$(EXEEXT) tools/caccel$(EXEEXT) $(filter collectives/%,$(pkglib_LTLIBRARIES))
	CACCEL_PLUGIN_PATH='$(abs_top_builddir)/collectives/.libs' bash $(top_srcdir)/bench/run_tp_sharded_state.sh \
	  --tp-check ./tests/tp_check$(EXEEXT) --caccel ./tools/caccel$(EXEEXT) $(BENCH_TP_SHARDED_ARGS)
