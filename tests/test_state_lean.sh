#!/bin/sh
# load_state into a run at ZeRO stage 3 (FSDP FULL_SHARD) with fsdp_cpu_ram_efficient_loading (the
# default) gathers nothing: each rank verifies and copies only the byte ranges of its own shard, from
# model.safetensors (FULL_STATE_DICT) or from the old shard files' params (SHARDED_STATE_DICT, at the
# same world size and at another one). Checked at 2, 3 and 4 ranks (caccel launch): the parameters and
# optimizer state after the load are the saved ones bit for bit (a FULL_STATE_DICT save right after the
# load writes model.safetensors and optimizer.safetensors byte for byte as the original full save did),
# the same files as the gathering load (fsdp_cpu_ram_efficient_loading false) writes; and each rank's
# bytes verified (CACCEL_TEST_ST_REPORT) stay near its share of each file, where the gathering load
# verifies model.safetensors whole on every rank. A corrupt chunk in one rank's slice of the model file
# is named by that rank only and nothing loads anywhere. Of optimizer.safetensors too each rank reads
# only its slices, into its shard: at 2 ranks the allocator's peak during load_state stays below a
# rank's share of the full optimizer state (building it whole allocated it all), and 2 steps saved,
# loaded and 2 more equal 4 uninterrupted bit for bit; a corrupt chunk in rank 1's slice of it is
# named by rank 1 only and nothing loads.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
DDP="$BUILD/tests/ddp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_SPLIT_BATCHES=true
LAUNCH_FLAGS=""   # ACCELERATE_USE_CPU chooses the device
train_backends
be=$(echo "$backends" | awk '{print $1}')
export CACCEL_TEST_ST_CHUNK=4096   # chunks far smaller than a rank's share of the files
# z3 NP DICT ARGS...: ddp_check at stage 3 on NP ranks saving state dicts of type DICT; a model of 2 x
# Linear(256, 256) between the small ones (132k parameters, 530 kB), AdamW, global batch 24
z3() {
    np=$1 sd=$2; shift 2
    FSDP_STATE_DICT_TYPE=${sd}_STATE_DICT launch "$np" "$be" --use_fsdp --fsdp_sharding_strategy FULL_SHARD \
        "$DDP" --batch 24 --mode plain --hidden 256 --depth 2 --adamw "$@"
}
report() { sed -n "s|^.*safetensors: .*/$2: \([0-9]*\) of \([0-9]*\) bytes verified.*|\1 \2|p" "$1"; }
flip() {
    b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
    printf "\\$(printf '%03o' $(( (b + 1) % 256 )))" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null
}
# same NAME X: X's model and optimizer files are the original full save's, byte for byte
same_files() {
    for f in model.safetensors optimizer.safetensors; do
        cmp "$WORK/ck.f/$f" "$2/$f" || fail "$1: $f differs from the full save of the original run"
    done
}
# load NAME NP DICT CK [env...]: CK loaded at NP ranks, saved at once as a full state dict into $WORK/NAME
load() {
    n=$1 np=$2 sd=$3 ck=$4; shift 4
    rm -rf "${WORK:?}/$n"
    (for a in "$@"; do export "${a?}"; done
     CACCEL_TEST_ST_REPORT=1 z3 "$np" FULL --steps 0 --load-state "$ck" --save-state "$WORK/$n") > "$WORK/o.$n" 2>&1 ||
        { cat "$WORK/o.$n"; fail "$n: load"; }
    same_files "$n" "$WORK/$n"
}
# lean_model NAME NP: in NAME's load every rank verified about its share of model.safetensors
lean_model() {
    report "$WORK/o.$1" model.safetensors > "$WORK/r"
    [ "$(wc -l < "$WORK/r")" = "$2" ] || { cat "$WORK/o.$1"; fail "$1: not one report per rank for model.safetensors"; }
    while read -r v size; do
        echo "  $1: model.safetensors: $v of $size bytes verified"
        # its share, plus the header's chunk and a chunk at each end of each tensor's slice
        [ "$v" -le $(( size / $2 + 8 * 2 * 4096 + 4096 )) ] || fail "$1: a rank verified $v of $size bytes: more than its shard"
    done < "$WORK/r"
}
# lean_shards NAME NP OLD: in NAME's load, the OLD shard files' bytes verified by all NP ranks together
# are about each file once (each rank its overlap, the header and a chunk at each end of each range)
lean_shards() {
    for k in $(seq 0 $(( $3 - 1 ))); do
        report "$WORK/o.$1" "zero_shard_$k.safetensors" > "$WORK/r"
        [ "$(wc -l < "$WORK/r")" = "$2" ] || { cat "$WORK/o.$1"; fail "$1: not one report per rank for zero_shard_$k"; }
        tot=0 size=$(head -1 "$WORK/r" | cut -d' ' -f2)
        while read -r v sz; do tot=$((tot + v)); done < "$WORK/r"
        echo "  $1: zero_shard_$k.safetensors: $tot of $size bytes verified by the $2 ranks together"
        [ "$tot" -le $(( size + $2 * 7 * 4096 )) ] || fail "$1: zero_shard_$k.safetensors: $tot of $size bytes verified: the params were read whole"
    done
}

