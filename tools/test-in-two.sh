#!/usr/bin/env bash
# `make test`: the whole suite, in two pytest processes at once: the tests on the session's Ray
# cluster (marker `ray`, set from the fixture) and all the others. The suite mostly waits (Ray
# workers and subprocesses starting, each importing verl and torch; a judge's latencies): run as one
# process it kept this 2-core machine at a load average of about 1. Each half is a pytest session of
# its own, so there is still one Ray cluster per session. The other half's report follows the Ray
# half's. Usage: tools/test-in-two.sh PYTHON [PYTEST_ARGS...]
set -u
python="$1"
shift
log="$(mktemp)"
"$python" -m pytest -p no:cacheprovider -m "not ray" "$@" >"$log" 2>&1 &
rest=$!
"$python" -m pytest -m ray "$@"
ray_status=$?
wait "$rest"
rest_status=$?
echo
echo "==================== the tests without Ray (run beside the ones above) ===================="
cat "$log"
rm -f "$log"
# pytest exits 5 when a half selects no test (PYTEST_ARGS naming files of one half only).
passed() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }
if passed "$ray_status" && passed "$rest_status" && ! [ "$ray_status" -eq 5 -a "$rest_status" -eq 5 ]; then
    exit 0
fi
echo "make test: FAILED (tests on Ray: exit $ray_status; the others: exit $rest_status)"
exit 1
