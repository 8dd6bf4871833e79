#!/bin/sh
# kernel-afalg-sizes.sh [ROUNDS] (in the testbed guest): one lane of the `kernel` engine
# against `openssl speed -engine afalg`, one size at a time so that the two take turns
# second by second (issue 20). First, when strace is in the guest, the system calls of
# the afalg engine per request (16 B and 16 KiB). Then ROUNDS rounds of: per size,
# `openssl speed -bytes N -seconds 1` and the `kernel_paths` lane at that size for 1 s;
# then cryptodev's tests/speed. Run from the host:
#   testbed/run --profile soft --with /usr/bin/openssl \
#     --with /usr/lib/x86_64-linux-gnu/engines-3 --env OPENSSL_ENGINES=/opt/hetcrypt/bin/engines-3 \
#     --with target/release/examples/kernel_paths [--with /usr/bin/strace] \
#     --with testbed/guest-tests/kernel-afalg-sizes.sh -- sh /opt/hetcrypt/bin/kernel-afalg-sizes.sh 8
# cryptodev-speed: cryptodev's tests/speed, which testbed/run builds and brings (see
# testbed/lib/cryptodev.sh).
rounds=${1:-5}
driver=${DRIVER:-virtio_crypto_aes_cbc}
echo "=== $(uname -r), profile ${HETCRYPT_TESTBED_PROFILE:-?}, driver $driver, $(grep -m1 'model name' /proc/cpuinfo)"
if command -v strace >/dev/null; then
	for sz in 16 16384; do
		echo "=== syscalls: openssl speed -engine afalg -bytes $sz"
		strace -f -c -o /tmp/afalg.st openssl speed -elapsed -engine afalg -evp aes-128-cbc \
			-seconds 1 -bytes $sz 2>/dev/null | tail -1
		sort -k4 -n -r /tmp/afalg.st | head -8
	done
fi
r=1
while [ "$r" -le "$rounds" ]; do
	for sz in 16 64 256 1024 8192 16384; do
		echo "=== round $r size $sz afalg"
		openssl speed -elapsed -engine afalg -evp aes-128-cbc -seconds 1 -bytes $sz 2>/dev/null | tail -1
		echo "=== round $r size $sz lane"
		kernel_paths "$driver" 1 $sz | grep "^lane"
	done
	echo "=== round $r tests/speed"
	SPEED_SECONDS=1 cryptodev-speed 2>&1 | tail -n 8
	r=$((r + 1))
done
