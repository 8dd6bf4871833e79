#!/bin/sh
# guest.sh (in the testbed guest, run by crates/hetcrypt-provider/testbed/run):
# the provider with a real crypto module (virtio-crypto), through unmodified OpenSSL:
#   1. with every call forced to the module, `openssl enc` is byte-identical to the
#      default provider (AES-128/192/256-CBC, both directions) and the module's
#      counters show the bytes;
#   2. balanced, `openssl speed` runs and the module carries 16 KiB calls;
#   3. the module is hot-unplugged while `openssl enc` runs through it (stopped
#      between two calls while the device goes: testbed-unplug-stopped): the run
#      completes, its output is still byte-identical, the module is quarantined and
#      the fail-over counted.
# Prints "provider-guest: N passed, N failed"; exit status 0 only if all passed.
P="-provider-path /opt/hetcrypt/bin -provider hetcrypt -provider default -propquery provider=hetcrypt"
KEY=000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
KEY128=000102030405060708090a0b0c0d0e0f
IV=0f0e0d0c0b0a09080706050403020100
# enc reads and ciphers in 16 KiB pieces: calls the module takes.
BUF="-bufsize 16384"
STATS=/tmp/hetcrypt-stats
MODULE=${HETCRYPT_PROVIDER_MODULE:-kernel:virtio_crypto_aes_cbc}
passed=0
failed=0
ok() { echo "provider-guest: ok: $*"; passed=$((passed + 1)); }
bad() { echo "provider-guest: FAIL: $*"; failed=$((failed + 1)); }
# The number before " calls" in the module's part of the last summary line.
module_calls() { tail -n 1 "$STATS" | sed -n "s/.*$MODULE[^:]*: \([0-9]*\) calls.*/\1/p"; }

openssl list -providers $P | grep -A3 hetcrypt

head -c 1048576 /dev/urandom >/tmp/plain
for bits in 128 192 256; do
	c=aes-$bits-cbc
	key=$(echo "$KEY" | cut -c1-$((bits / 4)))
	rm -f "$STATS"
	HETCRYPT_PROVIDER_POLICY=module HETCRYPT_PROVIDER_STATS=$STATS \
		openssl enc -$c -K "$key" -iv "$IV" $BUF -in /tmp/plain -out /tmp/ours $P
	openssl enc -$c -K "$key" -iv "$IV" -in /tmp/plain -out /tmp/theirs
	n=$(module_calls)
	if cmp -s /tmp/ours /tmp/theirs && [ "${n:-0}" -gt 0 ]; then
		ok "$c encrypt on the module: identical to the default provider ($n module calls)"
	else
		bad "$c encrypt on the module (module calls: ${n:-none}): $(tail -n 1 "$STATS")"
	fi
	# Decryption without padding runs on the module too (with padding, the last block
	# is held back and the calls run in-line).
	rm -f "$STATS"
	HETCRYPT_PROVIDER_POLICY=module HETCRYPT_PROVIDER_STATS=$STATS \
		openssl enc -d -nopad -$c -K "$key" -iv "$IV" $BUF -in /tmp/theirs -out /tmp/back $P
	openssl enc -d -nopad -$c -K "$key" -iv "$IV" -in /tmp/theirs -out /tmp/back2
	n=$(module_calls)
	if cmp -s /tmp/back /tmp/back2 && [ "${n:-0}" -gt 0 ]; then
		ok "$c decrypt on the module: identical ($n module calls)"
	else
		bad "$c decrypt on the module (module calls: ${n:-none})"
	fi
done

# The host's differential test (every cipher, random splits, in place and not)
# with every call the module can take on the module.
if [ -n "${DIFFERENTIAL:-}" ]; then
	rm -f "$STATS"
	if HETCRYPT_PROVIDER_POLICY=module HETCRYPT_PROVIDER_STATS=$STATS \
		HETCRYPT_PROVIDER_MODULE_PATH=/opt/hetcrypt/bin/libhetcrypt_provider.so \
		"/opt/hetcrypt/bin/$DIFFERENTIAL" --test-threads=1 >/tmp/diff.log 2>&1; then
		n=$(grep -c "$MODULE[^:]*: [1-9][0-9]* calls" "$STATS")
		if [ "$n" -gt 0 ]; then
			ok "differential against the default provider, calls on the module ($n runs used it)"
		else
			bad "differential passed but no run used the module"
		fi
	else
		tail -n 20 /tmp/diff.log
		bad "differential against the default provider with the module"
	fi
fi

rm -f "$STATS"
HETCRYPT_PROVIDER_STATS=$STATS openssl speed -elapsed -seconds 1 $P -bytes 16384 -evp aes-128-cbc | tail -n 1
n=$(module_calls)
if [ "${n:-0}" -gt 0 ]; then
	ok "balanced: openssl speed at 16 KiB ran $n calls on the module: $(tail -n 1 "$STATS")"
else
	bad "balanced: the module took no 16 KiB call: $(tail -n 1 "$STATS")"
fi

if [ "${HETCRYPT_TESTBED_UNPLUG:-0}" = 1 ]; then
	# 96 MiB at the module's ~45 MB/s: it is mid-run when the device leaves.
	head -c 100663296 /dev/zero >/tmp/big
	rm -f "$STATS"
	HETCRYPT_PROVIDER_POLICY=module HETCRYPT_PROVIDER_STATS=$STATS \
		openssl enc -aes-128-cbc -K "$KEY128" -iv "$IV" $BUF -in /tmp/big -out /tmp/big.ours $P &
	pid=$!
	sleep 1
	# The device leaves while `openssl enc` is stopped between two calls, none in
	# flight (a request in flight as it goes can oops or hang the 6.1 guest kernel,
	# its own defect: testbed/README.md); its next call meets the missing device.
	if testbed-unplug-stopped "$pid"; then echo "provider-guest: the device is gone"; fi
	if wait "$pid"; then rc=0; else rc=$?; fi
	openssl enc -aes-128-cbc -K "$KEY128" -iv "$IV" -in /tmp/big -out /tmp/big.theirs
	line=$(tail -n 1 "$STATS")
	if [ "$rc" = 0 ] && cmp -s /tmp/big.ours /tmp/big.theirs &&
		echo "$line" | grep -q quarantined && echo "$line" | grep -q 'fail-overs [1-9]'; then
		ok "hot-unplug mid-run: enc completed, output identical, module quarantined: $line"
	else
		bad "hot-unplug mid-run: enc exit $rc: $line"
	fi
fi
echo "provider-guest: $passed passed, $failed failed"
[ "$failed" = 0 ]
