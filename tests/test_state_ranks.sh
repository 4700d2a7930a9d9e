#!/bin/sh
# save_state / load_state on 2 ranks (caccel launch over Gloo): a save whose rank 1 fails completes
# on no rank (no complete.json, the directory is never renamed into place, its <dir>.tmp is removed),
# rank 0 names rank 1, and both return an error; a second save over a complete checkpoint replaces
# it with both ranks' files and leaves nothing beside it; a load that rank 1 refuses changes nothing
# on either rank.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
need_backend gloo
export OPENBLAS_NUM_THREADS=1

mkdir -p "$WORK/out"
timeout 300 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$BUILD/tests/test_state" --ranks "$WORK/out" \
    > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "2 ranks"; }
cat "$WORK/o"
grep -q "^rank 0: save CA_ERR_PEER .*rank 1 failed (CA_ERR_IO); .*/out/bad is not complete" "$WORK/o" || fail "rank 0 did not name rank 1"
grep -q "^rank 1: save CA_ERR_IO .*flaky: rank 1 cannot serialise" "$WORK/o" || fail "rank 1's own error"
[ ! -e "$WORK/out/bad" ] || fail "the failed save left a directory that looks like a checkpoint"
[ ! -e "$WORK/out/bad.tmp" ] || fail "the failed save left its bad.tmp"
[ -f "$WORK/out/good/complete.json" ] || fail "the good save is not complete"
[ ! -e "$WORK/out/good.tmp" ] && [ ! -e "$WORK/out/good.old" ] || fail "the save over good left the previous checkpoint"
[ -f "$WORK/out/good/random_states_1.json" ] || fail "rank 1's file is not in the checkpoint"
grep -q "^rank 0: load CA_ERR_PEER .*rank 1 failed (CA_ERR_INVALID) to load .*/out/good; nothing was applied" "$WORK/o" || fail "rank 0's load did not name rank 1"
grep -q "^rank 1: load CA_ERR_INVALID .*flaky: rank 1 refuses its bytes" "$WORK/o" || fail "rank 1's load error"
count 2 ": unchanged$" "$WORK/o"
count 2 ": reload CA_OK restored$" "$WORK/o"
echo "ok"
