#!/bin/sh
# ca_load_model into a meta model (ca_init_empty_weights) before ca_prepare on 2 processes, where rank 0
# reads the file and broadcasts what it holds (DDP, ZeRO stage 2; fsdp_cpu_ram_efficient_loading true,
# the default), is all or nothing:
# - a bad file (a tensor missing, a wrong shape, a file cut short): every rank refuses (rank 0 naming
#   the file, rank 1 rank 0), every parameter is still meta on every rank, and a correct load in the
#   same processes then gives the parameters of a load that never failed, bit for bit (nothing was
#   recorded for ca_prepare by the failed one);
# - rank 1 killed (kill -9; Gloo) or stopped (SIGSTOP; Gloo and MPI, the communicator's deadline
#   CACCEL_TIMEOUT=10 then passes) before rank 0's 2nd parameter broadcast, once it says so
#   (CACCEL_TEST_BCAST_STALL): rank 0, which had materialised the file's values, names rank 1, says its
#   model is restored, and every parameter is meta again (tests/bcast_stall.sh; under mpirun a
#   rank's death ends the job: a stopped peer only).
. "$(dirname "$0")/dist/lib.sh"
. "$(dirname "$0")/bcast_stall.sh"
digest_of() { sed -n "s/^rank=$1 params_fnv=\([0-9a-f]*\).*/\1/p" "$2"; }


job() {   # job BACKEND ARGS...: ddp_check on 2 ranks, output in $WORK/o
    be=$1; shift
    if [ "$be" = mpi ]; then run_mpi 2 "$DDP" --hidden 64 "$@" --cpu --backend mpi > "$WORK/o" 2>&1
    else timeout 300 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$DDP" --hidden 64 "$@" > "$WORK/o" 2>&1; fi
}

mkdir -p "$WORK/m64" "$WORK/m32"
job gloo --steps 3 --save-model "$WORK/m64" || { cat "$WORK/o"; fail "save"; }
timeout 300 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$DDP" --hidden 32 --steps 3 --save-model "$WORK/m32" \
    > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "save at hidden 32"; }
job gloo --steps 0 --load-model "$WORK/m64" --digest || { cat "$WORK/o"; fail "load"; }
digest_of 0 "$WORK/o" > "$WORK/saved"
mkdir -p "$WORK/cut" && cp "$WORK/m64/model.safetensors" "$WORK/cut/" && truncate -s -8 "$WORK/cut/model.safetensors"
bad="$WORK/m32:shape $WORK/cut:beyond"
PY=python3
[ -x /work/venv/bin/python ] && PY=/work/venv/bin/python
if "$PY" -c 'import safetensors.numpy' 2>/dev/null; then
    mkdir -p "$WORK/missing"
    "$PY" - "$WORK/m64/model.safetensors" "$WORK/missing/model.safetensors" <<'EOF' || fail "writing a file without fc2.bias"
import sys
from safetensors.numpy import load_file, save_file
t = load_file(sys.argv[1])
del t["fc2.bias"]
save_file(t, sys.argv[2], metadata={"format": "pt"})
EOF
    bad="$bad $WORK/missing:fc2.bias"
else
    echo "no python with safetensors: the missing-tensor case is not run"
fi

# refused BACKEND CFG: each bad file refused on both ranks, the model meta, then the good load
refused() {
    for b in $bad; do
        dir=${b%%:*} says=${b#*:}
        job "$1" --steps 0 --meta --try-load-early "$dir" --load-model-early "$WORK/m64" --digest ||
            { cat "$WORK/o"; fail "$1, $2, $dir: the job failed"; }
        grep "^rank=0 early_load=CA_ERR" "$WORK/o" | grep -q -- "$says" || { cat "$WORK/o"; fail "$1, $2, $dir: rank 0 does not say '$says'"; }
        grep "^rank=1 early_load=CA_ERR" "$WORK/o" | grep -q "rank 0 failed" || { cat "$WORK/o"; fail "$1, $2, $dir: rank 1 does not name rank 0"; }
        count 2 "meta_params=4 of 4" "$WORK/o"
        [ "$(digest_of 0 "$WORK/o")" = "$(cat "$WORK/saved")" ] && [ "$(digest_of 1 "$WORK/o")" = "$(cat "$WORK/saved")" ] ||
            { cat "$WORK/o"; fail "$1, $2, $dir: the correct load after the failed one gives other parameters"; }
        echo "$1, $2: $(basename "$dir") refused on both ranks, the model still meta; the correct load then succeeds"
    done
}

# stalled BACKEND HOW CFG: rank 1 held before the 2nd broadcast of the meta load, then killed or stopped
stalled() {
    stall_pair "$1" "$2" "^rank=0 meta_params=" --hidden 64 --meta --try-load-early "$WORK/m64" --leave
    what="$1, $2, $3"   # after stall_pair: wait_lines sets what
    [ "$1" = mpi ] || [ $rc = 3 ] || fail "$what: rank 0 ended with status $rc, not the failed load's 3"
    line=$(grep "^rank=0 early_load=" "$WORK/r0")
    echo "$line" | grep -q "^rank=0 early_load=CA_ERR" || fail "$what: rank 0's load did not fail"
    echo "$line" | grep -q "rank 1" || fail "$what: rank 0's error does not name rank 1"
    echo "$line" | grep -q "rank 0's model is as it was before the load (restored)" || fail "$what: rank 0 does not say restored"
    count 1 "^rank=0 meta_params=4 of 4" "$WORK/r0"
    echo "$what: rank 0's model is meta again"
}

for cfg in ddp zero2; do
    if [ $cfg = zero2 ]; then export ACCELERATE_USE_DEEPSPEED=true ACCELERATE_DEEPSPEED_ZERO_STAGE=2; fi
    refused gloo $cfg
    stalled gloo kill $cfg
    stalled gloo stop $cfg
done
unset ACCELERATE_USE_DEEPSPEED ACCELERATE_DEEPSPEED_ZERO_STAGE
if [ $has_mpi = yes ]; then
    refused mpi ddp
    stalled mpi stop ddp
else
    echo "no mpirun or MPI backend: the MPI part is not run"
fi
echo "PASS"