note "saved at 4 ranks, stage 3: a sharded and a full state dict of the same state"
z3 4 SHARDED --steps 4 --save-state "$WORK/ck.s" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "sharded save"; }
z3 4 FULL --steps 4 --save-state "$WORK/ck.f" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "full save"; }
[ -e "$WORK/ck.s/zero_shard_3.safetensors" ] && [ -e "$WORK/ck.f/model.safetensors" ] || fail "not the checkpoints expected"

for np in 2 4 3; do
    note "FULL_STATE_DICT loaded at $np ranks: each rank reads its share of model.safetensors"
    load "f$np" "$np" FULL "$WORK/ck.f"
    lean_model "f$np" "$np"
    note "SHARDED_STATE_DICT (4 shards) loaded at $np ranks: each old params byte read about once in all"
    load "s$np" "$np" SHARDED "$WORK/ck.s"
    lean_shards "s$np" "$np" 4
done

note "the gathering load (fsdp_cpu_ram_efficient_loading false) gives the same files, reading model.safetensors whole"
for np in 2 4; do
    load "g$np" "$np" FULL "$WORK/ck.f" FSDP_CPU_RAM_EFFICIENT_LOADING=false
    cmp "$WORK/g$np/model.safetensors" "$WORK/f$np/model.safetensors" || fail "lean and gathered loads differ at $np ranks"
    report "$WORK/o.g$np" model.safetensors | while read -r v size; do
        [ "$v" = "$size" ] || fail "g$np: the gathering load verified $v of $size bytes of model.safetensors"
    done || exit 1
    load "h$np" "$np" SHARDED "$WORK/ck.s" FSDP_CPU_RAM_EFFICIENT_LOADING=false
    cmp "$WORK/h$np/model.safetensors" "$WORK/s$np/model.safetensors" || fail "lean and gathered sharded loads differ at $np ranks"
done

note "the optimizer state at 2 ranks: each rank reads its slices into its shard, none makes the full state; 2 steps, save, load and 2 more == 4 uninterrupted"
z3 2 FULL --steps 4 --dump "$WORK/full.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "4 steps"; }
z3 2 FULL --steps 2 --save-state "$WORK/ck2" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "2 steps, saved"; }
z3 2 FULL --steps 2 --load-state "$WORK/ck2" --mem --dump "$WORK/res.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "loaded, 2 more"; }
cmp "$WORK/full.bin" "$WORK/res.bin" || fail "the resumed run differs from the uninterrupted one"
sed -n 's/^rank=\([0-9]*\) load_peak_bytes=\([0-9-]*\) model_bytes=\([0-9]*\)$/\1 \2 \3/p' "$WORK/o" > "$WORK/r"
[ "$(wc -l < "$WORK/r")" = 2 ] || { cat "$WORK/o"; fail "not one load_peak_bytes line per rank"; }
while read -r rank peak model; do
    full=$((2 * model))   # AdamW: exp_avg and exp_avg_sq, each the size of the parameters
    echo "  rank $rank: load_state allocated at most $peak bytes; the full optimizer state is $full"
    # a rank's share is full / 2; the load allocates less than that (the shard's state exists already)
    [ "$peak" -lt $((full / 2)) ] || fail "rank $rank: load_state allocated $peak bytes, the full optimizer state is $full"
done < "$WORK/r"

note "a corrupt chunk in rank 1's slice of model.safetensors: rank 1 names it, rank 0 does not read it; nothing loads"
cp -r "$WORK/ck.f" "$WORK/bad"
flip "$WORK/bad/model.safetensors" $(( $(wc -c < "$WORK/bad/model.safetensors") - 2 ))   # the last tensor's end: rank 1's
rm -rf "$WORK/x"
CACCEL_TEST_ST_REPORT=1 z3 2 FULL --steps 0 --load-state "$WORK/bad" --save-state "$WORK/x" > "$WORK/o" 2>&1 &&
    { cat "$WORK/o"; fail "a corrupt checkpoint loaded"; }
count 1 'model.safetensors: corrupt: CRC-32 [0-9a-f]* in chunk [0-9]* of [0-9]* (bytes' "$WORK/o"
count 1 'corrupt: CRC-32 .*(rank 1)$' "$WORK/o"
count 1 'load_state: rank 1 failed (CA_ERR_IO) to load .*nothing was applied (rank 0)' "$WORK/o"
[ -e "$WORK/x" ] && fail "a save ran after a failed load"

note "a corrupt chunk in rank 1's slice of optimizer.safetensors: rank 1 names it; nothing loads"
rm -rf "$WORK/bad" "$WORK/x"
cp -r "$WORK/ck.f" "$WORK/bad"
flip "$WORK/bad/optimizer.safetensors" $(( $(wc -c < "$WORK/bad/optimizer.safetensors") - 2 ))
z3 2 FULL --steps 0 --load-state "$WORK/bad" --save-state "$WORK/x" > "$WORK/o" 2>&1 && { cat "$WORK/o"; fail "a corrupt optimizer file loaded"; }
count 1 'optimizer.safetensors: corrupt: CRC-32 [0-9a-f]* in chunk [0-9]* of [0-9]* (bytes .*(rank 1)$' "$WORK/o"
count 1 'load_state: rank 1 failed (CA_ERR_IO) to load .*nothing was applied (rank 0)' "$WORK/o"
[ -e "$WORK/x" ] && fail "a save ran after a failed load"
echo "PASS"
