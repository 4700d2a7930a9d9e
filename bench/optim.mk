# bench/optim.mk: the fused AdamW/SGD kernels over the MLP's parameters with optimizer state from
# normal down to subnormal magnitudes, subnormal flushing on and off, bytes per step against memcpy
# (`make bench-optim`; not built by `make`). BENCH_OPTIM_ARGS: samples and steps, e.g. "15 100".
# Like bench-gemm it compiles the backend's sources and reaches them through ca_cpu_plugin().
EXTRA_PROGRAMS += bench/bench_optim
ca_bench_programs += bench/bench_optim$(EXEEXT)
CLEANFILES += bench/bench_optim
bench_bench_optim_SOURCES = bench/bench_optim.c $(ca_cpu_sources)
bench_bench_optim_CFLAGS = $(AM_CFLAGS) $(OPENBLAS_CFLAGS)
bench_bench_optim_LDADD = libcaccel.la $(OPENBLAS_LIBS) -lm
bench_bench_optim_LDFLAGS = $(OPENMP_CFLAGS)

.PHONY: bench-optim
bench: bench-optim
bench-optim: bench/bench_optim$(EXEEXT)
	./bench/bench_optim$(EXEEXT) $(BENCH_OPTIM_ARGS)
