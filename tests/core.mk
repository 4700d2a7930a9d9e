# tests/core.mk: status, registry, allocator, tensors, autograd, nn, optimizers, accelerator.
check_PROGRAMS += tests/test_core tests/test_autograd
TESTS += tests/test_core tests/test_autograd
EXTRA_DIST += tests/test_util.h
tests_test_core_SOURCES = tests/test_core.c tests/test_util.h
tests_test_core_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_core_LDADD = $(CA_TEST_LIBS)
tests_test_autograd_SOURCES = tests/test_autograd.c tests/test_util.h tests/gradcheck_util.h
tests_test_autograd_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_autograd_LDADD = $(CA_TEST_LIBS)

# Two tiny plugins for the registry tests: one for another ABI (refused), one for this ABI.
check_LTLIBRARIES += tests/caccel_test_badabi.la tests/caccel_test_goodabi.la
tests_caccel_test_badabi_la_SOURCES = tests/test_plugin_abi.c
tests_caccel_test_badabi_la_CFLAGS = $(AM_CFLAGS) -DTEST_ABI_MAJOR='(CA_ABI_MAJOR + 1)'
tests_caccel_test_badabi_la_LDFLAGS = -module -avoid-version -rpath /nowhere
tests_caccel_test_goodabi_la_SOURCES = tests/test_plugin_abi.c
tests_caccel_test_goodabi_la_CFLAGS = $(AM_CFLAGS)
tests_caccel_test_goodabi_la_LDFLAGS = -module -avoid-version -rpath /nowhere
check_PROGRAMS += tests/test_nn
TESTS += tests/test_nn
tests_test_nn_SOURCES = tests/test_nn.c tests/test_util.h
tests_test_nn_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_nn_LDADD = $(CA_TEST_LIBS)
VALGRIND_TESTS = tests/test_core tests/test_autograd tests/test_nn
check_PROGRAMS += tests/test_meta
TESTS += tests/test_meta
VALGRIND_TESTS += tests/test_meta
tests_test_meta_SOURCES = tests/test_meta.c tests/test_util.h
tests_test_meta_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_meta_LDADD = $(CA_TEST_LIBS)
check_PROGRAMS += tests/test_transformer_ops
TESTS += tests/test_transformer_ops
VALGRIND_TESTS += tests/test_transformer_ops
tests_test_transformer_ops_SOURCES = tests/test_transformer_ops.c tests/test_util.h
tests_test_transformer_ops_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_transformer_ops_LDADD = $(CA_TEST_LIBS)
# accelerator/'s files call each other without a circle (read from the built objects with nm)
TESTS += tests/test_file_cycles.sh
EXTRA_DIST += tests/test_file_cycles.sh
check_PROGRAMS += tests/test_accelerator
TESTS += tests/test_accelerator
VALGRIND_TESTS += tests/test_accelerator
tests_test_accelerator_SOURCES = tests/test_accelerator.c tests/test_util.h
tests_test_accelerator_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_accelerator_LDADD = $(CA_TEST_LIBS)
# find_executable_batch_size: the 0.9 steps, the size returned under a device memory limit, refusals
check_PROGRAMS += tests/test_batch_size
TESTS += tests/test_batch_size
VALGRIND_TESTS += tests/test_batch_size
tests_test_batch_size_SOURCES = tests/test_batch_size.c tests/test_util.h
tests_test_batch_size_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_batch_size_LDADD = $(CA_TEST_LIBS)
check_PROGRAMS += tests/test_mixed_precision
TESTS += tests/test_mixed_precision
VALGRIND_TESTS += tests/test_mixed_precision
tests_test_mixed_precision_SOURCES = tests/test_mixed_precision.c tests/test_util.h
tests_test_mixed_precision_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_mixed_precision_LDADD = $(CA_TEST_LIBS)
TESTS += tests/test_examples.sh
EXTRA_DIST += tests/test_examples.sh
# Model files (safetensors): the unit test, the interop checks against Python's safetensors and PyTorch.
check_PROGRAMS += tests/test_checkpoint
TESTS += tests/test_checkpoint tests/test_safetensors_interop.sh tests/test_checkpoint_ranks.sh \
	tests/test_torch_interop.sh
