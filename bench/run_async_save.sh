#!/usr/bin/env bash
# Asynchronous save_state against a synchronous one (the step loop's stall per save) and against
# cp + sync of the same files (the background write's throughput); bench/bench_async_save.c.
# usage: run_async_save.sh [--build DIR] [bench_async_save arguments: --mib N --reps R --dir D]
set -euo pipefail
build=.
if [ "${1:-}" = --build ]; then build=$2; shift 2; fi
echo "date: $(date -u '+%F %H:%M UTC'), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
"$build/bench/bench_async_save" "$@"
