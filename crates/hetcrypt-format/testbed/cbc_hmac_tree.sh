#!/bin/sh
# Runs INSIDE the testbed guest (busybox sh): encrypts a directory tree with
# --aead aes-128-cbc-hmac-sha256 under `pull` on cpu + kernel:virtio_crypto_aes_cbc,
# checks that the crypto module ran part of the chunks (from the --json summary), then
# decrypts on the CPU alone (so the module's chunks are checked by another engine) and
# on both engines again, and compares every file byte for byte.
# Host side: crates/hetcrypt-format/testbed/run-cbc-hmac-tree (it calls testbed/run).
# Exit status 0 = pass; the last line says what was seen.
set -eu

ENGINES=${HETCRYPT_TEST_ENGINES:-cpu,kernel:virtio_crypto_aes_cbc}
MODULE=${HETCRYPT_TEST_MODULE:-kernel:virtio_crypto_aes_cbc}
W=/tmp/hc-files
rm -rf "$W"
mkdir -p "$W/src/sub/deeper" "$W/src/spaced name"

# A small realistic tree: empty, tiny, chunk-edge and multi-chunk files.
n=0
for size in 0 1 15 16 100 4096 16383 16384 16385 32768 65536 200000 1048576 3000000; do
	for dir in "" sub/ "sub/deeper/" "spaced name/"; do
		n=$((n + 1))
		head -c "$size" /dev/urandom >"$W/src/${dir}file-$size-$n"
	done
done
echo "tree: $n files"

# Pulls the "jobs" count of engine $2 out of the pretty JSON summary $1.
engine_jobs() {
	awk -v want="\"name\": \"$2\"" '
		index($0, want) { found = 1; next }
		found && /"jobs"/ { gsub(/[^0-9]/, ""); print; exit }
	' "$1"
}

hetcrypt keygen -o "$W/key" --bits 256
hetcrypt encrypt --key "$W/key" --aead aes-128-cbc-hmac-sha256 --policy pull \
	--engines "$ENGINES" "$W/src" -o "$W/enc" --json >"$W/enc.json"
enc_module=$(engine_jobs "$W/enc.json" "$MODULE")
enc_total=$(awk '/"jobs"/ { gsub(/[^0-9]/, ""); print; exit }' "$W/enc.json")
echo "encrypt: $MODULE ran ${enc_module:-0} of $enc_total chunk jobs"

hetcrypt decrypt -q --key "$W/key" --engines cpu "$W/enc" -o "$W/dec-cpu"
hetcrypt decrypt --key "$W/key" --policy pull --engines "$ENGINES" "$W/enc" -o "$W/dec" \
	--json >"$W/dec.json"
dec_module=$(engine_jobs "$W/dec.json" "$MODULE")
echo "decrypt: $MODULE ran ${dec_module:-0} chunk jobs"

bad=0
checked=0
cd "$W/src"
for f in $(find . -type f | sed 's/ /%20/g'); do
	f=$(echo "$f" | sed 's/%20/ /g')
	checked=$((checked + 1))
	for d in dec dec-cpu; do
		if ! cmp -s "$f" "$W/$d/$f"; then
			echo "DIFFERS ($d): $f"
			bad=$((bad + 1))
		fi
	done
done
[ "$checked" -eq "$n" ] || { echo "FAIL: checked $checked of $n files"; exit 1; }
[ "$bad" -eq 0 ] || { echo "FAIL: $bad files differ after the round trip"; exit 1; }
[ "${enc_module:-0}" -gt 0 ] || { echo "FAIL: the module ran no chunk when encrypting"; exit 1; }
echo "PASS: $n files round-trip byte-identically (decrypted on cpu alone and on both); $MODULE ran $enc_module of $enc_total chunks (encrypt) and ${dec_module:-0} (decrypt)"
