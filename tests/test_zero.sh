#!/bin/sh
# Sharded data parallelism (ZeRO stages 1, 2 and 3) as users run it: N ranks under caccel launch
# (Gloo) and mpirun (MPI) hold the same parameters as DDP and as one rank on the same global batch,
# for SGD with momentum and AdamW, with accumulation, global-norm clipping and fp16 overflow skips;
# stage 3 also with activation checkpointing and each wrap policy, its per-rank memory between
# steps falls as 1/N, it sends the bytes of all-gathers and per-unit reduce-scatters, and its peak
# during a step stays below the full gradient; Accelerate's own FSDP and DeepSpeed config files (and a DeepSpeed JSON of
# "auto" values) train.
# Tolerance: parameters agree to 1e-5 (absolute) after the stated steps; sharding changes only where
# each element is updated, not the arithmetic, so the runs differ only by the order of the sums.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
DDP="$BUILD/tests/ddp_check"
FM="$BUILD/examples/fashion_mnist"
SRC=${CACCEL_TEST_SRCDIR:-$(dirname "$0")/..}
CFG="$SRC/tests/data/accelerate-configs"
DATA="$SRC/tests/data"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info

LAUNCH_FLAGS=""   # no --cpu flag: ACCELERATE_USE_CPU (above) chooses the device

# zlaunch NP BACKEND STAGE PROGRAM ARGS...: stage 1/2 through DeepSpeed's zero_stage, and through
# FSDP's strategy under mpirun (SHARD_GRAD_OP is stage 2); stage 3 through FULL_SHARD under Gloo and
# zero_stage 3 under mpirun, so every spelling is exercised
zlaunch() {
    np=$1 be=$2 st=$3; shift 3
    prog=$1; shift
    if [ "$be" = mpi ] && [ "$st" = 2 ]; then launch "$np" "$be" "$prog" --use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP "$@"
    elif [ "$be" != mpi ] && [ "$st" = 3 ]; then launch "$np" "$be" --use_fsdp --fsdp_sharding_strategy FULL_SHARD "$prog" "$@"
    elif [ "$be" = mpi ]; then launch "$np" "$be" "$prog" --use_deepspeed --zero_stage "$st" "$@"
    else launch "$np" "$be" --use_deepspeed --zero_stage "$st" "$prog" "$@"; fi
}

train_backends

note "SGD with momentum, global batch 24, 6 steps: 1 rank == DDP == stage 1 == stage 2 == stage 3 at 2, 3 and 4 ranks"
"$DDP" --mode plain --batch 24 --steps 6 --dump "$WORK/ref.bin" > /dev/null 2>&1 || fail "1 rank"
# Under the sanitizers (CACCEL_TEST_SANITIZED) 2 and 3 ranks only: 3 gives the uneven shards and
# padding where an access out of bounds would show; 4 ranks at stage 3 run again further down.
nps="2 3 4"
[ "${CACCEL_TEST_SANITIZED:-}" = yes ] && nps="2 3"
for be in $backends; do
    for np in $nps; do
        b=$((24 / np))
        launch "$np" "$be" "$DDP" --mode plain --batch $b --steps 6 --dump "$WORK/ddp.bin" > "$WORK/o" || { cat "$WORK/o"; fail "DDP $np $be"; }
        same "$WORK/ref.bin" "$WORK/ddp.bin"
        for st in 1 2 3; do
            zlaunch "$np" "$be" $st "$DDP" --mode plain --batch $b --steps 6 --dump "$WORK/z.bin" > "$WORK/o" || { cat "$WORK/o"; fail "stage $st $np $be"; }
            count 1 "sharded data parallelism: stage $st .*in $np shards" "$WORK/o"
            count "$np" 'steps=6 ' "$WORK/o"
            same "$WORK/ddp.bin" "$WORK/z.bin"
        done
        # stage 3 with the layers checkpointed: gathered for the forward, again for the recompute
        zlaunch "$np" "$be" 3 "$DDP" --fsdp_activation_checkpointing true --mode plain --batch $b --steps 6 --dump "$WORK/zc.bin" > "$WORK/o" || { cat "$WORK/o"; fail "stage 3 checkpointed $np $be"; }
        count 1 'stage 3 keeps .* 2 wrap unit(s)' "$WORK/o"
        count 1 'fsdp_activation_checkpointing .*: 2 layers of Sequential checkpointed' "$WORK/o"
        same "$WORK/ddp.bin" "$WORK/zc.bin"
    done
done

note "AdamW (Fashion-MNIST MLP), 15 steps: 1 rank at batch 256 == stage 1, 2 and 3 on 2 ranks at 128"
"$FM" --batch-size 256 --epochs 1 --max-steps 15 --dump-params "$WORK/fm1.bin" > /dev/null 2>&1 || fail "1 rank"
for be in $backends; do
    for st in 1 2 3; do
        zlaunch 2 "$be" $st "$FM" --batch-size 128 --epochs 1 --max-steps 15 --dump-params "$WORK/fm2.bin" > "$WORK/o" || { cat "$WORK/o"; fail "AdamW stage $st $be"; }
        same "$WORK/fm1.bin" "$WORK/fm2.bin"
    done
done

