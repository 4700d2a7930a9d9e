#!/bin/sh
# ca_load_model into a prepared model that every rank holds whole (DDP; ZeRO stage 2) on 2 processes,
# over Gloo (caccel launch) and MPI (mpirun): rank 0 alone opens the files (one CACCEL_TEST_ST_REPORT
# line for model.safetensors where each rank reading it gives two) and broadcasts its parameters,
# which equal on every rank those each rank gets by reading the file itself
# (fsdp_cpu_ram_efficient_loading false) bit for bit, and the saved ones. A model built under
# ca_init_empty_weights (meta) and loaded before ca_prepare is read the same way: rank 0 alone opens
# the file, the others give the parameters memory and receive rank 0's values (every rank reads it
# with the setting false): the saved parameters on every rank. A file rank 0 cannot read fails the
# load (rank 1 naming rank 0 under caccel launch; under mpirun rank 0's exit stops rank 1).
# load_state under DDP reads the same way: rank 0 alone opens model.safetensors and
# optimizer.safetensors and broadcasts the parameters and the optimizer state; 2 steps saved, loaded
# and 2 more give every rank the parameters of 4 uninterrupted steps (with the setting false too,
# where each rank reads the files); a corrupt optimizer file fails the load on both ranks.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
DDP="$BUILD/tests/ddp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info
LAUNCH_FLAGS=""   # ACCELERATE_USE_CPU chooses the device
train_backends
# digests FILE: the params_fnv of each rank in FILE, one a line, in rank order
digests() { sed -n 's/^.*rank=\([0-9]*\) params_fnv=\([0-9a-f]*\).*/\1 \2/p' "$1" | sort -n | cut -d' ' -f2; }
reports() { grep -c 'safetensors: .*/model.safetensors: [0-9]* of [0-9]* bytes verified' "$1"; }
# on BACKEND FLAGS ARGS...: ddp_check on 2 ranks; FLAGS (a strategy's) go to the launcher under caccel
# launch, to the program under mpirun
on() {
    obe=$1 ofl=$2; shift 2
    # shellcheck disable=SC2086
    if [ "$obe" = mpi ]; then launch 2 "$obe" "$DDP" $ofl "$@"; else launch 2 "$obe" $ofl "$DDP" "$@"; fi
}

