# tests/text.mk: BERT's WordPiece tokenizer, the fortunes dataset and BERT's config.json: unit
# tests on a small hand-written vocabulary and checkpoint, parity with Hugging Face's tokenizers
# on the real vocabulary, and the real all-MiniLM-L6-v2 files through the readers.
check_PROGRAMS += tests/test_tokenizer tests/test_tokenizer_bpe tests/test_bert_config tests/text_tool
TESTS += tests/test_tokenizer tests/test_tokenizer_bpe tests/test_bert_config tests/test_tokenizer_parity.sh \
	tests/test_tokenizer_bpe_parity.sh \
	tests/test_minilm_files.sh
VALGRIND_TESTS += tests/test_tokenizer tests/test_tokenizer_bpe tests/test_bert_config
EXTRA_DIST += tests/test_tokenizer_parity.sh tests/tokenizer_cases.py tests/test_minilm_files.sh \
	tests/test_tokenizer_bpe_parity.sh tests/tokenizer_bpe_cases.py

tests_test_tokenizer_bpe_SOURCES = tests/test_tokenizer_bpe.c tests/test_util.h
tests_test_tokenizer_bpe_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_tokenizer_bpe_LDADD = $(CA_TEST_LIBS)
tests_test_tokenizer_SOURCES = tests/test_tokenizer.c tests/test_util.h
tests_test_tokenizer_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_tokenizer_LDADD = $(CA_TEST_LIBS)

tests_text_tool_SOURCES = tests/text_tool.c
tests_text_tool_CFLAGS = $(AM_CFLAGS)
tests_text_tool_LDADD = libcaccel.la

tests_test_bert_config_SOURCES = tests/test_bert_config.c tests/test_util.h
tests_test_bert_config_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_bert_config_LDADD = $(CA_TEST_LIBS)

# BertModel and BertForSequenceClassification: parity with PyTorch on the real checkpoint.
check_PROGRAMS += tests/bert_tool tests/test_bert
TESTS += tests/test_bert tests/test_bert_parity.sh tests/test_bert_classifier.sh
EXTRA_DIST += tests/test_bert_parity.sh tests/test_bert_classifier.sh tests/bert_reference.py
VALGRIND_TESTS += tests/test_bert
tests_test_bert_SOURCES = tests/test_bert.c tests/test_util.h
tests_test_bert_CFLAGS = $(CA_TEST_CFLAGS)
tests_test_bert_LDADD = $(CA_TEST_LIBS)
tests_bert_tool_SOURCES = tests/bert_tool.c
tests_bert_tool_CFLAGS = $(AM_CFLAGS)
tests_bert_tool_LDADD = libcaccel.la

# Rotary tables and ca_rope: parity with transformers (tests/test_rope_parity.sh drives rope_tool).
check_PROGRAMS += tests/rope_tool
TESTS += tests/test_rope_parity.sh
EXTRA_DIST += tests/test_rope_parity.sh
tests_rope_tool_SOURCES = tests/rope_tool.c
tests_rope_tool_CFLAGS = $(AM_CFLAGS)
tests_rope_tool_LDADD = libcaccel.la
