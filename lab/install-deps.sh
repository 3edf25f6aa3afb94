#!/usr/bin/env bash
# What the lab needs from Debian's packages: a stock kernel and its headers for the qemu guest
# (and for building tcp_fusion.ko), qemu, busybox for the initramfs, the tools the guest runs,
# Debian's kernel source and what building it takes, for the User-Mode Linux guest
# (lab/uml/build-kernel.sh), and openssl, which the TLS test uses to make its certificates.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  linux-image-amd64 linux-headers-amd64 qemu-system-x86 busybox-static cpio kmod \
  iproute2 iperf3 ethtool make gcc openssl \
  linux-source-6.1 flex bison bc xz-utils patch libelf-dev util-linux \
  debootstrap dkms >/dev/null
