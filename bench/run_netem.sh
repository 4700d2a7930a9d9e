#!/usr/bin/env bash
# Data parallelism over a network of fixed bandwidth: two "machines" (network namespaces joined by a
# veth pair, each end shaped by tc's token bucket to --rate), one process on each, the MLP at batch
# 128 per process (1 thread), its gradients sent over Gloo's TCP transport. Rows: plain f32
# all-reduce, comm_hook bf16, comm_hook power_sgd (rank 4 from step 10), LocalSGD every 8 steps; and
# one process alone. Alternating, medians of --reps. Needs root (CAP_NET_ADMIN); says so and stops
# otherwise.
# usage: run_netem.sh --bench PATH --caccel PATH [--rate 1gbit] [--reps 3] [--batch 128]
set -euo pipefail
bench="" caccel="" rate=1gbit reps=3 batch=128
while [ $# -gt 0 ]; do
    case $1 in
        --bench) bench=$2; shift 2 ;;
        --caccel) caccel=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --batch) batch=$2; shift 2 ;;
        *) echo "run_netem.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$bench" ] && [ -x "$caccel" ] || { echo "run_netem.sh: --bench and --caccel are required" >&2; exit 2; }
bench=$(cd "$(dirname "$bench")" && pwd)/$(basename "$bench")
caccel=$(cd "$(dirname "$caccel")" && pwd)/$(basename "$caccel")
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
ns=("canetem$$a" "canetem$$b") out=$(mktemp) cfg=$(mktemp)   # machine i runs in namespace ns[i]
cleanup() { ip netns del "${ns[0]}" 2>/dev/null || true; ip netns del "${ns[1]}" 2>/dev/null || true; rm -f "$out" "$cfg"; }
trap cleanup EXIT
if ! ip netns add "${ns[0]}" 2>/dev/null; then
    echo "run_netem.sh: cannot create network namespaces (needs root or CAP_NET_ADMIN, and iproute2); not run"
    exit 0
fi
ip netns add "${ns[1]}"
ip link add eth0 netns "${ns[0]}" type veth peer name eth0 netns "${ns[1]}"
for i in 0 1; do
    ip -n "${ns[i]}" addr add "10.231.9.$((i + 1))/24" dev eth0
    ip -n "${ns[i]}" link set lo up
    ip -n "${ns[i]}" link set eth0 up
    # the link's bandwidth, each way: a token bucket at --rate
    ip netns exec "${ns[i]}" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
done
printf 'distributed_type: MULTI_CPU\ncomm_hook: power_sgd\ncomm_state_option:\n  matrix_approximation_rank: 4\n  start_powerSGD_iter: 10\n' \
    > "$cfg"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) CPUs, 2 machines x 1 process, link $rate each way (tc tbf), batch $batch per process"
port=29600
# run LABEL LAUNCH-FLAGS -- BENCH-FLAGS: one job on the two machines; rank 0's line, labelled
run() {
    label=$1; shift
    lf=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do lf+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    bf=("$@")
    port=$((port + 1))
    export CACCEL_JOB_TOKEN="netem-$$-$port"
    for m in 1 0; do
        ip netns exec "${ns[m]}" timeout 300 "$caccel" launch --num_machines 2 --machine_rank $m --main_process_ip 10.231.9.1 \
            --main_process_port $port --num_processes 2 --cpu --backend gloo -q "${lf[@]}" \
            "$bench" --batch-sizes "$batch" "${bf[@]}" > "$out.m$m" 2>&1 &
    done
    wait
    grep -o 'impl=caccel .*' "$out.m0" | head -1 | sed "s/^impl=caccel /impl=caccel run=$label /" >> "$out" ||
        { echo "# $label: no result"; tail -5 "$out.m0" "$out.m1"; }
    rm -f "$out.m0" "$out.m1"
}
for r in $(seq "$reps"); do
    "$bench" --batch-sizes "$batch" | grep -o 'impl=caccel .*' | sed 's/^impl=caccel /impl=caccel run=alone /' >> "$out"
    run f32
    run bf16 --comm_hook bf16
    run power_sgd --config_file "$cfg"
    run local_sgd -- --local-sgd-steps 8
done
python3 - "$out" <<'PY'
import statistics, sys
rows = [dict(kv.split("=", 1) for kv in line.split()) for line in open(sys.argv[1]) if line.startswith("impl=")]
def med(run, key):
    v = [float(r[key]) for r in rows if r["run"] == run and key in r]
    return (statistics.median(v) if v else float("nan")), len(v)
alone = med("alone", "samples_per_s")[0]
print(f"{'run':>10} | {'samples/s':>10} {'/ 1 process':>12} {'bwd_us':>8} {'opt_us':>8} {'acc %':>6} (n)")
for run in ("alone", "f32", "bf16", "power_sgd", "local_sgd"):
    s, n = med(run, "samples_per_s")
    print(f"{run:>10} | {s:10.0f} {s / alone:11.2f}x {med(run, 'bwd_us')[0]:8.0f} {med(run, 'opt_us')[0]:8.0f} "
          f"{med(run, 'accuracy')[0]:6.2f} ({n})")
PY
