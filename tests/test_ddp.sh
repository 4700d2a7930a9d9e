#!/bin/sh
# Data-parallel training as users run it: N ranks (caccel launch over Gloo, mpirun over MPI) hold
# the same parameters as one rank on the same global batch; accumulation all-reduces once per real
# step; clipping uses the global norm; an fp16 overflow on one rank skips the step on every rank;
# uneven data finishes and gather_for_metrics sees every sample once; comm_hook fp16/bf16 sends
# half the bytes and gives the one-rank gradient within 16-bit rounding; comm_hook power_sgd and
# batched_power_sgd give it exactly at full rank, and at rank 1 keep the ranks in step sending P and Q;
# LocalSGD equals a one-process simulation of its N ranks.
# Tolerance: parameters agree to 1e-5 (absolute) after the stated steps; they differ only by the
# order of floating-point sums.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
DDP="$BUILD/tests/ddp_check"
FM="$BUILD/examples/fashion_mnist"
export OPENBLAS_NUM_THREADS=1

train_backends

note "Fashion-MNIST MLP: 1 rank at batch 256/512 vs 2/4 ranks at batch 128, 15 AdamW steps"
"$FM" --cpu --batch-size 256 --epochs 1 --max-steps 15 --dump-params "$WORK/fm1_256.bin" > /dev/null || fail "1 rank"
"$FM" --cpu --batch-size 512 --epochs 1 --max-steps 15 --dump-params "$WORK/fm1_512.bin" > /dev/null || fail "1 rank"
for be in $backends; do
    launch 2 "$be" "$FM" --batch-size 128 --epochs 1 --max-steps 15 --dump-params "$WORK/fm2_$be.bin" > "$WORK/o" || { cat "$WORK/o"; fail "2 ranks $be"; }
    same "$WORK/fm1_256.bin" "$WORK/fm2_$be.bin"
    launch 4 "$be" "$FM" --batch-size 128 --epochs 1 --max-steps 15 --dump-params "$WORK/fm4_$be.bin" > "$WORK/o" || { cat "$WORK/o"; fail "4 ranks $be"; }
    same "$WORK/fm1_512.bin" "$WORK/fm4_$be.bin"
done

note "accumulation: 4 micro-batches of 8 on 2 ranks == 1 rank at batch 64; one all-reduce per real step"
"$DDP" --cpu --mode plain --batch 64 --steps 6 --dump "$WORK/acc1.bin" > /dev/null || fail "1 rank"
for be in $backends; do
    launch 2 "$be" "$DDP" --mode accum --k 4 --batch 8 --steps 6 --dump "$WORK/acc2_$be.bin" > "$WORK/o" || { cat "$WORK/o"; fail "accum $be"; }
    count 12 'collectives_per_step=1$' "$WORK/o"
    same "$WORK/acc1.bin" "$WORK/acc2_$be.bin"
done

note "clip_grad_norm over 2 ranks: the global norm, the same model as 1 rank"
"$DDP" --cpu --mode clip --batch 32 --steps 5 --dump "$WORK/clip1.bin" > "$WORK/o1" || fail "1 rank"
n1=$(sed -n 's/.*first_norm=//p' "$WORK/o1")
for be in $backends; do
    launch 2 "$be" "$DDP" --mode clip --batch 16 --steps 5 --dump "$WORK/clip2_$be.bin" > "$WORK/o" || { cat "$WORK/o"; fail "clip $be"; }
    count 2 "first_norm=$n1" "$WORK/o"
    same "$WORK/clip1.bin" "$WORK/clip2_$be.bin"
done

note "fp16: an Inf on the last rank makes every rank skip the step and halve the scale"
for be in $backends; do
    launch 2 "$be" "$DDP" --mode fp16inf --batch 16 --steps 5 > "$WORK/o" || { cat "$WORK/o"; fail "fp16 $be"; }
    count 2 'skipped=1 scale=32768$' "$WORK/o"
done

# near FILE1 FILE2 TOL: max |a - b| <= TOL * max |a| (gradients of 1 rank vs N ranks)
near() {
    float_pairs "$1" "$2" | awk -v t="$3" -v f="$(basename "$2")" '
        { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; a = $1 < 0 ? -$1 : $1; if (a > s) s = a; n++ }
        END { printf "  %s: %d values, max |diff| %.3g = %.3g of max |g| (bound %s)\n", f, n, m, m / s, t;
              exit !(n > 0 && s > 0 && m <= t * s) }' || fail "$(basename "$2"): gradients differ beyond $3 of their largest"
}

