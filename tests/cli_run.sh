#!/usr/bin/env bash
# cli_run.sh - `ddo run` on the cpu device: usage errors, a streamed run verified
# bit-identical against the direct-read reference, the same checksum on every route,
# metrics lines, a corrupted slot caught by --verify, and a phase-staged pipeline whose
# peak is its largest component's.
# ctest-labels: cli
set -u
: "${DDO_BIN:?DDO_BIN is not set}"
T=$(mktemp -d "${TMPDIR:-/tmp}/ddo-cli-run-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
pass() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; fails=$((fails + 1)); }
check() { if eval "$2"; then pass "$1"; else fail "$1"; fi; }

# A small layout: two resident-size tensors and 8 blocks of BF16, F16, F32 and FP8 tensors
# (each over 16 KiB so they stream with --ddo-small-tensor-threshold-kb 16).
layout() { # layout FILE SCALE(int) BLOCKS
    local f=$1 s=$2 n=$3 i sep=""
    {
        echo '{"architecture": "cli-test", "tensors": ['
        echo "{\"name\": \"embed.weight\", \"shape\": [64, $((32 * s))], \"dtype\": \"BF16\"},"
        for ((i = 0; i < n; i++)); do
            echo "{\"name\": \"blocks.$i.attn.weight\", \"shape\": [$((96 * s)), $((64 * s))], \"dtype\": \"BF16\"},"
            echo "{\"name\": \"blocks.$i.attn.bias\", \"shape\": [$((96 * s))], \"dtype\": \"BF16\"},"
            echo "{\"name\": \"blocks.$i.mlp.weight\", \"shape\": [$((64 * s)), $((96 * s))], \"dtype\": \"F16\"},"
            echo "{\"name\": \"blocks.$i.proj.weight\", \"shape\": [$((32 * s)), $((64 * s))], \"dtype\": \"F32\"},"
            echo "{\"name\": \"blocks.$i.q.weight\", \"shape\": [$((64 * s)), $((96 * s))], \"dtype\": \"F8_E4M3\"},"
        done
        echo "{\"name\": \"out.weight\", \"shape\": [16, $((64 * s))], \"dtype\": \"BF16\"}"
        echo ']}'
    } >"$f"
}
synth() { # synth LAYOUT OUT
    "$DDO_BIN" synth --layout "$1" --out "$2" --seed 7 >"$T/synth.log" 2>&1 ||
        { cat "$T/synth.log"; echo "FAIL: ddo synth $1"; exit 1; }
}

layout "$T/l4.json" 4 8
synth "$T/l4.json" "$T/model.safetensors"
STREAM=(--ddo-execution-device cpu --ddo-backend vmm --ddo-vmm-resident-weight-budget-gb 0.01 --ddo-resident-module-budget-gb 0
    --ddo-small-tensor-threshold-kb 16)

# --- usage -------------------------------------------------------------------------------
"$DDO_BIN" run --help >"$T/out" 2>&1; rc=$?
check "run --help exits 0 with the usage" '[ $rc -eq 0 ] && grep -q "usage: ddo run PATH" "$T/out"'
"$DDO_BIN" run >"$T/out" 2>&1; rc=$?
check "run without PATH is a usage error (2)" '[ $rc -eq 2 ]'
"$DDO_BIN" run "$T/model.safetensors" --steps 0 >"$T/out" 2>&1; rc=$?
check "--steps 0 is a usage error naming the flag" '[ $rc -eq 2 ] && grep -qF -- "ddo run: --steps \"0\": expected a whole number from 1 to 1000000" "$T/out"'
"$DDO_BIN" run "$T/model.safetensors" --frobnicate >"$T/out" 2>&1; rc=$?
check "an unknown option is a usage error naming it" '[ $rc -eq 2 ] && grep -q "unknown option .--frobnicate." "$T/out"'
"$DDO_BIN" run "$T/missing.safetensors" --ddo-execution-device cpu >"$T/out" 2>&1; rc=$?
check "a missing checkpoint fails (1) naming the file" '[ $rc -eq 1 ] && grep -q "missing.safetensors" "$T/out"'
"$DDO_BIN" run "$T/model.safetensors" --ddo-execution-device tpu:0 >"$T/out" 2>&1; rc=$?
check "a bad --ddo-execution-device fails naming the option" '[ $rc -ne 0 ] && grep -qi "execution_device\|EXECUTION_DEVICE\|tpu" "$T/out"'

