#!/usr/bin/env bash
# Debian's Chromium and its ChromeDriver, for the dashboard's browser tests (tests/test_dashboard.py
# drives them through Selenium; without them those tests skip).
set -euo pipefail
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
