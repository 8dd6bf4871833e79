# testbed/lib/cryptodev.sh: builds cryptodev.ko (cryptodev-linux, /dev/crypto) for the
# guest kernel, and caches it.  Sourced by testbed/run; needs its KDIR, KVER, CACHE,
# REPO, log, die, apt_install, apt_update_once.
#
# Source: the tarball in ../shared/third_party/ beside the repository (its README has
# the recipe this follows, verified on Debian 12's 6.1 kernel).  Kernel headers must
# match the guest's kernel: the Debian package version is read from the banner of the
# cached kernel image, and linux-headers-$KVER, linux-headers-<abi>-common and
# linux-kbuild-<major.minor> of exactly that version are fetched with apt-get download.
# The module is cached under $CACHE/cryptodev/<KVER>_<version>_<tarball sha256>/, so
# the headers are fetched and the module built once per kernel and tarball.
#
# Sets CRYPTODEV_KO (the module file) and CRYPTODEV_DESC (one line for the header).
#
# ensure_cryptodev_speed builds cryptodev's own benchmark, tests/speed, beside it:
# issue 20 compares the devcrypto engine with it.  Two changes, both by sed on a copy:
# its 5 s per size comes from $SPEED_SECONDS, and its NULL-cipher pass is skipped
# (only AES-128-CBC is timed).  Linked statically (the guest has no libc of its own
# beyond what --with brings).  Sets CRYPTODEV_SPEED; a failure is a warning, not the
# run's end: the guest then has no cryptodev-speed.

CRYPTODEV_TARBALL_NAME=cryptodev-linux-08644db02d43.tar.gz
CRYPTODEV_KO=
CRYPTODEV_DESC=
CRYPTODEV_SPEED=

cryptodev_tarball() {
	local t
	for t in "${HETCRYPT_CRYPTODEV_TARBALL:-}" "$REPO/../shared/third_party/$CRYPTODEV_TARBALL_NAME"; do
		[ -n "$t" ] && [ -f "$t" ] && { echo "$t"; return 0; }
	done
	return 1
}

ensure_cryptodev() {
	local tarball sum kver_deb key dir tmp src hdr major
	tarball=$(cryptodev_tarball) || die "cryptodev-linux source not found: expected $(cd "$REPO/.." && pwd)/shared/third_party/$CRYPTODEV_TARBALL_NAME (the shared/ folder beside the repository; see shared/third_party/README.md), or set HETCRYPT_CRYPTODEV_TARBALL; --no-cryptodev boots without /dev/crypto"
	sum=$(sha256sum "$tarball" | cut -d' ' -f1)
	# The Debian version of the cached kernel (e.g. 6.1.192-2), from the version string
	# bzImage keeps uncompressed in its setup header.
	kver_deb=$(grep -a -m1 -o 'SMP [A-Z_ ]*Debian [0-9][0-9a-z.+~-]*' "$VMLINUZ" | awk '{print $NF}') || true
	[ -n "$kver_deb" ] || die "cannot read the Debian version of $VMLINUZ (needed to fetch matching headers)"
	key=${KVER}_${kver_deb}_${sum:0:16}
	dir=$CACHE/cryptodev/$key
	CRYPTODEV_KO=$dir/cryptodev.ko
	CRYPTODEV_DESC="cryptodev.ko (cryptodev-linux ${CRYPTODEV_TARBALL_NAME#cryptodev-linux-}, built for $KVER, Debian $kver_deb)"
	CRYPTODEV_DESC=${CRYPTODEV_DESC/.tar.gz/}
	[ -f "$dir/ok" ] && [ -f "$CRYPTODEV_KO" ] && return 0

	command -v make >/dev/null || apt_install make
	command -v gcc-12 >/dev/null || command -v gcc >/dev/null || apt_install gcc
	mkdir -p "$CACHE/cryptodev"
	tmp=$(mktemp -d "$CACHE/cryptodev/.build.XXXXXX")
	log "building $CRYPTODEV_DESC"
	major=$(echo "$KVER" | cut -d. -f1,2)
	local pkgs=("linux-headers-$KVER=$kver_deb" "linux-headers-${KVER%-*}-common=$kver_deb" "linux-kbuild-$major=$kver_deb")
	if ! (cd "$tmp" && apt-get download -o APT::Sandbox::User=root "${pkgs[@]}" >&2); then
		apt_update_once
		(cd "$tmp" && apt-get download -o APT::Sandbox::User=root "${pkgs[@]}" >&2) ||
			die "apt-get download ${pkgs[*]} failed (headers matching the guest kernel are needed to build cryptodev.ko)"
	fi
	local d
	for d in "$tmp"/*.deb; do dpkg -x "$d" "$tmp/root" || die "dpkg -x $d failed"; done
	hdr=$tmp/root/usr/src/linux-headers-$KVER
	[ -f "$hdr/Makefile" ] || die "no $hdr/Makefile in the headers package"
	# The arch headers' Makefile includes the common tree by an absolute /usr/src path.
	sed -i "s|/usr/src/|$tmp/root/usr/src/|g" "$hdr/Makefile"
	tar xzf "$tarball" -C "$tmp" || die "cannot unpack $tarball"
	src=$(echo "$tmp"/cryptodev-linux-*/)
	# Debian builds its kernel with gcc-12; use it when present, as the headers expect.
	local cc=()
	command -v gcc-12 >/dev/null && cc=(CC=gcc-12)
	make -C "$src" KERNEL_DIR="$hdr" "${cc[@]}" -j2 >"$tmp/build.log" 2>&1 || {
		tail -n 30 "$tmp/build.log" >&2
		die "building cryptodev.ko failed (log above)"
	}
	[ -f "$src/cryptodev.ko" ] || die "the cryptodev build made no cryptodev.ko"
	mkdir -p "$dir"
	# Debug info is a few MB the guest does not need.
	strip --strip-debug -o "$dir/cryptodev.ko" "$src/cryptodev.ko" 2>/dev/null || cp "$src/cryptodev.ko" "$dir/cryptodev.ko"
	{
		echo "source $(basename "$tarball") sha256 $sum"
		echo "kernel $KVER Debian $kver_deb"
		echo "headers ${pkgs[*]}"
	} >"$dir/ok"
	rm -rf "$tmp"
	log "cached $dir/cryptodev.ko"
}

