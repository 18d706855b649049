#!/usr/bin/env bash
# check_no_outside_refs.sh - the repository stands alone: no tracked file cites a document
# that is not in it (a style guide, a design note, a specification's numbered sections, the
# seed documents the compatible API came from, a path on a development machine). Comments and
# docs state the rule itself, or point to a file of the repository (docs/*.md).
# ctest-labels: unit
set -u
SRC=${DDO_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$SRC" || exit 1
command -v git >/dev/null && git rev-parse --is-inside-work-tree >/dev/null 2>&1 || {
    echo "skipped: not a git checkout"
    exit 77
}
# Words that cite an outside document. Each alternative is one kind of reference.
pat='STYLE\.md|ARCHITECTURE\.md|ddo-upstream|shared/seeds|\.\./shared/|/work/(shared|\.library)|§'
pat+="|\\bthe seeds?\\b|\\bseed's|\\bseeds'|\\bseed:|\\bseed documents?|\\busage seed"
pat+='|\bsections? [0-9]+\.[0-9]+|reference/[a-z0-9-]+\.md'
# The one file that must name these words: this check.
exempt='^tests/check_no_outside_refs\.sh$'
files=$(git ls-files | grep -vE "$exempt" | grep -vE '^(docs/traces/|tests/data/|tests/fuzz/corpus/)')
# shellcheck disable=SC2086
hits=$(printf '%s\n' $files | xargs grep -nIiP "$pat" -- 2>/dev/null || true)
if [ -n "$hits" ]; then
    echo "FAIL: references to documents outside the repository (state the rule itself):"
    echo "$hits"
    exit 1
fi
echo "no references outside the repository ($(printf '%s\n' $files | wc -l) files)"
