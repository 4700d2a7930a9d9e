# tests/decoder.mk: decoder language models (Llama, Qwen2, Mistral): config.json refusals and the
# shifted loss on hand examples, and parity with transformers on tiny random models of each family
# (logits, loss, every gradient, the files caccel writes, a sharded checkpoint).
check_PROGRAMS += tests/test_causal_lm tests/causal_lm_tool
TESTS += tests/test_causal_lm tests/test_causal_lm_parity.sh
VALGRIND_TESTS += tests/test_causal_lm
EXTRA_DIST += tests/test_causal_lm_parity.sh tests/causal_lm_reference.py
tests_test_causal_lm_SOURCES = tests/test_causal_lm.c tests/test_util.h
tests_test_causal_lm_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_causal_lm_LDADD = $(CA_TEST_LIBS)
tests_causal_lm_tool_SOURCES = tests/causal_lm_tool.c
tests_causal_lm_tool_CFLAGS = $(AM_CFLAGS)
tests_causal_lm_tool_LDADD = libcaccel.la

# The models' attention through views of their projections (nn/bert.c, nn/causal_lm.c, nn/gpt2_lm.c): the
# copy kernels of one step counted in the kernel trace, the bits of a device whose kernels read no strides.
check_PROGRAMS += tests/test_nn_attention_views
TESTS += tests/test_nn_attention_views
VALGRIND_TESTS += tests/test_nn_attention_views
tests_test_nn_attention_views_SOURCES = tests/test_nn_attention_views.c tests/test_util.h
tests_test_nn_attention_views_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_nn_attention_views_LDADD = $(CA_TEST_LIBS)
