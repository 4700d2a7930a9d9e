# bench/mlp.mk: MLP training throughput against its GEMM time and against PyTorch
# (`make bench-mlp`; BENCH_MLP_ARGS passes e.g. "--reps 5 --threads 1,2").
EXTRA_PROGRAMS += bench/bench_mlp
ca_bench_programs += bench/bench_mlp$(EXEEXT)
CLEANFILES += bench/bench_mlp
bench_bench_mlp_SOURCES = bench/bench_mlp.c bench/bench_util.h
bench_bench_mlp_CFLAGS = $(AM_CFLAGS) $(OPENBLAS_CFLAGS)
bench_bench_mlp_LDADD = libcaccel.la $(OPENBLAS_LIBS) -lm
EXTRA_DIST += bench/run_mlp.sh bench/peers/torch_mlp.py

.PHONY: bench-mlp
bench: bench-mlp
bench-mlp: bench/bench_mlp$(EXEEXT)
	bash $(top_srcdir)/bench/run_mlp.sh --bench ./bench/bench_mlp$(EXEEXT) $(BENCH_MLP_ARGS)

# f32 vs bf16 vs fp16 (and torch.autocast bf16 as the peer): `make bench-amp`
.PHONY: bench-amp
bench: bench-amp
bench-amp: bench/bench_mlp$(EXEEXT)
	bash $(top_srcdir)/bench/run_mlp.sh --bench ./bench/bench_mlp$(EXEEXT) --precisions no,bf16,fp16 \
	  --threads 1 --batch-sizes 128,512 $(BENCH_AMP_ARGS)

# Data-parallel throughput against PyTorch DDP: `make bench-ddp`
EXTRA_DIST += bench/run_ddp.sh bench/peers/torch_ddp.py
.PHONY: bench-ddp
bench: bench-ddp
bench-ddp: bench/bench_mlp$(EXEEXT) tools/caccel$(EXEEXT) $(filter collectives/%,$(pkglib_LTLIBRARIES))
	CACCEL_PLUGIN_PATH='$(abs_top_builddir)/collectives/.libs' bash $(top_srcdir)/bench/run_ddp.sh \
	  --bench ./bench/bench_mlp$(EXEEXT) --caccel ./tools/caccel$(EXEEXT) $(BENCH_DDP_ARGS)

# Data parallelism over a shaped network link (two network namespaces, tc tbf; needs root):
# `make bench-netem`; BENCH_NETEM_ARGS passes e.g. "--rate 100mbit --reps 5".
EXTRA_DIST += bench/run_netem.sh
.PHONY: bench-netem
bench: bench-netem
bench-netem: bench/bench_mlp$(EXEEXT) tools/caccel$(EXEEXT) $(filter collectives/%,$(pkglib_LTLIBRARIES))
	CACCEL_PLUGIN_PATH='$(abs_top_builddir)/collectives/.libs' bash $(top_srcdir)/bench/run_netem.sh \
	  --bench ./bench/bench_mlp$(EXEEXT) --caccel ./tools/caccel$(EXEEXT) $(BENCH_NETEM_ARGS)

# enable_cpu_affinity at 2 processes, the MLP and the GPT example, with and without binding: `make bench-affinity`
EXTRA_DIST += bench/run_affinity.sh
.PHONY: bench-affinity
bench: bench-affinity
bench-affinity: bench/bench_mlp$(EXEEXT) examples/gpt$(EXEEXT) tools/caccel$(EXEEXT) $(filter collectives/%,$(pkglib_LTLIBRARIES))
	CACCEL_PLUGIN_PATH='$(abs_top_builddir)/collectives/.libs' bash $(top_srcdir)/bench/run_affinity.sh \
	  --bench ./bench/bench_mlp$(EXEEXT) --gpt ./examples/gpt$(EXEEXT) --caccel ./tools/caccel$(EXEEXT) $(BENCH_AFFINITY_ARGS)
