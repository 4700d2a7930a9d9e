#!/bin/sh
# The flight recorder (docs/PROFILING.md, "Flight recorder"): with CACCEL_FLIGHT_RECORDER_DIR set, every
# surviving rank of a failed job writes its last collectives and kernel calls, and `caccel trace analyze`
# names the rank that is behind and the collective. Three ranks, rank 1 the culprit each time (so that
# "the last rank" or "rank 0" cannot pass by chance): stopped with SIGSTOP, killed with SIGKILL, and
# calling a different collective (there rank 0: comm_check's desync mode). Then the analyzer's refusals.
. "$(dirname "$0")/lib.sh"
need_caccel
need_backend gloo
unset CACCEL_FLIGHT_RECORDER_ENTRIES
L="timeout 120 $CACCEL launch --main_process_port 0 --num_processes 3"

# analyze DIR: the analyzer's report in $WORK/report (it must succeed)
analyze() {
    "$CACCEL" trace analyze "$1" >"$WORK/report" 2>&1 || { cat "$WORK/out" "$WORK/report"; fail "trace analyze $1 failed"; }
    sed 's/^/    | /' "$WORK/report"
}

note "a rank stopped with SIGSTOP: the others time out; the analyzer names rank 1 and all_reduce #5"
CACCEL_TIMEOUT=3 CACCEL_FLIGHT_RECORDER_DIR="$WORK/fr_stop" $L -q "$CHECK" --tag "$TAG" --backend gloo --mode fault \
    --fault stop --victim 1 --step 5 --fail-code 3 >"$WORK/out" 2>&1
count 2 "comm_check: EXPECTED rank [02] failed at step 5 (CA_ERR_TIMEOUT)" "$WORK/out"
# the timeout's message names the rank the collective waited on (its published record: 5 issued)
count 2 "comm_check: EXPECTED rank [02] failed at step 5 .*; #5 waits on rank 1 (it has not called it)" "$WORK/out"
[ -f "$WORK/fr_stop/rank_0.json" ] && [ -f "$WORK/fr_stop/rank_2.json" ] || { cat "$WORK/out"; fail "ranks 0 and 2 wrote no dump"; }
count 1 "flight recorder: rank 0 wrote its last 6 collectives" "$WORK/out"
analyze "$WORK/fr_stop"
# the launcher continues the stopped rank with its SIGTERM: it writes a record then, which shows it late
count 1 "^verdict: rank 1 is behind: .*#5 .*all_reduce(f32, 16, sum)" "$WORK/report"
count 2 "^rank [02] (pid [0-9]*.*): at #5 all_reduce(f32, 16, sum) ([a-z]*), issued [0-9.]* s before the dump; last completed #4 all_reduce" "$WORK/report"
count 2 "failure (CA_ERR_TIMEOUT): all_reduce #5 .*timed out" "$WORK/report"
count 2 "^  waited on in #5: rank 1 (not called when it gave up)$" "$WORK/report"
no_orphans

note "a rank killed with SIGKILL: the analyzer names rank 1 and all_reduce #4"
# the launcher's flag this time (it passes CACCEL_FLIGHT_RECORDER_DIR on); a matmul (the gemm kernel) a step for the kernel records
CACCEL_TIMEOUT=20 $L -q --flight_recorder_dir "$WORK/fr_kill" "$CHECK" --tag "$TAG" --backend gloo --mode fault \
    --fault kill9 --victim 1 --step 4 --fail-code 3 --kernels >"$WORK/out" 2>&1
[ ! -e "$WORK/fr_kill/rank_1.json" ] || fail "the killed rank 1 wrote a dump"
analyze "$WORK/fr_kill"
count 1 "^verdict: rank 1 is behind: no record .*the others stopped at #4 all_reduce(f32, 16, sum)" "$WORK/report"
count 1 "^rank 1: no record" "$WORK/report"
count 2 "^rank [02] (pid .*): at #4 all_reduce(f32, 16, sum)" "$WORK/report"
count 2 "^  last kernel call: gemm f32 \[\[1,4,8\],\[1,8,2\]\] on cpu:0, ended [0-9.]* s before the dump" "$WORK/report"
no_orphans

