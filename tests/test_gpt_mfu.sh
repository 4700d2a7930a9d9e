#!/bin/sh
# examples/gpt's throughput line: after each --log_interval line the main process prints
# "throughput: step N: ... samples/s, ... tokens/s, ... GFLOP/s, MFU ...% of ... GFLOP/s f32 peak (...)";
# the first run of a machine probes the peak and caches it under XDG_CACHE_HOME, the second reads the
# cache, --peak_flops gives it, and --log_with json logs the same values (throughput/mfu) at the step.
# At 2 processes the line goes on with the world's totals ("; all 2 processes: ...", the peaks summed).
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

echo "== 2 processes (caccel launch, Gloo): the world's totals after the rank's own"
gloo=false
for d in $(echo "${CACCEL_PLUGIN_PATH:-}" | tr ':' ' '); do [ -e "$d/caccel_gloo.so" ] && gloo=true; done
if [ -x "$b/tools/caccel" ] && $gloo; then
    # shellcheck disable=SC2086
    timeout 120 "$b/tools/caccel" launch --num_processes 2 --main_process_port 0 --cpu --backend gloo "$GPT" $TINY \
        --peak_flops 1e12 --log_with json --logging_dir "$WORK/logs2" > "$WORK/o4" 2>&1 ||
        { cat "$WORK/o4"; fail "gpt at 2 processes exited non-zero"; }
    WLINE="$LINE (peak_flops); all 2 processes: [0-9.]* samples/s, [0-9]* tokens/s, [0-9.e+]* GFLOP/s, MFU [0-9.]*% of 2000 GFLOP/s\$"
    n=$(grep -c "$WLINE" "$WORK/o4")
    [ "$n" = 2 ] || { cat "$WORK/o4"; fail "expected 2 throughput lines with the world's totals (peaks summed: 2000), found $n"; }
    # the sums hold the other rank's too: above the main process's own samples/s
    grep "$WLINE" "$WORK/o4" | sed 's/^throughput: step [0-9]*: \([0-9.]*\) samples.*all 2 processes: \([0-9.]*\) samples.*/\1 \2/' |
        awk '{ if (!($2 > $1)) exit 1 }' || { cat "$WORK/o4"; fail "the world's samples/s is not above the rank's"; }
    grep -q '"throughput/world_mfu"' "$WORK/logs2/gpt/metrics.jsonl" && grep -q '"throughput/world_tokens_per_s"' \
        "$WORK/logs2/gpt/metrics.jsonl" || { cat "$WORK/logs2/gpt/metrics.jsonl"; fail "no world metrics"; }
else
    echo "(skipped: no caccel command or Gloo plugin)"
fi
echo "ok"
