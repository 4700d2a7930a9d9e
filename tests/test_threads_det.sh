#!/bin/sh
# Deterministic mode (docs/DETERMINISM.md) at 1, 2 and 3 CPU kernel threads: examples/gpt (2 layers,
# dropout 0.1, AdamW, clipping; f32 and bf16 autocast) trained 6 steps with --deterministic ends with a
# bit-identical model.safetensors and prints the same losses, and the Fashion-MNIST MLP (fp16 loss
# scaling, clipping; where its data is found) trained 8 steps ends with bit-identical parameters, on the
# cpu and on the lazy xla device (--tpu: its executor's kernels and GEMMs, the same bits), with
# every kernel loop split (CACCEL_CPU_GRAIN=1) and with the kernels' own grains. The kernels split ranges at fixed points and reduce in fixed blocks
# (docs/ARCHITECTURE.md, "Threads on the CPU"); the mode runs the BLAS on one thread and splits f32 GEMMs in
# blocks fixed by the shape (the same blocks at every thread count).
set -u
b=${CACCEL_TEST_BUILDDIR:-.}
GPT="$b/examples/gpt"
fail() { echo "FAIL: $*"; exit 1; }
fdir=${CACCEL_FORTUNES_DIR:-/usr/share/games/fortunes}
[ -f "$fdir/science" ] || { echo "SKIP: fortunes not found in $fdir (apt-get install fortunes)"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/caccel-threads-det.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SMALL="--n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --batch_size 8 --max_steps 6 --dropout 0.1
       --grad_clip 1.0 --log_interval 1 --eval_interval 6 --eval_samples 16 --sample_tokens 8 --seed 5 --cpu"

run() {   # run NAME THREADS GRAIN [ARGS...]
    name=$1 t=$2 g=$3; shift 3
    CACCEL_CPU_GRAIN=$g OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t "$GPT" $SMALL --deterministic \
        --output_dir "$WORK/$name" "$@" > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name: gpt exited non-zero"; }
    sed -n 's/^\(step [0-9/]*: loss [0-9.]*\),.*/\1/p; s/.*\(final validation loss [0-9.]*\).*/\1/p' "$WORK/$name.log" > "$WORK/$name.loss"
    [ "$(wc -l < "$WORK/$name.loss")" -eq 7 ] || { cat "$WORK/$name.log"; fail "$name: expected 6 loss lines and a validation loss"; }
}

same() {   # same REF OTHER
    cmp "$WORK/$1/model.safetensors" "$WORK/$2/model.safetensors" || fail "$2: parameters differ from $1"
    diff "$WORK/$1.loss" "$WORK/$2.loss" || fail "$2: losses differ from $1"
    echo "  bit-identical: $2"
}

for mp in no bf16; do
    echo "== mixed_precision $mp"
    run "ref_$mp" 1 "" --mixed_precision $mp
    echo "  $(tail -1 "$WORK/ref_$mp.loss")"
    for t in 1 2 3; do
        for g in 1 ""; do
            [ "$t$g" = 1 ] && continue
            n="${mp}_t${t}_grain${g:-default}"
            run "$n" "$t" "$g" --mixed_precision $mp
            same "ref_$mp" "$n"
        done
    done
done
FM="$b/examples/fashion_mnist"
if [ -x "$FM" ] && "$FM" --cpu --epochs 1 --max-steps 1 > /dev/null 2>&1; then
    echo "== Fashion-MNIST MLP, fp16, clipping"
    mlp() {   # mlp NAME THREADS GRAIN DEVICE-FLAG
        CACCEL_CPU_GRAIN=$3 OMP_NUM_THREADS=$2 OPENBLAS_NUM_THREADS=$2 "$FM" "$4" --deterministic --epochs 1 \
            --max-steps 8 --batch-size 64 --mixed_precision fp16 --gradient_clipping 1.0 --dump-params "$WORK/$1.bin" \
            > "$WORK/$1.log" 2>&1 || { cat "$WORK/$1.log"; fail "$1: fashion_mnist exited non-zero"; }
    }
    mlp mlp_ref 1 "" --cpu
    for dev in cpu tpu; do
        for t in 1 2 3; do
            for g in 1 ""; do
                [ "$dev$t$g" = cpu1 ] && continue
                n="mlp_${dev}_t${t}_grain${g:-default}"
                mlp "$n" "$t" "$g" "--$dev"
                cmp "$WORK/mlp_ref.bin" "$WORK/$n.bin" || fail "$n: parameters differ from the cpu's at 1 thread"
                echo "  bit-identical: $n"
            done
        done
    done
else
    echo "(no Fashion-MNIST data: the MLP part not run)"
fi
echo ok
