# tests/fuzz: one libFuzzer target per input format (docs/TESTING.md). `make check` replays each
# target's corpus and kept crash inputs through the same entry point (tests/fuzz/replay_*); a build
# configured with CC=clang --enable-fuzzing builds the fuzzers (`make fuzz-build`) and runs each
# for FUZZ_SECONDS (`make fuzz`). The programs link the library's objects, not libcaccel.so, so the
# targets reach the readers the library does not export (safetensors, the store, DeepSpeed's JSON).
FUZZ_TARGETS = config deepspeed state merge_weights idx safetensors tokenizer store bert_config causal_lm_config flightrec
FUZZ_SECONDS = 60
fuzz_cflags = $(CA_TEST_CFLAGS) $(JSONC_CFLAGS) $(YAML_CFLAGS)
fuzz_ldadd = $(libcaccel_la_OBJECTS) $(libcaccel_la_LIBADD) -lm

EXTRA_DIST += tests/fuzz

check_PROGRAMS += tests/fuzz/replay_config tests/fuzz/replay_deepspeed tests/fuzz/replay_state \
	tests/fuzz/replay_merge_weights tests/fuzz/replay_idx tests/fuzz/replay_safetensors \
	tests/fuzz/replay_tokenizer tests/fuzz/replay_store tests/fuzz/replay_bert_config \
	tests/fuzz/replay_causal_lm_config tests/fuzz/replay_flightrec
fuzz_replays = tests/fuzz/replay_config tests/fuzz/replay_deepspeed tests/fuzz/replay_state \
	tests/fuzz/replay_merge_weights tests/fuzz/replay_idx tests/fuzz/replay_safetensors \
	tests/fuzz/replay_tokenizer tests/fuzz/replay_store tests/fuzz/replay_bert_config \
	tests/fuzz/replay_causal_lm_config tests/fuzz/replay_flightrec
TESTS += $(fuzz_replays)
VALGRIND_TESTS += $(fuzz_replays)

tests_fuzz_replay_config_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_config.c tests/fuzz/fuzz_util.h
tests_fuzz_replay_config_CFLAGS = $(fuzz_cflags) -DFUZZ_TARGET='"config"'
tests_fuzz_replay_config_LDADD = $(fuzz_ldadd)
tests_fuzz_replay_deepspeed_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_deepspeed.c tests/fuzz/fuzz_util.h
tests_fuzz_replay_deepspeed_CFLAGS = $(fuzz_cflags) -DFUZZ_TARGET='"deepspeed"'
tests_fuzz_replay_deepspeed_LDADD = $(fuzz_ldadd)
tests_fuzz_replay_state_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_state.c tests/fuzz/fuzz_util.h
tests_fuzz_replay_state_CFLAGS = $(fuzz_cflags) -DFUZZ_TARGET='"state"'
tests_fuzz_replay_state_LDADD = $(fuzz_ldadd)
tests_fuzz_replay_merge_weights_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_merge_weights.c tests/fuzz/fuzz_util.h
tests_fuzz_replay_merge_weights_CFLAGS = $(fuzz_cflags) -DFUZZ_TARGET='"merge_weights"'
tests_fuzz_replay_merge_weights_LDADD = $(fuzz_ldadd)
tests_fuzz_replay_idx_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_idx.c tests/fuzz/fuzz_util.h
tests_fuzz_replay_idx_CFLAGS = $(fuzz_cflags) -DFUZZ_TARGET='"idx"'
tests_fuzz_replay_idx_LDADD = $(fuzz_ldadd)
tests_fuzz_replay_safetensors_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_safetensors.c tests/fuzz/fuzz_util.h
tests_fuzz_replay_safetensors_CFLAGS = $(fuzz_cflags) -DFUZZ_TARGET='"safetensors"'
tests_fuzz_replay_safetensors_LDADD = $(fuzz_ldadd)
tests_fuzz_replay_tokenizer_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_tokenizer.c tests/fuzz/fuzz_util.h
tests_fuzz_replay_tokenizer_CFLAGS = $(fuzz_cflags) -DFUZZ_TARGET='"tokenizer"'
tests_fuzz_replay_tokenizer_LDADD = $(fuzz_ldadd)
tests_fuzz_replay_store_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_store.c tests/fuzz/fuzz_util.h
tests_fuzz_replay_store_CFLAGS = $(fuzz_cflags) -DFUZZ_TARGET='"store"'
tests_fuzz_replay_store_LDADD = $(fuzz_ldadd)
tests_fuzz_replay_bert_config_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_bert_config.c tests/fuzz/fuzz_util.h
tests_fuzz_replay_bert_config_CFLAGS = $(fuzz_cflags) -DFUZZ_TARGET='"bert_config"'
tests_fuzz_replay_bert_config_LDADD = $(fuzz_ldadd)
tests_fuzz_replay_causal_lm_config_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_causal_lm_config.c tests/fuzz/fuzz_util.h
tests_fuzz_replay_causal_lm_config_CFLAGS = $(fuzz_cflags) -DFUZZ_TARGET='"causal_lm_config"'
tests_fuzz_replay_causal_lm_config_LDADD = $(fuzz_ldadd)
# the analyzer is the command's, not the library's: its file is compiled in
tests_fuzz_replay_flightrec_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_flightrec.c tests/fuzz/fuzz_util.h \
	tools/cmd_trace_analyze.c
