#!/bin/sh
# policy-lanes.sh [PASSES] (in the testbed guest): the policies with one and with two
# device lanes in the same boot (issue 20). Two hetcrypt binaries, hc-a and hc-b (e.g.
# one built with one device lane by default, one with two), each calibrate their own
# store and then run, per pass: the seeds' experiment (`bench`, 400 files per size, 8 B
# to 16 KiB, 3 reps) with the module through AF_ALG (every policy) and through
# /dev/crypto (only:cpu, only:devcrypto, pull, adaptive), and the short runs of
# scripts/bench-short (200 files, 64 B to 16 KiB, 3 reps, every policy, AF_ALG). The
# two binaries' order alternates by pass. JSON goes to /out/<bin>-<bench>-<pass>/.
# Run from the host (scripts/bench-lanes does, and prints the tables):
#   testbed/run --profile soft --timeout 3000 --out DIR --with HC_A --with HC_B \
#     --with testbed/guest-tests/policy-lanes.sh -- sh /opt/hetcrypt/bin/policy-lanes.sh 2
passes=${1:-2}
dev=${DRIVER:-virtio_crypto_aes_cbc}
grep -m1 'model name' /proc/cpuinfo
for bin in hc-a hc-b; do
	HETCRYPT_CALIBRATION=/root/cal-$bin.json $bin calibrate -q >/dev/null || exit 1
done
run() { # run BIN PASS
	export HETCRYPT_CALIBRATION=/root/cal-$1.json
	$1 bench -q --engines cpu,kernel:$dev --files 400 --reps 3 --out /out/$1-seeds-$2 >/dev/null &&
		$1 bench -q --engines cpu,devcrypto:$dev \
			--policies only:cpu,only:devcrypto:$dev,pull,adaptive \
			--files 400 --reps 3 --out /out/$1-devcrypto-$2 >/dev/null &&
		$1 bench -q --engines cpu,kernel:$dev --files 200 --sizes 64,256,1k,4k,16k --reps 3 \
			--out /out/$1-short-$2 >/dev/null
}
p=1
while [ "$p" -le "$passes" ]; do
	echo "=== pass $p $(date -u +%T)"
	if [ $((p % 2)) = 1 ]; then run hc-a $p && run hc-b $p || exit 1
	else run hc-b $p && run hc-a $p || exit 1; fi
	p=$((p + 1))
done
echo "=== done $(date -u +%T)"
