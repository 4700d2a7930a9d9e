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
# nosums FILE: complete.json FILE as a caccel before chunk sums wrote it: each file's size and whole CRC-32
# only ("chunk_size" and the "chunk_crc32" list dropped)
nosums() {
    awk '/"chunk_size":/ { sub(/,$/, "", prev); skip = 1; next }
         skip { if ($0 ~ /^ *\]/) skip = 0; next }
         { if (have) print prev; prev = $0; have = 1 }
         END { if (have) print prev }' "$1" > "$1.new" && mv "$1.new" "$1"
    ! grep -q chunk "$1" || fail "$1: chunk sums left"
}
# corrupt FILE: one byte changed at 3/5 of FILE
corrupt() { printf '\377' | dd of="$1" bs=1 seek=$(( $(wc -c < "$1") * 3 / 5 )) conv=notrunc 2>/dev/null; }
# field RANK NAME FILE: the values rank RANK printed as NAME=...
field() { sed -n "s/^rank=$1 $2=\([0-9a-f]*\).*/\1/p" "$3"; }
# refused NP PATTERN FILE: each of the NP ranks printed a refused load_state matching PATTERN, and its state
# digest before and after it, the same (--try-load-state)
refused() {
    count "$1" "load_state=CA_ERR_IO: .*$2" "$3"
    for r in $(seq 0 $(($1 - 1))); do
        [ "$(field "$r" state_fnv "$3" | sort -u | wc -l)" = 1 ] && [ "$(field "$r" state_fnv "$3" | wc -l)" = 2 ] ||
            { cat "$3"; fail "$case: rank $r's state changed in the refused load"; }
    done
}
