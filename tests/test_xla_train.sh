#!/bin/sh
# distributed_type XLA as users run it: the Fashion-MNIST example on the lazy xla device. Its graphs
# run the cpu backend's kernels in recorded order, so the parameters equal the eager CPU run's bit
# for bit (1 process after 50 steps, from --tpu and from a config file; 2 processes under caccel
# launch over Gloo from a config file and from --tpu, where each collective is a node of the graph; mixed precision, accumulation and
# clipping too). One epoch reaches the CPU's 80%
# floor (tests/test_examples.sh), and the whole epoch compiles a handful of programs: the training
# step's, the short last batch's, the evaluation's; every other graph comes from the cache.
. "$(dirname "$0")/dist/lib.sh"
FM="$BUILD/examples/fashion_mnist"
export OPENBLAS_NUM_THREADS=1

note "1 process, 50 steps: --tpu and distributed_type XLA equal the CPU bit for bit"
"$FM" --cpu --epochs 1 --max-steps 50 --dump-params "$WORK/cpu.bin" > /dev/null 2>&1 || fail "cpu run failed"
out=$("$FM" --tpu --epochs 1 --max-steps 50 --dump-params "$WORK/xla.bin" 2>&1) || { echo "$out"; fail "--tpu run failed"; }
echo "$out" | grep -q "on xla" || { echo "$out"; fail "--tpu did not train on the xla device"; }
cmp -s "$WORK/cpu.bin" "$WORK/xla.bin" || fail "--tpu parameters differ from the CPU run's"
printf 'distributed_type: XLA\n' > "$WORK/xla.yaml"
"$FM" --config_file "$WORK/xla.yaml" --epochs 1 --max-steps 50 --dump-params "$WORK/xla_cfg.bin" > /dev/null 2>&1 ||
    fail "--config_file (distributed_type: XLA) run failed"
cmp -s "$WORK/cpu.bin" "$WORK/xla_cfg.bin" || fail "distributed_type: XLA parameters differ from the CPU run's"

note "1 process, 50 steps: bf16, fp16, accumulation 4 x 32, clipping equal the CPU bit for bit"
for args in "--mixed_precision bf16" "--mixed_precision fp16" "--gradient_accumulation_steps 4 --batch-size 32" \
            "--gradient_clipping 0.5"; do
    # shellcheck disable=SC2086
    "$FM" --cpu --epochs 1 --max-steps 50 $args --dump-params "$WORK/c.bin" > /dev/null 2>&1 || fail "cpu $args failed"
    # shellcheck disable=SC2086
    "$FM" --tpu --epochs 1 --max-steps 50 $args --dump-params "$WORK/x.bin" > /dev/null 2>&1 || fail "--tpu $args failed"
    cmp -s "$WORK/c.bin" "$WORK/x.bin" || fail "--tpu $args: parameters differ from the CPU run's"
    echo "  $args: equal"
done

note "1 process, one epoch: accuracy floor and the compile count"
out=$(CACCEL_XLA_METRICS=1 "$FM" --tpu --epochs 1 2>&1) || { echo "$out"; fail "one epoch on xla failed"; }
acc=$(echo "$out" | sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' | tail -1)
compiles=$(echo "$out" | sed -n 's/^ *compiles: \([0-9]*\)$/\1/p')
hits=$(echo "$out" | sed -n 's/^ *cache_hits: \([0-9]*\)$/\1/p')
echo "  accuracy $acc%, $compiles compiles, $hits cache hits"
[ -n "$acc" ] && [ -n "$compiles" ] && [ -n "$hits" ] || { echo "$out"; fail "no accuracy or metrics printed"; }
awk -v a="$acc" 'BEGIN { exit !(a >= 80.0) }' || fail "xla reached $acc% after one epoch, below the 80% floor"
[ "$compiles" -le 8 ] || fail "$compiles compiles in one epoch: graphs are not being reused"
[ "$hits" -ge 400 ] || fail "only $hits cache hits over 469 steps"

need_caccel
need_backend gloo
note "2 processes under caccel launch (Gloo): equal to the 2-process CPU run"
timeout 300 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$FM" --batch-size 128 --epochs 1 \
    --max-steps 15 --dump-params "$WORK/cpu2.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "2 ranks on cpu"; }
printf 'distributed_type: XLA\nnum_processes: 2\n' > "$WORK/xla2.yaml"
CACCEL_XLA_METRICS=1 timeout 300 "$CACCEL" launch --config_file "$WORK/xla2.yaml" --backend gloo "$FM" --batch-size 128 --epochs 1 \
    --max-steps 15 --dump-params "$WORK/xla2.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "2 ranks on xla"; }
grep -q "2 process(es) on xla" "$WORK/o" || { cat "$WORK/o"; fail "the 2 ranks did not train on xla"; }
cmp -s "$WORK/cpu2.bin" "$WORK/xla2.bin" || fail "2-rank xla parameters differ from the 2-rank CPU run's"
# DDP's all-reduce of each step is a node of the step's graph: 15 steps, one bucket each, per rank
n=$(sed -n 's/^ *collectives_in_graph: \([0-9]*\)$/\1/p' "$WORK/o" | awk '$1 >= 15' | wc -l)
echo "  ranks whose metrics show at least 15 collectives run in their graphs: $n"
[ "$n" -eq 2 ] || { cat "$WORK/o"; fail "the collectives did not run as graph nodes on both ranks"; }

note "2 processes under caccel launch --tpu: the flag reaches the workers (CACCEL_USE_XLA)"
timeout 300 "$CACCEL" launch --num_processes 2 --tpu --backend gloo "$FM" --batch-size 128 --epochs 1 \
    --max-steps 15 --dump-params "$WORK/tpu2.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "2 ranks with --tpu"; }
grep -q "2 process(es) on xla" "$WORK/o" || { cat "$WORK/o"; fail "caccel launch --tpu did not train on xla"; }
cmp -s "$WORK/cpu2.bin" "$WORK/tpu2.bin" || fail "caccel launch --tpu parameters differ from the 2-rank CPU run's"
if command -v "${MPIRUN:-mpirun}" > /dev/null 2>&1 && have mpi; then
    note "2 processes under mpirun (MPI): the collectives run as graph nodes; equal to the 2-process CPU run"
    CACCEL_XLA_METRICS=1 run_mpi 2 "$FM" --tpu --batch-size 128 --epochs 1 --max-steps 15 \
        --dump-params "$WORK/mpi2.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "2 ranks on xla under mpirun"; }
    grep -q "2 process(es) on xla" "$WORK/o" || { cat "$WORK/o"; fail "the 2 MPI ranks did not train on xla"; }
    cmp -s "$WORK/cpu2.bin" "$WORK/mpi2.bin" || fail "2-rank xla parameters under mpirun differ from the 2-rank CPU run's"
    n=$(sed -n 's/^ *collectives_in_graph: \([0-9]*\)$/\1/p' "$WORK/o" | awk '$1 >= 15' | wc -l)
    [ "$n" -eq 2 ] || { cat "$WORK/o"; fail "under mpirun the collectives did not run as graph nodes on both ranks"; }
fi
echo "PASS"
