#!/usr/bin/env bash
# gpu_suite.sh - the whole GPU suite of ddo in one call, for the borrowed H200:
#
#   bash bench/gpu_suite.sh          (from the repository root; results go to $OUT)
#
#   1. preflight: nvidia-smi, the build dependencies, cuBLASLt, compute-sanitizer
#   2. build with CUDA (Release, -DDDO_CUDA=ON) into build-gpu/
#   3. ctest -L gpu (and the no-driver unit test)
#   4. compute-sanitizer (memcheck) on tests/test_gpu_device
#   5. ddo synth: the full-size flux1-dev layout (22.17 GiB BF16)
#   6. warm the page cache with the checkpoint
#   7. ddo bench, --tokens 4608: resident run, then the cases of issue 6
#      (zero resident VMM route with everything retained and registered; a 16 GiB
#      device budget; an 8 GiB retained store with the rest read from the file with
#      io_uring), JSON and a Chrome trace of 2 steps per case
#   8. the summary table, printed last
#
# Every command runs under `timeout` inside one global deadline (SUITE_BUDGET_S, default
# 530 s) so the script ends in under 9 minutes. A failed build, synth or preflight stops
# the script at once with a clear message; failed tests are recorded and the benchmark
# still runs (device time is scarce), and the exit status is 1.
#
# $OUT receives at most 8 files: suite.log build.log ctest.log (with the sanitizer's
# output) doctor.txt bench.log bench.json trace.json summary.txt.
#
# Knobs (environment): TORCH=1 (the Python binding's tests and bench/torch_flux.py, after the
# GPU tests; TORCH_ONLY=1 stops there, after a `ddo demo`; TORCH_ARGS: its arguments, default
# --all, "none" for the tests alone), PIPE_ARGS (bench/flux_pipeline.py, the whole Diffusers
# FluxPipeline in 8 GiB, with these arguments, e.g. --all, after its --tiny smoke test unless
# PIPE_SMOKE=0; the suite stops after it; results pipe.log flux_pipeline_tiny.json
# flux_pipeline.json; the full run is skipped when the smoke test's resident case failed; do
# not combine with TORCH=1, which adds two files to the eight),
# LOWRAM=1 (issue 28: bench/lowram.py, larger than RAM, then the suite stops; section 2c;
# LOWRAM_MODEL: its --model, wan (default: Wan 2.1 14B, 12 GiB) or qwen (Qwen-Image, 16 GiB);
# LOWRAM_ARGS: more of its arguments, e.g. "--cases sidecar-build,sidecar,auto --previous F"),
# CODEC=1 (issue 13: the weight codec on the full-size layout, then the suite stops; see
# section 2b; results suite.log build.log ctest.log bench.log bench.json trace.json
# summary.txt), SUITE_BUDGET_S, BENCH_STEPS (5), BENCH_TOKENS (4608), SYNTH_SCALE (1), LAYOUT
# (data/layouts/flux1-dev.json), WORK (build-gpu/work: the synthetic checkpoint),
# BENCH_CASES (the bench's cases kept, by name: e.g. "vmm-zero budget-16g"), SKIP_SANITIZER=1,
# SKIP_TESTS=1, SKIP_PROFILE=1 (no profile build), DEPS_DIR (.deps: *.deb build dependencies to unpack
# into /tmp/ddo-deps when the image lacks them; see docs/cuda.md).
set -u
ROOT=$(pwd)
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
BUILD=$ROOT/build-gpu
WORK=${WORK:-$BUILD/work}
LAYOUT=${LAYOUT:-$ROOT/data/layouts/flux1-dev.json}
STEPS=${BENCH_STEPS:-5}
TOKENS=${BENCH_TOKENS:-4608}
BUDGET=${SUITE_BUDGET_S:-530}
START=$(date +%s)
LOG=$OUT/suite.log
STATUS=0
: >"$LOG"