be=$(echo "$backends" | awk '{print $1}')
note "stage 3 wrap policies (2 ranks, each == DDP): the default (top-level children), NO_WRAP, TRANSFORMER_BASED_WRAP by type name, SIZE_BASED_WRAP"
launch 2 "$be" "$DDP" --mode plain --batch 12 --steps 6 --dump "$WORK/ddp.bin" > "$WORK/o" || { cat "$WORK/o"; fail "DDP"; }
wrap() {   # wrap UNITS LABEL FLAGS...
    units=$1 label=$2; shift 2
    launch 2 "$be" --use_fsdp --fsdp_sharding_strategy FULL_SHARD "$DDP" "$@" --mode plain --batch 12 --steps 6 --dump "$WORK/w.bin" > "$WORK/o" || { cat "$WORK/o"; fail "wrap $label"; }
    count 1 "stage 3 keeps 194 of 387 parameters per process between steps; $units wrap unit(s) ($label)" "$WORK/o"
    same "$WORK/ddp.bin" "$WORK/w.bin"
}
wrap 2 "the model's top-level children"
wrap 1 NO_WRAP --fsdp_auto_wrap_policy NO_WRAP
wrap 2 TRANSFORMER_BASED_WRAP --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP --fsdp_transformer_layer_cls_to_wrap Linear
wrap 1 TRANSFORMER_BASED_WRAP --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP --fsdp_transformer_layer_cls_to_wrap Block
# fc1 has 288 parameters, fc2 99: fc2 stays with the root's unit
wrap 2 SIZE_BASED_WRAP --fsdp_auto_wrap_policy SIZE_BASED_WRAP --fsdp_min_num_params 100

note "stage 3: reading a parameter between steps, before ca_summon_full_params, fails naming the parameter, that it is sharded and the call that gathers it (DDP reads it)"
launch 2 "$be" --use_fsdp --fsdp_sharding_strategy FULL_SHARD "$DDP" --mode plain --batch 12 --steps 2 --read-sharded > "$WORK/o" || { cat "$WORK/o"; fail "stage 3 read-sharded"; }
count 2 "read_sharded=ca_tensor_to_host: parameter 'fc1.weight' is sharded (FSDP FULL_SHARD / DeepSpeed ZeRO-3): outside its module's forward and backward its full value exists only between ca_summon_full_params(acc, true) and ca_summon_full_params(acc, false)" "$WORK/o"
launch 2 "$be" "$DDP" --mode plain --batch 12 --steps 2 --read-sharded > "$WORK/o" || { cat "$WORK/o"; fail "DDP read-sharded"; }
count 2 'read_sharded=ok$' "$WORK/o"

note "stage 3 memory between steps (allocator statistics, hidden width 4096: 53251 parameters, SGD with momentum): 1/N of stage 3 on 1 rank (+10%) at 2 and 4 ranks, under a third of DDP's at 4"
mem() {   # mem NP [FLAGS...]: rank 0's state_bytes
    np=$1; shift
    launch "$np" "$be" "$@" "$DDP" --hidden 4096 --mem --mode plain --batch 8 --steps 3 > "$WORK/o" || { cat "$WORK/o"; fail "mem $np $*"; }
    sed -n 's/^rank=0 state_bytes=//p' "$WORK/o"
}
m1=$(mem 1 --use_fsdp --fsdp_sharding_strategy FULL_SHARD)
m2=$(mem 2 --use_fsdp --fsdp_sharding_strategy FULL_SHARD)
m4=$(mem 4 --use_fsdp --fsdp_sharding_strategy FULL_SHARD)
d4=$(mem 4)
echo "  state bytes: stage 3 at 1, 2, 4 ranks: $m1 $m2 $m4; DDP at 4: $d4"
[ -n "$m1" ] && [ -n "$m2" ] && [ -n "$m4" ] && [ -n "$d4" ] || fail "no state_bytes line"
[ "$m1" -gt 600000 ] || fail "stage 3 on 1 rank holds $m1 bytes, less than its 3 x 213004 (parameters, gradients, momentum)"
[ "$m2" -le $((m1 * 11 / 20 + 16384)) ] || fail "stage 3 at 2 ranks holds $m2 bytes, more than half of $m1 (+10%)"
[ "$m4" -le $((m1 * 11 / 40 + 16384)) ] || fail "stage 3 at 4 ranks holds $m4 bytes, more than a quarter of $m1 (+10%)"
[ "$m4" -lt $((d4 / 3)) ] || fail "stage 3 at 4 ranks holds $m4 bytes, DDP $d4"

note "stage 3 reduce-scatters each unit's gradient as its backward ends: the allocator's peak during a step (2 ranks, width 512 and 8 more layers: 10 wrap units) stays below the full flat gradient, which stage 2 holds during backward"
peak() {   # peak FLAGS...: rank 0's "step_peak_bytes param_bytes"
    launch 2 "$be" "$@" "$DDP" --hidden 512 --depth 8 --mem --mode plain --batch 8 --steps 3 > "$WORK/o" || { cat "$WORK/o"; fail "peak $*"; }
    sed -n 's/^rank=0 step_peak_bytes=\([0-9]*\) param_bytes=\([0-9]*\)$/\1 \2/p' "$WORK/o"
}
set -- $(peak --use_fsdp --fsdp_sharding_strategy FULL_SHARD)
count 1 'stage 3 keeps .* 10 wrap unit(s)' "$WORK/o"
p3=${1:-} pb=${2:-}
set -- $(peak --use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP)
p2=${1:-}
echo "  peak bytes during a step: stage 3 $p3, stage 2 $p2; the flat gradient $pb"
[ -n "$p3" ] && [ -n "$p2" ] && [ -n "$pb" ] || fail "no step_peak_bytes line"
[ "$p3" -lt "$pb" ] || fail "stage 3 peaks at $p3 bytes during a step, not below the $pb bytes of the full gradient"
[ "$p2" -ge "$pb" ] || fail "stage 2 peaks at $p2 bytes, below the $pb bytes of the full gradient it holds"

