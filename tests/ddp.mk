# tests/ddp.mk: data-parallel training through the accelerator, as real processes.
check_PROGRAMS += tests/ddp_check
tests_ddp_check_SOURCES = tests/ddp_check.c tests/synthetic_data.h
tests_ddp_check_LDADD = libcaccel.la -lm
TESTS += tests/test_ddp.sh tests/test_determinism.sh tests/test_zero.sh tests/test_zero3_held.sh tests/test_frozen_ranks.sh tests/test_reshard.sh tests/test_meta_ranks.sh
EXTRA_DIST += tests/test_ddp.sh tests/test_determinism.sh tests/test_zero.sh tests/test_zero3_held.sh tests/test_frozen_ranks.sh tests/test_reshard.sh tests/test_meta_ranks.sh
check_PROGRAMS += tests/sync_check
tests_sync_check_SOURCES = tests/sync_check.c
tests_sync_check_LDADD = libcaccel.la -lm
TESTS += tests/test_sync.sh
EXTRA_DIST += tests/test_sync.sh
# find_executable_batch_size on 2 ranks: one rank out of memory makes both retry at the same size
check_PROGRAMS += tests/batch_size_check
tests_batch_size_check_SOURCES = tests/batch_size_check.c
tests_batch_size_check_LDADD = libcaccel.la -lm
TESTS += tests/test_batch_size_ranks.sh
EXTRA_DIST += tests/test_batch_size_ranks.sh
# Tensor parallelism on the device mesh (parallelism_config_tp_size): an MLP split colwise/rowwise against one process
check_PROGRAMS += tests/tp_check
tests_tp_check_SOURCES = tests/tp_check.c tests/synthetic_data.h
tests_tp_check_LDADD = libcaccel.la -lm
TESTS += tests/test_tp.sh
EXTRA_DIST += tests/test_tp.sh
# Context parallelism (parallelism_config_cp_size): the split attention and loss, the GPT example, against one process
check_PROGRAMS += tests/cp_check
tests_cp_check_SOURCES = tests/cp_check.c tests/mock_gpu.h
tests_cp_check_LDADD = libcaccel.la -lm
TESTS += tests/test_cp.sh tests/test_cp_mock_gpu.sh
EXTRA_DIST += tests/test_cp.sh tests/test_cp_mock_gpu.sh
# A Hugging Face decoder (examples/llm_finetune) split by base_model_tp_plan, full and LoRA, against one process
TESTS += tests/test_tp_llm.sh
EXTRA_DIST += tests/test_tp_llm.sh
# Tensor parallelism x ZeRO / FSDP over the data-parallel ranks (dp_shard): tp_check, GPT and a Llama against one process
TESTS += tests/test_tp_zero.sh
EXTRA_DIST += tests/test_tp_zero.sh
# Tensor parallelism on the lazy device (--tpu): the GPT example, a Llama, tp_check's MLP, checkpoints, against one process
TESTS += tests/test_tp_xla.sh
EXTRA_DIST += tests/test_tp_xla.sh
# Context parallelism x ZeRO / FSDP over dp_shard x cp (Accelerate's dp_shard_cp): the GPT example against one process
TESTS += tests/test_cp_zero.sh
EXTRA_DIST += tests/test_cp_zero.sh
# Sharded state dicts under tensor parallelism: saved at tp 2 x FULL_SHARD 2, loaded at other tp and dp sizes
TESTS += tests/test_tp_sharded_state.sh
EXTRA_DIST += tests/test_tp_sharded_state.sh