say() { echo "[$(($(date +%s) - START))s] $*" | tee -a "$LOG"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }
# limit WANTED: the seconds a step may take, capped by what is left of the budget
limit() {
    local l
    l=$(left)
    l=$((l - 15))
    [ "$1" -lt "$l" ] && l=$1
    echo "$l"
}
stop() {
    say "STOP: $*"
    summary
    exit 1
}
summary() {
    {
        echo "== ddo GPU suite summary ($(($(date +%s) - START)) s) =="
        grep -E '^\[[0-9]+s\] (ok|FAILED|SKIPPED|STOP)' "$LOG"
        if [ -s "$OUT/bench.log" ]; then
            echo
            sed -n '/^bus .* GB\/s/,$p' "$OUT/bench.log"
        fi
    } >"$OUT/summary.txt"
    echo
    cat "$OUT/summary.txt"
}
# step NAME WANTED_SECONDS LOGFILE CMD...: runs CMD with a time limit, output appended to
# LOGFILE; returns CMD's status (124 on timeout)
step() {
    local name=$1 want=$2 logf=$3
    shift 3
    local t
    t=$(limit "$want")
    if [ "$t" -lt 10 ]; then
        say "SKIPPED $name: the suite's time budget is spent"
        return 125
    fi
    say "run $name (limit ${t}s)"
    local s0 rc
    s0=$(date +%s)
    timeout --kill-after=10 "$t" "$@" >>"$logf" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
        say "ok $name ($(($(date +%s) - s0)) s)"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        say "FAILED $name: timed out after ${t}s (see $(basename "$logf"))"
    else
        say "FAILED $name: exit $rc (see $(basename "$logf"))"
    fi
    return $rc
}

# ---- 1. preflight -------------------------------------------------------------------
say "ddo GPU suite in $ROOT, results in $OUT"
{
    nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version --format=csv 2>&1
    uname -a
    nproc
    free -g
    df -h "$ROOT" | tail -1
} >>"$LOG" 2>&1
nvidia-smi -L >/dev/null 2>&1 || stop "nvidia-smi sees no GPU"