note "accumulation: 4 micro-batches of 8 on 2 ranks (and of 4 on 4 under stage 3) == 1 rank at batch 64; stage 2 reduce-scatters once and all-gathers once per real step; stage 3's bytes sent (ca_comm_bytes) are those of all-gathers, or of all-reduces where those send less"
"$DDP" --mode plain --batch 64 --steps 6 --dump "$WORK/acc1.bin" > /dev/null 2>&1 || fail "1 rank"
for be in $backends; do
    zlaunch 2 "$be" 2 "$DDP" --mode accum --k 4 --batch 8 --steps 6 --dump "$WORK/acc2.bin" > "$WORK/o" || { cat "$WORK/o"; fail "accum $be"; }
    count 12 'collectives_per_step=2$' "$WORK/o"
    same "$WORK/acc1.bin" "$WORK/acc2.bin"
    count 12 'bytes_per_step=1552$' "$WORK/o"   # (2 - 1) x 194 x 4 twice: reduce-scatter, all-gather
    zlaunch 2 "$be" 3 "$DDP" --mode accum --k 4 --batch 8 --steps 6 --dump "$WORK/acc3.bin" > "$WORK/o" || { cat "$WORK/o"; fail "accum stage 3 $be"; }
    # per micro-step each unit is all-gathered twice (forward, backward): fc1 (288 parameters, 194
    # in rank 0's shard) and fc2 (99, all in rank 1's) send 2 x (194 + 99) x 4 bytes; 4 micro-steps,
    # then each unit's gradient reduce-scattered on the last: 4 x 2344 + (194 + 99) x 4. An
    # all-reduce of each unit would send 4 x 2 x (288 + 99) x 4 for the gathers.
    count 12 'collectives_per_step=18$' "$WORK/o"
    count 12 'bytes_per_step=10548$' "$WORK/o"
    same "$WORK/acc1.bin" "$WORK/acc3.bin"
    # 4 ranks (shards of 97): fc1 has parts 97, 97, 94, 0 and is all-gathered, 3 x 97 x 4 bytes; fc2
    # has parts 3 and 96, where an all-gather (3 x 96 x 4) sends more than an all-reduce of the unit
    # (2 x 3 / 4 x 99 x 4 = 594): all-reduced. 4 x 2 x (1164 + 594), then 1164 + 594 for the gradients.
    zlaunch 4 "$be" 3 "$DDP" --mode accum --k 4 --batch 4 --steps 6 --dump "$WORK/acc4.bin" > "$WORK/o" || { cat "$WORK/o"; fail "accum stage 3 4 ranks $be"; }
    count 24 'collectives_per_step=18$' "$WORK/o"
    count 24 'bytes_per_step=15822$' "$WORK/o"
    same "$WORK/acc1.bin" "$WORK/acc4.bin"
done

note "stage 3 prefetch (fsdp_forward_prefetch, fsdp_backward_prefetch BACKWARD_PRE / BACKWARD_POST): the same parameters, collectives and bytes as without, with the gathers issued ahead counted (2 ranks, 10 wrap units, accumulation 2, 4 steps)"
# 8 forward + backward passes. Without prefetch each gathers the 10 units twice (forward, backward),
# then the end gathers them once more: 170. The first forward records the order, so it prefetches
# nothing; from the first backward on, every unit but the first of a pass comes prefetched: forward
# 7 x 9, backward 8 x 9 = 135 with both; BACKWARD_POST alone 8 x 9 = 72.
pf() {   # pf BACKEND OUT FLAGS...: prefetch flags through the launcher (Gloo) or the program (mpirun)
    pbe=$1 out=$2; shift 2
    if [ "$pbe" = mpi ]; then launch 2 mpi "$DDP" --use_fsdp --fsdp_sharding_strategy FULL_SHARD "$@" --hidden 64 --depth 8 --mode accum --k 2 --batch 8 --steps 4 --dump "$out"
    else launch 2 gloo --use_fsdp --fsdp_sharding_strategy FULL_SHARD "$@" "$DDP" --hidden 64 --depth 8 --mode accum --k 2 --batch 8 --steps 4 --dump "$out"; fi
}
for be in $backends; do
    pf "$be" "$WORK/p0.bin" > "$WORK/o0" || { cat "$WORK/o0"; fail "no prefetch $be"; }
    count 1 'stage 3: 170 unit gathers, 0 of them prefetched' "$WORK/o0"
    grep '_per_step=' "$WORK/o0" | sort > "$WORK/c0"
    pf "$be" "$WORK/p1.bin" --fsdp_forward_prefetch true --fsdp_backward_prefetch BACKWARD_PRE > "$WORK/o" || { cat "$WORK/o"; fail "prefetch $be"; }
    count 1 'stage 3: 170 unit gathers, 135 of them prefetched (forward prefetch on, backward prefetch BACKWARD_PRE)' "$WORK/o"
    count 0 'prefetch .*has no effect' "$WORK/o"
    grep '_per_step=' "$WORK/o" | sort | cmp -s - "$WORK/c0" || { cat "$WORK/o"; fail "prefetch changed the collectives or bytes per step ($be)"; }
    same "$WORK/p0.bin" "$WORK/p1.bin"
    pf "$be" "$WORK/p2.bin" --fsdp_backward_prefetch BACKWARD_POST --fsdp_activation_checkpointing true > "$WORK/o" || { cat "$WORK/o"; fail "BACKWARD_POST $be"; }
    count 1 'stage 3: 170 unit gathers, 72 of them prefetched (forward prefetch off, backward prefetch BACKWARD_POST)' "$WORK/o"
    same "$WORK/p0.bin" "$WORK/p2.bin"
