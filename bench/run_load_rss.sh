#!/usr/bin/env bash
# Peak resident memory per rank while building, preparing and loading a model of >= 1 GB f32 from
# safetensors: eager and deferred (--meta, ca_init_empty_weights), DDP and ZeRO-3 (FULL_SHARD), at
# 1, 2 and 4 processes (caccel launch, Gloo, CPU). One row per run: the largest VmHWM over the ranks
# and that rank's peak above its VmRSS before the model was built (the runtime's own libraries and
# communicator), and rank 0's RssAnon / RssFile at the end. VmHWM counts the pages of a mapped file a
# rank touched; the machine holds them once in its page cache. The target for ZeRO-3 at N ranks: 1/N of the model + one
# wrapped unit (here one Linear) + 10%, the machine's page cache of the file counted once (RssFile).
# usage: run_load_rss.sh --bench PATH --caccel PATH [bench_load_rss arguments...]
set -euo pipefail
bench="" caccel="" args=()
while [ $# -gt 0 ]; do
    case $1 in
        --bench) bench=$2; shift 2 ;;
        --caccel) caccel=$2; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
[ -x "$bench" ] && [ -x "$caccel" ] || { echo "run_load_rss.sh: --bench and --caccel are required" >&2; exit 2; }
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bench" "${args[@]}" --save "$dir" > /dev/null
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) CPUs; bench_load_rss ${args[*]:-} (file $(du -m "$dir" | cut -f1) MB)"
echo "| processes | mode | build | peak VmHWM MB (max over ranks) | above the runtime's own MB (rank of the max) | rank 0 RssAnon MB | rank 0 RssFile MB | target MB | within |"
echo "|---|---|---|---|---|---|---|---|---|"
for np in 1 2 4; do
    for mode in ddp z3; do
        for build in eager meta; do
            flags=()
            [ "$mode" = z3 ] && flags=(--use_fsdp --fsdp_sharding_strategy FULL_SHARD)
            extra=()
            [ "$build" = meta ] && extra=(--meta)
            out=$("$caccel" launch --num_processes "$np" --backend gloo "${flags[@]}" "$bench" "${args[@]}" "${extra[@]}" --load "$dir" 2>/dev/null | grep '^rank=')
            top=$(sort -t= -k4 -n <<< "$(sed 's/ hwm_mb=/ =/' <<< "$out")" | tail -1)
            hwm=$(sed -n 's/.* =\([0-9]*\).*/\1/p' <<< "$top")
            above=$(( hwm - $(sed -n 's/.* base_mb=\([0-9]*\).*/\1/p' <<< "$top") ))
            r0=$(grep '^rank=0 ' <<< "$out")
            v() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<< "$r0"; }
            model=$(v model_mb) unit=$(v unit_mb)
            target="" ok=""
            if [ "$mode" = z3 ]; then
                target=$(( (model / np + unit) * 11 / 10 ))
                ok=$([ "$above" -le "$target" ] && echo yes || echo no)
            fi
            echo "| $np | $([ $mode = ddp ] && echo DDP || echo ZeRO-3) | $build | $hwm | $above | $(v rss_anon_mb) | $(v rss_file_mb) | $target | $ok |"
        done
    done
done
