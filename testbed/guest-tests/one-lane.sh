#!/bin/sh
# one-lane.sh [ROUNDS] (in the testbed guest): where one request in flight spends its
# time, `devcrypto` beside cryptodev's tests/speed (issue 20). First the system calls
# per request, counted (strace -c, deterministic, unlike the timings): `hetcrypt speed`
# of each engine at one lane and tests/speed, one size each. Then ROUNDS rounds of
# AES-128-CBC encryption, 1 s per size: tests/speed, the `kernel_paths` example (one
# lane of each engine, no dispatcher, one buffer again and again as tests/speed does;
# it also times one sysfs look, the engines' unplug check per request) and
# `hetcrypt speed --lanes 1` of both engines. Run from the host:
#   testbed/run --profile soft --with /usr/bin/strace \
#     --with target/release/examples/kernel_paths \
#     --with testbed/guest-tests/one-lane.sh -- sh /opt/hetcrypt/bin/one-lane.sh 5 >LOG
# cryptodev-speed: cryptodev's tests/speed, which testbed/run builds and brings (see
# testbed/lib/cryptodev.sh).
rounds=${1:-3}
driver=${DRIVER:-virtio_crypto_aes_cbc}
sizes=1024,2048,4096,8192,16384
echo "=== $(uname -r), profile ${HETCRYPT_TESTBED_PROFILE:-?}, driver $driver, $(grep -m1 'model name' /proc/cpuinfo)"
if command -v strace >/dev/null; then
	for engine in devcrypto kernel; do
		echo "=== syscalls: hetcrypt speed --engine $engine:$driver --lanes 1 --sizes 16384"
		strace -f -c -o /tmp/one-lane.st hetcrypt speed --engine "$engine:$driver" --lanes 1 \
			--sizes 16384 --seconds 0.5 -q | tail -1
		sort -k4 -n -r /tmp/one-lane.st | head -6
	done
	echo "=== syscalls: cryptodev tests/speed (SPEED_SECONDS=1, 512 B..64 KiB)"
	SPEED_SECONDS=1 strace -f -c -o /tmp/one-lane.st cryptodev-speed >/dev/null 2>&1
	sort -k4 -n -r /tmp/one-lane.st | head -6
fi
r=1
while [ "$r" -le "$rounds" ]; do
	echo "=== round $r tests/speed"
	SPEED_SECONDS=1 cryptodev-speed 2>&1 | tail -n 8
	echo "=== round $r lane"
	kernel_paths "$driver" 1
	for engine in devcrypto kernel; do
		echo "=== round $r speed $engine"
		hetcrypt speed --engine "$engine:$driver" --lanes 1 --sizes "$sizes" --seconds 1 -q | tail -1
	done
	r=$((r + 1))
done
