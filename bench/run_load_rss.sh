#!/usr/bin/env bash
# Peak resident memory per rank while building, preparing and loading a model of >= 1 GB f32 from
# safetensors: eager and deferred (--meta, ca_init_empty_weights; early: loaded into the meta model before
# ca_prepare, which reads it), DDP and ZeRO-3 (FULL_SHARD), at
# 1, 2 and 4 processes (caccel launch, Gloo, CPU). One row per run: the largest VmHWM over the ranks
# (a rank's own memory and the pages of the mapped file it touched); the largest peak of a rank's own
# (anonymous) memory above its RssAnon before the model was built (the runtime's libraries and
# communicator), sampled every millisecond since the kernel keeps no peak of RssAnon alone; rank 0's
# RssAnon at the end of ca_prepare and of the load; and rank 0's largest RssFile (the file's pages it
# touched, which the machine's page cache holds once for all of its ranks). The target for ZeRO-3 at
# N ranks: 1/N of the model + one wrapped unit (here one Linear) + 10% of own memory per rank, the
# page cache of the file counted once per machine, so compared with the own peak.
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
echo "| processes | mode | build | peak VmHWM MB (max over ranks) | peak own (RssAnon) MB above the runtime's (max over ranks) | rank 0 RssAnon MB after prepare / after load | rank 0 peak RssFile MB (page cache, once per machine) | target MB | within |"
echo "|---|---|---|---|---|---|---|---|---|"
for np in 1 2 4; do
    for mode in ddp z3; do
        for build in eager meta early; do
            flags=()
            [ "$mode" = z3 ] && flags=(--use_fsdp --fsdp_sharding_strategy FULL_SHARD)
            extra=()
            [ "$build" = meta ] && extra=(--meta)
            [ "$build" = early ] && extra=(--early)   # loaded into the meta model before ca_prepare
            out=$("$caccel" launch --num_processes "$np" --backend gloo "${flags[@]}" "$bench" "${args[@]}" "${extra[@]}" --load "$dir" 2>/dev/null | grep '^rank=')
            f() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<< "$2"; }
            hwm=0 own=0
            while read -r line; do
                h=$(f hwm_mb "$line") o=$(( $(f peak_anon_mb "$line") - $(f base_anon_mb "$line") ))
                [ "$h" -gt "$hwm" ] && hwm=$h
                [ "$o" -gt "$own" ] && own=$o
            done <<< "$out"
            r0=$(grep '^rank=0 ' <<< "$out")
            model=$(f model_mb "$r0") unit=$(f unit_mb "$r0")
            target="" ok=""
            if [ "$mode" = z3 ]; then
                target=$(( (model / np + unit) * 11 / 10 ))
                ok=$([ "$own" -le "$target" ] && echo yes || echo no)
            fi
            echo "| $np | $([ $mode = ddp ] && echo DDP || echo ZeRO-3) | $build | $hwm | $own | $(f prep_anon_mb "$r0") / $(f rss_anon_mb "$r0") | $(f peak_file_mb "$r0") | $target | $ok |"
        done
    done
done