tests_fuzz_replay_flightrec_CFLAGS = $(fuzz_cflags) -DFUZZ_TARGET='"flightrec"'
tests_fuzz_replay_flightrec_LDADD = $(fuzz_ldadd)

# The fuzzers themselves: the same targets with libFuzzer's main (clang only).
EXTRA_PROGRAMS += tests/fuzz/fuzz_config tests/fuzz/fuzz_deepspeed tests/fuzz/fuzz_state \
	tests/fuzz/fuzz_merge_weights tests/fuzz/fuzz_idx tests/fuzz/fuzz_safetensors tests/fuzz/fuzz_tokenizer \
	tests/fuzz/fuzz_store tests/fuzz/fuzz_bert_config tests/fuzz/fuzz_causal_lm_config tests/fuzz/fuzz_flightrec
fuzz_ldflags = -fsanitize=fuzzer
tests_fuzz_fuzz_config_SOURCES = tests/fuzz/fuzz_config.c tests/fuzz/fuzz_util.h
tests_fuzz_fuzz_config_CFLAGS = $(fuzz_cflags)
tests_fuzz_fuzz_config_LDFLAGS = $(fuzz_ldflags)
tests_fuzz_fuzz_config_LDADD = $(fuzz_ldadd)
tests_fuzz_fuzz_deepspeed_SOURCES = tests/fuzz/fuzz_deepspeed.c tests/fuzz/fuzz_util.h
tests_fuzz_fuzz_deepspeed_CFLAGS = $(fuzz_cflags)
tests_fuzz_fuzz_deepspeed_LDFLAGS = $(fuzz_ldflags)
tests_fuzz_fuzz_deepspeed_LDADD = $(fuzz_ldadd)
tests_fuzz_fuzz_state_SOURCES = tests/fuzz/fuzz_state.c tests/fuzz/fuzz_util.h
tests_fuzz_fuzz_state_CFLAGS = $(fuzz_cflags)
tests_fuzz_fuzz_state_LDFLAGS = $(fuzz_ldflags)
tests_fuzz_fuzz_state_LDADD = $(fuzz_ldadd)
tests_fuzz_fuzz_merge_weights_SOURCES = tests/fuzz/fuzz_merge_weights.c tests/fuzz/fuzz_util.h
tests_fuzz_fuzz_merge_weights_CFLAGS = $(fuzz_cflags)
tests_fuzz_fuzz_merge_weights_LDFLAGS = $(fuzz_ldflags)
tests_fuzz_fuzz_merge_weights_LDADD = $(fuzz_ldadd)
tests_fuzz_fuzz_idx_SOURCES = tests/fuzz/fuzz_idx.c tests/fuzz/fuzz_util.h
tests_fuzz_fuzz_idx_CFLAGS = $(fuzz_cflags)
tests_fuzz_fuzz_idx_LDFLAGS = $(fuzz_ldflags)
tests_fuzz_fuzz_idx_LDADD = $(fuzz_ldadd)
tests_fuzz_fuzz_safetensors_SOURCES = tests/fuzz/fuzz_safetensors.c tests/fuzz/fuzz_util.h
tests_fuzz_fuzz_safetensors_CFLAGS = $(fuzz_cflags)
tests_fuzz_fuzz_safetensors_LDFLAGS = $(fuzz_ldflags)
tests_fuzz_fuzz_safetensors_LDADD = $(fuzz_ldadd)
tests_fuzz_fuzz_tokenizer_SOURCES = tests/fuzz/fuzz_tokenizer.c tests/fuzz/fuzz_util.h
tests_fuzz_fuzz_tokenizer_CFLAGS = $(fuzz_cflags)
tests_fuzz_fuzz_tokenizer_LDFLAGS = $(fuzz_ldflags)
tests_fuzz_fuzz_tokenizer_LDADD = $(fuzz_ldadd)
tests_fuzz_fuzz_store_SOURCES = tests/fuzz/fuzz_store.c tests/fuzz/fuzz_util.h
tests_fuzz_fuzz_store_CFLAGS = $(fuzz_cflags)
tests_fuzz_fuzz_store_LDFLAGS = $(fuzz_ldflags)
tests_fuzz_fuzz_store_LDADD = $(fuzz_ldadd)
tests_fuzz_fuzz_bert_config_SOURCES = tests/fuzz/fuzz_bert_config.c tests/fuzz/fuzz_util.h
tests_fuzz_fuzz_bert_config_CFLAGS = $(fuzz_cflags)
tests_fuzz_fuzz_bert_config_LDFLAGS = $(fuzz_ldflags)
tests_fuzz_fuzz_bert_config_LDADD = $(fuzz_ldadd)
tests_fuzz_fuzz_causal_lm_config_SOURCES = tests/fuzz/fuzz_causal_lm_config.c tests/fuzz/fuzz_util.h
tests_fuzz_fuzz_causal_lm_config_CFLAGS = $(fuzz_cflags)
tests_fuzz_fuzz_causal_lm_config_LDFLAGS = $(fuzz_ldflags)
tests_fuzz_fuzz_causal_lm_config_LDADD = $(fuzz_ldadd)
tests_fuzz_fuzz_flightrec_SOURCES = tests/fuzz/fuzz_flightrec.c tests/fuzz/fuzz_util.h tools/cmd_trace_analyze.c
tests_fuzz_fuzz_flightrec_CFLAGS = $(fuzz_cflags)
tests_fuzz_fuzz_flightrec_LDFLAGS = $(fuzz_ldflags)
tests_fuzz_fuzz_flightrec_LDADD = $(fuzz_ldadd)

if FUZZING
fuzz-build:
	$(MAKE) $(AM_MAKEFLAGS) $(BUILT_SOURCES)
	$(MAKE) $(AM_MAKEFLAGS) $(FUZZ_TARGETS:%=tests/fuzz/fuzz_%)
# Each target runs FUZZ_SECONDS on one job; new inputs go to a scratch corpus in the build tree
# (merge the useful ones into tests/fuzz/<target>/corpus with -merge=1), crashes to fuzz-<target>/.
fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz-$$t/corpus && \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s" && \
	  ./tests/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=25 -rss_limit_mb=2048 -max_len=65536 \
	    -artifact_prefix=fuzz-$$t/ -print_final_stats=1 fuzz-$$t/corpus $(abs_top_srcdir)/tests/fuzz/$$t/corpus \
	    2>fuzz-$$t/log || { tail -40 fuzz-$$t/log; exit 1; }; \
	  grep -h '^#[0-9]*.*DONE\|stat::number_of_executed_units\|stat::peak_rss' fuzz-$$t/log; \
	done
else
fuzz-build fuzz:
	@echo "the fuzzers need clang: configure CC=clang --enable-fuzzing (docs/TESTING.md)"; exit 1
endif
.PHONY: fuzz-build fuzz