done
if have gloo; then   # stage 2 gathers no parameters: the keys are reported as having no effect
    launch 2 gloo --use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP --fsdp_forward_prefetch true "$DDP" --mode plain --steps 2 > "$WORK/o" || { cat "$WORK/o"; fail "prefetch at stage 2"; }
    count 1 'fsdp_forward_prefetch / fsdp_backward_prefetch have no effect at stage 2' "$WORK/o"
fi

note "clip_grad_norm across shards: sqrt(all-reduced sum of squares) is the 1-rank norm; same model"
"$DDP" --mode clip --batch 32 --steps 5 --dump "$WORK/clip1.bin" > "$WORK/o1" 2>&1 || fail "1 rank"
n1=$(sed -n 's/.*first_norm=//p' "$WORK/o1")
for be in $backends; do
    for st in 1 2 3; do
        zlaunch 2 "$be" $st "$DDP" --mode clip --batch 16 --steps 5 --dump "$WORK/clip2.bin" > "$WORK/o" || { cat "$WORK/o"; fail "clip $st $be"; }
        count 2 "first_norm=$n1" "$WORK/o"
        same "$WORK/clip1.bin" "$WORK/clip2.bin"
    done
done

note "fp16 (stage 1): an Inf on the last rank makes every rank skip the step and halve the scale"
for be in $backends; do
    zlaunch 2 "$be" 1 "$DDP" --mode fp16inf --batch 16 --steps 5 > "$WORK/o" || { cat "$WORK/o"; fail "fp16 $be"; }
    count 2 'skipped=1 scale=32768$' "$WORK/o"
done

be=$(echo "$backends" | awk '{print $1}')
note "Accelerate's template_fsdp.yaml (FULL_SHARD, TRANSFORMER_BASED_WRAP with no class: one unit, bf16, 2 processes) trains as stage 3, equal to DDP with bf16"
launch 2 "$be" --config_file "$CFG/template_fsdp.yaml" "$DDP" --mode plain --batch 8 --steps 6 --dump "$WORK/f.bin" > "$WORK/o" || { cat "$WORK/o"; fail "template_fsdp.yaml"; }
count 0 'not implemented' "$WORK/o"
count 1 'sharded data parallelism: stage 3 (.*template_fsdp.yaml' "$WORK/o"
count 1 '1 wrap unit(s) (TRANSFORMER_BASED_WRAP)' "$WORK/o"
count 2 'steps=6 ' "$WORK/o"
launch 2 "$be" --mixed_precision bf16 "$DDP" --mode plain --batch 8 --steps 6 --dump "$WORK/fd.bin" > "$WORK/o" || { cat "$WORK/o"; fail "DDP bf16"; }
same "$WORK/fd.bin" "$WORK/f.bin"

note "stage 3 with mixed precision gathers the parameters in bf16 / fp16 (FSDP's param_dtype; reductions stay f32): == DDP with the same mixed precision, bit for bit, and the gathers send half the bytes (2 ranks, accumulation 4)"
for mp in bf16 fp16; do
    launch 2 "$be" --mixed_precision $mp "$DDP" --mode accum --k 4 --batch 8 --steps 6 --dump "$WORK/dmp.bin" > "$WORK/o" || { cat "$WORK/o"; fail "DDP $mp"; }
    launch 2 "$be" --use_fsdp --fsdp_sharding_strategy FULL_SHARD --mixed_precision $mp "$DDP" --mode accum --k 4 --batch 8 --steps 6 --dump "$WORK/zmp.bin" > "$WORK/o" || { cat "$WORK/o"; fail "stage 3 $mp"; }
    cmp "$WORK/dmp.bin" "$WORK/zmp.bin" || fail "stage 3 with $mp differs from DDP with $mp"
    # the f32 run's 10548: 4 x 2 x (194 + 99) x 4 of gathers, halved, + (194 + 99) x 4 of gradients (f32),
    # + 4 for fp16's overflow agreement
    if [ $mp = bf16 ]; then count 12 'bytes_per_step=5860$' "$WORK/o"; else count 12 'bytes_per_step=5864$' "$WORK/o"; fi
