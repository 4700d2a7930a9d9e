#!/bin/sh
# load_state of a FULL_STATE_DICT checkpoint at ZeRO stages 1 and 2 (DeepSpeed zero_stage 1, FSDP
# SHARD_GRAD_OP) with fsdp_cpu_ram_efficient_loading (the default): the parameters stay whole on every
# rank (rank 0 reads model.safetensors and broadcasts), and of optimizer.safetensors each rank verifies
# and reads only the byte ranges of its slice of each state tensor, into its shard; no rank makes the
# full optimizer state. Over Gloo (caccel launch) and MPI (mpirun) at 2 ranks: 2 steps saved, loaded
# and 2 more equal 4 uninterrupted bit for bit; the device allocator's peak during load_state stays
# below a rank's share of the full optimizer state (building it whole allocated all of it); the
# setting false (the full state made, each rank keeping its slice) resumes to the same bits. At 4
# ranks the 2-rank checkpoint loads (stage 1; under MPI stage 3 too) and, saved at once, gives its
# model and optimizer files byte for byte. A corrupt chunk in rank 1's slice of optimizer.safetensors
# is named by rank 1 only and nothing loads. Stage 3's lean load (tests/test_state_lean.sh over Gloo)
# resumes bit for bit, within the same allocator bound, under MPI too.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
DDP="$BUILD/tests/ddp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_SPLIT_BATCHES=true FSDP_STATE_DICT_TYPE=FULL_STATE_DICT
LAUNCH_FLAGS=""   # ACCELERATE_USE_CPU chooses the device
train_backends
export CACCEL_TEST_ST_CHUNK=4096   # chunks far smaller than a rank's share of the files
# under the sanitizers (CACCEL_TEST_SANITIZED=yes) the setting-false resumes (the full-state path,
# which tests/test_state_ranges.sh and tests/test_zero.sh run too) and the 4-rank stage-3 load are
# left out
SANITIZED=${CACCEL_TEST_SANITIZED:-no}

# zs NP BACKEND STAGE ARGS...: ddp_check on NP ranks at STAGE; a model of 2 x Linear(256, 256) between
# the small ones (132k parameters, 530 kB), AdamW, global batch 24. The strategy's flags go to the
# launcher under caccel launch, to the program under mpirun.
zs() {
    np=$1 be=$2 st=$3; shift 3
    case $st in
        1) fl="--use_deepspeed --zero_stage 1" ;;
        2) fl="--use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP" ;;
        *) fl="--use_fsdp --fsdp_sharding_strategy FULL_SHARD" ;;
    esac
    # shellcheck disable=SC2086
    if [ "$be" = mpi ]; then launch "$np" "$be" "$DDP" $fl --batch 24 --mode plain --hidden 256 --depth 2 --adamw "$@"
    else launch "$np" "$be" $fl "$DDP" --batch 24 --mode plain --hidden 256 --depth 2 --adamw "$@"; fi
}
flip() {
    b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
    printf "\\$(printf '%03o' $(( (b + 1) % 256 )))" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null
}
# peaks OUT WHAT: each of the 2 ranks' load_peak_bytes in OUT below its share of the full AdamW state
peaks() {
    sed -n 's/^rank=\([0-9]*\) load_peak_bytes=\([0-9-]*\) model_bytes=\([0-9]*\)$/\1 \2 \3/p' "$1" > "$WORK/r"
    [ "$(wc -l < "$WORK/r")" = 2 ] || { cat "$1"; fail "$2: not one load_peak_bytes line per rank"; }
    while read -r rank peak model; do
        full=$((2 * model))   # AdamW: exp_avg and exp_avg_sq, each the size of the parameters
        echo "  $2: rank $rank: load_state allocated at most $peak bytes; the full optimizer state is $full"
        [ "$peak" -lt $((full / 2)) ] || fail "$2: rank $rank: load_state allocated $peak bytes, the full optimizer state is $full"
    done < "$WORK/r"
}

