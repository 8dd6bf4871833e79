#!/bin/sh
# guest.sh (in the testbed guest, run by scripts/bench-https): seed 004's experiment
# on an unmodified nginx. For each OpenSSL configuration (openssl.cnf only, the same
# nginx.conf throughout):
#   default   the default provider;
#   module    the hetcrypt provider with every call the module can take on the module;
#   balanced  the hetcrypt provider's own policy;
#   before    the same with another build of the provider, $BIN/hetcrypt-before.so
#             (scripts/bench-https --baseline: a change's before and after in one boot);
# and each TLS suite, body size and connection mode, wrk loads nginx on loopback for
# DURATION seconds; perf (software clock) samples the whole guest meanwhile.
# Prints machine-readable lines:
#   RUN <cfg> <suite> <size> <mode> <requests/s> <bytes/s> <p50 ms> <p99 ms> <errors>
#   SHARE <cfg> <suite> <size> <mode> <dso>=<percent> ...   (perf, nginx's samples)
#   SYM <cfg> <suite> <size> <mode> <samples> <dso> <symbol or address>   (SYMBOLS=1:
#     nginx's perf samples in libcrypto, libssl and the provider by symbol; Debian's
#     libcrypto is stripped, so its internal functions show as addresses in the file)
#   STATS <cfg> <summary line of the provider in nginx's worker>
#   BODY <cfg> <suite> ok|bad
#   FAULT <what> ok|bad <details>   (FAULTS=1: the fault phase below)
#   SYSCALLS <cfg> <suite> <size> <mode> <syscall> <calls> <per request>   (STRACE=1:
#     strace -c on nginx's worker during the run; it slows nginx, so read that run's
#     requests/s as strace's, not the configuration's)
# Environment: CONFIGS, SUITES (tls12-cbc tls12-gcm tls13; also tls12-cbc-sha1), SIZES (1k 16k 1m), MODES
# (keepalive close), CELLS (if set, only these suite:size:mode cells of that cross
# product run, e.g. "tls12-cbc:1k:close tls12-gcm:16k:keepalive"), DURATION (s), CONNS, PERF (1 to sample), FAULTS (1: after the
# runs, with the module configuration on TLS 1.2 CBC under load, a client that
# disconnects mid-response, a malformed handshake, then the module hot-unplugged
# (testbed/run --unplug-on-marker); nginx must keep serving with the same worker).
CONFIGS=${CONFIGS:-default module balanced}
SUITES=${SUITES:-tls12-cbc tls12-gcm tls13}
SIZES=${SIZES:-1k 16k 1m}
MODES=${MODES:-keepalive close}
DURATION=${DURATION:-5}
CONNS=${CONNS:-4}
PERF=${PERF:-1}
CPUSTAT=${CPUSTAT:-0}
STRACE=${STRACE:-0}
SYMBOLS=${SYMBOLS:-0}
CELLS=${CELLS:-}
# MIN_REQUESTS (the smoke): a wrk run that completed fewer requests is run again for
# twice as long, up to MAX_DURATION seconds, so that a slow guest on a busy host makes
# the smoke take longer instead of failing it; the RUN line is the last run's.
MIN_REQUESTS=${MIN_REQUESTS:-0}
MAX_DURATION=${MAX_DURATION:-32}
BIN=/opt/hetcrypt/bin
W=/tmp/https
PORT=8443
# The guest's init leaves the loopback interface down.
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
mkdir -p "$W/www" "$W/logs"
head -c 1024 /dev/urandom >"$W/www/1k"
head -c 16384 /dev/urandom >"$W/www/16k"
head -c 1048576 /dev/urandom >"$W/www/1m"
cp "$BIN/https-cert/cert.pem" "$BIN/https-cert/key.pem" "$W/"

