#!/bin/sh
# ca_load_model into a model built under ca_init_empty_weights (meta) before ca_prepare at stage 3
# (FSDP FULL_SHARD) with fsdp_cpu_ram_efficient_loading (the default), over Gloo (caccel launch) and
# MPI (mpirun) at 2 ranks: the load checks the file against the model and reads no values; ca_prepare
# reads on each rank only the bytes of its shard's slices (the deferred read's CACCEL_TEST_ST_REPORT
# line: about half of model.safetensors' data per rank, the two together the data once), and the
# device allocator's peak from building the model to the end of ca_prepare stays below half the model
# plus the momentum's shard plus the largest parameter and 10% (reading it whole, as before, allocated the whole model). The parameters
# equal bit for bit those of the same file loaded after ca_prepare and those saved; with the setting
# false every rank loads the whole file, to the same bits. The file cut short between the load and
# ca_prepare fails ca_prepare on both ranks: rank 1, whose slice it cut, names the file; rank 0 says
# another rank failed (under mpirun rank 1's exit may end rank 0 first). examples/llm_finetune with the setting given
# true builds its Llama under ca_init_empty_weights, ca_causal_lm_load_pretrained defers the read, and
# ca_prepare reads each rank's half of the file (FULL_SHARD) or rank 0 all of it for both (NO_SHARD,
# the others reading nothing; at parallelism_config_tp_size 2 each rank reads its tp slices, less than
# the file): the losses print as those of the eager load, digit for digit.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
DDP="$BUILD/tests/ddp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info
LAUNCH_FLAGS=""   # ACCELERATE_USE_CPU chooses the device
train_backends
FL="--use_fsdp --fsdp_sharding_strategy FULL_SHARD"
digests() { sed -n 's/^.*rank=\([0-9]*\) params_fnv=\([0-9a-f]*\).*/\1 \2/p' "$1" | sort -n | cut -d' ' -f2; }
# z3 BACKEND ARGS...: ddp_check on 2 ranks at stage 3, a model of 2 x Linear(256, 256) between the small
# ones (530 kB)
z3() {
    be=$1; shift
    # shellcheck disable=SC2086
    if [ "$be" = mpi ]; then launch 2 "$be" "$DDP" $FL --hidden 256 --depth 2 --digest "$@"
    else launch 2 "$be" $FL "$DDP" --hidden 256 --depth 2 --digest "$@"; fi
}