# lean_opt OUT WHAT: in OUT's load rank 0 alone opened model.safetensors (and broadcast it), and each
# rank verified of optimizer.safetensors about its half: 16 state tensors, a chunk at each end of each
# slice and the header's
report() { sed -n "s|^.*safetensors: .*/$2: \([0-9]*\) of \([0-9]*\) bytes verified.*|\1 \2|p" "$1"; }
lean_opt() {
    [ "$(report "$1" model.safetensors | wc -l)" = 1 ] || { cat "$1"; fail "$2: model.safetensors was not read by rank 0 alone"; }
    report "$1" optimizer.safetensors > "$WORK/r"
    [ "$(wc -l < "$WORK/r")" = 2 ] || { cat "$1"; fail "$2: not one report per rank for optimizer.safetensors"; }
    while read -r v size; do
        echo "  $2: optimizer.safetensors: $v of $size bytes verified"
        [ "$v" -le $(( size / 2 + 33 * 4096 )) ] || fail "$2: a rank verified $v of $size bytes of optimizer.safetensors: more than its slices"
    done < "$WORK/r"
}

for be in $backends; do
    stages="1 2"
    [ "$be" = mpi ] && stages="3 1 2"   # stage 3 over Gloo: tests/test_state_lean.sh
    for st in $stages; do
        n="$be, stage $st"
        note "$n: 2 steps, save, load (each rank its optimizer-state slices) and 2 more == 4 uninterrupted"
        rm -rf "$WORK/ck"
        zs 2 "$be" "$st" --steps 4 --dump "$WORK/full.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$n: 4 steps"; }
        zs 2 "$be" "$st" --steps 2 --save-state "$WORK/ck" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$n: 2 steps, saved"; }
        CACCEL_TEST_ST_REPORT=1 zs 2 "$be" "$st" --steps 2 --load-state "$WORK/ck" --mem --dump "$WORK/res.bin" > "$WORK/o" 2>&1 ||
            { cat "$WORK/o"; fail "$n: loaded, 2 more"; }
        cmp "$WORK/full.bin" "$WORK/res.bin" || fail "$n: the resumed run differs from the uninterrupted one"
        peaks "$WORK/o" "$n"
        [ "$st" = 3 ] && continue
        lean_opt "$WORK/o" "$n"
        [ "$SANITIZED" = yes ] && continue
        note "$n: fsdp_cpu_ram_efficient_loading false (the full state made, the slice kept): the same bits"
        FSDP_CPU_RAM_EFFICIENT_LOADING=false zs 2 "$be" "$st" --steps 2 --load-state "$WORK/ck" --dump "$WORK/res.bin" > "$WORK/o" 2>&1 ||
            { cat "$WORK/o"; fail "$n: loaded (setting false), 2 more"; }
        cmp "$WORK/full.bin" "$WORK/res.bin" || fail "$n: the resumed run (setting false) differs from the uninterrupted one"
    done

    to4="1"
    [ "$be" = mpi ] && [ "$SANITIZED" != yes ] && to4="1 3"
    for st in $to4; do
        note "$be: the 2-rank checkpoint (stage 2) loaded at 4 ranks, stage $st, and saved at once: the same model and optimizer files"
        rm -rf "$WORK/x"
        zs 4 "$be" "$st" --steps 0 --load-state "$WORK/ck" --save-state "$WORK/x" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$be: load at 4 ranks, stage $st"; }
        for f in model.safetensors optimizer.safetensors; do
            cmp "$WORK/ck/$f" "$WORK/x/$f" || fail "$be: loaded at 4 ranks (stage $st) and saved, $f differs"
        done
    done

    note "$be: a corrupt chunk in rank 1's slice of optimizer.safetensors, stage 2: rank 1 names it; nothing loads"
    rm -rf "$WORK/bad" "$WORK/x"
    cp -r "$WORK/ck" "$WORK/bad"
    flip "$WORK/bad/optimizer.safetensors" $(( $(wc -c < "$WORK/bad/optimizer.safetensors") - 2 ))
    zs 2 "$be" 2 --steps 0 --load-state "$WORK/bad" --save-state "$WORK/x" > "$WORK/o" 2>&1 && { cat "$WORK/o"; fail "$be: a corrupt optimizer file loaded"; }
    count 1 'optimizer.safetensors: corrupt: CRC-32 [0-9a-f]* in chunk [0-9]* of [0-9]* (bytes .*(rank 1)$' "$WORK/o"
    count 0 'corrupt: CRC-32 .*(rank 0)$' "$WORK/o"
    # under mpirun rank 1's exit stops rank 0 (the program leaves at its first error), perhaps before
    # it prints: rank 0's message is checked under caccel launch
    [ "$be" = mpi ] || count 1 'load_state: rank 1 failed (CA_ERR_IO) to load .*nothing was applied (rank 0)' "$WORK/o"
    [ -e "$WORK/x" ] && fail "$be: a save ran after a failed load"
done
echo "PASS"
