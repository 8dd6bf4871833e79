#!/bin/sh
# suite.sh [NAME=VALUE | TEST_BINARY]... (in the testbed guest, run by testbed/ci)
# Runs each Rust test binary (found on PATH) one test at a time, then prints one
# summary line per binary and "N passed, N failed". A NAME=VALUE argument is exported
# for the binaries after it (NAME= unsets it), and their summary lines show it: so
# `HETCRYPT_TEST_DEVICE_ENGINE=devcrypto kat` runs the known answers with that engine
# forced. Exit status: 0 only if every
# binary passed. Test output is not captured (--nocapture), so the tests' notes
# (drivers, shares, timings) reach the CI log. The testbed tests are #[ignore]d so a
# host run lists them as ignored with the reason: --include-ignored runs them here.
# A binary that exits 0 having run no test, or with a test still ignored, fails: a
# device suite that ran nothing must not read as passed.
passed=0
failed=0
summary=""
setting=""
for t in "$@"; do
	case $t in
	*=)
		unset "${t%=}"
		setting=""
		continue
		;;
	*=*)
		export "${t?}"
		setting=" [$t]"
		continue
		;;
	esac
	name=${t%-*}$setting
	echo "=== $name ($(date +%T))"
	start=$(cut -d' ' -f1 /proc/uptime)
	out=/tmp/suite-$$.out
	# stdout goes to the log as it comes and to $out for the counts below (stderr
	# goes its own way, as before).
	{
		"$t" --include-ignored --test-threads=1 --nocapture
		echo $? >"$out.rc"
	} | tee "$out"
	rc=$(cat "$out.rc")
	# libtest's last line: "test result: ok. N passed; N failed; N ignored; ...".
	result=$(grep '^test result:' "$out" | tail -n 1)
	ran=$(echo "$result" | sed -n 's/.* \([0-9][0-9]*\) passed;.*/\1/p')
	ignored=$(echo "$result" | sed -n 's/.* \([0-9][0-9]*\) ignored;.*/\1/p')
	rm -f "$out" "$out.rc"
	if [ "$rc" != 0 ]; then
		st="FAILED (exit $rc)"
	elif [ "${ran:-0}" = 0 ]; then
		st="FAILED (no test ran: ${result:-no test result line})"
	elif [ "${ignored:-0}" != 0 ]; then
		st="FAILED ($ignored tests ignored despite --include-ignored)"
	else
		st="ok, $ran tests"
	fi
	case $st in
	ok*) passed=$((passed + 1)) ;;
	*) failed=$((failed + 1)) ;;
	esac
	end=$(cut -d' ' -f1 /proc/uptime)
	summary="$summary
  $name: $st in $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f s", b - a }')"
done
echo "=== guest suite on Linux $(uname -r), profile ${HETCRYPT_TESTBED_PROFILE:-?}:$summary"
echo "suite: $passed passed, $failed failed"
[ "$failed" = 0 ]
