#!/bin/sh
# Loads under tensor parallelism read only each rank's tp slices of the model's file, over Gloo (caccel
# launch) and MPI (mpirun), at tp 2 (2 ranks) and tp 2 x dp_replicate 2 (4 ranks): ddp_check's MLP
# (--tp-plan: fc1 colwise, h0 rowwise, h1 colwise, fc2 rowwise) trained 2 steps and saved, then loaded
# with ca_load_model after ca_prepare and into a meta model before it (read at ca_prepare). Each rank's
# deferred-read line (CACCEL_TEST_ST_REPORT: the bytes its preads read) is at most its 1/tp share of the
# split parameters plus the replicated ones whole plus 4 KB per tensor, and the model (gathered whole)
# equals the saved one bit for bit (at tp 2 x FULL_SHARD 2, 4 ranks of the first backend, too, for the
# meta load: the replicated tensors then read as the rank's stage-3 shard of them; and ca_load_model
# after ca_prepare there reads only the rank's stage-3 shard of its tp slices, half of its tp share, and
# equals the saved model and the gathering load's, fsdp_cpu_ram_efficient_loading false). A file cut short
# after the meta load fails ca_prepare on every rank: the rank whose slice lost its bytes names the file,
# the other says another rank failed; a file cut short before ca_load_model after ca_prepare is refused
# by every rank, naming it, and changes neither rank's model.
. "$(dirname "$0")/dist/lib.sh"
. "$(dirname "$0")/load_tp_model.sh"
# run NP BACKEND MESH ARGS...: ddp_check on NP ranks with the mesh flags MESH
run() {
    np=$1 be=$2 mesh=$3; shift 3
    # shellcheck disable=SC2086
    mesh_launch "$np" "$be" "$DDP" $mesh -- --tp-plan --hidden $H --depth 2 --digest "$@"
}
# reads FILE NP: every rank read its share by byte range, and no more
reads() {
    sed -n 's|^meta: .*/model.safetensors: \([0-9]*\) of \([0-9]*\) bytes read$|\1|p' "$1" > "$WORK/r"
    [ "$(wc -l < "$WORK/r")" = "$2" ] || { cat "$1"; fail "$case: not one read report per rank"; }
    limit=$(( (split / 2 + ${rlimit:-$repl}) * 4 + 4096 * tensors ))
    while read -r n; do
        echo "  $case: a rank read $n bytes of model.safetensors' $data (limit $limit)"
        [ "$n" -le "$limit" ] || fail "$case: a rank read $n bytes, more than its tp share ($limit)"
        [ "$n" -ge $(( (split / 2 + repl) * 4 )) ] || fail "$case: a rank read $n bytes, less than its slices"
    done < "$WORK/r"
}

for be in $backends; do
    for np in 2 4; do
        mesh="--parallelism_config_tp_size 2"
        [ "$np" = 4 ] && mesh="$mesh --parallelism_config_dp_replicate_size 2"
        case="$be, $np ranks"
        rm -rf "${WORK:?}/m"
        mkdir -p "$WORK/m"
        note "$case: 2 steps at tp 2, saved with ca_save_model"
        run "$np" "$be" "$mesh" --steps 2 --save-model "$WORK/m" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: save"; }
        digest "$WORK/o" > "$WORK/saved"
        [ "$(wc -l < "$WORK/saved")" = 1 ] || { cat "$WORK/o"; fail "$case: not one digest"; }
        data=$(stat -c %s "$WORK/m/model.safetensors")

        note "$case: ca_load_model after ca_prepare: each rank preads its slices"
        CACCEL_TEST_ST_REPORT=1 run "$np" "$be" "$mesh" --steps 0 --load-model "$WORK/m" > "$WORK/o" 2>&1 ||
            { cat "$WORK/o"; fail "$case: load after prepare"; }
        reads "$WORK/o" "$np"
        cmp "$WORK/saved" "$(digest "$WORK/o" > "$WORK/d"; echo "$WORK/d")" || { cat "$WORK/o"; fail "$case: not the saved model"; }

        note "$case: ca_load_model into a meta model before ca_prepare: each rank preads its slices there"
        CACCEL_TEST_ST_REPORT=1 run "$np" "$be" "$mesh" --steps 0 --meta --load-model-early "$WORK/m" > "$WORK/o" 2>&1 ||
            { cat "$WORK/o"; fail "$case: meta load"; }
        count "$np" 'model_meta=1' "$WORK/o"
        reads "$WORK/o" "$np"
        digest "$WORK/o" > "$WORK/d"
        cmp "$WORK/saved" "$WORK/d" || { cat "$WORK/o"; fail "$case: the deferred load's model differs"; }
    done

    note "$be: the file cut short after a meta load fails ca_prepare on both ranks, naming it"
    cp "$WORK/m/model.safetensors" "$WORK/cut.safetensors"
    run 2 "$be" "--parallelism_config_tp_size 2" --steps 0 --meta --load-model-early "$WORK/cut.safetensors" \
        --cut-before-prepare "$WORK/cut.safetensors" > "$WORK/o" 2>&1 && { cat "$WORK/o"; fail "$be: a cut file loaded"; }
    grep -q 'cut.safetensors: reading .*shorter than when it was checked' "$WORK/o" ||
        { cat "$WORK/o"; fail "$be: the error does not name the file"; }
    [ "$be" = mpi ] || grep -q 'tensor parallelism: 1 other rank(s) failed to read their tp slices' "$WORK/o" ||
        { cat "$WORK/o"; fail "$be: the other rank does not report the failure"; }

    note "$be: a file cut short before ca_load_model after ca_prepare is refused by both ranks, naming it"
    head -c $(( $(stat -c %s "$WORK/m/model.safetensors") - 4 )) "$WORK/m/model.safetensors" > "$WORK/short.safetensors"
    run 2 "$be" "--parallelism_config_tp_size 2" --steps 0 --try-load-model "$WORK/short.safetensors" > "$WORK/o" 2>&1
    count 2 'load_model=CA_ERR_IO: .*short.safetensors' "$WORK/o"
    [ "$(sed -n 's/^rank=\([0-9]\) params_fnv=\(.*\)$/\1 \2/p' "$WORK/o" | sort -u | wc -l)" = 2 ] ||
        { cat "$WORK/o"; fail "$be: a refused load changed a rank's model"; }
