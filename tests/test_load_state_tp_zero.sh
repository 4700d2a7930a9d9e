#!/bin/sh
# ca_load_state with ZeRO beside tensor parallelism (parallelism_config_tp_size 2 x dp_shard_size 2 on 4
# ranks), over Gloo (caccel launch) and MPI (mpirun), for every stage the tp code runs: FSDP FULL_SHARD
# (stage 3), FSDP SHARD_GRAD_OP (stage 2) and DeepSpeed zero_stage 1. ddp_check's MLP (--tp-plan: fc1
# colwise, h0 rowwise, h1 colwise, fc2 rowwise) with AdamW, 2 steps saved as a full state dict with chunk
# sums of 4 KB (CACCEL_TEST_ST_CHUNK: the rowwise slices are a piece of every chunk), then loaded after
# ca_prepare. Each rank reads of optimizer.safetensors only its ZeRO shard's part of its tp slice of each
# state tensor (and of model.safetensors the same at stage 3, its whole tp slices at stages 1 and 2, which
# keep the parameters whole): its bytes read (CACCEL_TEST_ST_REPORT) are its share, at most 4 KB a tensor
# more, and the 4 ranks' reads of the optimizer file add up to its tensor bytes with the replicated tensors
# once per tp rank (no byte read twice within a tp rank's shards); every byte of both files is verified by
# the tp x dp_shard group's sums together; nothing is gathered or broadcast (the log says which load ran).
# A save_state right after the load writes model.safetensors and optimizer.safetensors byte for byte as
# saved, and as after the gathering load (fsdp_cpu_ram_efficient_loading false); each rank's state digest
# (parameters, step, lr, scaler, generator) equals the saved run's and the gathering load's; 2 more steps
# equal 4 uninterrupted ones. A byte changed in the optimizer file (and, at stage 3, in the model file)
# fails the load on every rank naming the file and the chunk, and leaves every rank's state as it was (the
# group trains on).
# Without chunk sums (complete.json of a caccel before them) the reads are the same and the group verifies
# each file's whole CRC-32 from its 4 parts; a changed byte is refused on every rank.
# A checkpoint saved at tp 2 x dp_shard 2 also loads at tp 2 x dp_replicate 2 (DDP: tp slices) and the
# other way round (another dp_shard size: 1), to the same files; under HSDP (tp 2 x dp_shard 2 x dp_replicate
# 2, 8 ranks) each replica's 4 ranks read their parts and verify together, and all 8 refuse a changed byte.
. "$(dirname "$0")/dist/lib.sh"
. "$(dirname "$0")/load_tp_model.sh"
TPZ="--parallelism_config_tp_size 2 --parallelism_config_dp_shard_size 2"
run() {   # run NP BACKEND MESH ARGS...
    rn=$1 rb=$2 rm=$3; shift 3
    # shellcheck disable=SC2086
    mesh_launch "$rn" "$rb" "$DDP" $rm -- --tp-plan --hidden $H --depth 2 --adamw "$@"
}
# a tp rank's flat elements (its halves of the split tensors, the replicated ones whole), and its shards'
N=$((split / 2 + repl))
# reads FILE NAME LO HI SUM: every rank read between LO and HI bytes of NAME; SUM (when not empty): the ranks' total
reads() {
    sed -n "s|^meta: .*/$2: \([0-9]*\) of \([0-9]*\) bytes read\$|\1|p" "$1" > "$WORK/r"
    [ "$(wc -l < "$WORK/r")" = 4 ] || { cat "$1"; fail "$case: not one read report of $2 per rank"; }
    total=0
    while read -r n; do
        echo "  $case: a rank read $n bytes of $2 (its share: $3 to $4)"
        [ "$n" -ge "$3" ] && [ "$n" -le "$4" ] || fail "$case: a rank read $n bytes of $2, not its share"
        total=$((total + n))
    done < "$WORK/r"
    echo "  $case: the 4 ranks read $total bytes of $2${5:+ (its tensors with the replicated ones per tp rank: $5)}"
    [ -z "$5" ] || [ "$total" = "$5" ] || fail "$case: the ranks read $total bytes of $2, not each byte once per tp rank"
    sed -n "s|^safetensors: .*/$2: \([0-9]*\) of \([0-9]*\) bytes verified, \([0-9]*\) resident.*|\1 \2 \3|p" "$1" > "$WORK/v"
    [ "$(wc -l < "$WORK/v")" = 4 ] || { cat "$1"; fail "$case: not one verification report of $2 per rank"; }
    while read -r v size res; do
        [ "$v" = "$size" ] || fail "$case: $v of $size bytes of $2 verified"
        [ "$res" -le 65536 ] || fail "$case: $res bytes of $2 resident in the mapping"
    done < "$WORK/v"
}
same_files() {   # same_files DIR1 DIR2 WHAT
    for f in model.safetensors optimizer.safetensors; do
        cmp "$1/$f" "$2/$f" || fail "$case: $3: $f differs"
    done
}
same_state() {   # same_state FILE1 FILE2 WHAT: every rank's state digest
    for r in 0 1 2 3; do
        [ -n "$(field "$r" state_fnv "$1")" ] && [ "$(field "$r" state_fnv "$1")" = "$(field "$r" state_fnv "$2")" ] ||
            { cat "$2"; fail "$case: rank $r's state: $3"; }
    done
}

