# bench/tp.mk: tensor parallelism (tp 2) against data parallelism (dp 2) and one process on the GPT
# example: tokens/s, peak RSS per rank and each communicator's bytes per step against the plan's formula,
# and PyTorch's parallelize_module as the peer (`make bench-tp`). BENCH_TP_ARGS passes e.g.
# "--reps 3 --steps 6 --shapes default,wide --no-torch"; CACCEL_BENCH_PYTHON picks the python with torch.
EXTRA_DIST += bench/run_tp.sh bench/tp_report.py bench/bench_runs.py bench/peers/torch_tp_gpt.py

.PHONY: bench-tp
bench: bench-tp
# At 1 and 2 threads a process (BENCH_TP_THREADS).
BENCH_TP_THREADS = 1 2
bench-tp: examples/gpt$(EXEEXT) tools/caccel$(EXEEXT) $(filter collectives/%,$(pkglib_LTLIBRARIES))
	for t in $(BENCH_TP_THREADS); do \
	  CACCEL_PLUGIN_PATH='$(abs_top_builddir)/collectives/.libs' bash $(top_srcdir)/bench/run_tp.sh \
	    --gpt ./examples/gpt$(EXEEXT) --caccel ./tools/caccel$(EXEEXT) --threads $$t $(BENCH_TP_ARGS) || exit 1; \
	done
