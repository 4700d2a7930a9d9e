#!/bin/sh
# Counts the places in accelerator/ that test which parallelism mode runs (ZeRO's stage, deterministic
# mode, DDP's buckets or process count choosing DDP) outside the files that implement a mode
# (sync_<name>.c, zero*.c, powersgd.c; determinism.c and ddp.c's own state before they became
# strategies). With the gradient-synchronisation strategies (accelerator/sync_impl.h) only refusals
# of a combination should remain. Usage: tools/count-mode-tests.sh [REV] (default: the work tree);
# prints each line and the count.
cd "$(dirname "$0")/.." || exit 2
R='zero\.stage|zero\.reduced|st\.deterministic\b|acc->nbuckets &&|!acc->nbuckets|world > 1\)? \?? ?(s = )?ca_ddp_|world > 1 \? ca_ddp'
skip='accelerator/(zero[a-z0-9_]*|sync_[a-z]*|determinism|powersgd)\.c:'
if [ -n "${1:-}" ]; then
    git grep -nE "$R" "$1" -- 'accelerator/*.c' | cut -d: -f2-
else
    git grep -nE "$R" -- 'accelerator/*.c'
fi | grep -vE "^$skip" | awk '{ print } END { printf "mode tests: %d\n", NR }'
