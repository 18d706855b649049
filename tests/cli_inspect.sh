#!/usr/bin/env bash
# cli_inspect.sh - `ddo inspect`: the human table, the exact --json document,
# and the exit codes 0 (success), 1 (rejected checkpoint: one line on stderr,
# nothing on stdout) and 2 (usage error, usage on stderr).
#
# ctest-labels: cli
set -u

: "${DDO_BIN:?DDO_BIN must name the ddo tool}"
: "${DDO_TEST_DATA:?DDO_TEST_DATA must name tests/data}"
ST="$DDO_TEST_DATA/safetensors"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

passed=0
failed=0
fail() {
    echo "  FAILED: $*" >&2
    failed=$((failed + 1))
}
ok() {
    passed=$((passed + 1))
}

# run NAME ARGS...: runs the tool, keeping stdout, stderr and the exit status.
run() {
    "$DDO_BIN" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
}

# expect_rc WANT CONTEXT
expect_rc() {
    if [ "$rc" -eq "$1" ]; then ok; else fail "$2: exit $rc, wanted $1"; fi
}

# expect_line FILE REGEX CONTEXT: some line of FILE matches the extended regex.
expect_line() {
    if grep -Eq -- "$2" "$1"; then ok; else fail "$3: no line matches /$2/ in $(cat "$1")"; fi
}

# ---- human output ----
run inspect "$ST/valid/edge_shapes.safetensors"
expect_rc 0 "edge_shapes"
expect_line "$TMP/out" "^$ST/valid/edge_shapes.safetensors: 5 tensors, 221 bytes \(221 B\) in 1 file\$" "summary"
expect_line "$TMP/out" "^  file 0: $ST/valid/edge_shapes.safetensors \(533 bytes, header 304 bytes\)\$" "file row"
expect_line "$TMP/out" '^NAME +DTYPE +SHAPE +BYTES$' "tensor header"
expect_line "$TMP/out" '^conv +F16 +\[4, 3, 3, 3\] +216$' "conv row"
expect_line "$TMP/out" '^scalar +F32 +\[\] +4$' "scalar row"
expect_line "$TMP/out" '^zero_dim +BF16 +\[3, 0, 2\] +0$' "zero_dim row"
expect_line "$TMP/out" '^F32 +2 +4$' "F32 total"
expect_line "$TMP/out" '^total +5 +221$' "total"
expect_line "$TMP/out" '^block groups: none$' "no block groups"
[ -s "$TMP/err" ] && fail "edge_shapes: unexpected stderr: $(cat "$TMP/err")" || ok
# tensors in data-offset order: empty, scalar, zero_dim, conv, one
order=$(grep -E '^(empty|scalar|zero_dim|conv|one) ' "$TMP/out" | cut -d' ' -f1 | tr '\n' ' ')
[ "$order" = "empty scalar zero_dim conv one " ] && ok || fail "tensor order: $order"

run inspect "$ST/tiny_flux_sharded"
expect_rc 0 "tiny_flux_sharded"
expect_line "$TMP/out" "^$ST/tiny_flux_sharded: 126 tensors, 297888 bytes \(290.9 KiB\) in 8 files\$" "sharded summary"
expect_line "$TMP/out" '^  metadata: format = pt$' "metadata"
expect_line "$TMP/out" '^BLOCKS +COUNT +BYTES/BLOCK +TOTAL$' "blocks header"
expect_line "$TMP/out" '^transformer_blocks +2 +75776 +151552$' "transformer_blocks"
expect_line "$TMP/out" '^single_transformer_blocks +3 +31488 +94464$' "single_transformer_blocks"
expect_line "$TMP/out" '^BF16 +126 +297888$' "BF16 total"
rows=$(grep -cE '^[a-z_.0-9]+ +BF16 +\[' "$TMP/out")
[ "$rows" -eq 126 ] && ok || fail "sharded: $rows tensor rows, wanted 126"

# A directory whose name is outside any single-byte code page (a user name, a Chinese
# folder): paths are UTF-8 throughout. On Windows ddo.exe's manifest makes UTF-8 the process
# code page; without it this path reached ddo in the ANSI code page ("cannot open").
U="$TMP/Zoë 模型"
mkdir -p "$U" && cp "$ST/tiny_flux/diffusion_pytorch_model.safetensors" "$U/m.safetensors"
run inspect "$U/m.safetensors"
expect_rc 0 "a UTF-8 path"
expect_line "$TMP/out" "^$U/m.safetensors: 126 tensors, 297888 bytes" "a UTF-8 path echoed as given"

# ---- --json: the exact document ----
run inspect --json "$ST/valid/edge_shapes.safetensors"
expect_rc 0 "edge_shapes --json"
want='{"files":[{"path":"'"$ST"'/valid/edge_shapes.safetensors","size":533,"header_bytes":304}],"metadata":{},"tensors":[{"name":"empty","dtype":"F32","shape":[0],"file":0,"offset":312,"nbytes":0},{"name":"scalar","dtype":"F32","shape":[],"file":0,"offset":312,"nbytes":4},{"name":"zero_dim","dtype":"BF16","shape":[3,0,2],"file":0,"offset":316,"nbytes":0},{"name":"conv","dtype":"F16","shape":[4,3,3,3],"file":0,"offset":316,"nbytes":216},{"name":"one","dtype":"I8","shape":[1],"file":0,"offset":532,"nbytes":1}],"total_bytes":221,"blocks":[]}'
[ "$(cat "$TMP/out")" = "$want" ] && ok || fail "edge_shapes --json: $(cat "$TMP/out")"
[ "$(wc -l <"$TMP/out")" -eq 1 ] && ok || fail "--json is not one line"