done
first=${backends%% *}
case="$first, tp 2 x FULL_SHARD 2"
mesh="--parallelism_config_tp_size 2 --parallelism_config_dp_shard_size 2 --use_fsdp --fsdp_sharding_strategy FULL_SHARD"
note "$case: a meta model loaded before ca_prepare: each rank preads its tp slices (the replicated tensors its shard)"
rm -rf "${WORK:?}/m"
mkdir -p "$WORK/m"
run 4 "$first" "$mesh" --steps 2 --save-model "$WORK/m" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$case: save"; }
digest "$WORK/o" > "$WORK/saved"
data=$(stat -c %s "$WORK/m/model.safetensors")
CACCEL_TEST_ST_REPORT=1 run 4 "$first" "$mesh" --steps 0 --meta --load-model-early "$WORK/m" > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "$case: meta load"; }
rlimit=$repl repl=0   # the replicated tensors: at most whole, at least none (a shard)
reads "$WORK/o" 4
digest "$WORK/o" > "$WORK/d"
cmp "$WORK/saved" "$WORK/d" || { cat "$WORK/o"; fail "$case: the deferred load's model differs"; }

note "$case: ca_load_model after ca_prepare: each rank preads only its stage-3 shard of its tp slices"
CACCEL_TEST_ST_REPORT=1 run 4 "$first" "$mesh" --steps 0 --load-model "$WORK/m" > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "$case: load after prepare"; }
sed -n 's|^meta: .*/model.safetensors: \([0-9]*\) of \([0-9]*\) bytes read$|\1|p' "$WORK/o" > "$WORK/r"
[ "$(wc -l < "$WORK/r")" = 4 ] || { cat "$WORK/o"; fail "$case: not one read report per rank"; }
share=$(( (split / 2 + rlimit) * 4 / 2 ))   # half (dp 2) of a tp rank's flat parameters
while read -r n; do
    echo "  $case: a rank read $n bytes of model.safetensors' $data (its shard: about $share)"
    [ "$n" -le $((share + 64)) ] && [ "$n" -ge $((share - 64)) ] || fail "$case: a rank read $n bytes, not its shard's"
done < "$WORK/r"
digest "$WORK/o" > "$WORK/d"
cmp "$WORK/saved" "$WORK/d" || { cat "$WORK/o"; fail "$case: the load into the prepared model differs"; }
note "$case: the gathering load (fsdp_cpu_ram_efficient_loading false) gives the same model"
FSDP_CPU_RAM_EFFICIENT_LOADING=false run 4 "$first" "$mesh" --steps 0 --load-model "$WORK/m" > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "$case: gathering load"; }
digest "$WORK/o" > "$WORK/d"
cmp "$WORK/saved" "$WORK/d" || { cat "$WORK/o"; fail "$case: the gathering load's model differs"; }
echo PASS