ensure_cryptodev_speed() { # after ensure_cryptodev: the same cache directory
	local tarball dir tmp src
	dir=$(dirname "$CRYPTODEV_KO")
	CRYPTODEV_SPEED=$dir/cryptodev-speed
	[ -x "$CRYPTODEV_SPEED" ] && return 0
	tarball=$(cryptodev_tarball) || return 1
	command -v gcc >/dev/null || apt_install gcc
	dpkg -s libc6-dev >/dev/null 2>&1 || apt_install libc6-dev
	tmp=$(mktemp -d "$CACHE/cryptodev/.speed.XXXXXX")
	tar xzf "$tarball" -C "$tmp" && src=$(echo "$tmp"/cryptodev-linux-*/) &&
		cp "$src/tests/speed.c" "$tmp/speed.c" || {
		log "warning: cannot unpack cryptodev's tests/speed.c: the guest has no cryptodev-speed"
		rm -rf "$tmp"
		return 1
	}
	sed -i -e 's/alarm(5);/alarm(speed_seconds());/' \
		-e '/^\tfprintf(stderr, "Testing NULL cipher: \\n");/,/^\tfprintf(stderr, "\\nTesting AES-128-CBC cipher: \\n");/{/Testing AES-128-CBC/!d}' \
		-e '/^static int si = 1;/a\
/* hetcrypt testbed: seconds per size from $SPEED_SECONDS (upstream: 5). */\
static unsigned int speed_seconds(void)\
{\
\tconst char *s = getenv("SPEED_SECONDS");\
\tint n = s ? atoi(s) : 0;\
\treturn n > 0 ? (unsigned int)n : 5;\
}' "$tmp/speed.c"
	if ! grep -q 'alarm(speed_seconds())' "$tmp/speed.c" || grep -q 'CRYPTO_NULL' "$tmp/speed.c"; then
		log "warning: patching cryptodev's tests/speed.c failed (its source changed?): the guest has no cryptodev-speed"
		rm -rf "$tmp"
		return 1
	fi
	if ! gcc -O2 -static -I"$src" -o "$tmp/cryptodev-speed" "$tmp/speed.c" 2>"$tmp/build.log"; then
		cat "$tmp/build.log" >&2
		log "warning: building cryptodev's tests/speed failed (gcc, libc6-dev's static libc): the guest has no cryptodev-speed"
		rm -rf "$tmp"
		return 1
	fi
	mv "$tmp/cryptodev-speed" "$CRYPTODEV_SPEED"
	rm -rf "$tmp"
	log "cached $CRYPTODEV_SPEED (cryptodev's tests/speed)"
}