# --- a streamed run, verified ----------------------------------------------------------------
"$DDO_BIN" run "$T/model.safetensors" "${STREAM[@]}" --steps 3 --tokens 5 --verify \
    --metrics "$T/m.jsonl" --show-profile >"$T/stream.out" 2>&1; rc=$?
cat "$T/stream.out"
check "streamed run exits 0" '[ $rc -eq 0 ]'
check "plan printed before the session: route and 8 streamed units" \
    'grep -n "plan: route vmm_fast_runtime" "$T/stream.out" | grep -q . && grep -q "; 8 units," "$T/stream.out" &&
     [ "$(grep -n "^plan:" "$T/stream.out" | cut -d: -f1)" -lt "$(grep -n "^session:" "$T/stream.out" | cut -d: -f1)" ]'
check "three step rows" '[ "$(grep -cE "^ +[123] +[0-9.]+s" "$T/stream.out")" -eq 3 ]'
check "verify OK for all 3 steps" 'grep -q "verify: OK: 3 steps bit-identical" "$T/stream.out"'
check "profile printed" 'grep -q "ddo-profile" "$T/stream.out"'
check "one metrics line with schema_version 1 and 24 acquires (8 units x 3 steps)" \
    '[ "$(wc -l <"$T/m.jsonl")" -eq 1 ] && grep -q "\"schema_version\":1" "$T/m.jsonl" && grep -q "\"acquires\":24[,}]" "$T/m.jsonl"'
check "bytes were streamed from the file" \
    '! grep -q "\"bytes_staged_from_file\":0[,}]" "$T/m.jsonl" && grep -q "\"bytes_staged_from_file\":[1-9]" "$T/m.jsonl"'
sum_stream=$(sed -n 's/^verify: OK: .*(\([0-9a-f]*\))$/\1/p' "$T/stream.out")

# The same products on another route (everything resident, linear) give the same checksum.
"$DDO_BIN" run "$T/model.safetensors" --ddo-execution-device cpu --steps 2 --tokens 5 --verify \
    --metrics "$T/m.jsonl" >"$T/res.out" 2>&1; rc=$?
sum_res=$(sed -n 's/^verify: OK: .*(\([0-9a-f]*\))$/\1/p' "$T/res.out")
check "resident linear run verifies with the same checksum ($sum_res = $sum_stream)" \
    '[ $rc -eq 0 ] && [ -n "$sum_res" ] && [ "$sum_res" = "$sum_stream" ]'
check "--metrics appends (2 lines)" '[ "$(wc -l <"$T/m.jsonl")" -eq 2 ]'
"$DDO_BIN" run "$T/model.safetensors" "${STREAM[@]}" --steps 1 --tokens 6 --verify >"$T/t6.out" 2>&1
sum_t6=$(sed -n 's/^verify: OK: .*(\([0-9a-f]*\))$/\1/p' "$T/t6.out")
check "another token count gives another checksum" '[ -n "$sum_t6" ] && [ "$sum_t6" != "$sum_stream" ]'
"$DDO_BIN" run "$T/model.safetensors" "${STREAM[@]}" --ddo-unit-granularity leaf --steps 2 --tokens 5 \
    --verify >"$T/leaf.out" 2>&1; rc=$?
sum_leaf=$(sed -n 's/^verify: OK: .*(\([0-9a-f]*\))$/\1/p' "$T/leaf.out")
check "leaf units: verified, same checksum" '[ $rc -eq 0 ] && [ "$sum_leaf" = "$sum_stream" ]'

# A bit flipped in a slot (tests-only knob) is caught.
DDO_TEST_CORRUPT=2 "$DDO_BIN" run "$T/model.safetensors" "${STREAM[@]}" --steps 3 --tokens 5 \
    --verify >"$T/bad.out" 2>&1; rc=$?
check "a corrupted slot fails --verify with exit 1 at step 2" \
    '[ $rc -eq 1 ] && grep -q "step 2: MISMATCH" "$T/bad.out" && grep -q "verify: FAILED" "$T/bad.out" && ! grep -q "step 1: MISMATCH" "$T/bad.out"'