done
note "stage 3 with bf16: save at 10 and resume to 20 == 20 uninterrupted (a save gathers the f32 masters)"
b3fm() { launch 2 "$be" --use_fsdp --fsdp_sharding_strategy FULL_SHARD --mixed_precision bf16 "$FM" --batch-size 128 --epochs 1 "$@"; }
rm -rf "$WORK/ckb"
b3fm --max-steps 20 --dump-params "$WORK/bfull.bin" > "$WORK/o" || { cat "$WORK/o"; fail "bf16 stage 3 uninterrupted"; }
b3fm --max-steps 10 --checkpointing_steps 10 --checkpoint_dir "$WORK/ckb" > "$WORK/o" || { cat "$WORK/o"; fail "bf16 stage 3 save"; }
b3fm --max-steps 20 --checkpoint_dir "$WORK/ckb" --resume --dump-params "$WORK/bres.bin" > "$WORK/o" || { cat "$WORK/o"; fail "bf16 stage 3 resume"; }
cmp "$WORK/bfull.bin" "$WORK/bres.bin" || fail "bf16 stage 3: resumed differs from uninterrupted"

note "tests_latest_fsdp.yaml (1 process, FULL_SHARD, TRANSFORMER_BASED_WRAP of BertLayer): stage 3 over one shard, one unit; the wrap keys are acted on"
"$DDP" --config_file "$CFG/tests_latest_fsdp.yaml" --mode plain --batch 24 --steps 6 --dump "$WORK/f1.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "tests_latest_fsdp.yaml"; }
count 1 'stage 3 .*in 1 shards' "$WORK/o"
count 1 '1 wrap unit(s) (TRANSFORMER_BASED_WRAP)' "$WORK/o"
count 0 'fsdp_auto_wrap_policy .*has no effect' "$WORK/o"
count 0 'fsdp_transformer_layer_cls_to_wrap .*has no effect' "$WORK/o"
same "$WORK/ref.bin" "$WORK/f1.bin"

note "Accelerate's template_deepspeed.yaml and its zero_stage1_config.json (fp16 from the JSON) train as stage 1"
launch 2 "$be" --config_file "$CFG/template_deepspeed.yaml" "$DDP" --mode plain --batch 8 --steps 6 > "$WORK/o" || { cat "$WORK/o"; fail "template_deepspeed.yaml"; }
count 1 'sharded data parallelism: stage 1 ' "$WORK/o"
count 2 'steps=6 ' "$WORK/o"
count 1 'fp16.hysteresis is not implemented' "$WORK/o"

note "a DeepSpeed JSON of \"auto\" values takes them from the configuration (accumulation 2 here)"
launch 2 "$be" --use_deepspeed --deepspeed_config_file "$DATA/deepspeed_auto.json" --gradient_accumulation_steps 2 \
    "$DDP" --mode accum --k 2 --batch 8 --steps 3 > "$WORK/o" || { cat "$WORK/o"; fail "deepspeed_auto.json"; }
count 1 'sharded data parallelism: stage 2 ' "$WORK/o"
count 1 'offload to the CPU .*a no-op on the CPU backend' "$WORK/o"
count 6 'collectives_per_step=2$' "$WORK/o"

note "a DeepSpeed JSON with fields caccel does not implement fails at once, naming each"
t0=$(date +%s)
launch 2 "$be" --use_deepspeed --deepspeed_config_file "$DATA/deepspeed_unsupported.json" "$DDP" --mode plain --steps 2 > "$WORK/o" && fail "an unsupported JSON was accepted"
for f in 'zero_optimization.zero_quantized_weights' 'optimizer.params.lr' 'activation_checkpointing (not implemented)' 'deepspeed_unsupported.json'; do
    grep -q -- "$f" "$WORK/o" || { cat "$WORK/o"; fail "the error does not name $f"; }
done
[ $(($(date +%s) - t0)) -lt 60 ] || fail "the error took more than 60 s"

note "HYBRID_SHARD_ZERO2 on one machine is stage 2 (2 ranks, == DDP)"
launch 2 "$be" "$DDP" --mode plain --batch 12 --steps 6 --dump "$WORK/ddp.bin" > "$WORK/o" || { cat "$WORK/o"; fail "DDP"; }
launch 2 "$be" --use_fsdp --fsdp_sharding_strategy HYBRID_SHARD_ZERO2 "$DDP" --mode plain --batch 12 --steps 6 --dump "$WORK/h.bin" > "$WORK/o" || { cat "$WORK/o"; fail "HYBRID_SHARD_ZERO2"; }
count 1 'sharded data parallelism: stage 2 .*in 2 shards' "$WORK/o"
count 0 'HYBRID_SHARD: shards within' "$WORK/o"
same "$WORK/ddp.bin" "$WORK/h.bin"

