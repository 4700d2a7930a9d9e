#!/bin/sh
# Measures the spread that tests/test_examples.sh must allow: the Fashion-MNIST example's test
# accuracy and train loss over SEEDS seeds after EPOCHS epochs (default 1), for f32, bf16, fp16
# and gradient accumulation (4 x 32), and each run's difference to f32 with the same seed.
# With "ddp" as the fourth argument: 2 processes under `caccel launch` (Gloo) with bf16, fp16 and
# accumulation, the runs tests/test_ddp.sh checks.
# usage: tools/accuracy-spread.sh BUILDDIR [SEEDS [EPOCHS [ddp]]]   (OPENBLAS_CORETYPE set and unset)
set -u
b=${1:?usage: tools/accuracy-spread.sh BUILDDIR [SEEDS]}
seeds=${2:-10}
ep=${3:-1}
mode=${4:-one}
fm="$b/examples/fashion_mnist"
[ -x "$fm" ] || { echo "no $fm (build first)"; exit 1; }
run() {   # run SEED ARGS...: prints "accuracy loss" of the last epoch
    s=$1; shift
    if [ "$mode" = ddp ]; then
        CACCEL_PLUGIN_PATH="$b/collectives/.libs" "$b/tools/caccel" launch --num_processes 2 --cpu \
            --backend gloo "$fm" --seed "$s" "$@" 2>&1
    else
        "$fm" --cpu --seed "$s" "$@" 2>&1
    fi |
        sed -n 's/.*train loss \([0-9.]*\), test accuracy \([0-9.]*\)%.*/\2 \1/p' | tail -1
}
echo "# $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //') OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} build=$b"
runs=$(mktemp)
trap 'rm -f "$runs"' EXIT
echo "# seed config accuracy loss"
s=1
while [ "$s" -le "$seeds" ]; do
    echo "$s f32 $(run "$s" --epochs "$ep")"
    echo "$s bf16 $(run "$s" --epochs "$ep" --mixed_precision bf16)"
    echo "$s fp16 $(run "$s" --epochs "$ep" --mixed_precision fp16)"
    echo "$s accum $(run "$s" --epochs "$ep" --gradient_accumulation_steps 4 --batch-size 32)"
    s=$((s + 1))
done > "$runs"
cat "$runs"
awk '
    { acc[$2] = acc[$2] " " $3; loss[$2] = loss[$2] " " $4; a[$1, $2] = $3; l[$1, $2] = $4; seen[$1] = 1 }
    function stats(name, list,   n, v, i, lo, hi, sum) {
        n = split(list, v, " "); lo = 1e9; hi = -1e9; sum = 0
        for (i = 1; i <= n; i++) { if (v[i] < lo) lo = v[i]; if (v[i] > hi) hi = v[i]; sum += v[i] }
        printf "%-22s n=%d min %.4f mean %.4f max %.4f\n", name, n, lo, sum / n, hi
    }
    END {
        for (c in acc) { stats(c " accuracy", acc[c]); stats(c " loss", loss[c]) }
        split("bf16 fp16 accum", mp, " ")
        for (k = 1; k <= 3; k++) {
            d = ""; r = ""
            for (s in seen) {
                x = a[s, mp[k]] - a[s, "f32"]; d = d " " (x < 0 ? -x : x)
                y = (l[s, mp[k]] - l[s, "f32"]) / l[s, "f32"]; r = r " " (y < 0 ? -y : y)
            }
            stats(mp[k] " |acc-f32|", d); stats(mp[k] " |rel loss-f32|", r)
        }
    }' "$runs"
