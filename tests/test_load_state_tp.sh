#!/bin/sh
# ca_load_state under tensor parallelism (DDP beside it) reads only each rank's tp slices of
# model.safetensors and optimizer.safetensors, over Gloo (caccel launch) and MPI (mpirun), at tp 2 (2
# ranks) and tp 2 x dp_replicate 2 (4 ranks, the first backend): ddp_check's MLP (--tp-plan: fc1
# colwise, h0 rowwise, h1 colwise, fc2 rowwise) with AdamW, 2 steps saved with chunk sums of 4 KB
# (CACCEL_TEST_ST_CHUNK, so that the rowwise slices are a piece of every chunk), then loaded after
# ca_prepare. Each rank's bytes read of each file (CACCEL_TEST_ST_REPORT) are at least its 1/tp share
# of the split tensors plus the replicated ones and at most that plus 4 KB per tensor, every byte of
# both files is verified (the tp group's sums of each chunk together), and no file's mapping holds more
# than its header's chunks; each rank's state (its slices, their AdamW moments, the step, the lr, the
# scaler, the generator) equals the saved one and the gathering load's (fsdp_cpu_ram_efficient_loading
# false) bit for bit; the model loaded (gathered) equals one
# process's full read of the checkpoint bit for bit, and 2 more steps equal 4 uninterrupted ones. A
# byte changed in one rank's slice fails the load on every rank, naming the file and the chunk, and
# leaves every rank's state as it was. A checkpoint without chunk sums (complete.json as a caccel before
# them wrote it: each file's whole CRC-32 only) is read the same way, each rank its slices, and the tp
# group verifies each file's CRC-32 from its parts (the file one chunk); a changed byte is refused on both
# ranks.
. "$(dirname "$0")/dist/lib.sh"
. "$(dirname "$0")/load_tp_model.sh"
run() {   # run NP BACKEND MESH ARGS...
    rn=$1 rb=$2 rm=$3; shift 3
    # shellcheck disable=SC2086
    mesh_launch "$rn" "$rb" "$DDP" $rm -- --tp-plan --hidden $H --depth 2 --adamw "$@"
}
# reads FILE NP NAME FACTOR: every rank read its share of NAME (FACTOR tensors of the model's per tensor)
reads() {
    sed -n "s|^meta: .*/$3: \([0-9]*\) of \([0-9]*\) bytes read\$|\1|p" "$1" > "$WORK/r"
    [ "$(wc -l < "$WORK/r")" = "$2" ] || { cat "$1"; fail "$case: not one read report of $3 per rank"; }
    lo=$(( (split / 2 + repl) * 4 * $4 )) hi=$(( (split / 2 + repl) * 4 * $4 + 4096 * tensors * $4 ))
    while read -r n; do
        echo "  $case: a rank read $n bytes of $3 (at least $lo, at most $hi)"
        [ "$n" -ge "$lo" ] && [ "$n" -le "$hi" ] || fail "$case: a rank read $n bytes of $3, not its tp share"
    done < "$WORK/r"
    # verified whole (the group's sums), the mapping holding the header's chunks only (read ahead: 64 KB)
    sed -n "s|^safetensors: .*/$3: \([0-9]*\) of \([0-9]*\) bytes verified, \([0-9]*\) resident.*|\1 \2 \3|p" "$1" |
        while read -r v size res; do
            [ "$v" = "$size" ] || fail "$case: $v of $size bytes of $3 verified"
            [ "$res" -le 65536 ] || fail "$case: $res bytes of $3 resident in the mapping"
        done
}

