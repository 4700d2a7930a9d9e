#!/bin/sh
# A full state dict loaded under ZeRO (stage 2, 2 ranks over caccel launch): complete.json's chunk
# sums let each rank verify and read only its slice of the optimizer state (the bytes it hashed stay
# under 3/4 of the file and the resident pages of its mapping under 7/8, from CACCEL_TEST_ST_REPORT, where
# reading the file whole gives all of it), with pread (under 3/4 of the file read, its mapping holding
# under a quarter: the header); resumed == uninterrupted; a corrupt chunk inside one
# rank's slice fails that rank's check, named, and the load on every rank; a checkpoint without
# chunk sums (written before them) still loads, verified whole; a chunk list of the wrong length is
# refused by name. A sharded state dict (SHARDED_STATE_DICT, 2 ranks): each rank verifies its own
# zero_shard file whole and of the other's under half (header and params); a corrupt chunk in one
# rank's optimizer state is named by that rank only, one in params by both.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
FM="$BUILD/examples/fashion_mnist"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true
LAUNCH_FLAGS=""   # ACCELERATE_USE_CPU chooses the device
train_backends
be=$(echo "$backends" | awk '{print $1}')
export CACCEL_TEST_ST_CHUNK=4096   # chunks far smaller than the optimizer tensors (~800 kB)
zfm() { launch 2 "$be" --use_deepspeed --zero_stage 2 "$FM" --batch-size 128 --epochs 1 "$@"; }

# report FILE NAME: the "V S R" (verified, size, resident) of each rank's NAME in FILE's report lines
report() { sed -n "s|^.*safetensors: .*/$2: \([0-9]*\) of \([0-9]*\) bytes verified, \(-*[0-9]*\) resident.*|\1 \2 \3|p" "$1"; }
# preads FILE NAME: the "P S R" (bytes read by pread, size, resident) of each rank's NAME
preads() { sed -n "s|^.*safetensors: .*/$2: [0-9]* of \([0-9]*\) bytes verified, \(-*[0-9]*\) resident, \([0-9]*\) read$|\3 \1 \2|p" "$1"; }
# flip FILE OFFSET: one byte changed
flip() {
    b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
    printf "\\$(printf '%03o' $(( (b + 1) % 256 )))" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null
}

note "resume from a full state dict: each rank verifies and maps only its slice of optimizer.safetensors"
zfm --max-steps 4 --dump-params "$WORK/full.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "uninterrupted"; }
zfm --max-steps 2 --checkpointing_steps 2 --checkpoint_dir "$WORK/ck" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "save"; }
CK="$WORK/ck/checkpoints/checkpoint_0"
grep -q '"chunk_crc32"' "$CK/complete.json" || fail "complete.json has no chunk sums"
cp -r "$WORK/ck" "$WORK/pristine"
CACCEL_TEST_ST_REPORT=1 zfm --max-steps 4 --checkpoint_dir "$WORK/ck" --resume --dump-params "$WORK/res.bin" > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "resume"; }
cmp "$WORK/full.bin" "$WORK/res.bin" || fail "resumed differs from the uninterrupted run"
report "$WORK/o" optimizer.safetensors > "$WORK/r"
[ "$(wc -l < "$WORK/r")" = 2 ] || { cat "$WORK/o"; fail "not one report per rank for optimizer.safetensors"; }
while read -r v size res; do
    echo "  optimizer.safetensors: $v of $size bytes verified, $res resident"
    [ $((v * 4)) -lt $((size * 3)) ] || fail "a rank verified $v of $size bytes: more than its slice"
    # resident counts whole pages and those the kernel maps around a fault (fault-around, large
    # folios): more than the slice, but well short of the file, which reading it whole maps all of
    [ "$res" -ge 0 ] && [ $((res * 8)) -lt $((size * 7)) ] || fail "a rank's mapping has $res of $size bytes resident"
done < "$WORK/r"
# the slices are read with pread, not through the mapping: a rank reads under 3/4 of the file and its
# mapping holds only the header's pages (and those the kernel maps around them)
preads "$WORK/o" optimizer.safetensors > "$WORK/p"
[ "$(wc -l < "$WORK/p")" = 2 ] || { cat "$WORK/o"; fail "not one pread count per rank for optimizer.safetensors"; }
while read -r p size res; do
    echo "  optimizer.safetensors: $p of $size bytes read by pread, $res resident"
    [ "$p" -gt 0 ] && [ $((p * 4)) -lt $((size * 3)) ] || fail "a rank read $p of $size bytes: not its slice by pread"
    [ $((res * 4)) -lt "$size" ] || fail "a rank's mapping has $res of $size bytes resident: its slice was mapped"