cnf() { # cfg [stats file] -> openssl.cnf for nginx
	if [ "$1" = default ]; then
		cat <<CNF
openssl_conf = openssl_init
[openssl_init]
providers = provider_sect
[provider_sect]
default = default_sect
[default_sect]
activate = 1
CNF
		return
	fi
	policy=balanced
	[ "$1" = module ] && policy=module
	so=hetcrypt.so
	[ "$1" = before ] && so=hetcrypt-before.so
	cat <<CNF
openssl_conf = openssl_init
[openssl_init]
providers = provider_sect
alg_section = algorithm_sect
[provider_sect]
default = default_sect
hetcrypt = hetcrypt_sect
[default_sect]
activate = 1
[hetcrypt_sect]
module = $BIN/$so
activate = 1
policy = $policy
stats = ${2:-$W/stats}
[algorithm_sect]
default_properties = ?provider=hetcrypt
CNF
}

nginx_conf() { # suite [port] [pid file] -> nginx.conf
	case $1 in
	tls12-cbc) proto=TLSv1.2 ciphers=ECDHE-RSA-AES128-SHA256 ;;
	# The seed's own MAC (DES-CBC-SHA): HMAC-SHA1, cheaper than SHA-256 on the CPU.
	tls12-cbc-sha1) proto=TLSv1.2 ciphers=ECDHE-RSA-AES128-SHA ;;
	tls12-gcm) proto=TLSv1.2 ciphers=ECDHE-RSA-AES128-GCM-SHA256 ;;
	tls13) proto=TLSv1.3 ciphers=DEFAULT ;;
	esac
	cat <<CONF
user root;
worker_processes 1;
pid ${3:-$W/nginx.pid};
error_log $W/logs/error.log warn;
env HETCRYPT_PROVIDER_TRACE;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path $W/body;
    proxy_temp_path $W/proxy;
    fastcgi_temp_path $W/fastcgi;
    uwsgi_temp_path $W/uwsgi;
    scgi_temp_path $W/scgi;
    keepalive_requests 100000;
    server {
        listen 127.0.0.1:${2:-$PORT} ssl;
        ssl_certificate $W/cert.pem;
        ssl_certificate_key $W/key.pem;
        ssl_protocols $proto;
        ssl_ciphers $ciphers;
        ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256;
        ssl_session_cache off;
        ssl_session_tickets off;
        root $W/www;
    }
}
CONF
}

# CPUSTAT=1: where the guest's CPU time went during each wrk run: the all-CPU line of
# /proc/stat (ticks) and each process's user+system ticks (the top ones printed).
cpu_snapshot() { # file
	head -n 1 /proc/stat >"$1"
	for d in /proc/[0-9]*; do cat "$d/stat" 2>/dev/null; done |
		awk '{ o = index($0, "("); c = 0; for (i = length($0); i > o; i--) if (substr($0, i, 1) == ")") { c = i; break }
			comm = substr($0, o + 1, c - o - 1); gsub(/ /, "_", comm); split(substr($0, c + 2), f, " ")
			print substr($0, 1, o - 2), comm, f[12] + f[13] }' >>"$1"
}
cpu_report() { # before after key
	awk -v k="$3" 'FNR == 1 { if (NR == 1) for (i = 2; i <= 8; i++) a[i] = $i; else { s = "CPUSTAT " k; split("user nice system idle iowait irq softirq", n, " "); for (i = 2; i <= 8; i++) s = s " " n[i-1] "=" ($i - a[i]); print s } next }
		NR == FNR { t[$1] = $3; next } { d = $3 - t[$1]; if (d > 0) print "CPUPROC " k, $1, $2, d }' "$1" "$2" | sort -k8,8nr | awk '/^CPUSTAT/ || n++ < 10'
}
# The pids of the processes whose command line starts with $1 (busybox has no pgrep).
pids_of() {
	for d in /proc/[0-9]*; do
		case "$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null)" in
		"$1"*) echo "${d#/proc/}" ;;
		esac
	done
}
# The pid of nginx's worker; the pids of nginx's master and workers.
worker_pid() { pids_of "nginx: worker" | head -n 1; }
nginx_pids() { pids_of "nginx: "; }
# The worker of the nginx whose master's pid is in file $1.
worker_of() {
	master=$(cat "$1" 2>/dev/null) || return 0
	for d in /proc/[0-9]*; do
		# Field 4 of stat is the parent's pid (the command name, field 2, has no
		# spaces here).
		set -- $(cat "$d/stat" 2>/dev/null) x x x x
		[ "$4" = "$master" ] && echo "${d#/proc/}" && return 0
	done
}
# The configurations, once each, in first-seen order: CONFIGS lists them REPEAT times
# over (scripts/bench-https --repeat), so it falls into chunks of this many, one per
# repeat.
distinct=""
for cfg in $CONFIGS; do
	case " $distinct " in *" $cfg "*) ;; *) distinct="$distinct $cfg" ;; esac
