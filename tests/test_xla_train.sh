#!/bin/sh
# distributed_type XLA as users run it: the Fashion-MNIST example on the lazy xla device. Its graphs
# run the cpu backend's kernels in recorded order, so the parameters equal the eager CPU run's bit
# for bit (1 process after 50 steps, from --tpu and from a config file; 2 processes under caccel
# launch over Gloo from a config file and from --tpu, where each collective is a node of the graph; fp16, accumulation and
# clipping too). bf16 on xla is a TPU's bf16 storage instead: every parameter a bf16 value, downcast_bf16
# and XLA_USE_BF16=1 the same, accuracy within 2 points of f32. One epoch reaches the CPU's 80%
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

note "1 process, 50 steps: fp16, accumulation 4 x 32, clipping equal the CPU bit for bit"
for args in "--mixed_precision fp16" "--gradient_accumulation_steps 4 --batch-size 32" "--gradient_clipping 0.5"; do
    # shellcheck disable=SC2086
    "$FM" --cpu --epochs 1 --max-steps 50 $args --dump-params "$WORK/c.bin" > /dev/null 2>&1 || fail "cpu $args failed"
    # shellcheck disable=SC2086
    "$FM" --tpu --epochs 1 --max-steps 50 $args --dump-params "$WORK/x.bin" > /dev/null 2>&1 || fail "--tpu $args failed"
    cmp -s "$WORK/c.bin" "$WORK/x.bin" || fail "--tpu $args: parameters differ from the CPU run's"
    echo "  $args: equal"
done

# f32 words of a parameter dump that are not bf16 values (their low 16 bits are not zero)
not_bf16() { od -An -tx4 -v "$1" | tr -s ' ' '\n' | grep -v '^$' | grep -vc '0000$'; }

note "bf16 on xla stores every f32 value as bf16 (Accelerate's XLA_USE_BF16 on a TPU), no autocast"
"$FM" --cpu --epochs 1 --max-steps 200 --mixed_precision bf16 --dump-params "$WORK/cb.bin" > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "cpu bf16 failed"; }
"$FM" --tpu --epochs 1 --max-steps 200 --dump-params "$WORK/x32.bin" > "$WORK/o32" 2>&1 ||
    { cat "$WORK/o32"; fail "--tpu f32 failed"; }
"$FM" --tpu --epochs 1 --max-steps 200 --mixed_precision bf16 --dump-params "$WORK/xb.bin" > "$WORK/ob" 2>&1 ||
    { cat "$WORK/ob"; fail "--tpu bf16 failed"; }
printf 'distributed_type: XLA\nmixed_precision: bf16\ndowncast_bf16: true\n' > "$WORK/xlabf.yaml"
"$FM" --config_file "$WORK/xlabf.yaml" --epochs 1 --max-steps 200 --dump-params "$WORK/xd.bin" > "$WORK/od" 2>&1 ||
    { cat "$WORK/od"; fail "distributed_type: XLA, mixed_precision: bf16, downcast_bf16 failed"; }
XLA_USE_BF16=1 "$FM" --tpu --epochs 1 --max-steps 200 --dump-params "$WORK/xe.bin" > /dev/null 2>&1 ||
    fail "--tpu with XLA_USE_BF16=1 failed"
words=$(od -An -tx4 -v "$WORK/xb.bin" | wc -w)
nc=$(not_bf16 "$WORK/cb.bin"); nx=$(not_bf16 "$WORK/xb.bin"); nd=$(not_bf16 "$WORK/xd.bin"); ne=$(not_bf16 "$WORK/xe.bin")
echo "  parameters that are not bf16 values, of $words: cpu bf16 (autocast) $nc, xla bf16 $nx, with downcast_bf16 $nd, XLA_USE_BF16=1 $ne"
[ "$nc" -gt 1000 ] || fail "the CPU's bf16 run (f32 masters, autocast) should keep f32 parameters"
[ "$nx" -eq 0 ] && [ "$nd" -eq 0 ] && [ "$ne" -eq 0 ] || fail "a parameter on xla in bf16 storage is not a bf16 value"
cmp -s "$WORK/xb.bin" "$WORK/xd.bin" || fail "downcast_bf16 changed the result (caccel has no f64 for it to act on)"
cmp -s "$WORK/xb.bin" "$WORK/xe.bin" || fail "XLA_USE_BF16=1 differs from mixed_precision bf16 on xla"
grep -q "downcast_bf16.*differs from mixed_precision bf16 alone only for float64" "$WORK/od" ||
    { cat "$WORK/od"; fail "downcast_bf16 did not say what it does"; }
a32=$(sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' "$WORK/o32" | tail -1)
ab=$(sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' "$WORK/ob" | tail -1)
echo "  test accuracy after 200 steps: xla f32 $a32%, xla bf16 storage $ab%"
awk -v a="$ab" -v b="$a32" 'BEGIN { exit !(a >= b - 2.0) }' || fail "bf16 storage reached $ab%, more than 2 points below f32's $a32%"

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
note "2 processes with comm_hook bf16: the hook's casts are graph nodes; equal to the 2-process CPU run with the hook"
for dev in --cpu --tpu; do
    timeout 300 "$CACCEL" launch --num_processes 2 $dev --backend gloo --comm_hook bf16 "$FM" --batch-size 128 \
        --epochs 1 --max-steps 15 --dump-params "$WORK/hook$dev.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "2 ranks $dev, comm_hook bf16"; }
done
cmp -s "$WORK/hook--cpu.bin" "$WORK/hook--tpu.bin" || fail "with comm_hook bf16, xla parameters differ from the CPU run's"
cmp -s "$WORK/cpu2.bin" "$WORK/hook--cpu.bin" && fail "comm_hook bf16 changed nothing"
echo "  xla == cpu with comm_hook bf16, bit for bit"
note "2 processes with comm_hook power_sgd: GEMMs and collectives in the graph, Gram-Schmidt on the host; equal to the CPU run"
printf 'distributed_type: MULTI_CPU\ncomm_hook: power_sgd\ncomm_state_option:\n  matrix_approximation_rank: 2\n  start_powerSGD_iter: 5\n' \
    > "$WORK/psgd.yaml"
for dev in --cpu --tpu; do
    timeout 300 "$CACCEL" launch --num_processes 2 $dev --backend gloo "$FM" --batch-size 128 --epochs 1 \
        --max-steps 15 --config_file "$WORK/psgd.yaml" --dump-params "$WORK/psgd$dev.bin" > "$WORK/o" 2>&1 ||
        { cat "$WORK/o"; fail "2 ranks $dev, comm_hook power_sgd"; }
done
cmp -s "$WORK/psgd--cpu.bin" "$WORK/psgd--tpu.bin" || fail "with comm_hook power_sgd, xla parameters differ from the CPU run's"
cmp -s "$WORK/cpu2.bin" "$WORK/psgd--cpu.bin" && fail "comm_hook power_sgd changed nothing"
echo "  xla == cpu with comm_hook power_sgd, bit for bit"
note "2 processes, bf16 storage: the all-reduced gradients are rounded when the update reads them"
printf 'distributed_type: XLA\nnum_processes: 2\nmixed_precision: bf16\n' > "$WORK/xla2b.yaml"
timeout 300 "$CACCEL" launch --config_file "$WORK/xla2b.yaml" --backend gloo "$FM" --batch-size 128 --epochs 1 \
    --max-steps 15 --dump-params "$WORK/xla2b.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "2 ranks on xla in bf16"; }
n=$(not_bf16 "$WORK/xla2b.bin")
[ "$n" -eq 0 ] || fail "2 ranks in bf16 storage: $n parameters are not bf16 values"
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