VALGRIND_TESTS += tests/test_checkpoint
EXTRA_DIST += tests/test_safetensors_interop.sh tests/test_checkpoint_ranks.sh tests/test_torch_interop.sh
tests_test_checkpoint_SOURCES = tests/test_checkpoint.c tests/test_util.h
tests_test_checkpoint_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_checkpoint_LDADD = $(CA_TEST_LIBS)
# Training state (save_state / load_state): the unit test; exact resume of the example after kill -9
# on 1 and 2 processes, and kill -9 during a save.
check_PROGRAMS += tests/test_state
TESTS += tests/test_state
VALGRIND_TESTS += tests/test_state
tests_test_state_SOURCES = tests/test_state.c tests/test_util.h
tests_test_state_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_state_LDADD = $(CA_TEST_LIBS)
# Frozen parameters (requires_grad false): optimizers, clipping, mixed precision, checkpoints, one process.
check_PROGRAMS += tests/test_frozen
TESTS += tests/test_frozen
VALGRIND_TESTS += tests/test_frozen
tests_test_frozen_SOURCES = tests/test_frozen.c tests/test_util.h
tests_test_frozen_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_frozen_LDADD = $(CA_TEST_LIBS)
# Asynchronous save_state: the C test (one process, kill -9 of the background writer) and 2 and 4
# ranks under caccel launch (Gloo) and mpirun.
check_PROGRAMS += tests/test_async_save
TESTS += tests/test_async_save tests/test_async_save_ranks.sh
VALGRIND_TESTS += tests/test_async_save
EXTRA_DIST += tests/test_async_save_ranks.sh
tests_test_async_save_SOURCES = tests/test_async_save.c tests/test_util.h tests/test_ckpt_util.h
tests_test_async_save_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_async_save_LDADD = $(CA_TEST_LIBS)
# Asynchronous saves on a mocked GPU: pinned host copy, copy stream and events, the fallback without them.
check_PROGRAMS += tests/test_save_copy
TESTS += tests/test_save_copy
tests_test_save_copy_SOURCES = tests/test_save_copy.c tests/test_util.h tests/test_ckpt_util.h tests/mock_gpu.h
tests_test_save_copy_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_save_copy_LDADD = $(CA_TEST_LIBS) -lpthread
TESTS += tests/test_resume.sh tests/test_state_ranks.sh tests/test_full_disk.sh
EXTRA_DIST += tests/test_resume.sh tests/test_state_ranks.sh tests/test_full_disk.sh
# The safetensors reader's mapping and chunk verification (its functions are not exported: the objects).
check_PROGRAMS += tests/test_safetensors_map
TESTS += tests/test_safetensors_map
VALGRIND_TESTS += tests/test_safetensors_map
tests_test_safetensors_map_SOURCES = tests/test_safetensors_map.c tests/test_util.h
tests_test_safetensors_map_CFLAGS = $(CA_TEST_CFLAGS) $(JSONC_CFLAGS)
tests_test_safetensors_map_LDADD = $(libcaccel_la_OBJECTS) $(libcaccel_la_LIBADD) $(CMOCKA_LIBS) -lm
# A full state dict under ZeRO: each rank verifies and reads only its slice of the optimizer state.
TESTS += tests/test_state_ranges.sh
EXTRA_DIST += tests/test_state_ranges.sh
# load_state at ZeRO stage 3: each rank verifies and copies only its shard's ranges, nothing gathered.
TESTS += tests/test_state_lean.sh
EXTRA_DIST += tests/test_state_lean.sh
# ZeRO stages 1-2 (and 3 under MPI): each rank reads only its optimizer-state slices, over Gloo and MPI.
TESTS += tests/test_state_lean_zero.sh
EXTRA_DIST += tests/test_state_lean_zero.sh
# ca_load_model under DDP / ZeRO 1-2: rank 0 reads the files and broadcasts the parameters.
TESTS += tests/test_load_rank0.sh
EXTRA_DIST += tests/test_load_rank0.sh
# ... and a peer that dies or stops in the middle of those broadcasts: rank 0's model restored.
TESTS += tests/test_load_rank0_fail.sh
EXTRA_DIST += tests/test_load_rank0_fail.sh
TESTS += tests/test_load_state_restore.sh
EXTRA_DIST += tests/test_load_state_restore.sh
TESTS += tests/test_load_meta_restore.sh
EXTRA_DIST += tests/test_load_meta_restore.sh tests/bcast_stall.sh
# A meta model loaded before ca_prepare at stage 3, and the pretrained loaders under ca_init_empty_weights:
# each rank reads only its shard's bytes at ca_prepare (DDP: rank 0 reads and broadcasts).
TESTS += tests/test_load_meta_zero3.sh
EXTRA_DIST += tests/test_load_meta_zero3.sh
TESTS += tests/test_load_tp.sh
EXTRA_DIST += tests/test_load_tp.sh tests/load_tp_model.sh
TESTS += tests/test_load_state_tp.sh
EXTRA_DIST += tests/test_load_state_tp.sh
# ca_load_state at tp 2 x dp_shard 2 (ZeRO 1, 2, 3): each rank reads its shard's part of its tp slices, the
# chunks verified by the tp x dp_shard group's sums together.
TESTS += tests/test_load_state_tp_zero.sh
EXTRA_DIST += tests/test_load_state_tp_zero.sh
TESTS += tests/test_load_state_kill.sh
EXTRA_DIST += tests/test_load_state_kill.sh
# Broken files in the plugin path (truncated, text, not a plugin) are skipped with a warning naming each.
TESTS += tests/test_plugin_files.sh
EXTRA_DIST += tests/test_plugin_files.sh
# Activation checkpointing (ca_checkpoint, ca_module_set_checkpointing).
check_PROGRAMS += tests/test_actckpt
TESTS += tests/test_actckpt
VALGRIND_TESTS += tests/test_actckpt
tests_test_actckpt_SOURCES = tests/test_actckpt.c tests/test_util.h
tests_test_actckpt_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_actckpt_LDADD = $(CA_TEST_LIBS)
# Experiment trackers (log_with json/csv/mlflow): the unit test; only the main process writes on 2 ranks;
# TensorBoard and MLflow read their files back.
check_PROGRAMS += tests/test_trackers
TESTS += tests/test_trackers tests/test_trackers_ranks.sh tests/test_trackers_tensorboard.sh \
	tests/test_trackers_mlflow.sh