run inspect "$ST/tiny_flux/diffusion_pytorch_model.safetensors" --json
expect_rc 0 "tiny_flux --json (flag after the path)"
expect_line "$TMP/out" '"total_bytes":297888,"blocks":\[\{"prefix":"single_transformer_blocks","count":3,"bytes_per_block":31488\},\{"prefix":"transformer_blocks","count":2,"bytes_per_block":75776\}\]\}$' "tiny_flux blocks"
expect_line "$TMP/out" '"metadata":\{"format":"pt"\}' "tiny_flux metadata"
n=$(grep -o '"dtype":"BF16"' "$TMP/out" | wc -l)
[ "$n" -eq 126 ] && ok || fail "tiny_flux --json: $n tensors"

# ---- rejected checkpoints: exit 1, one line on stderr, nothing on stdout ----
rejected() { # FILE EXPECTED_STDERR
    run inspect "$1"
    expect_rc 1 "$1"
    [ -s "$TMP/out" ] && fail "$1: stdout not empty: $(cat "$TMP/out")" || ok
    [ "$(cat "$TMP/err")" = "$2" ] && ok || fail "$1: stderr '$(cat "$TMP/err")', wanted '$2'"
    [ "$(wc -l <"$TMP/err")" -eq 1 ] && ok || fail "$1: stderr is not one line"
}
rejected "$ST/invalid/overlapping.safetensors" \
    'ddo inspect: overlapping.safetensors: tensor "scalar": data_offsets [4, 220] overlap tensor "conv" [4, 220]'
rejected "$ST/invalid/shape_offsets_mismatch.safetensors" \
    'ddo inspect: shape_offsets_mismatch.safetensors: tensor "conv": data_offsets [4, 220] hold 216 bytes but F16 [4, 3, 3, 4] needs 288'
rejected "$ST/invalid/duplicate_key.safetensors" \
    'ddo inspect: duplicate_key.safetensors: duplicate key "one" in the header at line 1, column 351 (rejected: stricter than the official library, which keeps the last)'
rejected "$TMP/missing.safetensors" \
    "ddo inspect: $TMP/missing.safetensors: cannot open: No such file or directory"
rejected "$TMP" \
    "ddo inspect: $TMP: directory holds no diffusion_pytorch_model.safetensors[.index.json] or model.safetensors[.index.json]"
# the official library accepts an unpadded header, and so does ddo
run inspect "$ST/invalid/unpadded_header.safetensors"
expect_rc 0 "unpadded_header"

# ---- hostile files (issue 14) ----
# mk_st FILE HEADER NDATA: a safetensors file with HEADER (under 64 KiB) and NDATA zero bytes
mk_st() {
    local len=${#2}
    {
        printf "$(printf '\\x%02x\\x%02x' $((len & 255)) $((len >> 8 & 255)))"
        printf '\0\0\0\0\0\0%s' "$2"
        head -c "$3" /dev/zero
    } >"$1"
}
# special files are refused at once (timeout: a blocking open would hang here)
mkfifo "$TMP/fifo.safetensors" "$TMP/fifo.safetensors.index.json"
for f in "$TMP/fifo.safetensors" "$TMP/fifo.safetensors.index.json" /dev/zero; do
    timeout 20 "$DDO_BIN" inspect "$f" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    expect_rc 1 "$f"
    expect_line "$TMP/err" "^ddo inspect: .*: not a regular file \\(a FIFO, socket or device\\)\$" "$f refused"
done
# a name with a newline and a terminal escape: escaped in the table and in messages
mk_st "$TMP/esc.safetensors" '{"a\nb\u001b[31m":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"q":{"dtype":"F4","shape":[4],"data_offsets":[2,4]}}' 4
run inspect "$TMP/esc.safetensors"
expect_rc 0 "escaped name"
expect_line "$TMP/out" '^a\\nb\\x1b\[31m +U8 +\[2\] +2$' "escaped name row"
expect_line "$TMP/out" '^q +F4 +\[4\] +2$' "F4 row (4 bits per element)"
grep -q "$(printf '\033')" "$TMP/out" && fail "an escape byte reached stdout" || ok
mk_st "$TMP/esc2.safetensors" '{"a\nb\u001b[31m":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}' 0
rejected "$TMP/esc2.safetensors" \
    'ddo inspect: esc2.safetensors: tensor "a\nb\x1b[31m": shape [-0.0]: dimension 0 is a real number, not a non-negative integer'
deep=$(printf '%.0s[' $(seq 126))$(printf '%.0s]' $(seq 126))
mk_st "$TMP/deep.safetensors" '{"w":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":'"$deep"'}}' 0
run inspect "$TMP/deep.safetensors"
expect_rc 1 "128 levels of nesting"
expect_line "$TMP/err" 'nests arrays and objects more than 127 deep' "nesting limit named"

# ---- usage errors: exit 2, nothing on stdout ----
usage_error() { # CONTEXT ARGS...
    local ctx=$1
    shift
    run inspect "$@"
    expect_rc 2 "$ctx"
    [ -s "$TMP/out" ] && fail "$ctx: stdout not empty" || ok
    expect_line "$TMP/err" '^usage: ddo inspect PATH \[--json\]$' "$ctx usage"
}
usage_error "no PATH"
usage_error "two PATHs" "$ST/valid/edge_shapes.safetensors" "$ST/valid/names.safetensors"
usage_error "unknown option" --bogus "$ST/valid/edge_shapes.safetensors"
run inspect $'--bad\n\033[2J'
expect_rc 2 "unknown option with a newline"
expect_line "$TMP/err" "^ddo inspect: unknown option '--bad\\\\n\\\\x1b\\[2J'\$" "unknown option escaped"
run inspect --help
expect_rc 0 "--help"
expect_line "$TMP/out" '^usage: ddo inspect PATH \[--json\]$' "--help usage on stdout"

echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