done
distinct=${distinct# }
ncfg=$(echo "$distinct" | wc -w)
port_of() { # cfg -> the port of its nginx (one per configuration, side by side)
	i=0
	for c in $distinct; do
		[ "$c" = "$1" ] && echo $((PORT + 1 + i)) && return
		i=$((i + 1))
	done
}
for cfg in $distinct; do cnf "$cfg" "$W/stats-$cfg" >"$W/openssl-$cfg.cnf"; done
# Each repeat starts one nginx per configuration for each suite, all at once on their
# own ports, and runs every cell through each in turn: the runs of one cell that a
# ratio pairs lie seconds apart, not a whole suite's runs apart (a minute of host
# noise then moves one cell's pair, not every cell of one configuration alike). Each
# nginx lives for one suite of one repeat, as before. The order within a repeat is the
# chunk's, rotated once per repeat, so no configuration always runs first.
set -- $CONFIGS
rep=0
while [ $# -gt 0 ]; do
	chunk=""
	i=0
	while [ "$i" -lt "$ncfg" ] && [ $# -gt 0 ]; do chunk="$chunk $1"; shift; i=$((i + 1)); done
	chunk=${chunk# }
	i=0
	while [ "$i" -lt $((rep % ncfg)) ]; do chunk="${chunk#* } ${chunk%% *}"; i=$((i + 1)); done
	rep=$((rep + 1))
	for suite in $SUITES; do
		up=""
		for cfg in $chunk; do
			nginx_conf "$suite" "$(port_of "$cfg")" "$W/nginx-$cfg.pid" >"$W/nginx-$cfg.conf"
			rm -f "$W/stats-$cfg"
			if ! OPENSSL_CONF=$W/openssl-$cfg.cnf nginx -c "$W/nginx-$cfg.conf"; then
				echo "ERROR $cfg $suite nginx did not start"; cat "$W/logs/error.log"; continue
			fi
			up="$up $cfg"
		done
		sleep 1
		for cfg in $up; do
			# One body fetched through the server's TLS and compared (the client is the
			# default provider: the server side is what is under test).
			printf 'GET /16k HTTP/1.0\r\nHost: x\r\n\r\n' |
				OPENSSL_CONF=/dev/null openssl s_client -connect 127.0.0.1:"$(port_of "$cfg")" -quiet -ign_eof 2>/dev/null >"$W/got"
			# The body is the last 16384 bytes after the header.
			tail -c 16384 "$W/got" >"$W/got.body"
			if cmp -s "$W/got.body" "$W/www/16k"; then echo "BODY $cfg $suite ok"; else echo "BODY $cfg $suite bad"; fi
		done
		for size in $SIZES; do
			for mode in $MODES; do
				if [ -n "$CELLS" ]; then
					case " $CELLS " in
					*" $suite:$size:$mode "*) ;;
					*) continue ;;
					esac
				fi
				hdr=""
				[ "$mode" = close ] && hdr="Connection: close"
				for cfg in $up; do
					port=$(port_of "$cfg")
					[ "$CPUSTAT" = 1 ] && cpu_snapshot "$W/cpu.before"
					if [ "$STRACE" = 1 ]; then
						strace -c -f -p "$(worker_of "$W/nginx-$cfg.pid")" -o "$W/strace.out" 2>/dev/null &
						strace_pid=$!
						sleep 1
					fi
					if [ "$PERF" = 1 ]; then
						perf record -q -F 499 -e cpu-clock -a -o "$W/perf.data" -- sleep "$DURATION" >/dev/null 2>&1 &
						perf_pid=$!
					fi
					d=$DURATION
					while :; do
						if [ -n "$hdr" ]; then
							OPENSSL_CONF=/dev/null timeout $((d + 20)) wrk -t1 -c"$CONNS" -d"${d}s" --timeout 30s --latency -H "$hdr" "https://127.0.0.1:$port/$size" >"$W/wrk.out" 2>&1
						else
							OPENSSL_CONF=/dev/null timeout $((d + 20)) wrk -t1 -c"$CONNS" -d"${d}s" --timeout 30s --latency "https://127.0.0.1:$port/$size" >"$W/wrk.out" 2>&1
						fi
						done_reqs=$(awk '/requests in/ { print $1 }' "$W/wrk.out")
						[ "${done_reqs:-0}" -ge "$MIN_REQUESTS" ] || [ "$d" -ge "$MAX_DURATION" ] && break
						echo "LONGER $cfg $suite $size $mode: ${done_reqs:-0} requests in ${d} s, again for $((d * 2)) s"
						d=$((d * 2))
					done
					[ "$PERF" = 1 ] && wait "$perf_pid"
					if [ "$STRACE" = 1 ]; then
						kill -INT "$strace_pid"
						wait "$strace_pid"
						reqs=$(awk '/requests in/ { print $1 }' "$W/wrk.out")
						# Rows: % time, seconds, usecs/call, calls, [errors], syscall.
						awk -v k="$cfg $suite $size $mode" -v r="${reqs:-0}" '$4 ~ /^[0-9]+$/ && $NF != "syscall" {
							printf "SYSCALLS %s %s %d %.3f\n", k, $NF, $4, (r > 0 ? $4 / r : 0) }' "$W/strace.out"
					fi
					if [ "$CPUSTAT" = 1 ]; then
						cpu_snapshot "$W/cpu.after"
						cpu_report "$W/cpu.before" "$W/cpu.after" "$cfg $suite $size $mode"
					fi
					awk -v cfg="$cfg" -v suite="$suite" -v size="$size" -v mode="$mode" '
						function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
						function bytes(v) { n = v + 0; if (v ~ /KB$/) n *= 1024; if (v ~ /MB$/) n *= 1048576; if (v ~ /GB$/) n *= 1073741824; return n }
						/^ +50%/ { p50 = ms($2) } /^ +99%/ { p99 = ms($2) }
						/^Requests\/sec:/ { rps = $2 } /^Transfer\/sec:/ { bps = bytes($2) }
						/Socket errors:/ { for (i = 3; i <= NF; i++) { gsub(",", "", $i); if ($i ~ /^[0-9]+$/) err += $i } }
						/Non-2xx/ { err += $NF }
						END { printf "RUN %s %s %s %s %s %d %.3f %.3f %d\n", cfg, suite, size, mode, rps, bps, p50, p99, err + 0 }' "$W/wrk.out"
					if [ "$PERF" = 1 ]; then
						# nginx's samples by library, in percent of all samples (the idle
						# instances of the other configurations take none).
						perf report -q -i "$W/perf.data" --sort comm,dso --stdio 2>/dev/null |
							awk -v k="$cfg $suite $size $mode" '$2 == "nginx" && $1 ~ /%$/ { sub("%", "", $1); s = s " " $3 "=" $1 } END { print "SHARE " k s }'
						if [ "$SYMBOLS" = 1 ]; then
							# Rows: percent, samples, dso, [.], symbol.
							perf report -q -n -i "$W/perf.data" --comm nginx --sort dso,sym --stdio 2>/dev/null |
								awk -v k="$cfg $suite $size $mode" '$1 ~ /%$/ && $3 ~ /libcrypto|libssl|hetcrypt/ { print "SYM " k " " $2 " " $3 " " $NF }'
						fi
					fi
				done
			done
		done
		for cfg in $up; do
			nginx -c "$W/nginx-$cfg.conf" -s quit
		done
		for cfg in $up; do
			for _ in 1 2 3 4 5 6 7 8 9 10; do [ -e "$W/nginx-$cfg.pid" ] || break; sleep 0.5; done
			# One line per process that had the provider loaded (master and worker).
			[ -s "$W/stats-$cfg" ] && sed "s/^/STATS $cfg $suite /" "$W/stats-$cfg"
		done
	done
done

if [ "${FAULTS:-0}" = 1 ]; then
	cnf module >"$W/openssl-module.cnf"
	nginx_conf tls12-cbc >"$W/nginx.conf"
	rm -f "$W/stats"
	OPENSSL_CONF=$W/openssl-module.cnf nginx -c "$W/nginx.conf"
	sleep 1
	worker=$(worker_pid)
	OPENSSL_CONF=/dev/null timeout 60 wrk -t1 -c2 -d8s "https://127.0.0.1:$PORT/1m" >"$W/wrk.out" 2>&1 &
	wrk_pid=$!
	sleep 1
	# A client that goes away mid-response.
	printf 'GET /1m HTTP/1.1\r\nHost: x\r\n\r\n' |
		OPENSSL_CONF=/dev/null timeout 1 openssl s_client -connect 127.0.0.1:$PORT -quiet -ign_eof >/dev/null 2>&1
	# A malformed handshake: bytes that are no TLS record.
	head -c 600 /dev/urandom | timeout 2 nc 127.0.0.1 $PORT >/dev/null 2>&1
	# The device leaves while nginx is stopped between two calls, none in flight (a
	# request in flight as it goes can oops or hang the 6.1 guest kernel, its own
	# defect: testbed/README.md); wrk keeps its connections open meanwhile, and the
	# worker's next call meets the missing device.
	if testbed-unplug-stopped $(nginx_pids); then gone=yes; else gone=no; fi
	wait "$wrk_pid"
	printf 'GET /16k HTTP/1.0\r\nHost: x\r\n\r\n' |
		OPENSSL_CONF=/dev/null openssl s_client -connect 127.0.0.1:$PORT -quiet -ign_eof 2>/dev/null >"$W/got"
	tail -c 16384 "$W/got" >"$W/got.body"
	after=$(worker_pid)
	reqs=$(awk '/requests in/ { print $1 }' "$W/wrk.out")
	errs=$(awk '/Socket errors:|Non-2xx/ { print }' "$W/wrk.out" | tr '\n' ' ')
	nginx -c "$W/nginx.conf" -s quit
	for _ in 1 2 3 4 5 6 7 8 9 10; do [ -e "$W/nginx.pid" ] || break; sleep 0.5; done
	# The worker's line: the one whose module part counts calls (the master's has none).
	cat "$W/stats"
	summary=$(grep -v 'aes_cbc[^:]*: 0 calls' "$W/stats" | tail -n 1)
	if [ "$gone" = yes ] && [ -n "$worker" ] && [ "$worker" = "$after" ] && cmp -s "$W/got.body" "$W/www/16k"; then
		echo "FAULT unplug ok the device left under load, worker $worker kept serving, $reqs requests, wrk errors: ${errs:-none}"
	else
		echo "FAULT unplug bad device gone: $gone, worker $worker -> ${after:-none}, body after: $(cmp -s "$W/got.body" "$W/www/16k" && echo ok || echo bad)"
	fi
	if echo "$summary" | grep -q 'quarantined'; then
		echo "FAULT quarantine ok $summary"
	else
		echo "FAULT quarantine bad $summary"
	fi
fi
echo "https: done"