for B in $backends; do
    for P in 2 4; do
        [ "$P" = 4 ] && [ "$B" != "${backends%% *}" ] && continue
        mesh="--parallelism_config_tp_size 2"
        [ "$P" = 4 ] && mesh="$mesh --parallelism_config_dp_replicate_size 2"
        case="$B, $P ranks"
        rm -rf "${WORK:?}/ck"
        note "$case: 2 steps at tp 2 saved with save_state (4 KB chunk sums); 4 uninterrupted steps"
        CACCEL_TEST_ST_CHUNK=4096 run "$P" "$B" "$mesh" --steps 2 --save-state "$WORK/ck" > "$WORK/o" 2>&1 ||
            { cat "$WORK/o"; fail "$case: save"; }
        run "$P" "$B" "$mesh" --steps 2 --state-digest > "$WORK/saved" 2>&1 || { cat "$WORK/saved"; fail "$case: 2 steps"; }
        run "$P" "$B" "$mesh" --steps 4 --digest > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: 4 steps"; }
        digest "$WORK/o" > "$WORK/d4"

        note "$case: load_state after ca_prepare: each rank preads its slices; the state is the saved one"
        CACCEL_TEST_ST_REPORT=1 run "$P" "$B" "$mesh" --steps 0 --load-state "$WORK/ck" --state-digest --digest \
            > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: load"; }
        reads "$WORK/o" "$P" model.safetensors 1
        reads "$WORK/o" "$P" optimizer.safetensors 2
        grep -q "load_state: rank 0 read .* and broadcast" "$WORK/o" && fail "$case: rank 0 broadcast the checkpoint"
        for r in $(seq 0 $((P - 1))); do
            [ -n "$(field "$r" state_fnv "$WORK/o")" ] &&
                [ "$(field "$r" state_fnv "$WORK/o")" = "$(field "$r" state_fnv "$WORK/saved")" ] ||
                { cat "$WORK/o"; fail "$case: rank $r's state after the load is not the one saved"; }
        done
        digest "$WORK/o" > "$WORK/dtp"
        note "$case: the gathering load (fsdp_cpu_ram_efficient_loading false) gives the same state"
        FSDP_CPU_RAM_EFFICIENT_LOADING=false run "$P" "$B" "$mesh" --steps 0 --load-state "$WORK/ck" --state-digest \
            > "$WORK/g" 2>&1 || { cat "$WORK/g"; fail "$case: gathering load"; }
        for r in $(seq 0 $((P - 1))); do
            [ "$(field "$r" state_fnv "$WORK/g")" = "$(field "$r" state_fnv "$WORK/o")" ] ||
                { cat "$WORK/g"; fail "$case: rank $r's state differs between the slice reads and the gathering load"; }
        done
        [ "$(wc -l < "$WORK/dtp")" = 1 ] || { cat "$WORK/o"; fail "$case: the ranks' models differ"; }
        if [ "$P" = 2 ]; then
            note "$case: one process's full read of the checkpoint gives the same model"
            run 1 "$B" "" --steps 0 --load-state "$WORK/ck" --digest > "$WORK/o" 2>&1 ||
                { cat "$WORK/o"; fail "$case: one process's load"; }
            cmp "$WORK/dtp" "$(digest "$WORK/o" > "$WORK/d1"; echo "$WORK/d1")" ||
                fail "$case: the tp load's model is not one process's full read of it"
        fi

        note "$case: 2 more steps from the checkpoint equal 4 uninterrupted ones"
        run "$P" "$B" "$mesh" --steps 2 --load-state "$WORK/ck" --digest > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: resume"; }
        digest "$WORK/o" > "$WORK/d"
        cmp "$WORK/d4" "$WORK/d" || { cat "$WORK/o"; fail "$case: the resumed run differs from the uninterrupted one"; }
    done

    note "$B: a byte changed in one rank's slice: every rank refuses, naming the chunk; no state changes"
    rm -rf "$WORK/bad"
    cp -r "$WORK/ck" "$WORK/bad"
    f="$WORK/bad/model.safetensors"
    corrupt "$f"
    run 2 "$B" "--parallelism_config_tp_size 2" --steps 2 --try-load-state "$WORK/bad" > "$WORK/o" 2>&1
    case=$B
    refused 2 "bad/model.safetensors: corrupt: CRC-32 .* in chunk" "$WORK/o"

    case="$B, no chunk sums"
    note "$case: complete.json of a caccel before chunk sums: each rank reads its slices, the tp group checks the whole CRC-32 from its parts"
    rm -rf "$WORK/old"
    cp -r "$WORK/ck" "$WORK/old"
    nosums "$WORK/old/complete.json"
    run 2 "$B" "--parallelism_config_tp_size 2" --steps 0 --load-state "$WORK/ck" --state-digest > "$WORK/g" 2>&1 ||
        { cat "$WORK/g"; fail "$case: load with chunk sums"; }
    CACCEL_TEST_ST_REPORT=1 run 2 "$B" "--parallelism_config_tp_size 2" --steps 0 --load-state "$WORK/old" --state-digest \
        > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: load"; }
    reads "$WORK/o" 2 model.safetensors 1
    reads "$WORK/o" 2 optimizer.safetensors 2
    for r in 0 1; do
        [ -n "$(field "$r" state_fnv "$WORK/o")" ] && [ "$(field "$r" state_fnv "$WORK/o")" = "$(field "$r" state_fnv "$WORK/g")" ] ||
            { cat "$WORK/o"; fail "$case: rank $r's state differs from the load with chunk sums"; }
    done
    note "$case: a byte changed: both ranks refuse, from their parts of the whole file's CRC-32"
    corrupt "$WORK/old/model.safetensors"
    run 2 "$B" "--parallelism_config_tp_size 2" --steps 2 --try-load-state "$WORK/old" > "$WORK/o" 2>&1
    refused 2 "old/model.safetensors: corrupt: CRC-32 .* in chunk 0 of 1 .* from the 2 processes' parts" "$WORK/o"
done
echo PASS