# Tolerances: each rank's share is rounded to 16 bits once and each partial sum once more; at 4 ranks
# that is at most 3 roundings of 2^-9 (bf16) or 2^-12 (fp16) of the largest value, measured 5.2e-3
# and 5.1e-4 of it. The bounds are 2^-6 and 2^-9.
note "comm_hook fp16/bf16: half the bytes per step; every averaged gradient a 16-bit value, within 16-bit rounding of 1 rank's"
"$DDP" --cpu --mode plain --batch 64 --steps 1 --dump-grads "$WORK/g1.bin" > "$WORK/o" || { cat "$WORK/o"; fail "1 rank gradients"; }
count 1 'fp16_exact=0/' "$WORK/o"   # f32 gradients: the marks below are the hook's
for be in $backends; do
    for hook in bf16 fp16; do
        for np in 2 4; do
            launch $np "$be" "$DDP" --mode plain --batch $((64 / np)) --steps 1 --comm_hook $hook \
                --dump-grads "$WORK/g${np}_$hook.bin" > "$WORK/o" || { cat "$WORK/o"; fail "comm_hook $hook, $np ranks over $be"; }
            total=$(sed -n 's/.*fp16_exact=[0-9]*\/\([0-9]*\).*/\1/p' "$WORK/o")
            count 1 "${hook}_exact=$total/$total" "$WORK/o"
            tol=0.015625; [ $hook = fp16 ] && tol=0.001953125
            near "$WORK/g1.bin" "$WORK/g${np}_$hook.bin" $tol
        done
    done
    launch 2 "$be" "$DDP" --mode accum --k 1 --batch 16 --steps 2 > "$WORK/o" || { cat "$WORK/o"; fail "f32 bytes $be"; }
    full=$(sed -n 's/^rank=0 bytes_per_step=//p' "$WORK/o" | tail -1)
    launch 2 "$be" "$DDP" --mode accum --k 1 --batch 16 --steps 2 --comm_hook bf16 > "$WORK/o" || { cat "$WORK/o"; fail "bf16 bytes $be"; }
    half=$(sed -n 's/^rank=0 bytes_per_step=//p' "$WORK/o" | tail -1)
    echo "  bytes sent per step over $be: $full (f32), $half (bf16 hook)"
    [ -n "$full" ] && [ "$((full / 2))" = "$half" ] || fail "the bf16 hook sent $half bytes per step, f32 $full"
done

# PowerSGD. At full rank (matrix_approximation_rank above every gradient's smaller side, every gradient
# compressed: min_compression_rate 0) P spans M's columns and P P^T M = M: N ranks' averaged gradients
# equal 1 rank's up to f32 rounding (bound 1e-5 of the largest; measured 1.3e-7 to 2.8e-7). At rank 1 the ranks stay identical and
# each step sends P and Q (and the biases, too small to compress) instead of the gradients: per-tensor
# fc1 32x8 and fc2 3x32 send (32 + 8) + (3 + 32) + 35 bias values = 110 floats, batched the 387
# gradients as a 20x20 square send 20 + 20.
psgd_cfg() {   # psgd_cfg FILE HOOK RANK MIN_RATE START
    printf 'distributed_type: MULTI_CPU\ncomm_hook: %s\ncomm_state_option:\n  matrix_approximation_rank: %s\n  min_compression_rate: %s\n  start_powerSGD_iter: %s\n' \
        "$2" "$3" "$4" "$5" > "$1"
}
note "comm_hook power_sgd / batched_power_sgd: equal to 1 rank at full rank; at rank 1 the ranks in step, P and Q on the wire"
for be in $backends; do
    for hook in power_sgd batched_power_sgd; do
        psgd_cfg "$WORK/full.yaml" $hook 64 0 0
        for np in 2 4; do
            launch $np "$be" "$DDP" --mode plain --batch $((64 / np)) --steps 1 --config_file "$WORK/full.yaml" \
                --dump-grads "$WORK/g${np}_$hook.bin" > "$WORK/o" || { cat "$WORK/o"; fail "$hook at full rank, $np ranks over $be"; }
            near "$WORK/g1.bin" "$WORK/g${np}_$hook.bin" 0.00001
        done
        psgd_cfg "$WORK/r1.yaml" $hook 1 2 2
        launch 4 "$be" "$DDP" --mode plain --batch 16 --steps 12 --digest --config_file "$WORK/r1.yaml" > "$WORK/o" ||
            { cat "$WORK/o"; fail "$hook at rank 1, 4 ranks over $be"; }
        count 4 'params_fnv=' "$WORK/o"
        [ "$(sed -n 's/^rank=[0-9]* params_fnv=//p' "$WORK/o" | sort -u | wc -l)" = 1 ] ||
            { grep params_fnv "$WORK/o"; fail "$hook at rank 1: the ranks' parameters differ"; }
        # an fp16 overflow in one rank's backward runs through the factors: the step is skipped and
        # the error feedback and Q start afresh, or every later step would inherit NaN and be skipped
        psgd_cfg "$WORK/f16.yaml" $hook 2 2 0
        launch 2 "$be" "$DDP" --mode fp16inf --inf-input --batch 16 --steps 8 --config_file "$WORK/f16.yaml" > "$WORK/o" ||
            { cat "$WORK/o"; fail "$hook with an fp16 overflow over $be"; }
        count 2 'skipped=1 scale=32768$' "$WORK/o"
        count 2 'steps=7 ' "$WORK/o"
        launch 2 "$be" "$DDP" --mode accum --k 1 --batch 16 --steps 3 --config_file "$WORK/r1.yaml" > "$WORK/o" ||
            { cat "$WORK/o"; fail "$hook bytes over $be"; }
        sent=$(sed -n 's/^rank=0 bytes_per_step=//p' "$WORK/o" | tail -1)
        want=440; [ $hook = batched_power_sgd ] && want=160
        echo "  $hook at rank 1 over $be: $sent bytes per step (f32: 1548)"
        [ "$sent" = "$want" ] || fail "$hook sent $sent bytes per step, not $want"
    done