done < "$WORK/p"
report "$WORK/o" model.safetensors | while read -r v size res; do
    [ "$v" = "$size" ] || fail "model.safetensors: $v of $size bytes verified: every rank needs it whole"
done || exit 1

note "a corrupt chunk in rank 0's slice: rank 0 names it, rank 1 (which does not read it) does not; nothing loads"
rm -rf "$WORK/ck" && cp -r "$WORK/pristine" "$WORK/ck"
# 40000 bytes into the data: inside state.0.exp_avg (fc1.weight's, first by name), whose first half is rank 0's
hl=$(od -An -tu8 -N8 "$CK/optimizer.safetensors" | tr -d ' ')
flip "$CK/optimizer.safetensors" $((8 + hl + 40000))
zfm --max-steps 4 --checkpoint_dir "$WORK/ck" --resume > "$WORK/o" 2>&1 && { cat "$WORK/o"; fail "a corrupt checkpoint loaded"; }
count 1 'optimizer.safetensors: corrupt: CRC-32 [0-9a-f]* in chunk [0-9]* of [0-9]* (bytes' "$WORK/o"
count 1 'load_state: rank 0 failed (CA_ERR_IO) to load .*nothing was applied (rank 1)' "$WORK/o"
count 1 'corrupt: CRC-32 .*(rank 0)$' "$WORK/o"

note "the same in rank 1's slice (the file's last bytes, fc3.bias's exp_avg_sq): rank 1 names it"
rm -rf "$WORK/ck" && cp -r "$WORK/pristine" "$WORK/ck"
flip "$CK/optimizer.safetensors" $(( $(wc -c < "$CK/optimizer.safetensors") - 2 ))
zfm --max-steps 4 --checkpoint_dir "$WORK/ck" --resume > "$WORK/o" 2>&1 && { cat "$WORK/o"; fail "a corrupt checkpoint loaded"; }
count 1 'optimizer.safetensors: corrupt: CRC-32 [0-9a-f]* in chunk [0-9]* of [0-9]* (bytes' "$WORK/o"
count 1 'load_state: rank 1 failed (CA_ERR_IO) to load .*nothing was applied (rank 0)' "$WORK/o"
count 1 'corrupt: CRC-32 .*(rank 1)$' "$WORK/o"

note "a complete.json without chunk sums (an older checkpoint): loads, each rank verifying the file whole"
rm -rf "$WORK/ck" && cp -r "$WORK/pristine" "$WORK/ck"
sed -z 's/,[[:space:]]*"chunk_size":[[:space:]]*[0-9]*,[[:space:]]*"chunk_crc32":[[:space:]]*\[[^]]*\]//g' \
    "$CK/complete.json" > "$WORK/c.json" && cp "$WORK/c.json" "$CK/complete.json"
grep -q chunk "$CK/complete.json" && fail "the chunk sums were not removed"
CACCEL_TEST_ST_REPORT=1 zfm --max-steps 4 --checkpoint_dir "$WORK/ck" --resume --dump-params "$WORK/res2.bin" > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "resume without chunk sums"; }
cmp "$WORK/full.bin" "$WORK/res2.bin" || fail "resumed (no chunk sums) differs from the uninterrupted run"
report "$WORK/o" optimizer.safetensors > "$WORK/r"
[ "$(wc -l < "$WORK/r")" = 2 ] || { cat "$WORK/o"; fail "not one report per rank"; }
while read -r v size res; do [ "$v" = "$size" ] || fail "verified $v of $size bytes without chunk sums"; done < "$WORK/r"
note "a chunk list one CRC short: refused, naming complete.json and the file"
rm -rf "$WORK/ck" && cp -r "$WORK/pristine" "$WORK/ck"
sed -z 's/"chunk_crc32":[[:space:]]*\[[[:space:]]*[0-9]*,/"chunk_crc32": [/' "$CK/complete.json" > "$WORK/c.json" && cp "$WORK/c.json" "$CK/complete.json"
zfm --max-steps 4 --checkpoint_dir "$WORK/ck" --resume > "$WORK/o" 2>&1 && { cat "$WORK/o"; fail "a short chunk list loaded"; }
grep -q 'complete.json: [a-z_]*\.safetensors: "chunk_size" is not a positive integer or "chunk_crc32" is not a list of one CRC-32 per chunk' "$WORK/o" ||
    { cat "$WORK/o"; fail "no message naming complete.json and the file"; }

