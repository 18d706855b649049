#!/usr/bin/env bash
# cli_codec.sh - the weight codec through the tool on the cpu device: `ddo run --verify` with
# --ddo-weight-codec ddoc1 and auto on a checkpoint of trained-like values (`ddo synth --values
# normal`) is bit-identical on the retaining routes, with the same checksum as the raw run, the
# bus carrying coded bytes (ddoc1); auto codes only where the cost model predicts a gain; the
# plan shows the decision; a bad value is refused naming it.
# ctest-labels: cli
set -u
: "${DDO_BIN:?DDO_BIN is not set}"
T=$(mktemp -d "${TMPDIR:-/tmp}/ddo-cli-codec-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
pass() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; fails=$((fails + 1)); }
check() { if eval "$2"; then pass "$1"; else fail "$1"; fi; }

{
    echo '{"architecture": "cli-codec", "tensors": ['
    echo '{"name": "embed.weight", "shape": [64, 32], "dtype": "BF16"},'
    for i in 0 1 2 3 4 5; do
        echo "{\"name\": \"blocks.$i.attn.weight\", \"shape\": [384, 256], \"dtype\": \"BF16\"},"
        echo "{\"name\": \"blocks.$i.mlp.weight\", \"shape\": [256, 384], \"dtype\": \"F16\"},"
        echo "{\"name\": \"blocks.$i.proj.weight\", \"shape\": [128, 256], \"dtype\": \"F32\"},"
        echo "{\"name\": \"blocks.$i.q.weight\", \"shape\": [256, 384], \"dtype\": \"F8_E4M3\"},"
    done
    echo '{"name": "out.weight", "shape": [16, 64], "dtype": "BF16"}'
    echo ']}'
} >"$T/layout.json"
"$DDO_BIN" synth --layout "$T/layout.json" --out "$T/model.safetensors" --seed 3 --values normal \
    >"$T/synth.log" 2>&1 || { cat "$T/synth.log"; echo "FAIL: ddo synth"; exit 1; }

BASE=(--ddo-execution-device cpu --ddo-vmm-resident-weight-budget-gb 0.01 --ddo-resident-module-budget-gb 0
    --ddo-small-tensor-threshold-kb 16 --ddo-vmm-source-cache-gb 1 --steps 2 --tokens 5 --verify)
sum_of() { sed -n 's/^verify: OK: .*(\([0-9a-f]*\))$/\1/p' "$1"; }
metric() { # metric FILE NAME: the last line's value
    tail -1 "$1" | grep -o "\"$2\":[0-9.e+]*" | head -1 | cut -d: -f2
}

"$DDO_BIN" run "$T/model.safetensors" "${BASE[@]}" --ddo-backend vmm >"$T/raw.out" 2>&1; rc=$?
sum_raw=$(sum_of "$T/raw.out")
check "raw run verifies" '[ $rc -eq 0 ] && [ -n "$sum_raw" ]'

for route in vmm_fast_runtime linear_runtime; do
    for codec in ddoc1 auto; do
        for pin in false true; do
            args=("${BASE[@]}" --ddo-execution-mode "$route" --ddo-weight-codec "$codec"
                --ddo-pin-cpu-memory "$pin" --metrics "$T/$route.$codec.$pin.jsonl" --show-profile)
            [ "$route" = vmm_fast_runtime ] && args+=(--ddo-backend vmm)
            out="$T/$route.$codec.$pin.out"
            "$DDO_BIN" run "$T/model.safetensors" "${args[@]}" >"$out" 2>&1; rc=$?
            sum=$(sum_of "$out")
            m="$T/$route.$codec.$pin.jsonl"
            decoded=$(metric "$m" bytes_decoded)
            bus=$(metric "$m" bytes_coded_uploaded)
            check "$route $codec pin=$pin: verified, the raw run's checksum ($sum = $sum_raw)" \
                '[ $rc -eq 0 ] && [ "$sum" = "$sum_raw" ]' || cat "$out"
            # auto on the cpu device: its C decoder (0.25 GB/s) does not pay against its copies,
            # so the cost model keeps the weights raw (the plan checks below say why).
            [ "$codec" = auto ] && continue
            check "$route $codec pin=$pin: coded bytes over the bus ($bus) below decoded ($decoded)" \
                '[ -n "$bus" ] && [ -n "$decoded" ] && awk -v b="$bus" -v d="$decoded" "BEGIN{exit !(b > 0 && b < 0.9 * d)}"'
            check "$route $codec pin=$pin: the profile shows the codec line" \
                'grep -q "^  codec .*over the bus decoded into" "$out"'
        done
    done
done

