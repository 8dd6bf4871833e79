#!/bin/sh
# kernel-lanes.sh [ROUNDS] (in the testbed guest): the `kernel` and `devcrypto` engines
# with one and two lanes (requests in flight) beside `openssl speed -engine afalg` and
# cryptodev's tests/speed, round by round on the same device, AES-128-CBC encryption,
# 16 B..16 KiB, 1 s per size. For docs/performance.md (issue 20). Run from the host:
#   testbed/run --profile soft --with /usr/bin/openssl \
#     --with /usr/lib/x86_64-linux-gnu/engines-3 --env OPENSSL_ENGINES=/opt/hetcrypt/bin/engines-3 \
#     --with testbed/guest-tests/kernel-lanes.sh \
#     -- sh /opt/hetcrypt/bin/kernel-lanes.sh 3 >LOG
#   (about 2.5 min a round with LANES="1 2 default" and CALIBRATE=1 on a quiet 2-core
#   host: give testbed/run --timeout 1200 for 4 rounds)
#   python3 testbed/guest-tests/kernel-lanes-table.py LOG...
# cryptodev-speed: cryptodev's tests/speed (its 5 s per size cut to SPEED_SECONDS), which
# testbed/run builds and brings (see testbed/lib/cryptodev.sh).
# The engines run with one lane, two, and ("lanes default") their own count: with
# CALIBRATE=1 the store's choice (`hetcrypt calibrate` runs first), else the default;
# LANES="default" runs only those (LANES lists the counts, default "1 2 default").
# The calibration is timed (seconds since boot before and after); with OLD=<another
# hetcrypt binary> (e.g. --with /work/runs/hc-main-s21-merged, OLD=hc-main-s21-merged)
# that binary calibrates first, timed, and its lane choice is shown beside ours.
# With OLD and OLD_LANES (e.g. "1"), that binary's engines also run, with those lane
# counts, as rows "old-kernel" and "old-devcrypto" of each round (a before/after in
# one boot).
rounds=${1:-3}
driver=${DRIVER:-virtio_crypto_aes_cbc}
sizes=16,64,256,1024,2048,4096,8192,16384
echo "=== $(uname -r), profile ${HETCRYPT_TESTBED_PROFILE:-?}, driver $driver, $(grep -m1 'model name' /proc/cpuinfo)"
# Seconds since boot, to 10 ms (busybox date has no sub-second format).
now() { cut -d' ' -f1 /proc/uptime; }
if [ "${CALIBRATE:-0}" = 1 ]; then
	# OLD=<another hetcrypt binary copied in with --with>: its calibration first, timed,
	# and the lanes it chose (the store is then overwritten by ours).
	if [ -n "${OLD:-}" ]; then
		t0=$(now)
		"$OLD" calibrate -q >/dev/null || exit 1
		echo "=== calibrate ($OLD) took $(echo "$(now) $t0" | awk '{print $1 - $2}') s"
		"$OLD" engines | grep -E "^ *(kernel|devcrypto):$driver"
		"$OLD" calibrate --show | grep -E "^ *(kernel|devcrypto)" | grep aes-128-cbc
	fi
	t0=$(now)
	hetcrypt calibrate -q >/dev/null || exit 1
	echo "=== calibrate (hetcrypt) took $(echo "$(now) $t0" | awk '{print $1 - $2}') s"
	hetcrypt engines | grep -E "^ *(kernel|devcrypto):$driver"
	hetcrypt calibrate --show | grep -E "^ *(kernel|devcrypto)" | grep aes-128-cbc
fi
r=1
while [ "$r" -le "$rounds" ]; do
	echo "=== round $r afalg"
	for b in $(echo "$sizes" | tr , ' '); do
		openssl speed -elapsed -engine afalg -evp aes-128-cbc -seconds 1 -bytes "$b" 2>/dev/null | tail -1
	done
	echo "=== round $r tests/speed"
	SPEED_SECONDS=1 cryptodev-speed 2>&1 | tail -n 8
	for lanes in ${LANES:-1 2 default}; do
		opt="--lanes $lanes"
		[ "$lanes" = default ] && opt=
		for engine in kernel devcrypto; do
			echo "=== round $r $engine lanes $lanes"
			# shellcheck disable=SC2086
			hetcrypt speed --engine "$engine:$driver" $opt --sizes "$sizes" --seconds 1 -q | tail -1
		done
	done
	for lanes in ${OLD_LANES:-}; do
		for engine in kernel devcrypto; do
			echo "=== round $r old-$engine lanes $lanes"
			"$OLD" speed --engine "$engine:$driver" --lanes "$lanes" --sizes "$sizes" --seconds 1 -q | tail -1
		done
	done
	r=$((r + 1))
done