# hlaunch OUT ARGS...: 2 machines x 2 processes on this host over Gloo; both launchers must succeed
hlaunch() {
    hout=$1; shift
    launch_machines "$hout" --backend gloo "$@"
    [ "$m0_rc" -eq 0 ] && [ "$m1_rc" -eq 0 ] || { cat "$hout"; fail "2 machines: launcher statuses $m0_rc and $m1_rc"; }
}
if have gloo; then
    note "HYBRID_SHARD (stage 3) and HYBRID_SHARD_ZERO2 (stage 2) over 2 machines x 2 processes (Gloo): shards within each machine, gradients averaged across: == DDP over the 4 (global batch 24, 6 steps)"
    launch 4 gloo "$DDP" --mode plain --batch 6 --steps 6 --dump "$WORK/ddp4.bin" > "$WORK/o" || { cat "$WORK/o"; fail "DDP 4"; }
    for strat in HYBRID_SHARD HYBRID_SHARD_ZERO2; do
        hlaunch "$WORK/o" --use_fsdp --fsdp_sharding_strategy $strat "$DDP" --mode plain --batch 6 --steps 6 --dump "$WORK/h4.bin"
        count 1 'in 2 shards of 194' "$WORK/o"
        count 1 'HYBRID_SHARD: shards within groups of 2 processes, replicated 2 times' "$WORK/o"
        count 4 'steps=6 ' "$WORK/o"
        same "$WORK/ddp4.bin" "$WORK/h4.bin"
    done
    note "HYBRID_SHARD over 2 machines with clipping: the norm over one machine's shards is the 1-rank norm"
    "$DDP" --mode clip --batch 24 --steps 5 --dump "$WORK/hc1.bin" > "$WORK/o1" 2>&1 || fail "clip 1 rank"
    n1=$(sed -n 's/.*first_norm=//p' "$WORK/o1")
    hlaunch "$WORK/o" --use_fsdp --fsdp_sharding_strategy HYBRID_SHARD "$DDP" --mode clip --batch 6 --steps 5 --dump "$WORK/hc4.bin"
    count 4 "first_norm=$n1" "$WORK/o"
    same "$WORK/hc1.bin" "$WORK/hc4.bin"
fi
for be in $backends; do
    note "Accelerate's HSDP, parallelism_config dp_replicate_size 2 with FULL_SHARD / SHARD_GRAD_OP on 4 processes ($be): 2 groups of 2 == DDP"
    launch 4 "$be" "$DDP" --mode plain --batch 6 --steps 6 --dump "$WORK/ddp4.bin" > "$WORK/o" || { cat "$WORK/o"; fail "DDP 4 $be"; }
    for strat in FULL_SHARD SHARD_GRAD_OP; do
        PARALLELISM_CONFIG_DP_REPLICATE_SIZE=2 launch 4 "$be" "$DDP" --use_fsdp --fsdp_sharding_strategy $strat --mode plain --batch 6 --steps 6 --dump "$WORK/h4.bin" > "$WORK/o" || { cat "$WORK/o"; fail "HSDP $strat $be"; }
        count 1 'HYBRID_SHARD: shards within groups of 2 processes, replicated 2 times' "$WORK/o"
        count 0 'dp_replicate_size .*has no effect' "$WORK/o"
        same "$WORK/ddp4.bin" "$WORK/h4.bin"
    done
done
if have gloo; then
    note "HSDP with a hung rank (rank 3 stopped, timeout 5 s): every rank ends within the bound, the errors name rank 3 as the job numbers it, and the group"
    t0=$(date +%s)
    PARALLELISM_CONFIG_DP_REPLICATE_SIZE=2 launch 4 gloo --use_fsdp --fsdp_sharding_strategy FULL_SHARD "$DDP" --timeout 5 --mode plain --batch 6 --steps 100000 --stop-rank 3 > "$WORK/o" && fail "a run with a stopped rank succeeded"
    dt=$(($(date +%s) - t0))
    echo "  ended after $dt s"
    [ "$dt" -lt 60 ] || fail "the run with a stopped rank took $dt s"
    count 1 'rank=3 stops' "$WORK/o"
    grep -q 'rank 3 is stopped (pid' "$WORK/o" || { cat "$WORK/o"; fail "no error names rank 3 as stopped"; }
    grep -q '(in the group of ranks [0-9, ]*3 split from ' "$WORK/o" || { cat "$WORK/o"; fail "no error names rank 3's group"; }
    # the launcher has ended: its processes are gone within 10 s (a busy machine runs their exits late)
    end=$(( $(date +%s) + 10 ))
    while pgrep -f -- "--stop-rank 3" > /dev/null; do
        [ "$(date +%s)" -lt "$end" ] || { pgrep -a -f -- "--stop-rank 3"; fail "processes outlived their launcher by 10 s"; }
        sleep 0.1
    done
fi
note "a world that does not split into the groups asked is refused, naming the key"
be=$(echo "$backends" | awk '{print $1}')
PARALLELISM_CONFIG_DP_SHARD_SIZE=3 launch 4 "$be" "$DDP" --use_fsdp --fsdp_sharding_strategy HYBRID_SHARD --mode plain --steps 1 > "$WORK/o" 2>&1 && fail "4 processes in groups of 3 ran"
grep -q '4 processes do not split into shard groups of 3' "$WORK/o" || { cat "$WORK/o"; fail "no message for groups of 3"; }

note "NO_SHARD is DDP: no sharding"
launch 2 "$be" --use_fsdp --fsdp_sharding_strategy NO_SHARD "$DDP" --mode accum --k 1 --batch 8 --steps 2 > "$WORK/o" || { cat "$WORK/o"; fail "NO_SHARD"; }
count 0 'sharded data parallelism: stage' "$WORK/o"
count 4 'collectives_per_step=1$' "$WORK/o"

