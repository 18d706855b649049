#!/usr/bin/env bash
# cli_config.sh - `ddo config`: the environment then the flags, sources, JSON,
# the route table, errors and exit codes, and docs/options.md being exactly
# the generated catalog.
# ctest-labels: cli
set -u
BIN=${DDO_BIN:?DDO_BIN not set}
SRC=${DDO_SOURCE_DIR:?DDO_SOURCE_DIR not set}
fails=0
passes=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { passes=$((passes + 1)); }
bad() { echo "  FAILED: $*" >&2; fails=$((fails + 1)); }
# run NAME ENV... -- ARGS... : runs the tool in a clean environment
run() {
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env -i PATH="$PATH" "${envs[@]}" "$BIN" config "$@" >"$tmp/out" 2>"$tmp/err"
    echo $? >"$tmp/rc"
}
rc() { cat "$tmp/rc"; }
expect_rc() { [ "$(rc)" = "$1" ] && ok || bad "$2: exit $(rc), want $1; stderr: $(cat "$tmp/err")"; }
expect_out() { grep -qE -- "$1" "$tmp/out" && ok || bad "$2: stdout lacks /$1/"; }
expect_err() { grep -qF -- "$1" "$tmp/err" && ok || bad "$2: stderr lacks '$1': $(cat "$tmp/err")"; }

# docs/options.md is the generated catalog, byte for byte.
if "$BIN" config --list --markdown | diff -u "$SRC/docs/options.md" - >"$tmp/diff"; then ok; else
    bad "docs/options.md differs from \`ddo config --list --markdown\` (regenerate it):"
    head -40 "$tmp/diff" >&2
fi

# Default: linear + auto -> one_shot_fast, sources printed.
run -- ; expect_rc 0 default
expect_out '^  route +one_shot_fast$' default
expect_out '^  execution_mode +linear_runtime +preset:one_shot_fast$' default
expect_out '^  pin_cpu_workers +4 +preset:one_shot_fast$' default
expect_out '^  text_encoder +diffusers_group_offload' default

# The environment applies; flags win over it.
run DDO_PIN_CPU_WORKERS=3 DDO_VERBOSE=yes -- --ddo-pin-cpu-workers 5; expect_rc 0 flag-wins
expect_out '^  pin_cpu_workers +5 +flag$' flag-wins
expect_out '^  verbose +true +env:DDO_VERBOSE$' flag-wins

# The route table.
run -- --ddo-backend vmm --ddo-preset auto; expect_rc 0 vmm-auto
expect_out '^  route +vmm_fast_runtime$' vmm-auto
expect_out '^  vmm_resident_weight_budget_gb +4 +preset:vmm_fast_runtime$' vmm-auto
run -- --ddo-backend vmm --ddo-preset nvme_baseline --ddo-vmm-total-staging-gb 2
expect_rc 0 vmm-nvme
expect_out '^  route +vmm_runtime$' vmm-nvme
expect_out '^  vmm_staging_buffer_gb +1 +flag$' vmm-nvme
run DDO_BACKEND=vmm -- --ddo-vmm-total-staging-gb=2; expect_rc 0 vmm-total
expect_out '^  vmm_staging_buffer_gb +2 +flag$' vmm-total

# Errors: one line naming the variable/option, exit 1; usage errors exit 2.
run DDO_PIN_CPU_WORKERS=abc -- ; expect_rc 1 bad-int
expect_err 'ddo config: DDO_PIN_CPU_WORKERS="abc": expected an integer' bad-int
run -- --ddo-preset nvme_baseline; expect_rc 1 linear-nvme
expect_err "DDO_PRESET='nvme_baseline' is a native VMM preset and needs DDO_BACKEND=vmm" linear-nvme
run DDO_PRESET=windows_fast -- ; expect_rc 1 bad-preset
expect_err "Invalid DDO_PRESET='windows_fast'" bad-preset
run DDO_EXECUTION_MODE=vmm_fast_runtime -- ; expect_rc 1 vmm-mode-linear
expect_err 'execution_mode=vmm_fast_runtime (env:DDO_EXECUTION_MODE) needs backend=vmm, but backend=linear (default)' vmm-mode-linear
run -- --ddo-vmm-source-cache-gb 4 --ddo-vmm-source-registered-gb 8; expect_rc 1 registration
expect_err 'vmm_source_registered_gb=8 (flag) exceeds vmm_source_cache_gb=4 (flag)' registration
run -- --ddo-pin-cpu-worker 3; expect_rc 1 unknown-flag
expect_err 'unknown flag --ddo-pin-cpu-worker (did you mean --ddo-pin-cpu-workers?)' unknown-flag
run -- --frobnicate; expect_rc 2 usage

# Unknown DDO_* variables warn and suggest; component and harness variables do not.
run DDO_PIN_CPU_WORKER=3 DDO_VAE_ROUTE=none DDO_RUNNER_X=1 DDO_TEST_DATA=/x -- ; expect_rc 0 warn
expect_err 'ddo: warning: unknown environment variable DDO_PIN_CPU_WORKER ignored (did you mean DDO_PIN_CPU_WORKERS?)' warn
[ "$(grep -c warning "$tmp/err")" = 1 ] && ok || bad "warn: expected exactly one warning"
expect_out '^  vae +none \(env:DDO_VAE_ROUTE\)$' warn

# JSON: every option with value and source, the settings object, components.
run DDO_PRESET=low_ram_safe -- --json --ddo-verbose; expect_rc 0 json
if command -v python3 >/dev/null; then
    python3 - "$tmp/out" <<'PY' && ok || bad "json content"
import json, sys
d = json.load(open(sys.argv[1]))
o = d["options"]
assert o["preset"] == {"value": "low_ram_safe", "source": "env:DDO_PRESET"}, o["preset"]
assert o["verbose"] == {"value": True, "source": "flag"}, o["verbose"]
assert o["resident_module_budget_gb"]["value"] == 3.0
assert o["resident_module_budget_gb"]["source"] == "preset:low_ram_safe"
assert all("value" in v and "source" in v for v in o.values())
s = d["settings"]
assert s["effective_preset"] == "low_ram_safe" and s["route"] == "low_ram_safe", s
assert s["enabled"] is True and s["requested_pin_cpu_memory"] is False
assert d["components"]["text_encoder"]["use_stream"] is False
PY
else
    expect_out '"effective_preset": "low_ram_safe"' json
fi

# --list: the whole catalog.
run -- --list; expect_rc 0 list
expect_out '^vmm_source_registered_gb \(GiB, default 0.0\)$' list
expect_out '^    env DDO_VMM_SOURCE_REGISTERED_GB, flag --ddo-vmm-source-registered-gb$' list
expect_out '^    effect: live$' list
expect_out '^    effect: accepted for compatibility, no effect$' list
expect_out '^    effect: windows only$' list
expect_out '^    Accepted for compatibility, no effect: ddo keeps no plan cache' list
expect_out 'auto -> one_shot_fast' list
run -- --markdown; expect_rc 2 markdown-alone

echo "$passes passed, $fails failed, 0 skipped"
[ "$fails" = 0 ]
