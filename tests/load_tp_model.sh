# load_tp_model.sh: sourced by the tests of loads under tensor parallelism (after tests/dist/lib.sh):
# tests/ddp_check's MLP (--tp-plan --hidden $H --depth 2: fc1 colwise, h0 rowwise, h1 colwise, fc2
# rowwise) on the CPU over the backends built ($backends), its element counts, and the digest of the
# model a run printed.
need_caccel
DDP="$BUILD/tests/ddp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true
LAUNCH_FLAGS=""   # ACCELERATE_USE_CPU chooses the device
train_backends
H=256
# the model's f32 elements: split over tp (fc1 8H + H, h0 H*H, h1 H*H + H, fc2 3H) and replicated (h0's
# and fc2's biases: a rowwise layer's bias is whole)
split=$((8 * H + H + H * H + H * H + H + 3 * H)) repl=$((H + 3)) tensors=8
# digest FILE: the parameters' digests the ranks printed, each once
digest() { sed -n 's/^rank=[0-9]* params_fnv=\([0-9a-f]*\).*/\1/p' "$1" | sort -u; }
