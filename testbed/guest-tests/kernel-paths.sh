#!/bin/sh
# kernel-paths.sh [ROUNDS] (in the testbed guest): the two kernel paths of hetcrypt
# beside the reference tools, interleaved round by round on the same device, for
# docs/performance.md. Each round: `openssl speed -engine afalg` (AES-128-CBC, 1 s per
# size), the `kernel_paths` example (one lane of `kernel:<driver>` and of
# `devcrypto:<driver>`, no dispatcher), `hetcrypt speed` of both engines (through the
# dispatcher), and cryptodev's tests/speed (AES-128-CBC, 512 B..64 KiB; built with its
# 5 s per size cut to SPEED_SECONDS and its NULL-cipher pass skipped). Run from the host:
#   testbed/run --profile soft --with /usr/bin/openssl \
#     --with /usr/lib/x86_64-linux-gnu/engines-3 --env OPENSSL_ENGINES=/opt/hetcrypt/bin/engines-3 \
#     --with target/release/examples/kernel_paths \
#     --with testbed/guest-tests/kernel-paths.sh -- sh /opt/hetcrypt/bin/kernel-paths.sh 3
rounds=${1:-3}
driver=${DRIVER:-virtio_crypto_aes_cbc}
echo "=== $(uname -r), profile ${HETCRYPT_TESTBED_PROFILE:-?}, driver $driver, $(grep -m1 'model name' /proc/cpuinfo)"
r=1
while [ "$r" -le "$rounds" ]; do
	echo "=== round $r: openssl speed -elapsed -engine afalg -evp aes-128-cbc -seconds 1"
	openssl speed -elapsed -engine afalg -evp aes-128-cbc -seconds 1 2>/dev/null | tail -2
	echo "=== round $r: kernel_paths $driver 1"
	kernel_paths "$driver" 1
	echo "=== round $r: hetcrypt speed --engine kernel:$driver,devcrypto:$driver --seconds 1"
	hetcrypt speed --engine "kernel:$driver,devcrypto:$driver" --seconds 1 -q | tail -3
	echo "=== round $r: cryptodev tests/speed (SPEED_SECONDS=1)"
	SPEED_SECONDS=1 cryptodev-speed 2>&1
	r=$((r + 1))
done
