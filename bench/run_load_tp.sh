#!/usr/bin/env bash
# Loading a model of >= 1 GB f32 under tensor parallelism: bench_load_rss --tp-plan (16 Linear(4096,
# 4096) without bias, alternately colwise and rowwise) saved once, then loaded on tp processes (caccel
# launch, Gloo, CPU) at tp 1, 2 and 4: eager build, ca_prepare, ca_load_model ("after prepare"), and
# a meta model loaded before ca_prepare ("early"), ca_load_state of a checkpoint of it saved by one
# process ("state"), ca_load_model after ca_prepare at tp x FULL_SHARD over dp_shard 2 (2 x tp
# processes: "shard"), and ca_load_state of that checkpoint at tp x FULL_SHARD over dp_shard 2
# ("stateshard"; not in the default modes). Per run: each rank's bytes read by read()/pread()
# (max over ranks), its peak RSS (VmHWM: its own memory and the mapped file pages it touched; max over
# ranks), rank 0's largest RssFile (file pages touched through a mapping) and rank 0's seconds of the
# load. --before BENCH CACCEL runs the same with another build (the code before a change) beside it.
# PyTorch's peer (bench/peers/torch_load_tp.py, safetensors safe_open + get_slice of rank 0's same
# slices) at 1 and 2 threads.
# usage: run_load_tp.sh --bench PATH --caccel PATH [--before BENCH CACCEL] [--tp "1 2 4"]
#        [--modes "after early state shard stateshard"]
set -euo pipefail
bench="" caccel="" bbench="" bcaccel="" tps="1 2 4" modes="after early state shard"
while [ $# -gt 0 ]; do
    case $1 in
        --bench) bench=$2; shift 2 ;;
        --caccel) caccel=$2; shift 2 ;;
        --before) bbench=$2 bcaccel=$3; shift 3 ;;
        --tp) tps=$2; shift 2 ;;
        --modes) modes=$2; shift 2 ;;
        *) echo "run_load_tp.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$bench" ] && [ -x "$caccel" ] || { echo "run_load_tp.sh: --bench and --caccel are required" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bench" --tp-plan --save "$dir" > /dev/null
file=$dir/model.safetensors
case " $modes " in *" state"*) "$bench" --tp-plan --save-state "$dir/state" > /dev/null ;; esac
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; file $(( $(stat -c %s "$file") / 1048576 )) MiB"
echo "| build | tp | load | bytes read MiB (max rank) | peak VmHWM MiB (max rank) | rank 0 peak RssFile MiB | rank 0 s |"
echo "|---|---|---|---|---|---|---|"
row() {   # row NAME BENCH CACCEL TP MODE
    local extra=(--load "$dir") np=$4 out
    [ "$5" = early ] && extra+=(--early)
    [ "$5" = state ] && extra=(--load-state "$dir/state")
    [ "$5" = shard ] && np=$(( $4 * 2 )) extra+=(--parallelism_config_dp_shard_size 2 --use_fsdp --fsdp_sharding_strategy FULL_SHARD)
    [ "$5" = stateshard ] && np=$(( $4 * 2 )) extra=(--load-state "$dir/state" --parallelism_config_dp_shard_size 2 \
        --use_fsdp --fsdp_sharding_strategy FULL_SHARD)
    out=$("$3" launch --num_processes "$np" --backend gloo --parallelism_config_tp_size "$4" "$2" --tp-plan \
          "${extra[@]}" 2>/dev/null | grep '^rank=')
    f() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<< "$2" | sort -n | tail -1; }
    r0=$(grep '^rank=0 ' <<< "$out")
    echo "| $1 | $4 | $5 | $(f rchar_mb "$out") | $(f hwm_mb "$out") | $(f peak_file_mb "$r0") | $(f load_s "$r0") |"
}
for tp in $tps; do
    for mode in $modes; do
        case $mode in shard | stateshard) [ "$tp" = 1 ] && continue ;; esac   # tp x FULL_SHARD: tp above 1
        [ -n "$bbench" ] && row before "$bbench" "$bcaccel" "$tp" "$mode"
        row after "$bench" "$caccel" "$tp" "$mode"
    done
done
py=${TORCH_PYTHON:-python3}
if "$py" -c 'import torch, safetensors' 2>/dev/null; then
    echo "| build | tp | threads | rank 0 s | peak RSS MiB |"
    echo "|---|---|---|---|---|"
    for tp in $tps; do
        for th in 1 2; do
            read -r s kb < <(OMP_NUM_THREADS=$th "$py" -c "import torch; torch.set_num_threads($th); import runpy, sys; \
sys.argv = ['x', '$file', '$tp', '0']; runpy.run_path('$here/peers/torch_load_tp.py', run_name='__main__')")
            echo "| torch $("$py" -c 'import torch; print(torch.__version__)') | $tp | $th | $s | $((kb / 1024)) |"
        done
    done
fi
