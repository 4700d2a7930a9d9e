#!/bin/sh
# dispatch_batches across real processes (caccel launch over Gloo, mpirun over MPI) at 2, 3 and 4
# processes. The data exists on rank 0 only: tests/dispatch_check.c fails the run when a dataset
# callback (get, begin, next) is called on another rank.
#  (a) a stream read by rank 0 alone trains to the parameters of 1 process on the same global batches
#      of 24 samples, within 1e-5 (absolute; only the order of floating-point sums differs);
#  (b) the sample ids each rank gets per step, the last incomplete batch included, are Accelerate's
#      DataLoaderDispatcher's (listed below, for a map-style dataset and for a stream alike);
#  (c) gather_for_metrics gives every sample exactly once;
#  and the same epoch resumed at batch 1 (skip_batches) gives the same ids from step 1 on; a read
#  error on rank 0 fails every rank on the same step and leaves them in step; every rank sees the
#  loader's last batch (the end of an accumulation cycle) on the same step.
#
# How DataLoaderDispatcher cuts an epoch of n samples read in order, world W, loader batch B
# (src/accelerate/data_loader.py: _fetch_batches, __iter__):
#  - process 0 takes W batches of its loader (or one with split_batches) and concatenates them: the
#    global batch, of G = W * B samples (B with split_batches), is broadcast and process r keeps
#    [r * g / W, (r + 1) * g / W) of it, g being its size;
#  - without drop_last, a last global batch of m samples that W does not divide is completed with the
#    first W samples of the epoch's first batch and each process gets m // W + 1 of it; the repeats are
#    the remainder gather_for_metrics drops (remainder = m). When W divides m, each gets m / W;
#  - with drop_last, process 0's loader drops a short batch and a group of fewer than W batches ends
#    the epoch unsent (split_batches: the short global batch is dropped).
. "$(dirname "$0")/dist/lib.sh"
need_caccel
DC="$BUILD/tests/dispatch_check"
export OPENBLAS_NUM_THREADS=1

train_backends

# check_ids KIND DROP OUT: the "ids" lines of KIND with drop_last DROP in OUT are exactly stdin's, and
# the epoch resumed at batch 1 ("skip" lines) gives them from step 1 on.
check_ids() {
    sort > "$WORK/want"
    grep "^ids $1 drop=$2 " "$3" | sed "s/^ids $1 drop=$2 //" | sort > "$WORK/got"
    cmp -s "$WORK/want" "$WORK/got" || { echo "want:"; cat "$WORK/want"; echo "got:"; cat "$WORK/got";
                                         fail "$1 drop_last=$2: the ids per rank and step differ"; }
    grep -v ' step=0 ' "$WORK/want" > "$WORK/want_skip"
    grep "^skip $1 drop=$2 " "$3" | sed "s/^skip $1 drop=$2 //" | sort > "$WORK/got"
    cmp -s "$WORK/want_skip" "$WORK/got" || { echo "want:"; cat "$WORK/want_skip"; echo "got:"; cat "$WORK/got";
                                              fail "$1 drop_last=$2: resumed at batch 1, the ids differ"; }
}

# both DROP OUT: stdin's lines hold for the map-style dataset and for the stream.
both() { cat > "$WORK/lines"; for k in map stream; do check_ids "$k" "$1" "$2" < "$WORK/lines"; done; }

# gathered DROP COUNT SUM BATCHES NP OUT: gather_for_metrics gave COUNT samples, SUM of ids, none twice.
gathered() {
    for k in map stream; do count "$5" "^gather $k drop=$1 rank=[0-9]* count=$2 sum=$3 repeats=0 batches=$4$" "$6"; done
}

# 10 samples, batch 2 per process (global 2W)
ids_plain() { # NP OUT
    case $1 in
    2) both 0 "$2" <<'EOF'
rank=0 step=0 ids=0,1 pad=0
rank=0 step=1 ids=4,5 pad=0
rank=0 step=2 ids=8 pad=0
rank=1 step=0 ids=2,3 pad=0
rank=1 step=1 ids=6,7 pad=0
rank=1 step=2 ids=9 pad=0
EOF
       both 1 "$2" <<'EOF'
rank=0 step=0 ids=0,1 pad=0
rank=0 step=1 ids=4,5 pad=0
rank=1 step=0 ids=2,3 pad=0
rank=1 step=1 ids=6,7 pad=0
EOF
       gathered 0 10 45 3 2 "$2"; gathered 1 8 28 2 2 "$2" ;;
    3) # the last global batch [6..9] is completed with 0, 1, 2; 10 % 3 != 0: 2 each
       both 0 "$2" <<'EOF'