done

# LocalSGD: the N-rank run equals one process that plays the N ranks (N model copies, each on its
# slice of every global batch, averaged every K steps and at the end); the collectives are one
# average (a barrier and one all-reduce per parameter tensor: 5) every K steps and one at the end.
note "LocalSGD (local_sgd_steps 1 and 4): N ranks equal the one-process simulation of N ranks; averages every K steps"
for np in 2 4; do
    for K in 1 4; do
        "$DDP" --cpu --mode localsgd-ref --sim $np --batch 8 --steps 12 --local-sgd-steps $K --dump "$WORK/lref${np}_$K.bin" \
            > "$WORK/o" || { cat "$WORK/o"; fail "LocalSGD reference of $np ranks, K=$K"; }
        for be in $backends; do
            launch $np "$be" "$DDP" --mode localsgd --batch 8 --steps 12 --local-sgd-steps $K \
                --dump "$WORK/lsgd${np}_${K}_$be.bin" > "$WORK/o" || { cat "$WORK/o"; fail "LocalSGD $np ranks K=$K over $be"; }
            same "$WORK/lref${np}_$K.bin" "$WORK/lsgd${np}_${K}_$be.bin"
            count $np "collectives=$(( (12 / K + 1) * 5 ))\$" "$WORK/o"
        done
    done
done

note "a prepared LR schedule advances once per process per step, as Accelerate's: a schedule over 8 one-process steps is half-way after 4 steps on 1 rank, 2 on 2 ranks, 1 on 4 ranks"
"$DDP" --cpu --mode plain --batch 8 --steps 4 --sched-total 8 > "$WORK/o" || fail "1 rank schedule"
count 1 'steps=4 lr_factor=0.5000$' "$WORK/o"
for be in $backends; do
    launch 2 "$be" "$DDP" --mode plain --batch 8 --steps 2 --sched-total 8 > "$WORK/o" || { cat "$WORK/o"; fail "schedule 2 $be"; }
    count 2 'steps=2 lr_factor=0.5000$' "$WORK/o"
    launch 4 "$be" "$DDP" --mode plain --batch 8 --steps 1 --sched-total 8 > "$WORK/o" || { cat "$WORK/o"; fail "schedule 4 $be"; }
    count 4 'steps=1 lr_factor=0.5000$' "$WORK/o"
done