for B in $backends; do
    for stage in "3 --use_fsdp --fsdp_sharding_strategy FULL_SHARD" "2 --use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP" \
                 "1 --use_deepspeed --zero_stage 1"; do
        z=${stage%% *} mesh="$TPZ ${stage#* }"
        case="$B, tp 2 x dp_shard 2, stage $z"
        rm -rf "${WORK:?}/ck" "$WORK/ck2" "$WORK/ck3"
        note "$case: 2 steps saved with save_state (4 KB chunk sums); 4 uninterrupted steps"
        CACCEL_TEST_ST_CHUNK=4096 run 4 "$B" "$mesh" --steps 2 --save-state "$WORK/ck" > "$WORK/o" 2>&1 ||
            { cat "$WORK/o"; fail "$case: save"; }
        # (the digest reads the next batch: not in the run that saves)
        run 4 "$B" "$mesh" --steps 2 --state-digest > "$WORK/saved" 2>&1 || { cat "$WORK/saved"; fail "$case: 2 steps"; }
        run 4 "$B" "$mesh" --steps 4 --digest > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: 4 steps"; }
        digest "$WORK/o" > "$WORK/d4"

        note "$case: load_state after ca_prepare: each rank preads its shard's part of its tp slices"
        CACCEL_TEST_ST_REPORT=1 CACCEL_LOG_LEVEL=info run 4 "$B" "$mesh" --steps 0 --load-state "$WORK/ck" --state-digest \
            --save-state "$WORK/ck2" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: load"; }
        count 1 "load_state: .* each rank reads its dp_shard part of its tp slices" "$WORK/o"
        grep -q "load_state: rank 0 read .* and broadcast" "$WORK/o" && fail "$case: rank 0 broadcast the checkpoint"
        # AdamW: two state tensors per parameter; a shard: half a tp rank's elements, the last one's up to 16
        # elements of padding fewer
        reads "$WORK/o" optimizer.safetensors $(( (N / 2 - 16) * 8 )) $(( (N + 1) / 2 * 8 + 4096 * tensors * 2 )) \
            $(( (split + 2 * repl) * 8 ))
        if [ "$z" = 3 ]; then
            reads "$WORK/o" model.safetensors $(( (N / 2 - 16) * 4 )) $(( (N + 1) / 2 * 4 + 4096 * tensors )) \
                $(( (split + 2 * repl) * 4 ))
        else
            reads "$WORK/o" model.safetensors $((N * 4)) $((N * 4 + 4096 * tensors)) ""
        fi
        same_state "$WORK/saved" "$WORK/o" "after the load it is not the one saved"
        same_files "$WORK/ck" "$WORK/ck2" "saved again after the load"

        note "$case: the gathering load (fsdp_cpu_ram_efficient_loading false) gives the same state and files"
        FSDP_CPU_RAM_EFFICIENT_LOADING=false run 4 "$B" "$mesh" --steps 0 --load-state "$WORK/ck" --state-digest \
            --save-state "$WORK/ck3" > "$WORK/g" 2>&1 || { cat "$WORK/g"; fail "$case: gathering load"; }
        same_state "$WORK/g" "$WORK/o" "the slice reads and the gathering load differ"
        same_files "$WORK/ck3" "$WORK/ck2" "the slice reads against the gathering load"

        note "$case: 2 more steps from the checkpoint equal 4 uninterrupted ones"
        run 4 "$B" "$mesh" --steps 2 --load-state "$WORK/ck" --digest > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: resume"; }
        digest "$WORK/o" > "$WORK/d"
        cmp "$WORK/d4" "$WORK/d" || { cat "$WORK/o"; fail "$case: the resumed run differs from the uninterrupted one"; }

        files="optimizer.safetensors"
        [ "$z" = 3 ] && files="$files model.safetensors"
        for f in $files; do
            note "$case: a byte changed in $f: every rank refuses, naming the chunk; no state changes"
            rm -rf "$WORK/bad"
            cp -r "$WORK/ck" "$WORK/bad"
            corrupt "$WORK/bad/$f"
            # --after 1: every rank trains a step on (the digests are collective at stage 3: no rank leaves first)
            run 4 "$B" "$mesh" --steps 2 --try-load-state "$WORK/bad" --after 1 > "$WORK/o" 2>&1 ||
                { cat "$WORK/o"; fail "$case: the group did not go on after the refused load"; }
            refused 4 "bad/$f: corrupt: CRC-32 .* in chunk .* from the 4 processes' parts" "$WORK/o"
        done
    done
