# bench/load.mk: loading one ~1 GiB safetensors file: ca_load_model against safetensors.torch.load_file
# + load_state_dict and against cat of the file (`make bench-load`; BENCH_LOAD_ARGS passes e.g.
# "--reps 3 --layers 16 --dir /some/disk"; CACCEL_BENCH_PYTHON the python with torch and safetensors).
EXTRA_PROGRAMS += bench/bench_load
ca_bench_programs += bench/bench_load$(EXEEXT)
CLEANFILES += bench/bench_load
bench_bench_load_SOURCES = bench/bench_load.c bench/bench_util.h
bench_bench_load_LDADD = libcaccel.la -lm
EXTRA_DIST += bench/run_load.sh bench/peers/torch_load.py

.PHONY: bench-load
bench: bench-load
bench-load: bench/bench_load$(EXEEXT)
	bash $(top_srcdir)/bench/run_load.sh --build . $(BENCH_LOAD_ARGS)