# --- a phase-staged pipeline ---------------------------------------------------------------
P="$T/pipe"
mkdir -p "$P/text_encoder" "$P/transformer" "$P/vae" "$P/tokenizer" "$P/scheduler"
layout "$T/l2.json" 2 4
layout "$T/l3.json" 3 3
synth "$T/l2.json" "$P/text_encoder/model.safetensors"
layout "$T/l8.json" 8 4
synth "$T/l8.json" "$P/transformer/diffusion_pytorch_model.safetensors"
synth "$T/l3.json" "$P/vae/diffusion_pytorch_model.safetensors"
echo '{}' >"$P/tokenizer/vocab.json"
echo '{}' >"$P/scheduler/scheduler_config.json"
cat >"$P/model_index.json" <<'JSON'
{"_class_name": "FluxPipeline", "_diffusers_version": "0.30.0",
 "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
 "vae": ["diffusers", "AutoencoderKL"],
 "text_encoder": ["transformers", "CLIPTextModel"],
 "tokenizer": ["transformers", "CLIPTokenizer"],
 "transformer": ["diffusers", "FluxTransformer2DModel"]}
JSON
DDO_TEXT_ENCODER_ROUTE=none DDO_VAE_ROUTE=group "$DDO_BIN" run "$P" "${STREAM[@]}" \
    --ddo-vmm-resident-weight-budget-gb 0.03 --steps 2 \
    --tokens 4 --verify --metrics "$T/p.jsonl" >"$T/pipe.out" 2>&1; rc=$?
cat "$T/pipe.out"
check "pipeline exits 0" '[ $rc -eq 0 ]'
check "components in pipeline order, folders without weights left out" \
    'grep -q "3 components in order: text_encoder transformer vae$" "$T/pipe.out"'
check "component routes: none, dynamic_offload, diffusers_group_offload" \
    'grep -q "text_encoder (route none" "$T/pipe.out" && grep -q "transformer (route dynamic_offload" "$T/pipe.out" && grep -q "vae (route diffusers_group_offload" "$T/pipe.out"'
check "every component verified" '[ "$(grep -c "verify: OK: 2 steps" "$T/pipe.out")" -eq 3 ]'
check "peak check passed" 'grep -q "^peak check: OK" "$T/pipe.out"'
check "three metrics lines tagged with the components" \
    '[ "$(wc -l <"$T/p.jsonl")" -eq 3 ] && grep -q "\"component\":\"text_encoder\"" "$T/p.jsonl" && grep -q "\"component\":\"vae\"" "$T/p.jsonl"'
check "text encoder resident (no acquires), transformer and vae streamed" \
    'grep "\"component\":\"text_encoder\"" "$T/p.jsonl" | grep -q "\"acquires\":0[,}]" &&
     grep "\"component\":\"transformer\"" "$T/p.jsonl" | grep -q "\"acquires\":[1-9]" &&
     grep "\"component\":\"vae\"" "$T/p.jsonl" | grep -q "\"acquires\":[1-9]"'
peaks=$(grep -o '"device_weights_peak_bytes":[0-9]*' "$T/p.jsonl" | cut -d: -f2)
max=0; sum=0
for p in $peaks; do sum=$((sum + p)); [ "$p" -gt "$max" ] && max=$p; done
tpeak=$(grep '"component":"transformer"' "$T/p.jsonl" | grep -o '"device_weights_peak_bytes":[0-9]*' | cut -d: -f2)
said=$(sed -n 's/^  pipeline weights peak .*(\([0-9]*\) bytes) = largest component (\([a-z_]*\)).*/\1 \2/p' "$T/pipe.out")
check "pipeline peak = the largest component's ($said; max $max, sum $sum)" \
    '[ "$said" = "$max transformer" ] && [ "$tpeak" = "$max" ] && [ "$max" -lt "$sum" ]'
dev=$(sed -n 's/^  pipeline device peak .*(\([0-9]*\) bytes;.*/\1/p' "$T/pipe.out")
check "device memory in use never exceeded the largest component ($dev <= $max)" \
    '[ -n "$dev" ] && [ "$dev" -le "$max" ]'

echo "$fails failed"
[ "$fails" -eq 0 ]