done

first=${backends%% *}
case="$first, stage 3, no chunk sums"
note "$case: complete.json of a caccel before chunk sums: each rank its shard's part, the group checks each whole CRC-32"
rm -rf "$WORK/old" "$WORK/ck2"
cp -r "$WORK/ck" "$WORK/old"   # the last checkpoint: stage 1's (the files are the same at every stage)
nosums "$WORK/old/complete.json"
mesh="$TPZ --use_fsdp --fsdp_sharding_strategy FULL_SHARD"
CACCEL_TEST_ST_REPORT=1 run 4 "$first" "$mesh" --steps 0 --load-state "$WORK/old" --save-state "$WORK/ck2" > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "$case: load"; }
reads "$WORK/o" optimizer.safetensors $(( (N / 2 - 16) * 8 )) $(( (N + 1) / 2 * 8 + 4096 * tensors * 2 )) $(( (split + 2 * repl) * 8 ))
reads "$WORK/o" model.safetensors $(( (N / 2 - 16) * 4 )) $(( (N + 1) / 2 * 4 + 4096 * tensors )) $(( (split + 2 * repl) * 4 ))
same_files "$WORK/ck" "$WORK/ck2" "saved again after the load without chunk sums"
note "$case: a byte changed: every rank refuses, from the 4 processes' parts of the whole file's CRC-32"
corrupt "$WORK/old/optimizer.safetensors"
run 4 "$first" "$mesh" --steps 2 --try-load-state "$WORK/old" --after 1 > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: refused load"; }
refused 4 "old/optimizer.safetensors: corrupt: CRC-32 .* in chunk 0 of 1 .* from the 4 processes' parts" "$WORK/o"

case="$first, another layout"
note "$case: the stage-3 checkpoint at tp 2 x dp_replicate 2 (DDP: each rank its tp slices) saves the same files"
rm -rf "${WORK:?}/ck" "$WORK/ck2" "$WORK/ck3"
CACCEL_TEST_ST_CHUNK=4096 run 4 "$first" "$TPZ --use_fsdp --fsdp_sharding_strategy FULL_SHARD" --steps 2 \
    --save-state "$WORK/ck" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: save"; }
CACCEL_TEST_ST_CHUNK=4096 run 4 "$first" "--parallelism_config_tp_size 2 --parallelism_config_dp_replicate_size 2" --steps 0 --load-state "$WORK/ck" \
    --save-state "$WORK/ck2" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: load at tp 2 x dp_replicate 2"; }
same_files "$WORK/ck" "$WORK/ck2" "loaded at tp 2 x dp_replicate 2"
note "$case: that checkpoint of tp 2 x dp_replicate 2 loads at tp 2 x dp_shard 2, stage 2 (its shards' parts)"
CACCEL_TEST_ST_REPORT=1 run 4 "$first" "$TPZ --use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP" --steps 0 \
    --load-state "$WORK/ck2" --save-state "$WORK/ck3" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: load at stage 2"; }
reads "$WORK/o" optimizer.safetensors $(( (N / 2 - 16) * 8 )) $(( (N + 1) / 2 * 8 + 4096 * tensors * 2 )) \
    $(( (split + 2 * repl) * 8 ))
same_files "$WORK/ck" "$WORK/ck3" "loaded at tp 2 x dp_shard 2, stage 2"

case="$first, HSDP"
hsdp="$TPZ --parallelism_config_dp_replicate_size 2 --use_fsdp --fsdp_sharding_strategy HYBRID_SHARD"
note "$case: tp 2 x dp_shard 2 x dp_replicate 2 on 8 ranks: each replica's 4 ranks read and verify the files together"
rm -rf "$WORK/ck2" "$WORK/bad"
CACCEL_TEST_ST_REPORT=1 run 8 "$first" "$hsdp" --steps 0 --load-state "$WORK/ck" --save-state "$WORK/ck2" > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "$case: load"; }
sed -n "s|^meta: .*/optimizer.safetensors: \([0-9]*\) of .*|\1|p" "$WORK/o" | awk -v lo=$(( (N / 2 - 16) * 8 )) \
    -v hi=$(( (N + 1) / 2 * 8 + 4096 * tensors * 2 )) '{ n++; if ($1 < lo || $1 > hi) bad++ } END { exit !(n == 8 && !bad) }' ||
    { cat "$WORK/o"; fail "$case: a rank did not read its shard's part of optimizer.safetensors"; }
same_files "$WORK/ck" "$WORK/ck2" "loaded under HSDP"
cp -r "$WORK/ck" "$WORK/bad"
corrupt "$WORK/bad/optimizer.safetensors"
run 8 "$first" "$hsdp" --steps 2 --try-load-state "$WORK/bad" --after 1 > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: refused load"; }
refused 8 "bad/optimizer.safetensors: corrupt: CRC-32 .* from the 4 processes' parts" "$WORK/o"
echo PASS
