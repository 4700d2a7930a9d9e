# bench/save.mk: ca_save_model / ca_load_model against raw write+fsync, dd and cp of the same bytes;
# ca_save_state / ca_load_state (model + AdamW state) against a raw write of as many bytes
# (`make bench-save`; BENCH_SAVE_ARGS passes e.g. "--mib 512 --reps 7 --dir /some/disk").
EXTRA_PROGRAMS += bench/bench_save
ca_bench_programs += bench/bench_save$(EXEEXT)
CLEANFILES += bench/bench_save
bench_bench_save_SOURCES = bench/bench_save.c bench/bench_util.h
bench_bench_save_LDADD = libcaccel.la -lm

.PHONY: bench-save
bench: bench-save
bench-save: bench/bench_save$(EXEEXT)
	./bench/bench_save$(EXEEXT) $(BENCH_SAVE_ARGS)