note "split_batches: the schedule advances once per optimizer step, as Accelerate's AcceleratedScheduler (once per process without it): lr 1e-3 decaying linearly over 12 steps, after 3 optimizer steps on 2 ranks"
# Accelerate's rule: split_batches steps the scheduler once per optimizer step, else num_processes times
with_split=$(awk 'BEGIN { printf "%.6g", 1e-3 * (1 - 3 / 12) }')
without=$(awk 'BEGIN { printf "%.6g", 1e-3 * (1 - 3 * 2 / 12) }')
echo "  expected lr: $with_split with split_batches, $without without"
for be in $backends; do
    if [ "$be" = gloo ]; then set -- --split_batches true "$DDP"; else set -- "$DDP" --split_batches true; fi
    launch 2 "$be" "$@" --mode plain --batch 8 --steps 3 --sched-total 12 --lr 1e-3 > "$WORK/o" || { cat "$WORK/o"; fail "split schedule $be"; }
    count 2 "steps=3 " "$WORK/o"
    count 2 "lr=$with_split\$" "$WORK/o"
    launch 2 "$be" "$DDP" --mode plain --batch 8 --steps 3 --sched-total 12 --lr 1e-3 > "$WORK/o" || { cat "$WORK/o"; fail "schedule $be"; }
    count 2 "lr=$without\$" "$WORK/o"
done

note "uneven data (103 samples): training and evaluation finish, gather_for_metrics sees 103 on every rank"
for be in $backends; do
    for np in 2 3; do
        launch $np "$be" "$DDP" --mode uneven --batch 8 --steps 20 > "$WORK/o" || { cat "$WORK/o"; fail "uneven $np $be"; }
        count $np 'eval_samples=103 ' "$WORK/o"
    done
done
# The floor, 80%, sits 2 points under the lowest of the 2-process runs measured with
# tools/accuracy-spread.sh (10 seeds x 4 recipes x normal and sanitizer build x both OpenBLAS kernel
# sets: 82.03%; docs/TESTING.md). Accuracy is not compared between runs (docs/TESTING.md says why).
# --local_sgd_steps 8: 81.82-82.98% over 4 seeds and both OpenBLAS kernel sets (7 runs).
# Under the sanitizers (CACCEL_TEST_SANITIZED) each epoch is the first 12,800 training and 2,000 test
# samples: the same code runs, a quarter as long, and the accuracy floors (set for whole epochs) are
# left out; the normal build checks them.
small=""
[ "${CACCEL_TEST_SANITIZED:-}" = yes ] && small="--max_train_samples 12800 --max_eval_samples 2000"
above() {   # above ACC FLOOR: true when ACC >= FLOOR, or under the sanitizers' short epochs
    [ -n "$small" ] || awk -v a="$1" -v f="$2" 'BEGIN { exit !(a >= f) }'
}
note "the Fashion-MNIST binary unchanged on 2 processes with bf16, fp16, accumulation, the bf16 comm hook and LocalSGD (1 epoch)"
[ -z "$small" ] || echo "  (short epochs under the sanitizers: the accuracy floors are left out)"
be=$(echo "$backends" | awk '{print $1}')
for flags in "--mixed_precision bf16" "--mixed_precision fp16" "--gradient_accumulation_steps 4 --batch-size 32" \
    "--comm_hook bf16" "--local_sgd_steps 8"; do
    # shellcheck disable=SC2086
    launch 2 "$be" "$FM" --epochs 1 $small $flags > "$WORK/o" || { cat "$WORK/o"; fail "2 processes with $flags"; }
    a=$(sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' "$WORK/o" | tail -1)
    echo "  $flags: $a%"
    [ -n "$a" ] || { cat "$WORK/o"; fail "2 processes with $flags printed no accuracy"; }
    above "$a" 80.0 || fail "2 processes with $flags reached only $a%"
done
# PowerSGD at rank 4 from step 10: 81.66-82.99% over 6 seeds and both OpenBLAS kernel sets (9 runs);
# the floor sits 2.66 points under the lowest.
note "the Fashion-MNIST binary on 2 processes with comm_hook power_sgd (rank 4 from step 10, 1 epoch)"
printf 'distributed_type: MULTI_CPU\ncomm_hook: power_sgd\ncomm_state_option:\n  matrix_approximation_rank: 4\n  start_powerSGD_iter: 10\n' \
    > "$WORK/fm_psgd.yaml"
# shellcheck disable=SC2086
launch 2 "$be" "$FM" --epochs 1 $small --config_file "$WORK/fm_psgd.yaml" > "$WORK/o" || { cat "$WORK/o"; fail "2 processes with power_sgd"; }
a=$(sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' "$WORK/o" | tail -1)
echo "  power_sgd: $a%"
[ -n "$a" ] || { cat "$WORK/o"; fail "2 processes with power_sgd printed no accuracy"; }
above "$a" 79.0 || fail "2 processes with power_sgd reached only $a%"
echo "ok"