note "save_state / load_state (full state dict: the optimizer state gathered from the shards): 10 steps, save, resume to 20 == 20 uninterrupted; a stage-2 checkpoint resumes under DDP and back"
zfm() { launch 2 "$be" --use_deepspeed --zero_stage 2 "$FM" --batch-size 128 --epochs 1 "$@"; }
dfm() { launch 2 "$be" "$FM" --batch-size 128 --epochs 1 "$@"; }
zfm --max-steps 20 --dump-params "$WORK/full.bin" > "$WORK/o" || { cat "$WORK/o"; fail "uninterrupted"; }
zfm --max-steps 10 --checkpointing_steps 10 --checkpoint_dir "$WORK/ck" > "$WORK/o" || { cat "$WORK/o"; fail "first 10 steps"; }
cp -r "$WORK/ck" "$WORK/ck2"
zfm --max-steps 20 --checkpoint_dir "$WORK/ck" --resume --dump-params "$WORK/res.bin" > "$WORK/o" || { cat "$WORK/o"; fail "resume"; }
cmp "$WORK/full.bin" "$WORK/res.bin" || fail "resumed stage 2 differs from the uninterrupted run"
dfm --max-steps 20 --checkpoint_dir "$WORK/ck2" --resume --dump-params "$WORK/res2.bin" > "$WORK/o" || { cat "$WORK/o"; fail "DDP resume"; }
same "$WORK/full.bin" "$WORK/res2.bin"
rm -rf "$WORK/ck"
dfm --max-steps 10 --checkpointing_steps 10 --checkpoint_dir "$WORK/ck" > "$WORK/o" || { cat "$WORK/o"; fail "DDP first 10 steps"; }
zfm --max-steps 20 --checkpoint_dir "$WORK/ck" --resume --dump-params "$WORK/res3.bin" > "$WORK/o" || { cat "$WORK/o"; fail "stage 2 from DDP"; }
same "$WORK/full.bin" "$WORK/res3.bin"

note "stage 3: a full state dict saved at step 10 and resumed to 20 == 20 uninterrupted (the parameters gathered for the save and the load)"
z3fm() { launch 2 "$be" --use_fsdp --fsdp_sharding_strategy FULL_SHARD "$FM" --batch-size 128 --epochs 1 "$@"; }
rm -rf "$WORK/ck"
z3fm --max-steps 10 --checkpointing_steps 10 --checkpoint_dir "$WORK/ck" > "$WORK/o" || { cat "$WORK/o"; fail "stage 3 first 10 steps"; }
z3fm --max-steps 20 --checkpoint_dir "$WORK/ck" --resume --dump-params "$WORK/res5.bin" > "$WORK/o" || { cat "$WORK/o"; fail "stage 3 resume"; }
same "$WORK/full.bin" "$WORK/res5.bin"
rm -rf "$WORK/ck"

note "SHARDED_STATE_DICT: each rank saves its shard; resume == uninterrupted; merge-weights == the full state dict's model.safetensors; another world size loads"
sfm() { np=$1; shift; launch "$np" "$be" --use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP --fsdp_state_dict_type SHARDED_STATE_DICT "$FM" --batch-size 128 --epochs 1 "$@"; }
rm -rf "$WORK/ck" "$WORK/ckf"
sfm 2 --max-steps 10 --checkpointing_steps 10 --checkpoint_dir "$WORK/ck" > "$WORK/o" || { cat "$WORK/o"; fail "sharded save"; }
c0="$WORK/ck/checkpoints/checkpoint_0"
for f in zero_index.json zero_shard_0.safetensors zero_shard_1.safetensors; do [ -e "$c0/$f" ] || fail "no $f in the sharded checkpoint"; done
[ ! -e "$c0/model.safetensors" ] && [ ! -e "$c0/optimizer.safetensors" ] || fail "a sharded checkpoint holds full files"
cp -r "$WORK/ck" "$WORK/ck3"
sfm 2 --max-steps 20 --checkpoint_dir "$WORK/ck" --resume --dump-params "$WORK/res4.bin" > "$WORK/o" || { cat "$WORK/o"; fail "sharded resume"; }
cmp "$WORK/full.bin" "$WORK/res4.bin" || fail "resumed from a sharded checkpoint differs from the uninterrupted run"
zfm --max-steps 10 --checkpointing_steps 10 --checkpoint_dir "$WORK/ckf" > "$WORK/o" || { cat "$WORK/o"; fail "full save"; }
"$CACCEL" merge-weights "$c0" "$WORK/merged" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "merge-weights"; }
cmp "$WORK/merged/model.safetensors" "$WORK/ckf/checkpoints/checkpoint_0/model.safetensors" || fail "merged weights differ from the full state dict"
note "SHARDED_STATE_DICT under stage 3 (FULL_SHARD): resume == uninterrupted; a stage-2 sharded checkpoint resumes under stage 3 (same flat layout)"
s3fm() { launch 2 "$be" --use_fsdp --fsdp_sharding_strategy FULL_SHARD --fsdp_state_dict_type SHARDED_STATE_DICT "$FM" --batch-size 128 --epochs 1 "$@"; }
rm -rf "$WORK/ck4"
s3fm --max-steps 10 --checkpointing_steps 10 --checkpoint_dir "$WORK/ck4" > "$WORK/o" || { cat "$WORK/o"; fail "stage 3 sharded save"; }
s3fm --max-steps 20 --checkpoint_dir "$WORK/ck4" --resume --dump-params "$WORK/res6.bin" > "$WORK/o" || { cat "$WORK/o"; fail "stage 3 sharded resume"; }
same "$WORK/full.bin" "$WORK/res6.bin"
cp -r "$WORK/ck3" "$WORK/ck5"
s3fm --max-steps 20 --checkpoint_dir "$WORK/ck5" --resume --dump-params "$WORK/res7.bin" > "$WORK/o" || { cat "$WORK/o"; fail "stage 2 checkpoint resumed under stage 3"; }
same "$WORK/full.bin" "$WORK/res7.bin"
# another world size reshards (tests/test_reshard.sh checks the state bit for bit)
sfm 3 --max-steps 20 --checkpoint_dir "$WORK/ck3" --resume > "$WORK/o" || { cat "$WORK/o"; fail "a 2-shard checkpoint on 3 processes"; }
count 1 'was saved as 2 shards; each rank reads the parts of its shard of 3 (stage 2)' "$WORK/o"

