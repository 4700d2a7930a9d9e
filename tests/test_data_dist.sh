#!/bin/sh
# Data without a length and custom batch samplers across real processes (caccel launch over Gloo,
# mpirun over MPI): training on an iterable dataset at 2 processes holds the same parameters as one
# process on the same global batches (with and without split_batches), and gather_for_metrics over a
# stream of 103 samples and over a custom batch sampler gives every sample exactly once.
# Tolerance: parameters agree to 1e-5 (absolute); they differ only by the order of floating-point sums.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
DC="$BUILD/tests/data_check"
export OPENBLAS_NUM_THREADS=1

train_backends

note "1 process, batch 16: the reference; evaluation sees 103 samples once"
"$DC" --cpu --batch 16 --steps 12 --dump "$WORK/one.bin" > "$WORK/o1" || { cat "$WORK/o1"; fail "1 process"; }
count 1 'stream eval_count=103 eval_sum=5253 repeats=0 ' "$WORK/o1"
count 1 'sampler eval_count=103 eval_sum=5253 repeats=0 ' "$WORK/o1"

for be in $backends; do
    note "$be: 2 processes reading one stream, batch 8 each = the global batch of 16"
    launch 2 "$be" "$DC" --batch 8 --steps 12 --dump "$WORK/two_$be.bin" > "$WORK/o" || { cat "$WORK/o"; fail "2 processes $be"; }
    count 2 'train_steps=12 rows_per_step=8$' "$WORK/o"
    same "$WORK/one.bin" "$WORK/two_$be.bin"
    # 103 = 6 global batches of 16 + 7: the last one is completed from the first and the 9 repeats dropped
    count 2 'stream eval_count=103 eval_sum=5253 repeats=0 batches=7$' "$WORK/o"
    # 18 batches of 6 (the last of 1): rank 1 gets 9, the last one completed; 5 + 6 repeats dropped
    count 2 'sampler eval_count=103 eval_sum=5253 repeats=0 batches=9$' "$WORK/o"

    note "$be: --split_batches true: batch 16 is global, each process reads a slice of 8"
    # caccel launch takes the flag itself and passes it on as CACCEL_SPLIT_BATCHES; under mpirun the
    # program reads it from its own arguments
    if [ "$be" = gloo ]; then set -- --split_batches true "$DC"; else set -- "$DC" --split_batches true; fi
    launch 2 "$be" "$@" --batch 16 --steps 12 --dump "$WORK/split_$be.bin" > "$WORK/o" || { cat "$WORK/o"; fail "split $be"; }
    count 2 'train_steps=12 rows_per_step=8$' "$WORK/o"
    same "$WORK/one.bin" "$WORK/split_$be.bin"
    count 2 'stream eval_count=103 eval_sum=5253 repeats=0 batches=7$' "$WORK/o"
    count 2 'sampler eval_count=103 eval_sum=5253 repeats=0 batches=18$' "$WORK/o"
done

note "3 processes: the stream's last global batch of 24 holds 7 samples and 17 repeats"
be=$(echo "$backends" | awk '{print $1}')
launch 3 "$be" "$DC" --batch 8 --steps 4 > "$WORK/o" || { cat "$WORK/o"; fail "3 processes $be"; }
count 3 'stream eval_count=103 eval_sum=5253 repeats=0 batches=5$' "$WORK/o"
count 3 'sampler eval_count=103 eval_sum=5253 repeats=0 batches=6$' "$WORK/o"

note "a batch sampler declaring varying batch sizes (batch_size 0) with even_batches is refused at ca_prepare on 2 processes, naming the option (as Accelerate's BatchSamplerShard); accepted on 1 process and with even_batches false"
"$DC" --cpu --varying > "$WORK/o" || { cat "$WORK/o"; fail "varying sampler, 1 process"; }
count 1 'varying_sampler=ok$' "$WORK/o"
launch 2 "$be" "$DC" --varying > "$WORK/o" || { cat "$WORK/o"; fail "varying sampler, 2 processes"; }
count 2 "varying_sampler=even_batches: in-memory dataset: the batch sampler's batches vary in size (batch_size 0), so the 2 processes cannot be given batches of one size" "$WORK/o"
if [ "$be" = gloo ]; then set -- --even_batches false "$DC"; else set -- "$DC" --even_batches false; fi
launch 2 "$be" "$@" --varying > "$WORK/o" || { cat "$WORK/o"; fail "varying sampler, even_batches false"; }
count 2 'varying_sampler=ok$' "$WORK/o"
echo "ok"
