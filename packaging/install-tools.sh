#!/usr/bin/env bash
# What building the images and Debian packages needs, from Debian's own packages: debootstrap
# for the base root file system, umoci to assemble OCI image layouts without any daemon, and
# systemd (for systemd-analyze, which checks the agent's unit offline). dpkg-deb is part of
# dpkg. tests/test_images.py and the package tests skip, naming the missing tool, without them.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends debootstrap umoci systemd >/dev/null