note "HSDP (dp_replicate_size 2, FULL_SHARD, 4 processes) with SHARDED_STATE_DICT: the first group writes 2 shards; resume to 20 == 20 uninterrupted"
hfm() { PARALLELISM_CONFIG_DP_REPLICATE_SIZE=2 launch 4 "$be" --use_fsdp --fsdp_sharding_strategy FULL_SHARD --fsdp_state_dict_type SHARDED_STATE_DICT "$FM" --batch-size 64 --epochs 1 "$@"; }
rm -rf "$WORK/ck6"
hfm --max-steps 20 --dump-params "$WORK/hfull.bin" > "$WORK/o" || { cat "$WORK/o"; fail "HSDP uninterrupted"; }
count 1 'HYBRID_SHARD: shards within groups of 2 processes, replicated 2 times' "$WORK/o"
hfm --max-steps 10 --checkpointing_steps 10 --checkpoint_dir "$WORK/ck6" > "$WORK/o" || { cat "$WORK/o"; fail "HSDP sharded save"; }
c6="$WORK/ck6/checkpoints/checkpoint_0"
[ -e "$c6/zero_shard_0.safetensors" ] && [ -e "$c6/zero_shard_1.safetensors" ] && [ ! -e "$c6/zero_shard_2.safetensors" ] || { ls "$c6"; fail "HSDP: not shards 0 and 1 only"; }
hfm --max-steps 20 --checkpoint_dir "$WORK/ck6" --resume --dump-params "$WORK/hres.bin" > "$WORK/o" || { cat "$WORK/o"; fail "HSDP sharded resume"; }
cmp "$WORK/hfull.bin" "$WORK/hres.bin" || fail "HSDP: resumed from a sharded checkpoint differs from the uninterrupted run"

# Offload moves the optimizer state and the update of each rank's shard to host memory; on a GPU the
# shard's parameters and gradient cross to pinned buffers and back each step. CACCEL_OFFLOAD_ON_CPU=1
# runs that path on the CPU backend (the copies between two host buffers), so it is checked here: the
# same kernels on the same numbers, so the same parameters bit for bit.
note "offload (DeepSpeed offload_optimizer_device cpu, FSDP fsdp_offload_params; run on the CPU by CACCEL_OFFLOAD_ON_CPU=1): stages 1, 2 and 3 give the parameters of no offload, bit for bit; full and sharded state dicts save and resume through it"
for st in 1 2 3; do
    zlaunch 2 "$be" $st "$FM" --batch-size 128 --epochs 1 --max-steps 15 --dump-params "$WORK/no.bin" > "$WORK/o" || { cat "$WORK/o"; fail "stage $st without offload"; }
    CACCEL_OFFLOAD_ON_CPU=1 ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE=cpu FSDP_OFFLOAD_PARAMS=true \
        zlaunch 2 "$be" $st "$FM" --batch-size 128 --epochs 1 --max-steps 15 --dump-params "$WORK/off.bin" > "$WORK/o" || { cat "$WORK/o"; fail "stage $st with offload"; }
    count 1 "offload to the CPU .*: the optimizer state of each rank's shard and its update in host memory" "$WORK/o"
    cmp "$WORK/no.bin" "$WORK/off.bin" || fail "stage $st: offload changed the parameters"
done
export CACCEL_OFFLOAD_ON_CPU=1 ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE=cpu FSDP_OFFLOAD_PARAMS=true
rm -rf "$WORK/ck"
zfm --max-steps 10 --checkpointing_steps 10 --checkpoint_dir "$WORK/ck" > "$WORK/o" || { cat "$WORK/o"; fail "offload: first 10 steps"; }
zfm --max-steps 20 --checkpoint_dir "$WORK/ck" --resume --dump-params "$WORK/res8.bin" > "$WORK/o" || { cat "$WORK/o"; fail "offload: resume"; }
cmp "$WORK/full.bin" "$WORK/res8.bin" || fail "offload: resumed (full state dict) differs from the uninterrupted run"
rm -rf "$WORK/ck"
s3fm --max-steps 10 --checkpointing_steps 10 --checkpoint_dir "$WORK/ck" > "$WORK/o" || { cat "$WORK/o"; fail "offload: stage 3 sharded save"; }
s3fm --max-steps 20 --checkpoint_dir "$WORK/ck" --resume --dump-params "$WORK/res9.bin" > "$WORK/o" || { cat "$WORK/o"; fail "offload: stage 3 sharded resume"; }
same "$WORK/full.bin" "$WORK/res9.bin"
unset CACCEL_OFFLOAD_ON_CPU ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE FSDP_OFFLOAD_PARAMS
echo "ok"