for be in $backends; do
    note "$be: trained 3 steps on 2 ranks and saved with ca_save_model"
    rm -rf "${WORK:?}/m" "$WORK/ck" "$WORK/bad"
    mkdir -p "$WORK/m"
    launch 2 "$be" "$DDP" --steps 3 --hidden 64 --save-model "$WORK/m" --digest > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$be: save"; }
    digests "$WORK/o" | head -1 > "$WORK/saved"
    [ -s "$WORK/saved" ] || { cat "$WORK/o"; fail "$be: no digest"; }

    for mode in ddp zero2; do
        fl=""
        [ "$mode" = zero2 ] && fl="--use_deepspeed --zero_stage 2"
        note "$be, $mode: loaded into a fresh run: rank 0 reads model.safetensors and broadcasts"
        CACCEL_TEST_ST_REPORT=1 on "$be" "$fl" --steps 0 --hidden 64 --load-model "$WORK/m" --digest > "$WORK/o" 2>&1 ||
            { cat "$WORK/o"; fail "$be: $mode: load"; }
        [ "$(reports "$WORK/o")" = 1 ] || { cat "$WORK/o"; fail "$be: $mode: model.safetensors was opened by $(reports "$WORK/o") ranks, not by rank 0 alone"; }
        count 1 'load_model: rank 0 read .* and broadcast its 4 parameters (fsdp_cpu_ram_efficient_loading)' "$WORK/o"
        digests "$WORK/o" > "$WORK/lean"
        [ "$(sort -u "$WORK/lean" | wc -l)" = 1 ] && [ "$(wc -l < "$WORK/lean")" = 2 ] || { cat "$WORK/o"; fail "$be: $mode: the ranks' parameters differ"; }
        [ "$(head -1 "$WORK/lean")" = "$(cat "$WORK/saved")" ] || fail "$be: $mode: the loaded parameters are not the saved ones"
        note "$be, $mode: fsdp_cpu_ram_efficient_loading false: every rank reads the file; the same parameters"
        FSDP_CPU_RAM_EFFICIENT_LOADING=false CACCEL_TEST_ST_REPORT=1 on "$be" "$fl" --steps 0 --hidden 64 \
            --load-model "$WORK/m" --digest > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$be: $mode: load by every rank"; }
        [ "$(reports "$WORK/o")" = 2 ] || { cat "$WORK/o"; fail "$be: $mode: not both ranks read the file"; }
        digests "$WORK/o" > "$WORK/each"
        cmp "$WORK/lean" "$WORK/each" || fail "$be: $mode: broadcast and per-rank loads differ"
        note "$be, $mode: a meta model (ca_init_empty_weights) loaded before ca_prepare: rank 0 reads, the others get its values"
        for lean in true false; do
            FSDP_CPU_RAM_EFFICIENT_LOADING=$lean CACCEL_TEST_ST_REPORT=1 on "$be" "$fl" --steps 0 --hidden 64 --meta \
                --load-model-early "$WORK/m" --digest > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$be: $mode: meta load ($lean)"; }
            n=1 c=1
            [ $lean = false ] && n=2 c=0   # the setting off: every rank reads the file itself
            [ "$(reports "$WORK/o")" = $n ] || { cat "$WORK/o"; fail "$be: $mode: meta load ($lean): model.safetensors was read by $(reports "$WORK/o") ranks, not $n"; }
            count $c 'load_model: rank 0 read .* into the meta model and broadcast its 4 parameters (fsdp_cpu_ram_efficient_loading)' "$WORK/o"
            count 2 'model_meta=1' "$WORK/o"
            digests "$WORK/o" > "$WORK/meta"
            cmp "$WORK/lean" "$WORK/meta" || fail "$be: $mode: meta load ($lean): not the saved parameters on every rank"
        done
    done

    note "$be: load_state under DDP: rank 0 alone reads model.safetensors and optimizer.safetensors and broadcasts; 2 steps, save, load and 2 more == 4 uninterrupted"
    # on2 ARGS: ddp_check on 2 ranks under DDP, AdamW (state of two tensors a parameter)
    on2() { launch 2 "$be" "$DDP" --hidden 64 --adamw --digest "$@"; }
    opened() { grep -c "safetensors: .*/$2: [0-9]* of [0-9]* bytes verified" "$1"; }
    on2 --steps 4 > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$be: 4 steps"; }
    digests "$WORK/o" | head -1 > "$WORK/full"
    on2 --steps 2 --save-state "$WORK/ck" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "$be: 2 steps, saved"; }
    for lean in true false; do
        FSDP_CPU_RAM_EFFICIENT_LOADING=$lean CACCEL_TEST_ST_REPORT=1 on2 --steps 2 --load-state "$WORK/ck" > "$WORK/o" 2>&1 ||
            { cat "$WORK/o"; fail "$be: load_state ($lean)"; }
        n=1 c=1
        [ $lean = false ] && n=2 c=0   # the setting off: every rank reads the files itself
        for f in model.safetensors optimizer.safetensors; do
            [ "$(opened "$WORK/o" $f)" = $n ] || { cat "$WORK/o"; fail "$be: fsdp_cpu_ram_efficient_loading $lean: $f was read by $(opened "$WORK/o" $f) ranks, not $n"; }
        done
        count $c "load_state: rank 0 read $WORK/ck's model and optimizer state and broadcast them (fsdp_cpu_ram_efficient_loading)" "$WORK/o"
        digests "$WORK/o" > "$WORK/res"
        [ "$(sort -u "$WORK/res" | wc -l)" = 1 ] && [ "$(wc -l < "$WORK/res")" = 2 ] || { cat "$WORK/o"; fail "$be: load_state ($lean): the ranks' parameters differ after 2 more steps"; }
        [ "$(head -1 "$WORK/res")" = "$(cat "$WORK/full")" ] || fail "$be: load_state ($lean): the resumed run differs from the uninterrupted one"
    done

    note "$be: load_state, an optimizer.safetensors rank 0 finds corrupt: rank 0 names it, rank 1 that rank 0 failed; nothing loads"
    cp -r "$WORK/ck" "$WORK/bad"
    printf 'X' | dd of="$WORK/bad/optimizer.safetensors" bs=1 seek=$(( $(wc -c < "$WORK/bad/optimizer.safetensors") - 3 )) conv=notrunc 2>/dev/null
    on2 --steps 0 --load-state "$WORK/bad" > "$WORK/o" 2>&1 && { cat "$WORK/o"; fail "$be: a corrupt checkpoint loaded"; }
    count 1 'optimizer.safetensors: corrupt: CRC-32 .*(rank 0)$' "$WORK/o"
    # under mpirun the failed rank's exit stops the others (the program leaves at its first error),
    # perhaps before they print: their message is checked under caccel launch
    [ "$be" = mpi ] || count 1 'load_state: rank 0 failed (CA_ERR_IO) to load .*nothing was applied (rank 1)' "$WORK/o"

    note "$be: a file rank 0 cannot read: the load fails (rank 1 naming rank 0 under caccel launch)"
    printf 'not a safetensors file' > "$WORK/bad.safetensors"
    launch 2 "$be" "$DDP" --steps 0 --hidden 64 --load-model "$WORK/bad.safetensors" > "$WORK/o" 2>&1 && { cat "$WORK/o"; fail "$be: a bad file loaded"; }
    count 1 'bad.safetensors: .*(rank 0)' "$WORK/o"
    [ "$be" = mpi ] || count 1 'load_model: rank 0 failed to read the model; nothing was loaded (CA_ERR_IO)' "$WORK/o"
done
echo "PASS"
