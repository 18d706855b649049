#!/usr/bin/env bash
# cli_gguf.sh - GGUF files in the tool: `ddo synth` writes one (Q8_0, Q4_K, F16, F32, BF16),
# `ddo inspect` shows its dtypes, shapes and exact sizes (text and JSON), `ddo plan` and
# `ddo run --verify` stream it bit-identical to direct reads on several routes, the weight
# codec's among them (a corrupted slot is caught), `ddo bench` runs it; malformed files written here (truncated, an unknown
# GGML type, a misaligned tensor, a 4 GiB claimed string) are refused with one line and exit 1.
#
# ctest-labels: cli
set -u
: "${DDO_BIN:?DDO_BIN must name the ddo tool}"
T=$(mktemp -d "${TMPDIR:-/tmp}/ddo-cli-gguf-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
pass() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; fails=$((fails + 1)); }
check() { if eval "$2"; then pass "$1"; else fail "$1"; fi; }

# le VALUE BYTES: VALUE as BYTES little-endian bytes.
le() {
    local v=$1 n=$2 i
    for ((i = 0; i < n; i++)); do
        printf "\\$(printf %03o $(((v >> (8 * i)) & 255)))"
    done
}
gstr() { le "${#1}" 8; printf '%s' "$1"; }

# --- a synthetic GGUF: 6 blocks of Q8_0 / Q4_K / F32 ------------------------------------------
{
    echo '{"architecture": "cli-gguf", "tensors": ['
    echo '{"name": "img_in.weight", "shape": [256, 512], "dtype": "F16"},'
    for i in 0 1 2 3 4 5; do
        echo "{\"name\": \"blocks.$i.attn.weight\", \"shape\": [512, 512], \"dtype\": \"Q8_0\"},"
        echo "{\"name\": \"blocks.$i.attn.bias\", \"shape\": [512], \"dtype\": \"F32\"},"
        echo "{\"name\": \"blocks.$i.mlp.weight\", \"shape\": [512, 1024], \"dtype\": \"Q4_K\"},"
    done
    echo '{"name": "out.weight", "shape": [16, 512], "dtype": "BF16"}'
    echo ']}'
} >"$T/layout.json"
"$DDO_BIN" synth --layout "$T/layout.json" --out "$T/model.gguf" --seed 3 >"$T/synth.out" 2>&1
check "synth writes a .gguf" '[ $? -eq 0 ] && [ -s "$T/model.gguf" ] && [ "$(head -c 4 "$T/model.gguf")" = GGUF ]'

"$DDO_BIN" inspect "$T/model.gguf" >"$T/inspect.out" 2>"$T/inspect.err"; rc=$?
check "inspect exits 0" '[ $rc -eq 0 ] && [ ! -s "$T/inspect.err" ]'
# Q8_0: 512 x 512 / 32 blocks x 34 bytes; Q4_K: 512 x 1024 / 256 x 144; the data section
# holds the tensors at 32-aligned offsets.
check "Q8_0 row: shape and exact bytes" 'grep -Eq "^blocks\.0\.attn\.weight +Q8_0 +\[512, 512\] +278528$" "$T/inspect.out"'
check "Q4_K row: shape and exact bytes" 'grep -Eq "^blocks\.5\.mlp\.weight +Q4_K +\[512, 1024\] +294912$" "$T/inspect.out"'
check "dtype totals" 'grep -Eq "^Q8_0 +6 +1671168$" "$T/inspect.out" && grep -Eq "^Q4_K +6 +1769472$" "$T/inspect.out"'
check "block groups from tensor names" 'grep -Eq "^blocks +6 +575488 +3452928$" "$T/inspect.out"'
check "metadata shown" 'grep -q "metadata: general.architecture = cli-gguf" "$T/inspect.out"'
"$DDO_BIN" inspect "$T/model.gguf" --json >"$T/inspect.json" 2>&1
check "inspect --json names the block dtypes" 'grep -q "\"Q4_K\"" "$T/inspect.json" && grep -q "\"Q8_0\"" "$T/inspect.json"'

"$DDO_BIN" plan "$T/model.gguf" --ddo-small-tensor-threshold-kb 16 --ddo-resident-module-budget-gb 0 \
    >"$T/plan.out" 2>&1
check "plan streams the blocks" '[ $? -eq 0 ] && grep -Eq "streamed +[1-9]" "$T/plan.out"'

# --- run --verify: every streamed tensor's bytes against direct reads, on several routes (the
# weight codec codes the F16/F32/BF16 tensors and moves the GGML blocks raw) ----------------
STREAM=(--ddo-small-tensor-threshold-kb 16 --ddo-execution-device cpu)
sums=""
for route in "" "--ddo-backend linear" "--ddo-backend vmm" "--ddo-unit-granularity leaf" \
    "--ddo-weight-codec ddoc1"; do
    # shellcheck disable=SC2086
    "$DDO_BIN" run "$T/model.gguf" "${STREAM[@]}" $route --steps 2 --tokens 4 --verify \
        >"$T/run.out" 2>&1; rc=$?
    s=$(sed -n 's/^verify: OK: .*(\([0-9a-f]*\))$/\1/p' "$T/run.out")
    check "run --verify ${route:-default}: bit-identical" '[ $rc -eq 0 ] && [ -n "$s" ]'
    check "run ${route:-default}: quantized tensors moved as bytes" 'grep -Eq "tensors moved only" "$T/run.out"'
    sums="$sums $s"