# A sharded state dict (FSDP SHARDED_STATE_DICT, SHARD_GRAD_OP, 2 ranks): each rank reads every shard
# file's params (it holds the parameters whole at a load) but of the optimizer state only the slices
# in its own shard, so of the other rank's zero_shard_<r>.safetensors it verifies params and the
# header, under half of the file, and its own whole.
zsh() { FSDP_STATE_DICT_TYPE=SHARDED_STATE_DICT launch 2 "$be" --use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP \
            "$FM" --batch-size 128 --epochs 1 "$@"; }
note "a sharded state dict: each rank verifies its own shard file whole, of the other's the params only"
zsh --max-steps 2 --checkpointing_steps 2 --checkpoint_dir "$WORK/sck" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "sharded: save"; }
CK="$WORK/sck/checkpoints/checkpoint_0"
[ -e "$CK/zero_shard_1.safetensors" ] || { ls "$CK"; fail "not a sharded checkpoint"; }
cp -r "$WORK/sck" "$WORK/spristine"
# (that the slices land where they belong: tests/test_reshard.sh, bit for bit at every size)
CACCEL_TEST_ST_REPORT=1 zsh --max-steps 4 --checkpoint_dir "$WORK/sck" --resume > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "sharded: resume"; }
for r in 0 1; do
    # one report line per rank: the one that verified the file whole is its owner
    report "$WORK/o" "zero_shard_$r.safetensors" > "$WORK/r"
    [ "$(wc -l < "$WORK/r")" = 2 ] || { cat "$WORK/o"; fail "not one report per rank for zero_shard_$r.safetensors"; }
    whole=0 part=0
    while read -r v size res; do
        echo "  zero_shard_$r.safetensors: $v of $size bytes verified"
        if [ "$v" = "$size" ]; then whole=$((whole + 1)); elif [ $((v * 2)) -lt "$size" ]; then part=$((part + 1)); fi
    done < "$WORK/r"
    [ "$whole" = 1 ] && [ "$part" = 1 ] || fail "zero_shard_$r.safetensors: not verified whole by one rank and under half by the other"
done

note "a corrupt chunk in zero_shard_1's optimizer state: rank 1 names it, rank 0 (which does not read it) does not"
rm -rf "$WORK/sck" && cp -r "$WORK/spristine" "$WORK/sck"
flip "$CK/zero_shard_1.safetensors" $(( $(wc -c < "$CK/zero_shard_1.safetensors") - 2 ))   # state2's last bytes
zsh --max-steps 4 --checkpoint_dir "$WORK/sck" --resume > "$WORK/o" 2>&1 && { cat "$WORK/o"; fail "a corrupt shard loaded"; }
count 1 'zero_shard_1.safetensors: corrupt: CRC-32 [0-9a-f]* in chunk [0-9]* of [0-9]* (bytes' "$WORK/o"
count 1 'corrupt: CRC-32 .*(rank 1)$' "$WORK/o"
count 1 'load_state: rank 1 failed (CA_ERR_IO) to load .*nothing was applied (rank 0)' "$WORK/o"

note "a corrupt chunk in zero_shard_1's params: every rank reads them, both name it"
rm -rf "$WORK/sck" && cp -r "$WORK/spristine" "$WORK/sck"
hl=$(od -An -tu8 -N8 "$CK/zero_shard_1.safetensors" | tr -d ' ')
flip "$CK/zero_shard_1.safetensors" $((8 + hl + 100))   # params comes first by name
zsh --max-steps 4 --checkpoint_dir "$WORK/sck" --resume > "$WORK/o" 2>&1 && { cat "$WORK/o"; fail "a corrupt shard loaded"; }
count 2 'zero_shard_1.safetensors: corrupt: CRC-32 [0-9a-f]* in chunk [0-9]* of [0-9]* (bytes' "$WORK/o"
echo "PASS"
