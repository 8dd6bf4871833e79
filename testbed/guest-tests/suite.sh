#!/bin/sh
# suite.sh TEST_BINARY... (in the testbed guest, run by testbed/ci)
# Runs each Rust test binary (found on PATH) one test at a time, then prints one
# summary line per binary and "N passed, N failed". Exit status: 0 only if every
# binary passed. Test output is not captured (--nocapture), so the tests' notes
# (drivers, shares, timings) reach the CI log. The testbed tests are #[ignore]d so a
# host run lists them as ignored with the reason: --include-ignored runs them here.
passed=0
failed=0
summary=""
for t in "$@"; do
	name=${t%-*}
	echo "=== $name ($(date +%T))"
	start=$(cut -d' ' -f1 /proc/uptime)
	if "$t" --include-ignored --test-threads=1 --nocapture; then
		st=ok
		passed=$((passed + 1))
	else
		st="FAILED (exit $?)"
		failed=$((failed + 1))
	fi
	end=$(cut -d' ' -f1 /proc/uptime)
	summary="$summary
  $name: $st in $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f s", b - a }')"
done
echo "=== guest suite on Linux $(uname -r), profile ${HETCRYPT_TESTBED_PROFILE:-?}:$summary"
echo "suite: $passed passed, $failed failed"
[ "$failed" = 0 ]
