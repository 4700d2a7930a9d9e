#!/bin/sh
# examples/gpt's throughput line: after each --log_interval line the main process prints
# "throughput: step N: ... samples/s, ... tokens/s, ... GFLOP/s, MFU ...% of ... GFLOP/s f32 peak (...)";
# the first run of a machine probes the peak and caches it under XDG_CACHE_HOME, the second reads the
# cache, --peak_flops gives it, and --log_with json logs the same values (throughput/mfu) at the step.
set -u
b=${CACCEL_TEST_BUILDDIR:-.}
GPT="$b/examples/gpt"
fail() { echo "FAIL: $*"; exit 1; }
fdir=${CACCEL_FORTUNES_DIR:-/usr/share/games/fortunes}
[ -f "$fdir/science" ] || { echo "SKIP: fortunes not found in $fdir (apt-get install fortunes)"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/caccel-gpt-mfu.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OPENBLAS_NUM_THREADS=1 XDG_CACHE_HOME="$WORK/cache"
TINY="--cpu --n_layer 1 --n_head 2 --n_embd 32 --block_size 16 --batch_size 4 --max_steps 6 --log_interval 3 --eval_interval 0 --eval_samples 8 --sample_tokens 0"
LINE='^throughput: step [0-9]*: [0-9.]* samples/s, [0-9]* tokens/s, [0-9.e+]* GFLOP/s, MFU [0-9.]*% of [0-9.e+]* GFLOP/s f32 peak'

echo "== first run: the peak is probed and cached"
# shellcheck disable=SC2086
"$GPT" $TINY > "$WORK/o1" 2>&1 || { cat "$WORK/o1"; fail "gpt exited non-zero"; }
n=$(grep -c "$LINE (probe)\$" "$WORK/o1")
[ "$n" = 2 ] || { cat "$WORK/o1"; fail "expected 2 throughput lines with a probed peak, found $n"; }
grep "^throughput: step 6:" "$WORK/o1" || fail "no throughput line at step 6"
ls "$WORK/cache/caccel/"peak-f32-*.json > /dev/null 2>&1 || fail "no peak cache file under $WORK/cache/caccel"

echo "== second run: the cached peak"
# shellcheck disable=SC2086
"$GPT" $TINY > "$WORK/o2" 2>&1 || { cat "$WORK/o2"; fail "gpt exited non-zero"; }
n=$(grep -c "$LINE (cache)\$" "$WORK/o2")
[ "$n" = 2 ] || { cat "$WORK/o2"; fail "expected 2 throughput lines with the cached peak, found $n"; }

echo "== --peak_flops and --log_with json"
# shellcheck disable=SC2086
"$GPT" $TINY --peak_flops 1e12 --log_with json --logging_dir "$WORK/logs" > "$WORK/o3" 2>&1 ||
    { cat "$WORK/o3"; fail "gpt exited non-zero"; }
grep "$LINE (peak_flops)\$" "$WORK/o3" | grep -q "of 1000 GFLOP/s" || { cat "$WORK/o3"; fail "no line with the given peak"; }
m="$WORK/logs/gpt/metrics.jsonl"
[ -f "$m" ] || fail "no $m"
grep -q '"throughput/mfu"' "$m" && grep -q '"throughput/tokens_per_s"' "$m" || { cat "$m"; fail "no throughput metrics in $m"; }
echo "ok"