for be in $backends; do
    rm -rf "${WORK:?}/m"
    mkdir -p "$WORK/m"
    note "$be: 2 steps at stage 3, saved with ca_save_model"
    z3 "$be" --steps 2 --save-model "$WORK/m" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$be: save"; }
    digests "$WORK/o" | head -1 > "$WORK/saved"
    [ -s "$WORK/saved" ] || { cat "$WORK/o"; fail "$be: no digest"; }
    data=$(( $(stat -c %s "$WORK/m/model.safetensors") ))

    note "$be: loaded after ca_prepare (each rank its shard's slices from the mapping)"
    z3 "$be" --steps 0 --load-model "$WORK/m" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$be: load after prepare"; }
    digests "$WORK/o" > "$WORK/after"
    [ "$(sort -u "$WORK/after")" = "$(cat "$WORK/saved")" ] || { cat "$WORK/o"; fail "$be: not the saved parameters"; }

    note "$be: a meta model loaded before ca_prepare: each rank reads its shard's bytes at ca_prepare"
    CACCEL_TEST_ST_REPORT=1 z3 "$be" --steps 0 --meta --mem --load-model-early "$WORK/m" > "$WORK/o" 2>&1 ||
        { cat "$WORK/o"; fail "$be: meta load"; }
    count 2 'model_meta=1' "$WORK/o"
    digests "$WORK/o" > "$WORK/meta"
    cmp "$WORK/after" "$WORK/meta" || { cat "$WORK/o"; fail "$be: the deferred load's parameters differ"; }
    sed -n 's|^.*meta: .*/model.safetensors: \([0-9]*\) of \([0-9]*\) bytes read$|\1|p' "$WORK/o" > "$WORK/r"
    [ "$(wc -l < "$WORK/r")" = 2 ] || { cat "$WORK/o"; fail "$be: not one deferred read per rank"; }
    total=0
    while read -r n; do
        echo "  $be: a rank read $n of model.safetensors' $data bytes"
        [ "$n" -le $((data / 2 + 4096)) ] || fail "$be: a rank read $n bytes of $data, more than its half"
        total=$((total + n))
    done < "$WORK/r"
    [ "$total" -lt "$data" ] || fail "$be: the ranks read $total bytes together, more than the file's $data"
    sed -n 's/^rank=[0-9]* prepare_peak_bytes=\([0-9]*\) model_bytes=\([0-9]*\) largest_param_bytes=\([0-9]*\)$/\1 \2 \3/p' \
        "$WORK/o" > "$WORK/p"
    [ "$(wc -l < "$WORK/p")" = 2 ] || { cat "$WORK/o"; fail "$be: not one prepare_peak_bytes line per rank"; }
    while read -r peak model largest; do
        # parameter and momentum shards (2 x model / 2) and one slice's buffer, +10%: reading the file
        # whole gave every parameter its whole memory on top
        limit=$(( (2 * model / 2 + largest) * 11 / 10 ))
        echo "  $be: ca_prepare allocated at most $peak bytes (limit $limit); the model is $model, its largest parameter $largest"
        [ "$peak" -le "$limit" ] || fail "$be: prepare peaked at $peak bytes, above the shards + one parameter + 10% ($limit)"
    done < "$WORK/p"

    note "$be: fsdp_cpu_ram_efficient_loading false: every rank loads the file whole; the same parameters"
    FSDP_CPU_RAM_EFFICIENT_LOADING=false CACCEL_TEST_ST_REPORT=1 z3 "$be" --steps 0 --meta --load-model-early "$WORK/m" \
        > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$be: meta load, setting false"; }
    count 0 'meta: .* bytes read' "$WORK/o"
    digests "$WORK/o" > "$WORK/whole"
    cmp "$WORK/after" "$WORK/whole" || fail "$be: the whole loads differ"

    note "$be: the file cut short between the load and ca_prepare fails ca_prepare on both ranks, naming it"
    cp "$WORK/m/model.safetensors" "$WORK/cut.safetensors"
    z3 "$be" --steps 0 --meta --load-model-early "$WORK/cut.safetensors" --cut-before-prepare "$WORK/cut.safetensors" \
        > "$WORK/o" 2>&1 && { cat "$WORK/o"; fail "$be: a cut file loaded"; }
    grep -q 'cut.safetensors: reading .*shorter than when it was checked' "$WORK/o" ||
        { cat "$WORK/o"; fail "$be: the error does not name the file"; }
    [ "$be" = mpi ] || grep -q 'other rank(s) failed to read their shard' "$WORK/o" ||
        { cat "$WORK/o"; fail "$be: rank 0 does not report rank 1's failure"; }

done