rank=0 step=0 ids=0,1 pad=0
rank=0 step=1 ids=6,7 pad=0
rank=1 step=0 ids=2,3 pad=0
rank=1 step=1 ids=8,9 pad=0
rank=2 step=0 ids=4,5 pad=0
rank=2 step=1 ids=0,1 pad=2
EOF
       both 1 "$2" <<'EOF'
rank=0 step=0 ids=0,1 pad=0
rank=1 step=0 ids=2,3 pad=0
rank=2 step=0 ids=4,5 pad=0
EOF
       gathered 0 10 45 2 3 "$2"; gathered 1 6 15 1 3 "$2" ;;
    4) # the last global batch [8, 9] is completed with 0..3; 2 % 4 != 0: 1 each
       both 0 "$2" <<'EOF'
rank=0 step=0 ids=0,1 pad=0
rank=0 step=1 ids=8 pad=0
rank=1 step=0 ids=2,3 pad=0
rank=1 step=1 ids=9 pad=0
rank=2 step=0 ids=4,5 pad=0
rank=2 step=1 ids=0 pad=1
rank=3 step=0 ids=6,7 pad=0
rank=3 step=1 ids=1 pad=1
EOF
       both 1 "$2" <<'EOF'
rank=0 step=0 ids=0,1 pad=0
rank=1 step=0 ids=2,3 pad=0
rank=2 step=0 ids=4,5 pad=0
rank=3 step=0 ids=6,7 pad=0
EOF
       gathered 0 10 45 2 4 "$2"; gathered 1 8 28 1 4 "$2" ;;
    esac
}

# split_batches: 29 samples, global batch 12 (12 / W each); the last global batch is [24..28]
ids_split() { # NP OUT
    case $1 in
    2) both 0 "$2" <<'EOF'
rank=0 step=0 ids=0,1,2,3,4,5 pad=0
rank=0 step=1 ids=12,13,14,15,16,17 pad=0
rank=0 step=2 ids=24,25,26 pad=0
rank=1 step=0 ids=6,7,8,9,10,11 pad=0
rank=1 step=1 ids=18,19,20,21,22,23 pad=0
rank=1 step=2 ids=27,28,0 pad=1
EOF
       ;;
    3) both 0 "$2" <<'EOF'
rank=0 step=0 ids=0,1,2,3 pad=0
rank=0 step=1 ids=12,13,14,15 pad=0
rank=0 step=2 ids=24,25 pad=0
rank=1 step=0 ids=4,5,6,7 pad=0
rank=1 step=1 ids=16,17,18,19 pad=0
rank=1 step=2 ids=26,27 pad=0
rank=2 step=0 ids=8,9,10,11 pad=0
rank=2 step=1 ids=20,21,22,23 pad=0
rank=2 step=2 ids=28,0 pad=1
EOF
       ;;
    4) both 0 "$2" <<'EOF'
rank=0 step=0 ids=0,1,2 pad=0
rank=0 step=1 ids=12,13,14 pad=0
rank=0 step=2 ids=24,25 pad=0
rank=1 step=0 ids=3,4,5 pad=0
rank=1 step=1 ids=15,16,17 pad=0
rank=1 step=2 ids=26,27 pad=0
rank=2 step=0 ids=6,7,8 pad=0
rank=2 step=1 ids=18,19,20 pad=0
rank=2 step=2 ids=28,0 pad=1
rank=3 step=0 ids=9,10,11 pad=0
rank=3 step=1 ids=21,22,23 pad=0
rank=3 step=2 ids=1,2 pad=2
EOF
       ;;
    esac
    # with drop_last the short global batch is dropped: the first two steps alone
    grep -v ' step=2 ' "$WORK/lines" > "$WORK/lines_drop"
    both 1 "$2" < "$WORK/lines_drop"
    gathered 0 29 406 3 "$1" "$2"; gathered 1 24 276 2 "$1" "$2"
}

note "1 process, global batch 24: the reference"
"$DC" --cpu --train-batch 24 --steps 12 --dump "$WORK/one.bin" > "$WORK/o1" || { cat "$WORK/o1"; fail "1 process"; }
count 1 'train rank=0 steps=12 rows_per_step=24 ' "$WORK/o1"
note "1 process: dispatch_batches true is the plain loader"
"$DC" --cpu --steps 0 > "$WORK/plain" && "$DC" --cpu --dispatch_batches true --steps 0 > "$WORK/disp" ||
    fail "1 process, batches of ids"
cmp -s "$WORK/plain" "$WORK/disp" ||
    { diff "$WORK/plain" "$WORK/disp"; fail "1 process: dispatch_batches changed the batches"; }