done
check "one checksum on every route" '[ $(echo $sums | tr " " "\n" | sort -u | wc -l) -eq 1 ]'
DDO_TEST_CORRUPT=2 "$DDO_BIN" run "$T/model.gguf" "${STREAM[@]}" --steps 3 --tokens 4 --verify \
    >"$T/bad.out" 2>&1; rc=$?
check "a corrupted slot fails --verify" '[ $rc -eq 1 ] && grep -q "step 2: MISMATCH" "$T/bad.out"'

"$DDO_BIN" bench "$T/model.gguf" --ddo-execution-device cpu --ddo-small-tensor-threshold-kb 0 \
    --tokens 4 --steps 2 --cpu-gbps 2 >"$T/bench.out" 2>&1
check "bench runs a .gguf" '[ $? -eq 0 ] && grep -Eq "^default +" "$T/bench.out"'

# --quant: 2-D float tensors whose rows are whole blocks take the block type, the rest stay
cat >"$T/q.json" <<'EOF2'
{"tensors": [{"name": "a.weight", "shape": [4, 512], "dtype": "BF16"},
             {"name": "a.bias", "shape": [512], "dtype": "BF16"},
             {"name": "b.weight", "shape": [4, 100], "dtype": "F32"}]}
EOF2
"$DDO_BIN" synth --layout "$T/q.json" --out "$T/q.gguf" --quant Q4_K >"$T/out" 2>&1 &&
    "$DDO_BIN" inspect "$T/q.gguf" >"$T/q.out" 2>&1
check "synth --quant Q4_K" '[ $? -eq 0 ] && grep -Eq "^a\.weight +Q4_K +\[4, 512\] +1152$" "$T/q.out" &&
    grep -Eq "^a\.bias +BF16 " "$T/q.out" && grep -Eq "^b\.weight +F32 " "$T/q.out"'
"$DDO_BIN" synth --layout "$T/q.json" --out "$T/q.safetensors" --quant Q4_K >"$T/out" 2>&1
check "synth --quant needs a .gguf" '[ $? -eq 1 ] && grep -q "takes a .gguf output" "$T/out"'

# synth refuses a dtype GGML lacks
echo '{"tensors": [{"name": "w", "shape": [4], "dtype": "F8_E4M3"}]}' >"$T/f8.json"
"$DDO_BIN" synth --layout "$T/f8.json" --out "$T/f8.gguf" >"$T/out" 2>&1
check "synth: F8 has no GGML type" '[ $? -ne 0 ] && grep -q "has no GGML type" "$T/out"'

# --- malformed files: one line on stderr, nothing on stdout, exit 1 -----------------------
refused() { # refused FILE REGEX WHAT
    "$DDO_BIN" inspect "$1" >"$T/out" 2>"$T/err"
    local rc=$? want=$2
    check "$3" '[ $rc -eq 1 ] && [ ! -s "$T/out" ] && [ $(wc -l <"$T/err") -eq 1 ] && grep -Eq -- "$want" "$T/err"'
}
size=$(stat -c %s "$T/model.gguf")
head -c $((size - 1)) "$T/model.gguf" >"$T/trunc.gguf"
refused "$T/trunc.gguf" 'truncated: tensor "out.weight"' "truncated file"
head -c 300 "$T/model.gguf" >"$T/trunc2.gguf"
refused "$T/trunc2.gguf" 'trunc2.gguf: truncated' "file cut inside the tensor infos"
# one tensor "w" F32 [8]: type and offset set per case, then 64 bytes of data
one() { # one TYPE OFFSET
    printf GGUF; le 3 4; le 1 8; le 0 8
    gstr w; le 1 4; le 8 8; le "$1" 4; le "$2" 8
    head -c $((64 - 37)) /dev/zero # pad the 37-byte header to the alignment of 32
    head -c 64 /dev/zero
}
one 0 0 >"$T/ok.gguf"
"$DDO_BIN" inspect "$T/ok.gguf" >"$T/out" 2>&1
check "the hand-written file is valid" '[ $? -eq 0 ] && grep -Eq "^w +F32 +\[8\] +32$" "$T/out"'
one 77 0 >"$T/type.gguf"
refused "$T/type.gguf" 'tensor "w": unknown GGML type 77' "unknown GGML type"
one 0 16 >"$T/align.gguf"
refused "$T/align.gguf" 'offset 16 is not a multiple of the alignment 32' "misaligned tensor"
{ printf GGUF; le 3 4; le 0 8; le 1 8; gstr k; le 8 4; le $((4 << 30)) 8; printf abc; } >"$T/str.gguf"
refused "$T/str.gguf" 'a string of 4294967296 bytes claimed' "4 GiB claimed string"
{ printf GGUF; le 3 4; le 1 8; le 0 8; gstr w; le 9 4; head -c 64 /dev/zero; } >"$T/dims.gguf"
refused "$T/dims.gguf" '9 dimensions; GGUF allows at most 4' "absurd dimension count"

echo "cli_gguf: $fails failed"
[ "$fails" -eq 0 ]