# examples/llm_finetune with fsdp_cpu_ram_efficient_loading set true builds the Llama under
# ca_init_empty_weights and ca_causal_lm_load_pretrained defers the read to ca_prepare
FT="$BUILD/examples/llm_finetune"
mkdir -p "$WORK/base"
cp "$(dirname "$0")/../examples/llama-tiny.json" "$WORK/base/config.json"
FTA="--lora_r 0 --block_size 64 --batch_size 8 --seed 7 --eval_blocks 16 --max_steps 3 --lr 3e-3 --sample_tokens 0"
# shellcheck disable=SC2086
"$FT" --cpu --model "$WORK/base" --from_scratch $FTA --max_steps 1 --output_dir "$WORK/llama" > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "llm_finetune: the small Llama"; }
data=$(( $(stat -c %s "$WORK/llama/model.safetensors") ))
losses() { grep -E '^(before training|epoch [0-9]*):' "$1"; }
for be in $backends; do
    for st in FULL_SHARD NO_SHARD; do
        for lean in "" true; do
            fl="--use_fsdp --fsdp_sharding_strategy $st${lean:+ --fsdp_cpu_ram_efficient_loading $lean}"
            note "$be, llm_finetune, $st, fsdp_cpu_ram_efficient_loading ${lean:-at its default}"
            # shellcheck disable=SC2086
            if [ "$be" = mpi ]; then CACCEL_TEST_ST_REPORT=1 launch 2 "$be" "$FT" $fl --model "$WORK/llama" $FTA > "$WORK/o" 2>&1
            else CACCEL_TEST_ST_REPORT=1 launch 2 "$be" $fl "$FT" --model "$WORK/llama" $FTA > "$WORK/o" 2>&1; fi ||
                { cat "$WORK/o"; fail "$be: llm_finetune $st ($lean)"; }
            losses "$WORK/o" > "$WORK/loss.$st$lean"
            [ -s "$WORK/loss.$st$lean" ] || { cat "$WORK/o"; fail "$be: llm_finetune $st: no losses"; }
            sed -n 's|^meta: .*/model.safetensors: \([0-9]*\) of [0-9]* bytes read$|\1|p' "$WORK/o" | sort -n > "$WORK/r"
            if [ -z "$lean" ]; then
                [ -s "$WORK/r" ] && { cat "$WORK/o"; fail "$be: $st: a deferred read at the default"; }
                continue
            fi
            count 1 'fsdp_cpu_ram_efficient_loading: .* is read at ca_prepare' "$WORK/o"
            [ "$(wc -l < "$WORK/r")" = 2 ] || { cat "$WORK/o"; fail "$be: $st: not one deferred read per rank"; }
            lo=$(head -1 "$WORK/r") hi=$(tail -1 "$WORK/r")
            echo "  $be, $st: the ranks read $lo and $hi of model.safetensors' $data bytes"
            if [ $st = FULL_SHARD ]; then   # each its half of the data
                [ "$hi" -le $((data / 2 + 4096)) ] || fail "$be: $st: a rank read $hi of $data bytes"
            else                            # rank 0 all of it for both, rank 1 nothing
                if [ "$lo" != 0 ] || [ "$hi" -le $((data - 4096)) ]; then
                    fail "$be: $st: the reads were $lo and $hi, not rank 0's alone"
                fi
            fi
            cmp "$WORK/loss.$st" "$WORK/loss.$st$lean" || fail "$be: llm_finetune $st: the deferred load trains otherwise"
        done
    done
done
first=${backends%% *}
note "$first, llm_finetune at parallelism_config_tp_size 2: each rank reads its tp slices (and the replicated tensors)"
for lean in "" true; do
    # shellcheck disable=SC2086
    CACCEL_TEST_ST_REPORT=1 launch 2 "$first" --parallelism_config_tp_size 2 ${lean:+--fsdp_cpu_ram_efficient_loading $lean} \
        "$FT" --model "$WORK/llama" $FTA > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "tp 2 ($lean)"; }
    losses "$WORK/o" > "$WORK/loss.tp$lean"
done
sed -n 's|^meta: .*/model.safetensors: \([0-9]*\) of [0-9]* bytes read$|\1|p' "$WORK/o" | sort -n > "$WORK/r"
[ "$(wc -l < "$WORK/r")" = 2 ] || { cat "$WORK/o"; fail "tp 2: not one deferred read per rank"; }
lo=$(head -1 "$WORK/r") hi=$(tail -1 "$WORK/r")
echo "  tp 2: the ranks read $lo and $hi of model.safetensors' $data bytes"
[ "$lo" -gt 0 ] && [ "$hi" -lt "$data" ] || fail "tp 2: the reads were $lo and $hi, not each rank's slices"
[ -s "$WORK/loss.tp" ] && cmp "$WORK/loss.tp" "$WORK/loss.tptrue" || fail "tp 2: the deferred load trains otherwise"
echo PASS