count 1 '^gather map drop=0 rank=0 count=10 sum=45 repeats=0 batches=5$' "$WORK/disp"

# dispatch NP BACKEND ARGS...: dispatch_check on NP processes with dispatch_batches and ARGS (caccel
# launch takes the configuration flags itself; under mpirun the program reads them from its arguments)
dispatch() {
    np=$1 be=$2; shift 2
    if [ "$be" = gloo ]; then launch "$np" "$be" --dispatch_batches true "$@"
    else
        prog=$1; shift
        launch "$np" "$be" "$prog" --dispatch_batches true "$@"
    fi
}

be1=$(echo "$backends" | awk '{print $1}')
note "$be1: without dispatch_batches the other ranks read, and the check catches it"
if launch 2 "$be1" "$DC" --train-batch 12 --steps 2 > "$WORK/o" 2>&1; then
    cat "$WORK/o"; fail "ranks read without dispatch"
fi
count 1 'rank=1 FAIL: the dataset.s [a-z]* was called on rank 1' "$WORK/o"

note "$be1: rank 0 cannot read sample 7 (global batch 1: samples 6..9): every rank fails on that step, in step"
dispatch 3 "$be1" "$DC" --steps 0 --fail-at 7 > "$WORK/o" || { cat "$WORK/o"; fail "read error"; }
count 1 'failed rank=0 step=1: .*sample 7 is unreadable' "$WORK/o"
count 2 'failed rank=[12] step=1: dispatch_batches: rank 0 could not read batch 1 of epoch 0' "$WORK/o"

note "$be1: 3 processes, gradient_accumulation_steps 100: every rank marks the same last step"
dispatch 3 "$be1" "$DC" --steps 0 --gradient_accumulation_steps 100 > "$WORK/o" || { cat "$WORK/o"; fail "last step"; }
for k in map stream; do
    count 3 "^last $k drop=0 rank=[0-2] step=1$" "$WORK/o"    # 2 steps: [0..5], [6..9] completed
    count 3 "^last $k drop=1 rank=[0-2] step=0$" "$WORK/o"    # 1 step: [0..5]
done
count 12 '^last ' "$WORK/o"
ids_plain 3 "$WORK/o"

for be in $backends; do
    for np in 2 3 4; do
        note "$be: $np processes, batch $((24 / np)) each, rank 0 reads"
        dispatch "$np" "$be" "$DC" --train-batch $((24 / np)) --steps 12 --dump "$WORK/d${np}_$be.bin" > "$WORK/o" ||
            { cat "$WORK/o"; fail "$np processes $be"; }
        grep -q 'FAIL' "$WORK/o" && { cat "$WORK/o"; fail "$np processes $be"; }
        count "$np" "train rank=[0-9]* steps=12 rows_per_step=$((24 / np)) device=cpu" "$WORK/o"
        same "$WORK/one.bin" "$WORK/d${np}_$be.bin"
        ids_plain "$np" "$WORK/o"
        count "$np" "sampler rank=[0-9]* refused: dispatch_batches: not supported with a custom batch sampler" "$WORK/o"

        note "$be: $np processes, split_batches: global batch 24 (training) and 12 (ids)"
        if [ "$be" = gloo ]; then set -- --split_batches true "$DC"; else set -- "$DC" --split_batches true; fi
        dispatch "$np" "$be" "$@" --train-batch 24 --steps 12 --ids 29 --batch 12 --dump "$WORK/s${np}_$be.bin" \
            > "$WORK/o" || { cat "$WORK/o"; fail "split, $np processes $be"; }
        grep -q 'FAIL' "$WORK/o" && { cat "$WORK/o"; fail "split, $np processes $be"; }
        count "$np" "train rank=[0-9]* steps=12 rows_per_step=$((24 / np)) device=cpu" "$WORK/o"
        same "$WORK/one.bin" "$WORK/s${np}_$be.bin"
        ids_split "$np" "$WORK/o"
    done
done
if have gloo; then
    note "gloo, the lazy xla device (--tpu): 2 processes, the batch goes through a device buffer"
    LAUNCH_FLAGS=--tpu dispatch 2 gloo "$DC" --train-batch 12 --steps 12 --dump "$WORK/x2.bin" > "$WORK/o" ||
        { cat "$WORK/o"; fail "2 processes on xla"; }
    grep -q 'FAIL' "$WORK/o" && { cat "$WORK/o"; fail "2 processes on xla"; }
    count 2 'train rank=[01] steps=12 rows_per_step=12 device=xla' "$WORK/o"
    same "$WORK/one.bin" "$WORK/x2.bin"
    ids_plain 2 "$WORK/o"
fi
echo "ok"