VALGRIND_TESTS += tests/test_trackers
EXTRA_DIST += tests/test_trackers_ranks.sh tests/test_trackers_tensorboard.sh tests/test_trackers_mlflow.sh
tests_test_trackers_SOURCES = tests/test_trackers.c tests/test_util.h
tests_test_trackers_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_trackers_LDADD = $(CA_TEST_LIBS)
# Progress bar: line format, rate limiting and ETA against a test clock; only the main process draws on 2 ranks.
check_PROGRAMS += tests/test_progress
TESTS += tests/test_progress tests/test_progress_ranks.sh
VALGRIND_TESTS += tests/test_progress
EXTRA_DIST += tests/test_progress_ranks.sh
tests_test_progress_SOURCES = tests/test_progress.c tests/test_util.h
tests_test_progress_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_progress_LDADD = $(CA_TEST_LIBS)
# Every reader handed a FIFO, /dev/zero or an oversized file; the file opener itself (hidden in the
# library, so the test links it).
check_PROGRAMS += tests/test_files
TESTS += tests/test_files
VALGRIND_TESTS += tests/test_files
tests_test_files_SOURCES = tests/test_files.c tests/test_util.h base/file.c base/file_impl.h
tests_test_files_CFLAGS = $(CA_TEST_CFLAGS) $(ZLIB_CFLAGS)
tests_test_files_LDADD = $(CA_TEST_LIBS) $(ZLIB_LIBS)
# Op conformance: every op case of one table on every device that opens (cpu, xla, cuda), forward,
# backward and finite differences against the CPU, and the kernel rows (docs/TESTING.md, "test_ops").
# 2 s; 23 s CPU under valgrind.
check_PROGRAMS += tests/test_ops
TESTS += tests/test_ops
VALGRIND_TESTS += tests/test_ops
tests_test_ops_SOURCES = tests/test_ops.c tests/test_util.h tests/test_ulp.h
tests_test_ops_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_ops_LDADD = $(CA_TEST_LIBS)
# host simulations of the CUDA kernels' rounding against test_ops's bounds (docs/CUDA.md); no GPU needed
check_PROGRAMS += tests/test_cuda_numerics
TESTS += tests/test_cuda_numerics
tests_test_cuda_numerics_SOURCES = tests/test_cuda_numerics.c tests/test_util.h tests/test_ulp.h
tests_test_cuda_numerics_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_cuda_numerics_LDADD = $(CA_TEST_LIBS)
