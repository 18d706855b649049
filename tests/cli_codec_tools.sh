#!/usr/bin/env bash
# cli_codec_tools.sh - the weight codec's tools on the cpu device: `ddo inspect --codec` (coded
# / raw per dtype and block group on `ddo synth --values normal` (FP8 too) and uniform values, a random-
# bits BF16 tensor stored raw, other dtypes raw, the same figures for 1 and 2 threads, JSON),
# `ddo plan --ddo-weight-codec ddoc1` with the estimated coded bytes and transfer times
# (--codec-ratio, --decode-gbps, the defaults) and `ddo bench`'s codec figures.
# ctest-labels: cli
set -u
: "${DDO_BIN:?DDO_BIN is not set}"
T=$(mktemp -d "${TMPDIR:-/tmp}/ddo-cli-codec-tools-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
pass() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; fails=$((fails + 1)); }
check() { if eval "$2"; then pass "$1"; else fail "$1"; fi; }
# jget FILE EXPR: a value from a JSON file (python3 -c "print(EXPR)" with d the document)
jget() { /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN{exit !(a < b)}'; }
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN{d=a-b; if (d<0) d=-d; exit !(d <= t)}'; }

{
    echo '{"architecture": "cli-codec-tools", "tensors": ['
    echo '{"name": "embed.weight", "shape": [256, 64], "dtype": "BF16"},'
    for i in 0 1 2 3; do
        echo "{\"name\": \"blocks.$i.attn.weight\", \"shape\": [512, 512], \"dtype\": \"BF16\"},"
        echo "{\"name\": \"blocks.$i.mlp.weight\", \"shape\": [512, 256], \"dtype\": \"F16\"},"
        echo "{\"name\": \"blocks.$i.q.weight\", \"shape\": [256, 256], \"dtype\": \"F8_E4M3\"},"
    done
    for i in 0 1; do
        echo "{\"name\": \"single.$i.proj.weight\", \"shape\": [256, 512], \"dtype\": \"F32\"},"
        echo "{\"name\": \"single.$i.norm.weight\", \"shape\": [512], \"dtype\": \"BF16\"},"
    done
    echo '{"name": "out.weight", "shape": [64, 256], "dtype": "BF16"}'
    echo ']}'
} >"$T/layout.json"
for v in normal uniform; do
    "$DDO_BIN" synth --layout "$T/layout.json" --out "$T/$v.safetensors" --seed 4 --values "$v" \
        >"$T/synth.log" 2>&1 || { cat "$T/synth.log"; echo "FAIL: ddo synth $v"; exit 1; }
done

# ---- inspect --codec ------------------------------------------------------------------
"$DDO_BIN" inspect --codec "$T/normal.safetensors" >"$T/normal.txt" 2>&1; rc=$?
check "inspect --codec exits 0" '[ $rc -eq 0 ]' || cat "$T/normal.txt"
check "prints per dtype, per group, (root), total, codec_ratio and the time" \
    'grep -q "^BF16 " "$T/normal.txt" && grep -q "^blocks " "$T/normal.txt" &&
     grep -q "^single " "$T/normal.txt" && grep -q "^(root) " "$T/normal.txt" &&
     grep -q "^total " "$T/normal.txt" && grep -q "^codec_ratio 0\.[0-9]" "$T/normal.txt" &&
     grep -Eq "coded on [0-9]+ threads in [0-9.]+ s" "$T/normal.txt"'
"$DDO_BIN" inspect --codec --json --threads 1 "$T/normal.safetensors" >"$T/n1.json" 2>&1
"$DDO_BIN" inspect --codec --json --threads 2 "$T/normal.safetensors" >"$T/n2.json" 2>&1
r1=$(jget "$T/n1.json" 'd["codec_ratio"]')
r2=$(jget "$T/n2.json" 'd["codec_ratio"]')
check "the same ratio for 1 and 2 threads ($r1, $r2)" '[ -n "$r1" ] && [ "$r1" = "$r2" ]'
check "the same coded bytes per group for 1 and 2 threads" \
    '[ "$(jget "$T/n1.json" "d[\"groups\"]")" = "$(jget "$T/n2.json" "d[\"groups\"]")" ]'
bf=$(jget "$T/n1.json" '[x["ratio"] for x in d["dtypes"] if x["dtype"]=="BF16"][0]')
f16=$(jget "$T/n1.json" '[x["ratio"] for x in d["dtypes"] if x["dtype"]=="F16"][0]')
f32=$(jget "$T/n1.json" '[x["ratio"] for x in d["dtypes"] if x["dtype"]=="F32"][0]')
f8=$(jget "$T/n1.json" '[x["ratio"] for x in d["dtypes"] if x["dtype"]=="F8_E4M3"][0]')
check "normal values: BF16 codes below 0.8 ($bf)" 'lt "$bf" 0.8'
check "normal values: F16 ($f16) and F32 ($f32) code below 0.9" 'lt "$f16" 0.9 && lt "$f32" 0.9'
check "normal values: F8_E4M3 (whole bytes) codes below 0.9 ($f8)" 'lt "$f8" 0.9'
groups=$(jget "$T/n1.json" '",".join(g["group"] for g in d["groups"])')
check "groups: the planner's prefixes and (root) ($groups)" '[ "$groups" = "blocks,single,(root)" ]'
check "the groups add up to the total" \
    '[ "$(jget "$T/n1.json" "sum(g[\"coded_bytes\"] for g in d[\"groups\"]) == d[\"total\"][\"coded_bytes\"]")" = True ]'
"$DDO_BIN" inspect --codec --json "$T/uniform.safetensors" >"$T/u.json" 2>&1
ub=$(jget "$T/u.json" '[x["ratio"] for x in d["dtypes"] if x["dtype"]=="BF16"][0]')
uf8=$(jget "$T/u.json" '[x["ratio"] for x in d["dtypes"] if x["dtype"]=="F8_E4M3"][0]')
check "uniform F8 values (random bytes): kept raw, ratio 1 ($uf8)" '[ "$uf8" = "1.0" ]'
# uniform values: 4 exponents (2 bits) and a raw byte: about 10/16 of the bytes
check "uniform values (exponents 120..123): BF16 codes to about 0.63 ($ub)" 'near "$ub" 0.63 0.02'

# A BF16 tensor of random bits: coding does not pay, it is kept raw (ratio 1).
/usr/bin/python3 - "$T/random.safetensors" <<'PY'
import json, os, struct, sys
n = 1 << 20
h = json.dumps({"r.weight": {"dtype": "BF16", "shape": [n // 2], "data_offsets": [0, n]}}).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + os.urandom(n))
PY
"$DDO_BIN" inspect --codec --json "$T/random.safetensors" >"$T/r.json" 2>&1
rr=$(jget "$T/r.json" 'd["total"]["ratio"]')
kept=$(jget "$T/r.json" 'd["total"]["kept_raw"]')
check "random bits: stored raw, ratio 1 ($rr, kept raw $kept)" '[ "$rr" = "1.0" ] && [ "$kept" = 1 ]'

"$DDO_BIN" inspect --codec --verify --json "$T/normal.safetensors" >"$T/v.json" 2>&1; rc=$?
nv=$(jget "$T/v.json" 'd["verified_streams"]')
ncoded=$(jget "$T/v.json" 'sum(x["tensors"] for x in d["dtypes"] if x["dtype"] in ("BF16", "F16", "F32", "F8_E4M3"))')
check "inspect --codec --verify: every stream of a coded dtype decoded bit-identical ($nv of $ncoded)" \
    '[ $rc -eq 0 ] && [ "$nv" = "$ncoded" ] && [ "$(jget "$T/v.json" "d[\"decoder_gb_per_s_per_thread\"] > 0")" = True ]'
"$DDO_BIN" inspect --codec --verify "$T/random.safetensors" >"$T/vr.txt" 2>&1; rc=$?
check "inspect --codec --verify on random bits (raw blocks)" \
    '[ $rc -eq 0 ] && grep -q "^verify: 1 coded streams .* bit-identical" "$T/vr.txt"'
"$DDO_BIN" inspect --codec --threads 0 "$T/normal.safetensors" >/dev/null 2>"$T/err"; rc=$?
check "inspect --threads 0 is a usage error" '[ $rc -eq 2 ] && grep -q "threads" "$T/err"'

# ---- plan: coded sizes and the cost model ------------------------------------------------
P=(--ddo-execution-device cpu --ddo-backend vmm --ddo-vmm-source-cache-gb 1
    --ddo-small-tensor-threshold-kb 16 --ddo-vmm-resident-weight-budget-gb 0.01 --ddo-resident-module-budget-gb 0
    --bandwidth-gbps 1 --tflops 1000 --device-memory-gb 1)
"$DDO_BIN" plan "$T/normal.safetensors" "${P[@]}" --ddo-weight-codec ddoc1 --codec-ratio 0.5 \
    --decode-gbps 1000 --json >"$T/p.json" 2>"$T/err"; rc=$?
check "plan --codec-ratio --json exits 0" '[ $rc -eq 0 ]' || cat "$T/err"
# every streamed unit: coded = bytes - 0.5 x its coded tensors; transfer = coded / bus (the
# decoder at 1000 GB/s is never the longer)
check "plan units carry coded and decoded bytes, the transfer on the coded bytes" \
    '[ "$(jget "$T/p.json" "all(abs(u[\"coded_bytes\"] - (u[\"bytes\"] - u[\"decoded_bytes\"] / 2)) <= len(u[\"tensors\"]) for u in d[\"units\"] if not u[\"resident\"] and u[\"decoded_bytes\"] > 0) and any(u[\"decoded_bytes\"] > 0 for u in d[\"units\"]) and all(abs(u[\"transfer_s\"] - u[\"coded_bytes\"] / 1e9) < 1e-9 for u in d[\"units\"] if not u[\"resident\"] and u[\"coded_bytes\"] > 0)")" = True ]'
check "plan decisions: the ratio from the inputs" \
    '[ "$(jget "$T/p.json" "d[\"planner_decisions\"][\"codec_ratio_source\"]")" = inputs ]'
"$DDO_BIN" plan "$T/normal.safetensors" "${P[@]}" --ddo-weight-codec ddoc1 --codec-ratio 0.5 \
    --decode-gbps 0.01 --json >"$T/pd.json" 2>&1
check "a slow decoder makes the transfer decode-bound (decoded / decode rate)" \
    '[ "$(jget "$T/pd.json" "all(abs(u[\"transfer_s\"] - u[\"decoded_bytes\"] / 1e7) < 1e-9 for u in d[\"units\"] if not u[\"resident\"] and u[\"coded_bytes\"] > 0)")" = True ]'
"$DDO_BIN" plan "$T/normal.safetensors" "${P[@]}" --ddo-weight-codec ddoc1 >"$T/p.txt" 2>&1; rc=$?
check "plan (text): a coded MiB column, raw and coded totals, the coded and raw step" \
    '[ $rc -eq 0 ] && grep -q "coded MiB" "$T/p.txt" &&
     grep -Eq "streamed, coded .* GiB raw -> .* GiB coded over the bus" "$T/p.txt" &&
     grep -Eq "predicted step +[0-9.]+ s coded \([0-9.]+ s raw\)" "$T/p.txt" &&
     grep -q "codec_ratio_source  *default" "$T/p.txt" &&
     grep -q "codec_decode_gbps  *0.25" "$T/p.txt"'
steps() { sed -n 's/.*predicted step *\([0-9.]*\) s coded (\([0-9.]*\) s raw).*/\1 \2/p' "$1"; }
st=$(steps "$T/p.txt")
check "the cpu device's decoder (0.25 GB/s) is slower than this 1 GB/s bus: coded step above raw ($st)" \
    'lt ${st#* } ${st% *}'
"$DDO_BIN" plan "$T/normal.safetensors" "${P[@]}" --ddo-weight-codec ddoc1 --decode-gbps 100 \
    >"$T/pf.txt" 2>&1
st=$(steps "$T/pf.txt")
check "a fast decoder: the coded step below the raw one on a slow bus ($st)" 'lt ${st% *} ${st#* }'
"$DDO_BIN" plan "$T/normal.safetensors" "${P[@]}" >"$T/pn.txt" 2>&1
check "without the codec: no coded column" '! grep -q "coded MiB" "$T/pn.txt"'
"$DDO_BIN" plan --from-json "$T/p.json" >"$T/pj.txt" 2>&1; rc=$?
check "a saved coded plan prints its coded sizes again" \
    '[ $rc -eq 0 ] && grep -q "coded MiB" "$T/pj.txt"'
"$DDO_BIN" plan "$T/normal.safetensors" "${P[@]}" --codec-ratio 1.5 >/dev/null 2>"$T/err"; rc=$?
check "plan --codec-ratio above 1 is a usage error" '[ $rc -eq 2 ]'

# ---- bench: the codec figures ------------------------------------------------------------
C="--ddo-backend vmm --ddo-preset auto --ddo-vmm-source-cache-gb 1 --ddo-vmm-resident-weight-budget-gb 0.01 --ddo-resident-module-budget-gb 0"
"$DDO_BIN" bench "$T/normal.safetensors" --ddo-execution-device cpu --ddo-small-tensor-threshold-kb 16 \
    --tokens 4 --steps 2 --trace-steps 0 --cpu-gbps 2 --bus-gib 0.05 --direct-gib 0 \
    --case "raw $C" --case "coded $C --ddo-weight-codec ddoc1" --json "$T/b.json" >"$T/b.out" 2>&1; rc=$?
check "bench with a coded case exits 0" '[ $rc -eq 0 ]' || cat "$T/b.out"
check "bench: the codec table lists the coded case only" \
    'grep -q "^weight codec (per step" "$T/b.out" && grep -Eq "^coded +[0-9.]+ +[0-9.]+" "$T/b.out" &&
     ! sed -n "/^weight codec/,\$p" "$T/b.out" | grep -q "^raw "'
check "bench JSON: coded bytes below decoded, raw bound above the coded bound, both ratios" \
    '[ "$(jget "$T/b.json" "[(c[\"weight_codec\"], c.get(\"coded_bytes_per_step\", 0) < c.get(\"decoded_bytes_per_step\", 0), c.get(\"raw_bound_s\", 0) > c.get(\"coded_bound_s\", 1), abs(c.get(\"step_over_raw_bound\", 0) - c[\"step_s\"] / c.get(\"raw_bound_s\", 1)) < 1e-6) for c in d[\"cases\"] if c[\"name\"] != \"resident\"]")" = "[('"'"'none'"'"', False, False, False), ('"'"'ddoc1'"'"', True, True, True)]" ]'
check "bench: the coded case is bit-identical" \
    '[ "$(jget "$T/b.json" "[c[\"bit_identical\"] for c in d[\"cases\"]]")" = "[True, True, True]" ]'

echo "$fails failed"
[ "$fails" -eq 0 ]
