# bench/threads.mk: thread scaling of the GPT, BERT, MLP and xla-MLP steps against PyTorch eager and
# torch.compile, with each step's serial fraction and its Amdahl projection (`make bench-threads`).
# BENCH_THREADS_ARGS passes e.g. "--threads 1,2,4 --reps 3 --parts gpt,bert"; THREADS, REPS, QUICK and
# TORCH_PYTHON in the environment work too (bench/run_threads.sh's header).
EXTRA_DIST += bench/run_threads.sh bench/stage_threads.sh bench/serial_profile.py

.PHONY: bench-threads
bench: bench-threads
bench-threads: examples/gpt$(EXEEXT) bench/bench_transformer$(EXEEXT) bench/bench_mlp$(EXEEXT) \
  bench/bench_xla$(EXEEXT) tools/caccel$(EXEEXT)
	bash $(top_srcdir)/bench/run_threads.sh --build . $(BENCH_THREADS_ARGS)
