#!/bin/sh
# speed.sh ROUNDS SECONDS DIR CIPHER... : `openssl speed -elapsed -evp` for each cipher
# under each configuration, the configurations in a rotating order each round, printing
# one line per run: "RESULT <config> <cipher> <round> <bytes/s at 16 B> ... <16 KiB>".
# Configurations: default (the default provider), hetcrypt (the provider, balanced),
# and where a crypto module is present (CONFIGS may name them): module (the provider
# with every call it can take on the module) and afalg (OpenSSL 3.0's afalg engine).
# Runs on the host and in the testbed guest (busybox sh); scripts/bench-provider
# drives it and summarises. -elapsed: wall-clock time (by default `openssl speed`
# counts user CPU time, which leaves out the time a call waits for the module).
rounds=$1
seconds=$2
dir=$3
shift 3
ciphers=$*
configs=${CONFIGS:-default hetcrypt}
P="-provider-path $dir -provider hetcrypt -provider default -propquery provider=hetcrypt"
r=1
while [ "$r" -le "$rounds" ]; do
	# Rotate the order so no configuration always runs first (or last).
	order=$configs
	i=1
	while [ "$i" -lt "$r" ]; do
		first=${order%% *}
		rest=${order#* }
		[ "$rest" = "$order" ] && break
		order="$rest $first"
		i=$((i + 1))
	done
	for cipher in $ciphers; do
		for cfg in $order; do
			case $cfg in
			default) args="" env="" ;;
			hetcrypt) args=$P env="" ;;
			module) args=$P env="HETCRYPT_PROVIDER_POLICY=module" ;;
			afalg) args="-engine afalg" env="" ;;
			esac
			# shellcheck disable=SC2086
			line=$(env $env openssl speed -elapsed -seconds "$seconds" $args -evp "$cipher" 2>/dev/null | tail -n 1)
			# "AES-128-CBC v16 v64 ...": drop the name.
			echo "RESULT $cfg $cipher $r ${line#* }"
		done
	done
	r=$((r + 1))
done
