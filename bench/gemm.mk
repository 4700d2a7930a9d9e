# bench/gemm.mk: GEMM through the CPU kernel table against raw cblas_sgemm
# (`make bench-gemm`; not built by `make`). Like the tests, it compiles the
# backend's sources itself and reaches them through ca_cpu_plugin().
EXTRA_PROGRAMS += bench/bench_gemm
ca_bench_programs += bench/bench_gemm$(EXEEXT)
CLEANFILES += bench/bench_gemm
bench_bench_gemm_SOURCES = bench/bench_gemm.c $(ca_cpu_sources)
bench_bench_gemm_CFLAGS = $(AM_CFLAGS) $(OPENBLAS_CFLAGS)
bench_bench_gemm_LDADD = libcaccel.la $(OPENBLAS_LIBS) -lm
bench_bench_gemm_LDFLAGS = $(OPENMP_CFLAGS)

.PHONY: bench bench-gemm
bench: bench-gemm
# BENCH_GEMM_ARGS: samples per point (default 7), e.g. make bench-gemm BENCH_GEMM_ARGS=15
bench-gemm: bench/bench_gemm$(EXEEXT)
	./bench/bench_gemm$(EXEEXT) $(BENCH_GEMM_ARGS)
