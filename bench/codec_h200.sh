#!/usr/bin/env bash
# codec_h200.sh - the codec's GPU run in one call on the borrowed H200 (results in $OUT):
#
#   bash bench/codec_h200.sh [SOURCE.tar]
#
#   1. build dependencies from .deps/ when the image lacks them (as bench/gpu_suite.sh does)
#   2. build (Release, CUDA, nvcc -> embedded PTX) from SOURCE.tar (a `git archive` of the
#      commit under test) or from the working tree
#   3. test_gpu_codec: bit-identical to the C reference, corruption, batches, throughput on
#      in-process Gaussian BF16 (64, 256, 1024 MiB; 4/8/16 warps per thread block) and of a
#      Flux double block's 32 tensors (one launch each, the session's batches, one launch)
#   4. compute-sanitizer memcheck on test_gpu_codec (its correctness tests)
#   5. ddo synth --values normal of the full Flux.1-dev layout, its coded ratio
#      (test_gpu_codec --ratio) and the throughput on its BF16 tensors
# Every step has a time limit inside one deadline (CODEC_BUDGET_S, default 320 s).
set -u
ROOT=$(pwd)
OUT=${OUT:-$ROOT/codec-out}
mkdir -p "$OUT"
BUDGET=${CODEC_BUDGET_S:-320}
START=$(date +%s)
LOG=$OUT/run.log
: >"$LOG"
say() { echo "[$(($(date +%s) - START))s] $*" | tee -a "$LOG"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }
step() { # step NAME SECONDS LOGFILE CMD...
    local name=$1 want=$2 logf=$3 t
    shift 3
    t=$(left)
    [ "$want" -lt "$t" ] && t=$want
    if [ "$t" -lt 5 ]; then say "SKIPPED $name (budget spent)"; return 125; fi
    say "run $name (limit ${t}s)"
    timeout --kill-after=5 "$t" "$@" >>"$logf" 2>&1
    local rc=$?
    say "$([ $rc -eq 0 ] && echo ok || echo "FAILED rc=$rc") $name"
    return $rc
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; nproc; free -g; } >>"$LOG" 2>&1
D=/tmp/ddo-deps
if ! pkg-config --exists jansson libpcre2-8 2>/dev/null && ls "$ROOT"/.deps/*.deb >/dev/null 2>&1; then
    mkdir -p $D
    for f in "$ROOT"/.deps/*.deb; do dpkg -x "$f" $D; done
    for pc in $D/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do sed -i "s|^prefix=/usr|prefix=$D/usr|" "$pc"; done
    export PATH="$PATH:$D/usr/bin"
    export PKG_CONFIG_PATH="$D/usr/lib/x86_64-linux-gnu/pkgconfig:$D/usr/lib/pkgconfig:$D/usr/share/pkgconfig"
    export CMAKE_PREFIX_PATH="$D/usr" C_INCLUDE_PATH="$D/usr/include:$D/usr/include/x86_64-linux-gnu"
    export LIBRARY_PATH="$D/usr/lib/x86_64-linux-gnu" LD_LIBRARY_PATH="$D/usr/lib/x86_64-linux-gnu"
    say "unpacked .deps into $D"
fi

SRC=$ROOT
if [ -n "${1:-}" ] && [ -f "$1" ]; then
    SRC=/tmp/ddo-src
    mkdir -p $SRC && tar -xf "$1" -C $SRC
fi
B=/tmp/ddo-build
GEN=""
command -v ninja >/dev/null && GEN="-G Ninja"
step configure 60 "$OUT/build.log" cmake -S $SRC -B $B $GEN -DCMAKE_BUILD_TYPE=Release -DDDO_CUDA=ON ||
    { say "STOP"; exit 1; }
step build 150 "$OUT/build.log" cmake --build $B -j "$(nproc)" --target ddo_tool test_gpu_codec test_codec ||
    { say "STOP"; tail -30 "$OUT/build.log"; exit 1; }
cp $B/codec_decode.ptx "$OUT/" 2>/dev/null

export DDO_CODEC_BENCH_MIB=1024
step "test_gpu_codec (Gaussian)" 120 "$OUT/gpu_codec.log" $B/test_gpu_codec
step "test_codec" 30 "$OUT/gpu_codec.log" $B/test_codec
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
[ -n "$SAN" ] && DDO_CODEC_BENCH_MIB=0 step "compute-sanitizer memcheck" 70 "$OUT/sanitizer.log" \
    "$SAN" --tool memcheck --error-exitcode 1 $B/test_gpu_codec

CK=/tmp/flux1-dev-normal.safetensors
if step "synth flux1-dev --values normal" 90 "$LOG" $B/ddo synth --layout $SRC/data/layouts/flux1-dev.json \
    --out $CK --values normal; then
    step "ratio (full layout)" 60 "$OUT/ratio.log" $B/test_gpu_codec --ratio $CK
    DDO_CODEC_BENCH_CHECKPOINT=$CK step "test_gpu_codec (synth BF16)" 60 "$OUT/gpu_codec_synth.log" \
        $B/test_gpu_codec
fi
say "done"
{
    echo "== summary =="
    grep -E '^\[[0-9]+s\] (ok|FAILED|SKIPPED|STOP)' "$LOG"
    for f in gpu_codec.log gpu_codec_synth.log; do
        [ -f "$OUT/$f" ] && { echo "-- $f"; grep -E "throughput|batch|MiB|^ +[0-9]+ |^(one|session) |passed|FAILED|check failed" "$OUT/$f"; }
    done
    [ -f "$OUT/ratio.log" ] && { echo "-- ratio"; cat "$OUT/ratio.log"; }
    [ -f "$OUT/sanitizer.log" ] && { echo "-- sanitizer"; tail -3 "$OUT/sanitizer.log"; }
} | tee "$OUT/summary.txt"
