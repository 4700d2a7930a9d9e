# bench/comm.mk: all_reduce through caccel against raw MPI_Allreduce (same processes, under mpirun)
# and raw gloo::allreduce (bench_gloo_raw, under caccel launch), 4 B .. 64 MiB, 2 ranks
# (`make bench-comm`; not built by `make`). BENCH_COMM_ARGS passes e.g. "--max-mib 16 --rounds 5".
EXTRA_PROGRAMS += bench/bench_allreduce
ca_bench_programs += bench/bench_allreduce$(EXEEXT)
CLEANFILES += bench/bench_allreduce bench/bench_gloo_raw
bench_bench_allreduce_SOURCES = bench/bench_allreduce.c
bench_bench_allreduce_CFLAGS = $(AM_CFLAGS)
bench_bench_allreduce_LDADD = libcaccel.la
if HAVE_MPI
bench_bench_allreduce_CFLAGS += $(MPI_CFLAGS) -DCA_BENCH_MPI
bench_bench_allreduce_LDADD += $(MPI_LIBS)
endif
if HAVE_GLOO
EXTRA_PROGRAMS += bench/bench_gloo_raw
ca_bench_programs += bench/bench_gloo_raw$(EXEEXT)
bench_bench_gloo_raw_SOURCES = bench/bench_gloo_raw.cc
bench_bench_gloo_raw_CXXFLAGS = $(AM_CXXFLAGS) $(GLOO_CFLAGS)
bench_bench_gloo_raw_LDADD = $(GLOO_LIBS) -lpthread
endif
EXTRA_DIST += bench/bench_gloo_raw.cc

ca_bench_comm_env = CACCEL_PLUGIN_PATH='$(abs_top_builddir)/collectives/.libs'
ca_bench_comm_deps = bench/bench_allreduce$(EXEEXT) tools/caccel$(EXEEXT) $(pkglib_LTLIBRARIES)
if HAVE_GLOO
ca_bench_comm_deps += bench/bench_gloo_raw$(EXEEXT)
endif

.PHONY: bench-comm
bench: bench-comm
bench-comm: $(ca_bench_comm_deps)
	@echo "== bench-comm on $$(hostname): $$(nproc) CPUs, $$(date -u '+%Y-%m-%d %H:%M UTC')"
if HAVE_MPI
	@echo "== caccel (backend mpi) vs raw MPI_Allreduce, 2 ranks under mpirun"
	$(ca_bench_comm_env) $(MPIRUN) $(CA_BENCH_MPIRUN_ARGS) -np 2 ./bench/bench_allreduce$(EXEEXT) --backend mpi $(BENCH_COMM_ARGS)
endif
if HAVE_GLOO
	@echo "== caccel (backend gloo) vs raw gloo::allreduce, 2 ranks under caccel launch"
	@rm -rf bench-comm.tmp && mkdir -p bench-comm.tmp/store
	$(ca_bench_comm_env) ./tools/caccel$(EXEEXT) launch -q --num_processes 2 --main_process_port 0 \
	  ./bench/bench_gloo_raw$(EXEEXT) bench-comm.tmp/store > bench-comm.tmp/raw-gloo.txt
	$(ca_bench_comm_env) ./tools/caccel$(EXEEXT) launch -q --num_processes 2 --main_process_port 0 \
	  ./bench/bench_allreduce$(EXEEXT) --backend gloo --raw bench-comm.tmp/raw-gloo.txt $(BENCH_COMM_ARGS)
	@rm -rf bench-comm.tmp
endif
# mpirun flags for this machine, e.g. CA_BENCH_MPIRUN_ARGS="--allow-run-as-root --oversubscribe"
CA_BENCH_MPIRUN_ARGS =
