# tests/dist.mk: multi-process tests (real processes, real mpirun, real caccel launch), the store and
# communicator unit tests. Tests whose dependency is missing exit 77 (SKIP).
check_PROGRAMS += tests/dist/comm_check
tests_dist_comm_check_SOURCES = tests/dist/comm_check.c
tests_dist_comm_check_CFLAGS = $(AM_CFLAGS)
tests_dist_comm_check_LDADD = $(CA_TEST_LIBS)

# The store alone (its sources are hidden in the library, so the test links them itself).
check_PROGRAMS += tests/test_comm_store tests/test_comm_threads tests/test_comm_single tests/test_procenv
TESTS += tests/test_comm_store tests/test_comm_threads tests/test_comm_single tests/test_procenv
tests_test_comm_store_SOURCES = tests/test_comm_store.c comm/store_server.c comm/store_client.c comm/store_wire_impl.h comm/store_impl.h
tests_test_comm_store_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_comm_store_LDADD = $(CA_TEST_LIBS)
# Threads as ranks over Gloo: the public ca_comm API, a store served in the test.
tests_test_comm_threads_SOURCES = tests/test_comm_threads.c comm/store_server.c comm/store_client.c comm/store_wire_impl.h comm/store_impl.h
tests_test_comm_threads_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_comm_threads_LDADD = $(CA_TEST_LIBS)
tests_test_comm_single_SOURCES = tests/test_comm_single.c
tests_test_comm_single_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_comm_single_LDADD = $(CA_TEST_LIBS)
# Launcher detection from environment lists (procenv.c stands alone with the store).
tests_test_procenv_SOURCES = tests/test_procenv.c comm/procenv.c comm/procenv_impl.h comm/store_server.c comm/store_client.c \
	comm/store_wire_impl.h comm/store_impl.h
tests_test_procenv_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_procenv_LDADD = $(CA_TEST_LIBS)
VALGRIND_TESTS += tests/test_comm_store tests/test_comm_single tests/test_procenv

# Real processes: mpirun, caccel launch, failures, ranks that leave early, ports, three network namespaces,
# a private one-node Slurm cluster (srun, sbatch), the fault matrix.
ca_dist_scripts = tests/dist/launch_mpirun.sh tests/dist/mpi.sh tests/dist/gloo.sh tests/dist/p2p.sh tests/dist/failures.sh tests/dist/exits.sh tests/dist/port.sh \
	tests/dist/restarts.sh tests/dist/shutdown.sh \
	tests/dist/netns.sh tests/dist/faults.sh tests/dist/slurm.sh tests/dist/hostfile.sh tests/dist/hostfile_netns.sh \
	tests/dist/flightrec.sh tests/dist/flightrec_signal.sh tests/dist/elastic.sh tests/dist/elastic_rdzv.sh
TESTS += $(ca_dist_scripts)
EXTRA_DIST += $(ca_dist_scripts) tests/dist/lib.sh tests/dist/netns_lib.sh

# The whole fault matrix (tests/dist/faults.sh): every cell 20 times; `make check` runs 8 cells once.
FAULT_MATRIX_ARGS = --trials 20
fault-matrix: tests/dist/comm_check$(EXEEXT) tools/caccel$(EXEEXT)
	CACCEL_TEST_BUILDDIR='$(abs_top_builddir)' CACCEL_PLUGIN_PATH='$(abs_top_builddir)/collectives/.libs' \
	  sh $(top_srcdir)/tests/dist/faults.sh $(FAULT_MATRIX_ARGS)
.PHONY: fault-matrix

# enable_cpu_affinity: the sets on synthetic topologies and this process's own binding (affinity.c is hidden
# in the library, so the test links it itself); then ranks of caccel launch and mpirun reporting theirs.
check_PROGRAMS += tests/test_affinity tests/affinity_rank
TESTS += tests/test_affinity tests/test_affinity_ranks.sh
EXTRA_DIST += tests/test_affinity_ranks.sh
tests_test_affinity_SOURCES = tests/test_affinity.c comm/affinity.c comm/affinity_impl.h
tests_test_affinity_CFLAGS = $(CA_TEST_CFLAGS) $(HWLOC_CFLAGS)
tests_test_affinity_LDADD = $(CA_TEST_LIBS) $(HWLOC_LIBS)
tests_affinity_rank_SOURCES = tests/affinity_rank.c
tests_affinity_rank_CFLAGS = $(AM_CFLAGS) $(HWLOC_CFLAGS)
tests_affinity_rank_LDADD = libcaccel.la $(HWLOC_LIBS)