note "a rank calling a different collective: the analyzer names rank 0's barrier against the others' all_reduce at #3"
CACCEL_FLIGHT_RECORDER_DIR="$WORK/fr_desync" $L -q "$CHECK" --tag "$TAG" --backend gloo --mode desync \
    --timeout-ms 60000 >"$WORK/out" 2>&1
count 3 "comm_check: EXPECTED rank .*mismatch" "$WORK/out"
analyze "$WORK/fr_desync"
count 1 "^flight recorder: 3 of 3 ranks wrote a record" "$WORK/report"
count 1 "^verdict: collective mismatch at #3: rank 0 called barrier; ranks 1,2 called all_reduce(f32, 16, sum); rank 0 differs" "$WORK/report"
count 1 "^rank 0 (pid .*: at #3 barrier (unfinished)" "$WORK/report"
no_orphans

note "every rank in the same collective: the one that issued it after the others had given up on it is behind"
# (what a stopped rank continued by the launcher's SIGTERM leaves when it gets to issue the collective first)
mkdir "$WORK/late"
dump() {   # dump RANK DUMP_NS ISSUE_NS_OF_#1
    printf '{"format":"caccel-flight-recorder","version":1,"rank":%s,"world":2,"host":"h","pid":1,"dump_ns":%s,' "$1" "$2"
    printf '"issued":2,"status":"CA_ERR_TIMEOUT","reason":"r","kernels":[],"collectives":['
    printf '{"seq":0,"sig":"broadcast(f32, 8, root 0)","state":"completed","t_issue_ns":1000,"t_end_ns":2000},'
    printf '{"seq":1,"sig":"all_reduce(f32, 16, sum)","state":"unfinished","t_issue_ns":%s,"t_end_ns":0}]}\n' "$3"
}
dump 0 5000000000 2000000000 >"$WORK/late/rank_0.json"
dump 1 8100000000 8000000000 >"$WORK/late/rank_1.json"
analyze "$WORK/late"
count 1 "^verdict: rank 1 is behind: it issued #1 all_reduce(f32, 16, sum) 3.000 s after every other rank had given up on it" "$WORK/report"

note "the analyzer's refusals name the file"
mkdir "$WORK/empty" "$WORK/bad"
"$CACCEL" trace analyze "$WORK/empty" >"$WORK/report" 2>&1 && fail "an empty directory was analyzed"
count 1 "caccel trace: error: no rank_<r>.json in" "$WORK/report"
cp "$WORK/fr_desync/rank_0.json" "$WORK/bad/rank_0.json"
echo '{"format": "caccel-flight-recorder", "rank": 1' >"$WORK/bad/rank_1.json"
"$CACCEL" trace analyze "$WORK/bad" >"$WORK/report" 2>&1 && fail "a truncated dump was analyzed"
count 1 "caccel trace: error: .*/rank_1.json: .*unexpected end of input" "$WORK/report"
sed 's/"rank": 0/"rank": 5/' "$WORK/fr_desync/rank_0.json" >"$WORK/bad/rank_1.json"
"$CACCEL" trace analyze "$WORK/bad" >"$WORK/report" 2>&1 && fail "a dump of another rank was analyzed"
count 1 "caccel trace: error: .*/rank_1.json: says rank 5 of world 3 (want rank 1" "$WORK/report"
sed 's/"state":"completed"/"state":"done"/' "$WORK/fr_desync/rank_0.json" >"$WORK/bad/rank_1.json"
sed -i 's/"rank": 0/"rank": 1/' "$WORK/bad/rank_1.json"
"$CACCEL" trace analyze "$WORK/bad" >"$WORK/report" 2>&1 && fail "a dump with a bad state was analyzed"
count 1 "caccel trace: error: .*/rank_1.json: collectives\[0\] has state 'done'" "$WORK/report"
rm "$WORK/bad/rank_1.json"
mkfifo "$WORK/bad/rank_2.json"
timeout 20 "$CACCEL" trace analyze "$WORK/bad" >"$WORK/report" 2>&1 && fail "a FIFO was analyzed"
count 1 "rank_2.json.*not a regular file" "$WORK/report"
echo "PASS"
