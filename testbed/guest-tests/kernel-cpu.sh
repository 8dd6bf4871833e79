#!/bin/sh
# kernel-cpu.sh [ROUNDS] [SIZES] (in the testbed guest): where one request in flight
# spends its CPU, the `kernel` lane beside `openssl speed -engine afalg` (issue 20).
# First what the unplug check's candidates cost per call beside a call that does
# nothing (`kernel_paths`' last lines). Then ROUNDS rounds of, per size: `openssl speed
# -elapsed -engine afalg -evp aes-128-cbc -seconds 2 -bytes N` (requests from its
# "Doing" line; its user and system CPU from the shell's `times`, start-up included)
# and then each `kernel_paths*` binary on the PATH (e.g. one built at the base commit
# as `kernel_paths_base` and one at the branch as `kernel_paths`), one lane of
# `kernel:<driver>` for 2 s, whose `cpu` line gives the lane loop's own user and system
# CPU per request (start-up excluded), stopped by a timer thread as `openssl speed` is
# by an alarm, and again reading the clock after every request to know when to stop
# (`HETCRYPT_PATHS_STOP=clock`, the example's loop before the nineteenth session; a
# binary built before then reads it per request either way). Clock ticks are 10 ms: 2 s
# hold about 200.
# Run from the host:
#   testbed/run --profile soft --with /usr/bin/openssl \
#     --with /usr/lib/x86_64-linux-gnu/engines-3 --env OPENSSL_ENGINES=/opt/hetcrypt/bin/engines-3 \
#     --with KERNEL_PATHS_BASE --with target/release/examples/kernel_paths \
#     --with testbed/guest-tests/kernel-cpu.sh -- sh /opt/hetcrypt/bin/kernel-cpu.sh 3
# KERNEL_PATHS_BASE: the example built at the commit compared against, copied under
# the name kernel_paths_base (optional).
rounds=${1:-3}
sizes=${2:-16 64 256 1024 8192 16384}
driver=${DRIVER:-virtio_crypto_aes_cbc}
echo "=== $(uname -r), profile ${HETCRYPT_TESTBED_PROFILE:-?}, driver $driver, $(grep -m1 'model name' /proc/cpuinfo)"
bins=""
for b in kernel_paths_base kernel_paths; do
	command -v $b >/dev/null && bins="$bins $b"
done
echo "=== check costs (kernel_paths $driver 0.2 16 kernel)"
kernel_paths "$driver" 0.2 16 kernel | grep -v "^lane\|^type"
# Seconds of children's user and system CPU in `times` output file $1 (second line).
# (`times` itself must run in this shell, not in a `$(...)` subshell.)
child_cpu() {
	tail -1 "$1" | awk '{
		for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); t[i] = a[1] * 60 + a[2] }
		printf "%.3f %.3f\n", t[1], t[2] }'
}
r=1
while [ "$r" -le "$rounds" ]; do
	for sz in $sizes; do
		times >/tmp/times0
		openssl speed -elapsed -engine afalg -evp aes-128-cbc -seconds 2 -bytes $sz \
			>/tmp/speed.out 2>/tmp/speed.err
		times >/tmp/times1
		before=$(child_cpu /tmp/times0)
		after=$(child_cpu /tmp/times1)
		n=$(grep -m1 "^Doing" /tmp/speed.err | sed 's/.*: \([0-9]*\) .*/\1/')
		echo "$before $after $n" | awk -v r=$r -v sz=$sz '{
			n = $5 > 0 ? $5 : 1
			printf "=== round %d size %d afalg: %d requests, user %.1f us, sys %.1f us, wall %.1f us per request (start-up included)\n",
				r, sz, $5, ($3 - $1) * 1e6 / n, ($4 - $2) * 1e6 / n, 2e6 / n }'
		for b in $bins; do
			echo "=== round $r size $sz $b: $($b "$driver" 2 $sz kernel | grep "^cpu")"
			[ "$b" = kernel_paths_base ] && continue
			echo "=== round $r size $sz $b clock: $(HETCRYPT_PATHS_STOP=clock $b "$driver" 2 $sz kernel | grep "^cpu")"
		done
	done
	r=$((r + 1))
done