DEPS_DIR=${DEPS_DIR:-$ROOT/.deps}
missing=""
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
for p in jansson libpcre2-8 liburing; do pkg-config --exists "$p" 2>/dev/null || missing="$missing $p"; done
[ -e /usr/include/openssl/sha.h ] || missing="$missing openssl"
if [ -n "$missing" ] && ls "$DEPS_DIR"/*.deb >/dev/null 2>&1; then
    say "build dependencies missing ($missing); unpacking $DEPS_DIR/*.deb into /tmp/ddo-deps"
    mkdir -p /tmp/ddo-deps
    for f in "$DEPS_DIR"/*.deb; do dpkg -x "$f" /tmp/ddo-deps; done
    D=/tmp/ddo-deps
    export PATH="$PATH:$D/usr/bin"
    export PKG_CONFIG_PATH="$D/usr/lib/x86_64-linux-gnu/pkgconfig:$D/usr/lib/pkgconfig:$D/usr/share/pkgconfig:${PKG_CONFIG_PATH:-}"
    export PKG_CONFIG_SYSROOT_DIR=""
    export CMAKE_PREFIX_PATH="$D/usr:${CMAKE_PREFIX_PATH:-}"
    export C_INCLUDE_PATH="$D/usr/include:$D/usr/include/x86_64-linux-gnu:${C_INCLUDE_PATH:-}"
    export LIBRARY_PATH="$D/usr/lib/x86_64-linux-gnu:${LIBRARY_PATH:-}"
    export LD_LIBRARY_PATH="$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
    # .pc files name /usr; point them at the unpacked tree
    for pc in "$D"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
        [ -f "$pc" ] && sed -i "s|^prefix=/usr|prefix=$D/usr|" "$pc"
    done
    missing=""
    command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
    for p in jansson libpcre2-8; do pkg-config --exists "$p" 2>/dev/null || missing="$missing $p"; done
    [ -e /usr/include/openssl/sha.h ] || [ -e "$D/usr/include/openssl/sha.h" ] || missing="$missing openssl"
fi
[ -z "$missing" ] || stop "build dependencies missing:$missing (carry their .deb files in .deps/: see docs/cuda.md)"

for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
if ! ldconfig -p 2>/dev/null | grep -q libcublasLt.so && ! ls /usr/local/cuda/lib64/libcublasLt.so* >/dev/null 2>&1; then
    # the pip wheel nvidia-cublas carries it
    lt=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$lt" ] && [ -d "$lt" ] && export LD_LIBRARY_PATH="$lt:${LD_LIBRARY_PATH:-}"
fi
say "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)

# ---- 2. build -----------------------------------------------------------------------
GEN=""
command -v ninja >/dev/null && GEN="-G Ninja"
step "configure" 60 "$OUT/build.log" cmake -S "$ROOT" -B "$BUILD" $GEN -DCMAKE_BUILD_TYPE=Release \
    -DDDO_CUDA=ON || stop "cmake configure failed: see build.log"
step "build" 240 "$OUT/build.log" cmake --build "$BUILD" -j "$(nproc)" || stop "build failed: see build.log"
DDO=$BUILD/ddo
[ -x "$DDO" ] || stop "no ddo binary in $BUILD"

# ---- 2b. the weight codec (CODEC=1; the suite stops after it) ------------------------------
# The full-size layout with trained-like values (ddo synth --values normal, on every core),
# in the page cache; test_gpu_codec (bit-identical to the C reference, corruption, the
# decoder's throughput, also on this checkpoint's BF16 tensors); ddo inspect --codec --verify
# (the ratio per dtype and block group, every stream decoded on the host and compared); ddo
# bench --steps 4 with zero resident weights and a 16 GiB device budget, each raw and with
# --ddo-weight-codec ddoc1 (the codec table: coded bytes per step, the step against the raw
# and the coded bus bound), the trace of the coded zero-resident case's steps. CODEC_WORKERS (16): pin_cpu_workers of every case (the
# encoder's threads at setup). Files: suite.log build.log ctest.log bench.log (inspect's
# table first) bench.json trace.json summary.txt.
if [ "${CODEC:-0}" = 1 ]; then
    mkdir -p "$WORK"
    CK=$WORK/flux1-dev-normal.safetensors
    step "synth $(basename "$LAYOUT") --values normal" 240 "$LOG" "$DDO" synth --layout "$LAYOUT" \
        --out "$CK" --scale "${SYNTH_SCALE:-1}" --values normal || stop "ddo synth failed"
    ls -l "$CK" >>"$LOG"
    step "warm page cache" 60 "$LOG" dd if="$CK" of=/dev/null bs=16M || say "FAILED to warm the page cache (continuing)"
    if [ -x "$BUILD/test_gpu_codec" ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
        DDO_CODEC_BENCH_MIB=1024 step "test_gpu_codec" 90 "$OUT/ctest.log" "$BUILD/test_gpu_codec" || STATUS=1
        DDO_CODEC_BENCH_CHECKPOINT=$CK step "test_gpu_codec (checkpoint BF16)" 90 "$OUT/ctest.log" \
            "$BUILD/test_gpu_codec" || STATUS=1
    else
        say "SKIPPED test_gpu_codec: not built (or SKIP_TESTS=1)"
    fi
    step "ddo inspect --codec --verify" 120 "$OUT/bench.log" "$DDO" inspect --codec --verify "$CK" || STATUS=1
    CW=${CODEC_WORKERS:-16}
    VMM="--ddo-backend vmm --ddo-preset auto --ddo-pin-cpu-workers $CW"
    NONE="--ddo-always-resident-module-patterns ^\$ --ddo-small-tensor-threshold-kb 0 --ddo-resident-module-budget-gb 0"
    ZERO="$VMM $NONE --ddo-vmm-resident-weight-budget-gb 4 --ddo-vmm-source-cache-gb 24 --ddo-pin-cpu-memory 1"
    # 16 GiB: 14 GiB of blocks resident raw; coded, 13.25 (the two 256 MiB decode areas must fit).
    B16="$VMM --ddo-vmm-resident-weight-budget-gb 16 --ddo-always-resident-module-patterns ^(time_text_embed|context_embedder|x_embedder|norm_out|proj_out)(\\.|\$) --ddo-resident-module-patterns auto --ddo-vmm-source-cache-gb 24 --ddo-pin-cpu-memory 1"
    # The first coded case codes at setup and writes the sidecar; the later ones read it.
    SIDECAR=$WORK/codec-sidecar
    rm -rf "$SIDECAR" && mkdir -p "$SIDECAR"
    step "ddo bench (codec)" "$(($(left) - 30))" "$OUT/bench.log" "$DDO" bench "$CK" --tokens "$TOKENS" \
        --steps "${BENCH_STEPS:-4}" --trace-steps 0 --bus-gib 4 --direct-gib 0 \
        --case "vmm-zero $ZERO" \
        --case "codec-zero $ZERO --ddo-weight-codec ddoc1 --ddo-weight-codec-cache-dir $SIDECAR --trace-steps 1" \
        --case "codec-zero-sidecar $ZERO --ddo-weight-codec ddoc1 --ddo-weight-codec-cache-dir $SIDECAR" \
        --case "budget-16g $B16 --ddo-resident-module-budget-gb 14" \
        --case "codec-16g $B16 --ddo-resident-module-budget-gb 13.25 --ddo-weight-codec ddoc1 --ddo-weight-codec-cache-dir $SIDECAR" \
        --json "$OUT/bench.json" --trace "$OUT/trace.json" || STATUS=1
    rm -rf "$CK" "$SIDECAR"
    [ $STATUS -eq 0 ] && say "ok suite" || say "FAILED suite: see the lines above"
    summary
    grep -E "^(DTYPE|BF16|F16|F32|GROUP|transformer|single|\(root\)|total|codec)" "$OUT/bench.log" | head -20
    exit $STATUS
fi

# ---- 2c. larger than RAM (LOWRAM=1; the suite stops after it) -------------------------------
# bench/lowram.py (issue 28): the Wan 2.1 14B transformer layout written to this machine's disk
# (LOWRAM_DIR, default $WORK/lowram), then one `ddo bench` process per case under a 12 GiB host
# limit on an emulated 8 GiB card (LOWRAM_MODEL=qwen: Qwen-Image 20B under 16 GiB), the page
# cache dropped before each where the machine allows and each case in a cgroup of the limit where
# one can be made (both recorded). Files: suite.log build.log lowram.log lowram.json summary.txt.
if [ "${LOWRAM:-0}" = 1 ]; then
    left_s=$(left)
    step "bench/lowram.py" $((left_s - 15)) "$OUT/lowram.log" python3 "$ROOT/bench/lowram.py" \
        --ddo "$DDO" --dir "${LOWRAM_DIR:-$WORK/lowram}" --out "$OUT" --deadline-s $((left_s - 30)) \
        --model "${LOWRAM_MODEL:-wan}" ${LOWRAM_ARGS:-} ||
        STATUS=1
    tail -n 8 "$OUT/lowram.log" | tee -a "$LOG"
    summary
    exit $STATUS
fi

# ---- 3. GPU tests -------------------------------------------------------------------
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    step "ctest -L gpu" 150 "$OUT/ctest.log" ctest --test-dir "$BUILD" -L gpu -R . \
        --output-on-failure --timeout 140 || STATUS=1
    step "ctest no-driver test" 30 "$OUT/ctest.log" ctest --test-dir "$BUILD" -R test_cuda_nodriver \
        --output-on-failure || STATUS=1
    if grep -q "Skipped" "$OUT/ctest.log"; then
        say "FAILED gpu tests skipped: the GPU was not opened (see ctest.log)"
        STATUS=1
    fi
fi

# ---- 4. compute-sanitizer -----------------------------------------------------------
if [ "${SKIP_SANITIZER:-0}" != 1 ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
    if [ -n "$SANITIZER" ]; then
        step "compute-sanitizer memcheck" 150 "$OUT/sanitizer.log" \
            env DDO_GPU_TEST_HEADROOM_MIB=4096 "$SANITIZER" --tool memcheck --leak-check full --report-api-errors no --error-exitcode 1 \
            "$BUILD/test_gpu_device" || STATUS=1
        cat "$OUT/sanitizer.log" >>"$OUT/ctest.log" && rm -f "$OUT/sanitizer.log"
    else
        say "SKIPPED compute-sanitizer: not installed"
    fi
fi

# ---- 4b. the Python binding (TORCH=1; TORCH_ONLY=1 stops after it) -------------------
# Its tests with this machine's torch (cpu-device tests and tests/python/test_cuda.py), then
# bench/torch_flux.py against Diffusers' own offload (the Diffusers source in .devbench/src,
# carried, never committed), each case a fresh process.
if [ "${TORCH:-0}" = 1 ]; then
    export PYTHONPATH="$ROOT/python:$ROOT/.devbench/src:${PYTHONPATH:-}" DDO_LIBRARY="$BUILD/libddo.so" \
        DDO_BIN="$DDO"
    if [ "${SKIP_TESTS:-0}" != 1 ]; then
        step "python binding tests" 150 "$OUT/torch.log" python3 -m pytest -q -p no:cacheprovider \
            "$ROOT/tests/python" || STATUS=1
    else
        say "SKIPPED python binding tests (SKIP_TESTS=1)"
    fi
    if [ "${TORCH_ARGS:-}" != none ]; then
        left_s=$(($(left) - 25))
        step "torch_flux.py" "$left_s" "$OUT/torch.log" python3 "$ROOT/bench/torch_flux.py" \
            ${TORCH_ARGS:---all} --deadline-s $((left_s - 20)) --workdir "$BUILD/torch_flux" \
            --out "$OUT/torch_flux.json" || STATUS=1
    fi
    if [ "${TORCH_ONLY:-0}" = 1 ]; then
        step "ddo demo" 90 "$LOG" "$DDO" demo || STATUS=1
        [ $STATUS -eq 0 ] && say "ok suite" || say "FAILED suite: see the lines above"
        summary
        tail -n 40 "$OUT/torch.log"
        exit $STATUS
    fi
fi

# ---- 4c. the whole Diffusers pipeline in 8 GiB (PIPE_ARGS; the suite stops after it) ------
# bench/flux_pipeline.py: a Diffusers FluxPipeline with Flux.1-dev's configurations and random
# weights; ddo phase-staged against Diffusers' offload modes, each case a fresh process. First
# its --tiny smoke test (every code path at toy size), then the cases of PIPE_ARGS in what is
# left of the budget.
if [ -n "${PIPE_ARGS:-}" ]; then
    export PYTHONPATH="$ROOT/python:$ROOT/.devbench/src:${PYTHONPATH:-}" DDO_LIBRARY="$BUILD/libddo.so" \
        DDO_BIN="$DDO"
    if [ "${PIPE_SMOKE:-1}" = 1 ]; then
        step "flux_pipeline.py --tiny" 150 "$OUT/pipe.log" python3 "$ROOT/bench/flux_pipeline.py" \
            --all --tiny --in-process --deadline-s 130 --min-case-s 10 \
            --workdir "$BUILD/flux_pipeline_tiny" --out "$OUT/flux_pipeline_tiny.json" || STATUS=1
    fi
    # A smoke test whose resident case failed (imports, the pipeline itself) would fail every
    # full-size case the same way, a minute each: then the full run is skipped.
    if [ "${PIPE_SMOKE:-1}" = 1 ] && ! python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["cases"].get("resident", {})
sys.exit(0 if r.get("total_s") is not None and "error" not in r else 1)' \
        "$OUT/flux_pipeline_tiny.json" >>"$OUT/pipe.log" 2>&1; then
        say "SKIPPED flux_pipeline.py: the smoke test's resident case failed (see pipe.log)"
        STATUS=1
    else
        left_s=$(($(left) - 25))
        step "flux_pipeline.py" "$left_s" "$OUT/pipe.log" python3 "$ROOT/bench/flux_pipeline.py" \
            $PIPE_ARGS --deadline-s $((left_s - 20)) --workdir "$BUILD/flux_pipeline" \
            --out "$OUT/flux_pipeline.json" || STATUS=1
    fi
    [ $STATUS -eq 0 ] && say "ok suite" || say "FAILED suite: see the lines above"
    summary
    tail -n 70 "$OUT/pipe.log"
    exit $STATUS
fi

# ---- 5. the full-size checkpoint ----------------------------------------------------
mkdir -p "$WORK"
CK=$WORK/flux1-dev.safetensors
step "synth $(basename "$LAYOUT")" 180 "$LOG" "$DDO" synth --layout "$LAYOUT" --out "$CK" \
    --scale "${SYNTH_SCALE:-1}" ||
    stop "ddo synth failed"
ls -l "$CK" >>"$LOG"

# ---- 6. page cache ------------------------------------------------------------------
step "warm page cache" 60 "$LOG" dd if="$CK" of=/dev/null bs=16M || say "FAILED to warm the page cache (continuing)"

step "ddo doctor" 60 "$OUT/doctor.txt" "$DDO" doctor "$CK" || say "FAILED ddo doctor (continuing)"
step "ddo demo" 90 "$LOG" "$DDO" demo || STATUS=1
# A named capacity profile: calibrate on the full model (zero resident), then apply it.
export DDO_PROFILE_DIR=$WORK/profiles
[ "${SKIP_PROFILE:-0}" = 1 ] || step "ddo profile build" 120 "$LOG" "$DDO" profile build flux-4608 "$CK" --ddo-backend vmm \
    --ddo-preset auto --ddo-vmm-resident-weight-budget-gb 4 --ddo-vmm-source-cache-gb 24 \
    --ddo-pin-cpu-memory 1 --ddo-pin-cpu-workers 8 --steps 2 --tokens "$TOKENS" || STATUS=1
[ "${SKIP_PROFILE:-0}" = 1 ] || step "ddo profile list" 20 "$LOG" "$DDO" profile list || STATUS=1

# ---- 7. the benchmark ---------------------------------------------------------------
VMM="--ddo-backend vmm --ddo-preset auto --ddo-pin-cpu-workers 8"
NONE="--ddo-always-resident-module-patterns ^\$ --ddo-small-tensor-threshold-kb 0 --ddo-resident-module-budget-gb 0"
CASES=(
    "vmm-zero $VMM $NONE --ddo-vmm-resident-weight-budget-gb 4 --ddo-vmm-source-cache-gb 24 --ddo-pin-cpu-memory 1"
    "vmm-zero-4 $VMM $NONE --ddo-execution-slots 4 --ddo-vmm-resident-weight-budget-gb 4 --ddo-vmm-source-cache-gb 24 --ddo-pin-cpu-memory 1"
    "budget-16g $VMM --ddo-vmm-resident-weight-budget-gb 16 --ddo-always-resident-module-patterns ^(time_text_embed|context_embedder|x_embedder|norm_out|proj_out)(\\.|\$) --ddo-resident-module-patterns auto --ddo-resident-module-budget-gb 14 --ddo-vmm-source-cache-gb 24 --ddo-pin-cpu-memory 1"
    "linear-zero --ddo-backend linear --ddo-preset one_shot_fast --ddo-auto-budget-policy off $NONE --steps 3 --trace-steps 0"
    "nvme-4g --ddo-backend vmm --ddo-preset nvme_baseline $NONE --ddo-vmm-resident-weight-budget-gb 4 --steps 1 --trace-steps 0"
    "retained-8g $VMM $NONE --ddo-vmm-resident-weight-budget-gb 4 --ddo-vmm-source-cache-gb 8 --ddo-pin-cpu-memory 1 --ddo-read-engine io_uring --steps 2 --trace-steps 0"
)
# BENCH_CASES (space-separated case names, default all): the cases kept, for a shorter call
CASE_ARGS=()
for c in "${CASES[@]}"; do
    if [ -z "${BENCH_CASES:-}" ] || [[ " $BENCH_CASES " == *" ${c%% *} "* ]]; then
        CASE_ARGS+=(--case "$c")
    fi
done
step "ddo bench" 330 "$OUT/bench.log" "$DDO" bench "$CK" --tokens "$TOKENS" --steps "$STEPS" \
    --trace-steps 2 --bus-gib 4 --direct-gib 2 "${CASE_ARGS[@]}" \
    --json "$OUT/bench.json" --trace "$OUT/trace.json" || STATUS=1

# ---- 8. summary ---------------------------------------------------------------------
rm -f "$CK"
for f in "$OUT"/*; do
    sz=$(stat -c %s "$f")
    if [ "$sz" -gt $((15 * 1024 * 1024)) ]; then
        tail -c $((15 * 1024 * 1024)) "$f" >"$f.tmp" && mv "$f.tmp" "$f"
        say "note: $(basename "$f") truncated to its last 15 MiB"
    fi
done
[ $STATUS -eq 0 ] && say "ok suite" || say "FAILED suite: see the lines above"
summary
exit $STATUS
