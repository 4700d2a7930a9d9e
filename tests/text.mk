# tests/text.mk: BERT's WordPiece tokenizer and the fortunes dataset: unit tests on a small
# hand-written vocabulary, and parity with Hugging Face's tokenizers on the real vocabulary.
check_PROGRAMS += tests/test_tokenizer tests/tokenizer_tool
TESTS += tests/test_tokenizer tests/test_tokenizer_parity.sh
VALGRIND_TESTS += tests/test_tokenizer
EXTRA_DIST += tests/test_tokenizer_parity.sh tests/tokenizer_cases.py

tests_test_tokenizer_SOURCES = tests/test_tokenizer.c tests/test_util.h
tests_test_tokenizer_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_tokenizer_LDADD = $(CA_TEST_LIBS)

tests_tokenizer_tool_SOURCES = tests/tokenizer_tool.c
tests_tokenizer_tool_CFLAGS = $(AM_CFLAGS)
tests_tokenizer_tool_LDADD = libcaccel.la
