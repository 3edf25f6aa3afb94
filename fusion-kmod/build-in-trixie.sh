#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Build tcp_fusion.ko with W=1 against Debian 13 (trixie)'s kernel headers and compiler, without
# touching the host: a minimal trixie chroot made by debootstrap (root), the module built inside
# it, and trixie's kernel image unpacked beside it so the lab can boot that kernel.
#
#   fusion-kmod/build-in-trixie.sh [setup|build|all]      (default: all)
#
# setup  debootstrap the chroot (once; a marker file says it is complete) and unpack the kernel
#        image of linux-image-amd64 with dpkg -x into $TRIXIE_KERNEL_ROOT (boot/vmlinuz-<rel>,
#        lib/modules/<rel>/): what GEMINI_LAB_KERNEL_ROOT names for the lab.
# build  copy the module's sources ($FUSION_SRC, fusion-kmod/ by default) into the chroot,
#        `make W=1` against linux-headers-<rel>, keep the compiler output in
#        $TRIXIE_OUT/build.log and the modules (tcp_fusion.ko, tcp_gemini.ko, tcp_dcvegas.ko)
#        in $TRIXIE_OUT (GEMINI_LAB_FUSION_KO=$TRIXIE_OUT/tcp_fusion.ko). Exits non-zero if
#        the build fails; warnings are for the caller to judge (tests/test_kmod_build.py
#        refuses any).
#
# The chroot and the kernel live outside the clone, so that a machine makes them once for all
# its clones: in $GEMINI_CACHE (/var/cache/gemini by default; `off` keeps them in var/) under
# trixie-<hash of the package list and this script's setup>, with var/trixie/root and
# var/trixie/kernel symlinks to them (a chroot already in var/ is moved there, not made again).
# The build output stays in var/trixie/out. Needs debootstrap and network access to a Debian
# mirror for setup (DEBIAN_MIRROR, deb.debian.org by default); build needs neither.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd)
VAR=${GEMINI_VAR:-$REPO/var}
# the cache unless the caller names the chroot or the kernel's place itself
CACHED=
if [ -z "${TRIXIE_ROOT:-}${TRIXIE_KERNEL_ROOT:-}" ] && [ "${GEMINI_CACHE:-}" != off ]; then
	CACHED=${GEMINI_CACHE:-/var/cache/gemini}/trixie
fi
TRIXIE_ROOT=${TRIXIE_ROOT:-$VAR/trixie/root}
TRIXIE_KERNEL_ROOT=${TRIXIE_KERNEL_ROOT:-$VAR/trixie/kernel}
TRIXIE_OUT=${TRIXIE_OUT:-$VAR/trixie/out}
FUSION_SRC=${FUSION_SRC:-$REPO/fusion-kmod}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# the compiler and headers (linux-headers-amd64 pulls in the matching gcc and kbuild), and
# perl's standard modules for W=1's kernel-doc check
PACKAGES="make gcc libc6-dev perl linux-headers-amd64"
COMPLETE=$TRIXIE_ROOT/.gemini-complete

die() {
	echo "build-in-trixie: $*" >&2
	exit 1
}

# The kernel release the chroot's headers are for, e.g. 6.12.57+deb13-amd64.
release() {
	rel=$(ls "$TRIXIE_ROOT/usr/src" | sed -n 's/^linux-headers-\(.*-amd64\)$/\1/p' | sort -V | tail -n 1)
	[ -n "$rel" ] || die "no linux-headers-*-amd64 in $TRIXIE_ROOT/usr/src"
	echo "$rel"
}

