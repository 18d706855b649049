#!/usr/bin/env bash
# cli_comfy_quant.sh - ComfyUI's safetensors quantization layout in the tool: `ddo inspect`
# shows each quantized layer's format and where it was read (text and JSON) for the newer
# layout (comfy_quant tensors, the _quantization_metadata header entry) and the older one
# (scaled_fp8); `ddo run --verify` streams the F8/U8 weights with their scales bit-identical;
# malformed layouts written here are refused with one line and exit 1.
#
# ctest-labels: cli
set -u
: "${DDO_BIN:?DDO_BIN must name the ddo tool}"
: "${DDO_TEST_DATA:?DDO_TEST_DATA must name tests/data}"
CORPUS="$DDO_TEST_DATA/../fuzz/corpus/header"
T=$(mktemp -d "${TMPDIR:-/tmp}/ddo-cli-cq-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
pass() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; fails=$((fails + 1)); }
check() { if eval "$2"; then pass "$1"; else fail "$1"; fi; }

le() {
    local v=$1 n=$2 i
    for ((i = 0; i < n; i++)); do
        printf "\\$(printf %03o $(((v >> (8 * i)) & 255)))"
    done
}
# st FILE HEADER DATA_BYTES: a safetensors file (the data: DATA_BYTES bytes of 0x01, then the
# comfy_quant text given in $CQ, if any).
st() {
    { le "${#2}" 8; printf '%s' "$2"; head -c "$3" /dev/zero | tr '\0' '\1'; printf '%s' "${CQ:-}"; } >"$1"
}

"$DDO_BIN" inspect "$CORPUS/comfy_quant_layout.safetensors" >"$T/out" 2>&1
check "inspect: the newer layout's layers" '[ $? -eq 0 ] &&
    grep -Eq "^blocks\.0\.q +float8_e4m3fn +comfy_quant +63$" "$T/out" &&
    grep -Eq "^blocks\.1\.q +nvfp4 +_quantization_metadata +24$" "$T/out"'
"$DDO_BIN" inspect "$CORPUS/comfy_quant_layout.safetensors" --json >"$T/out.json" 2>&1
check "inspect --json: quantization entries" 'grep -q "\"quantization\": *\[" "$T/out.json" && grep -q "\"format\": *\"nvfp4\"" "$T/out.json"'
"$DDO_BIN" inspect "$CORPUS/scaled_fp8_layout.safetensors" >"$T/out" 2>&1
check "inspect: the older layout" '[ $? -eq 0 ] && grep -Eq "^a +scaled_fp8 +scaled_fp8 +12$" "$T/out"'

# A larger model of the newer layout, streamed and verified: 4 blocks of an F8 weight (64 KiB),
# its scale and comfy_quant tensor.
CQ='{"format": "float8_e4m3fn"}'
hdr='{'
off=0
for i in 0 1 2 3; do
    hdr+="\"blocks.$i.q.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[256,256],\"data_offsets\":[$off,$((off + 65536))]},"
    off=$((off + 65536))
    hdr+="\"blocks.$i.q.weight_scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[$off,$((off + 4))]},"
    off=$((off + 4))
done
hdr+="\"blocks.0.q.comfy_quant\":{\"dtype\":\"U8\",\"shape\":[${#CQ}],\"data_offsets\":[$off,$((off + ${#CQ}))]}}"
st "$T/model.safetensors" "$hdr" "$off"
"$DDO_BIN" inspect "$T/model.safetensors" >"$T/out" 2>&1
check "a written model: one comfy_quant layer, the others plain F8" '[ $? -eq 0 ] && [ $(grep -c "float8_e4m3fn" "$T/out") -eq 1 ]'
"$DDO_BIN" run "$T/model.safetensors" --ddo-execution-device cpu --ddo-small-tensor-threshold-kb 0 \
    --steps 2 --tokens 4 --verify >"$T/run.out" 2>&1
check "run --verify streams it bit-identical" '[ $? -eq 0 ] && grep -q "^verify: OK" "$T/run.out"'

# --- malformed layouts: one line, exit 1 ----------------------------------------------------
refused() { # refused FILE REGEX WHAT
    "$DDO_BIN" inspect "$1" >"$T/out" 2>"$T/err"
    local rc=$? want=$2
    check "$3" '[ $rc -eq 1 ] && [ ! -s "$T/out" ] && [ $(wc -l <"$T/err") -eq 1 ] && grep -Eq -- "$want" "$T/err"'
}
w='"l.weight":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]}'
s='"l.weight_scale":{"dtype":"F32","shape":[],"data_offsets":[4,8]}'
CQ='not json'
st "$T/notjson.safetensors" "{$w,$s,\"l.comfy_quant\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[8,16]}}" 8
refused "$T/notjson.safetensors" 'tensor "l.comfy_quant" is not JSON' "comfy_quant not JSON"
CQ='{"format": "fp3"}'
st "$T/unknown.safetensors" "{$w,$s,\"l.comfy_quant\":{\"dtype\":\"U8\",\"shape\":[17],\"data_offsets\":[8,25]}}" 8
refused "$T/unknown.safetensors" 'unknown quantization format "fp3"' "unknown format"
CQ='{"format": "float8_e4m3fn"}'
st "$T/noscale.safetensors" "{$w,\"l.comfy_quant\":{\"dtype\":\"U8\",\"shape\":[27],\"data_offsets\":[4,31]}}" 4
refused "$T/noscale.safetensors" 'scale tensor "l.weight_scale" is missing' "scale tensor missing"
st "$T/shape.safetensors" "{$w,\"l.weight_scale\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},\"l.comfy_quant\":{\"dtype\":\"U8\",\"shape\":[27],\"data_offsets\":[12,39]}}" 12
refused "$T/shape.safetensors" 'has shape \[2\], not one value' "scale tensor of the wrong shape"
CQ=''
st "$T/legacy.safetensors" "{\"scaled_fp8\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]},\"l.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,2],\"data_offsets\":[2,6]}}" 6
refused "$T/legacy.safetensors" 'scale tensor "l.scale_weight" is missing' "older layout: scale_weight missing"

# The dequantization scratch (dequant_scratch_bytes) comes off the device weights limit, and a
# budget without room for it is refused with one line.
"$DDO_BIN" plan "$CORPUS/comfy_quant_layout.safetensors" --ddo-execution-device cpu \
    --ddo-device-budget-gb 0.01 --ddo-dequant-scratch-bytes 1048576 >"$T/out" 2>&1
check "plan: the dequantization scratch off the limit" '[ $? -eq 0 ] &&
    grep -q "limit: device_budget_gb minus 1.00 MiB dequantization scratch" "$T/out" &&
    grep -Eq "^ +dequant_scratch_bytes +1048576" "$T/out"'
"$DDO_BIN" plan "$CORPUS/comfy_quant_layout.safetensors" --ddo-execution-device cpu \
    --ddo-device-budget-gb 0.01 --ddo-dequant-scratch-bytes 20971520 >"$T/out" 2>&1
check "plan: no room for the scratch" '[ $? -ne 0 ] && [ $(wc -l <"$T/out") -eq 1 ] &&
    grep -q "leaves no room for the dequantization scratch 20.00 MiB" "$T/out"'

echo "cli_comfy_quant: $fails failed"
[ "$fails" -eq 0 ]