"$DDO_BIN" plan "$T/model.safetensors" --ddo-execution-device cpu --ddo-backend vmm \
    --ddo-vmm-source-cache-gb 1 --ddo-small-tensor-threshold-kb 16 --ddo-weight-codec ddoc1 \
    --json >"$T/plan.json" 2>&1; rc=$?
check "ddo plan --json records weight_codec ddoc1 and the decode area" \
    '[ $rc -eq 0 ] && grep -q "\"weight_codec\": *\"ddoc1\"" "$T/plan.json" && grep -q "codec_decode_area_gb" "$T/plan.json"'
# auto with a cost model codes only where the coded step is predicted shorter: bus-bound with a
# fast decoder it codes; compute-bound, or with the cpu device's slow decoder, it keeps the
# weights raw and says why.
PA=("$T/model.safetensors" --ddo-execution-device cpu --ddo-backend vmm --ddo-vmm-source-cache-gb 1
    --ddo-small-tensor-threshold-kb 16 --ddo-weight-codec auto --ddo-resident-module-budget-gb 0 --json)
"$DDO_BIN" plan "${PA[@]}" --bandwidth-gbps 1 --tflops 1000 --decode-gbps 400 >"$T/auto1.json" 2>&1
check "auto codes a bus-bound plan with a fast decoder" \
    'grep -q "\"weight_codec\": *\"ddoc1\"" "$T/auto1.json"'
"$DDO_BIN" plan "${PA[@]}" --bandwidth-gbps 1 --tflops 0.001 --decode-gbps 400 >"$T/auto2.json" 2>&1
check "auto keeps a compute-bound plan raw, saying why" \
    'grep -q "\"weight_codec\": *\"none\"" "$T/auto2.json" && grep -q "coding would not pay" "$T/auto2.json"'
"$DDO_BIN" plan "${PA[@]}" --bandwidth-gbps 100 --tflops 1000 --decode-gbps 0.25 >"$T/auto3.json" 2>&1
check "auto keeps the weights raw when the decoder is slower than the bus" \
    'grep -q "\"weight_codec\": *\"none\"" "$T/auto3.json" && grep -q "coding would not pay" "$T/auto3.json"'
# A given device memory replaces the device: no measured rates, no cost model.
"$DDO_BIN" plan "${PA[@]}" --device-memory-gb 64 >"$T/auto4.json" 2>&1
check "auto without a cost model codes where a decoder is" \
    'grep -q "\"weight_codec\": *\"ddoc1\"" "$T/auto4.json"'
# The cpu device opened as `ddo run` opens it: its own rates price the choice (its decoder,
# 0.25 GB/s, is slower than any memcpy: raw, saying why), not the no-cost-model default above.
"$DDO_BIN" plan "${PA[@]}" >"$T/auto5.json" 2>&1
check "auto on the cpu device decides by the cost model" \
    'grep -q "\"weight_codec_note\": *\"auto: weights move raw: coding would not pay here (predicted step" "$T/auto5.json"'
"$DDO_BIN" run "$T/model.safetensors" "${BASE[@]}" --ddo-weight-codec zstd >"$T/bad.out" 2>&1; rc=$?
check "an unknown codec is refused naming the option" \
    '[ $rc -ne 0 ] && grep -qi "weight.codec" "$T/bad.out"'

# weight_codec_cache_dir: the first run codes and writes the sidecar, the second reads it;
# both verify with the raw run's checksum.
for n in 1 2; do
    "$DDO_BIN" run "$T/model.safetensors" "${BASE[@]}" --ddo-backend vmm --ddo-weight-codec ddoc1 \
        --ddo-weight-codec-cache-dir "$T/cache" --metrics "$T/side$n.jsonl" >"$T/side$n.out" 2>&1
    rc=$?
    sum=$(sum_of "$T/side$n.out")
    check "sidecar run $n: verified, the raw run's checksum ($sum = $sum_raw)" \
        '[ $rc -eq 0 ] && [ "$sum" = "$sum_raw" ]' || cat "$T/side$n.out"
done
hits1=$(metric "$T/side1.jsonl" codec_sidecar_hits)
hits2=$(metric "$T/side2.jsonl" codec_sidecar_hits)
check "the first run wrote a sidecar, the second took the store from it ($hits1, $hits2 tensors)" \
    '[ "$(ls "$T/cache" | grep -c "\.ddoc$")" = 1 ] && [ "$hits1" = 0 ] && awk -v h="$hits2" "BEGIN{exit !(h > 0)}" && grep -q "\"codec_store\": *\"sidecar\"" "$T/side2.jsonl"'

echo "$fails failed"
[ "$fails" -eq 0 ]
