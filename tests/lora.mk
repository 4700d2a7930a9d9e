# tests/lora.mk: LoRA adapters (caccel/lora.h): unit tests (target matching by PEFT's rules,
# refusals, gradients, merge round trips, the adapter files) and parity with PEFT itself on a
# small BertModel (outputs, gradients, adapter files both ways, merged weights, merge-weights).
check_PROGRAMS += tests/test_lora tests/lora_tool
TESTS += tests/test_lora tests/test_lora_peft.sh
VALGRIND_TESTS += tests/test_lora
EXTRA_DIST += tests/test_lora_peft.sh
tests_test_lora_SOURCES = tests/test_lora.c tests/test_util.h
tests_test_lora_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_lora_LDADD = $(CA_TEST_LIBS)
tests_lora_tool_SOURCES = tests/lora_tool.c
tests_lora_tool_CFLAGS = $(AM_CFLAGS)
tests_lora_tool_LDADD = libcaccel.la -lm