# var/trixie/root and var/trixie/kernel as symlinks into the cache, keyed by the inputs: the
# suite, the packages and setup() below (what else goes in, the mirror's state, is the day's).
use_cache() {
	key=$({ echo "trixie $PACKAGES"; sed -n '/^setup() {/,/^}/p' "$0"; } | sha256sum | cut -c1-16)
	entry=$CACHED-$key
	mkdir -p "$entry" "$VAR/trixie"
	exec 8>"$entry.lock"
	flock 8 # one setup of an entry at a time
	for part in root kernel; do
		link=$VAR/trixie/$part
		if [ -d "$link" ] && [ ! -L "$link" ]; then
			if [ -e "$entry/$part" ]; then rm -rf "$link"; else mv "$link" "$entry/$part"; fi
		fi
		ln -sfn "$entry/$part" "$link"
	done
	TRIXIE_ROOT=$entry/root
	TRIXIE_KERNEL_ROOT=$entry/kernel
	COMPLETE=$TRIXIE_ROOT/.gemini-complete
}

setup() {
	[ "$(id -u)" = 0 ] || die "setup needs root (debootstrap, chroot)"
	if [ -n "$CACHED" ]; then use_cache; fi
	if [ ! -f "$COMPLETE" ]; then
		command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap"
		rm -rf "$TRIXIE_ROOT"
		mkdir -p "$TRIXIE_ROOT"
		debootstrap --variant=minbase trixie "$TRIXIE_ROOT" "$DEBIAN_MIRROR"
	fi
	# idempotent: a chroot made by an older list of packages gets the new ones
	chroot "$TRIXIE_ROOT" env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends $PACKAGES
	touch "$COMPLETE"
	rel=$(release)
	if [ ! -f "$TRIXIE_KERNEL_ROOT/.gemini-complete" ]; then
		debs=$TRIXIE_ROOT/var/cache/gemini-debs
		mkdir -p "$debs"
		# only the package's files are wanted: download inside the chroot, unpack outside
		chroot "$TRIXIE_ROOT" sh -c "cd /var/cache/gemini-debs &&
			apt-get -q -o APT::Sandbox::User=root download linux-image-$rel-unsigned"
		tmp=$TRIXIE_KERNEL_ROOT.tmp
		rm -rf "$tmp"
		mkdir -p "$tmp"
		dpkg -x "$debs"/linux-image-"$rel"-unsigned_*.deb "$tmp"
		# trixie ships modules under usr/lib (merged /usr); the lab looks in lib/modules
		[ -e "$tmp/lib" ] || ln -s usr/lib "$tmp/lib"
		depmod -b "$tmp" "$rel"
		touch "$tmp/.gemini-complete"
		rm -rf "$TRIXIE_KERNEL_ROOT"
		mv "$tmp" "$TRIXIE_KERNEL_ROOT"
	fi
	echo "trixie chroot: $TRIXIE_ROOT (kernel $rel, image under $TRIXIE_KERNEL_ROOT)"
}

build() {
	[ -f "$COMPLETE" ] || die "no trixie chroot at $TRIXIE_ROOT: run '$0 setup' first"
	rel=$(release)
	exec 9>"$TRIXIE_ROOT/.build.lock"
	flock 9 # the chroot may be shared by several clones: one build in it at a time
	src=$TRIXIE_ROOT/build/fusion-kmod
	rm -rf "$src"
	mkdir -p "$src" "$TRIXIE_OUT"
	cp "$FUSION_SRC"/Kbuild "$FUSION_SRC"/Makefile "$FUSION_SRC"/*.[ch] "$src"/
	rm -f "$src"/*.mod.c
	status=0
	chroot "$TRIXIE_ROOT" env LC_ALL=C.UTF-8 make -C /build/fusion-kmod KVER="$rel" W=1 \
		>"$TRIXIE_OUT/build.log" 2>&1 || status=$?
	cat "$TRIXIE_OUT/build.log"
	[ "$status" = 0 ] || die "module build against $rel failed (log: $TRIXIE_OUT/build.log)"
	# every module Kbuild lists: tcp_fusion.ko, tcp_gemini.ko, tcp_dcvegas.ko
	cp "$src"/*.ko "$TRIXIE_OUT"/
	echo "$rel" >"$TRIXIE_OUT/release"
	echo "built $(cd "$src" && echo *.ko) in $TRIXIE_OUT for $rel"
}

case "${1:-all}" in
setup) setup ;;
build) build ;;
all)
	setup
	build
	;;
*) die "usage: $0 [setup|build|all]" ;;
esac
