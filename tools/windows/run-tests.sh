#!/bin/sh
# run-tests.sh BUILD [CTEST_ARGS...] - the CTest suite of a cross build (BUILD) under Wine, as CI
# runs it: tools/windows/run-tests.sh build-win/b -j 2
#
# WINEPREFIX must be a prefix of the tests' own (CI's: build-win/wineprefix): a server running
# on it is stopped first, and the one this starts is stopped at the end.
#
# Wine's process start failed now and then under ctest -j 2, before the test's program ran:
# in about 0.01 s, with "wine client error:0: recvmsg: Connection reset by peer" or with no
# output at all; and two programs starting together on a fresh server waited 80-600 s for
# Wine's services (docs/windows.md). So:
#   - one server serves the whole run: started here, kept 60 s after its last client instead of
#     Wine's 3 s, so no test starts while a server exits or while a new one starts its services;
#   - one program runs alone first, so Wine's services are up before two tests start at once;
#   - a test that still fails is named and run once more, alone; a second failure fails.
set -u
[ $# -ge 1 ] || { echo "usage: run-tests.sh BUILD [CTEST_ARGS...]" >&2; exit 2; }
build=$1
shift
: "${WINEDEBUG:=-all}" "${WINEDLLOVERRIDES:=winedbg.exe=d}"
export WINEDEBUG WINEDLLOVERRIDES
server=${WINESERVER:-wineserver}
wine=${WINE:-wine}

"$server" -k >/dev/null 2>&1
"$server" -w >/dev/null 2>&1
"$server" -p60 </dev/null >/dev/null 2>&1 || {
    echo "run-tests: the Wine server did not start" >&2
    exit 1
}
timeout 600 "$wine" cmd /c exit 0 </dev/null >/dev/null 2>&1 ||
    echo "run-tests: the warm-up program failed under Wine; the tests run anyway" >&2

failed=$build/Testing/Temporary/LastTestsFailed.log
rm -f "$failed" # (an earlier run's list is not this one's)
rc=0
ctest --test-dir "$build" --output-on-failure "$@" || rc=$?
if [ $rc -ne 0 ] && [ -s "$failed" ]; then
    echo "run-tests: tests failed under Wine (above); running them once more, one at a time:"
    sed -n 's/^[0-9]*:/run-tests:   /p' "$failed"
    rc=0
    ctest --test-dir "$build" --output-on-failure --rerun-failed || rc=$?
fi
"$server" -k >/dev/null 2>&1
exit $rc
