# bench/async_save.mk: asynchronous ca_save_state: the training stall per save against a synchronous
# save, and the background write against cp + sync of the same files (`make bench-async-save`;
# BENCH_ASYNC_SAVE_ARGS passes e.g. "--mib 512 --reps 3 --dir /some/disk").
EXTRA_PROGRAMS += bench/bench_async_save
ca_bench_programs += bench/bench_async_save$(EXEEXT)
CLEANFILES += bench/bench_async_save
bench_bench_async_save_SOURCES = bench/bench_async_save.c bench/bench_util.h
bench_bench_async_save_LDADD = libcaccel.la -lm
EXTRA_DIST += bench/run_async_save.sh bench/torch_async_save.py

.PHONY: bench-async-save
bench: bench-async-save
bench-async-save: bench/bench_async_save$(EXEEXT)
	$(srcdir)/bench/run_async_save.sh --build . $(BENCH_ASYNC_SAVE_ARGS)
