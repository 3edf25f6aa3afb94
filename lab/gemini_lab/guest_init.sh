#!/bin/sh
# PID 1 of a lab guest, on the host's root file system shared read-only (qemu: 9p; User-Mode
# Linux: hostfs).
# Makes the writable places a running system needs, loads the lab's modules, runs the job that
# the host left in the output share, records its exit status and the kernel log, powers off.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH HOME=/tmp LANG=C.UTF-8
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
REPO=
MODROOT=
HOSTOUT=
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    gemini.repo=*) REPO="${arg#gemini.repo=}" ;;
    gemini.modroot=*) MODROOT="${arg#gemini.modroot=}" ;;
    gemini.out=*) HOSTOUT="${arg#gemini.out=}" ;;
  esac
done
# a kernel unpacked outside /boot (GEMINI_LAB_KERNEL_ROOT) brings its own modules
[ -n "$MODROOT" ] && mount --bind "$MODROOT/lib/modules" /lib/modules
mount -t tmpfs tmpfs /run
# /tmp becomes writable tmpfs; a checkout that lives under the host's /tmp stays visible
mkdir -p /run/host-tmp
mount --bind /tmp /run/host-tmp
for d in /tmp /var/tmp /var/log; do mount -t tmpfs tmpfs "$d" 2>/dev/null; done
case "$REPO" in
  /tmp/*) mkdir -p "$REPO" && mount --bind "/run/host-tmp/${REPO#/tmp/}" "$REPO" ;;
esac
mkdir -p /dev/pts /dev/shm /run/netns
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
OUT=/mnt   # the host's output directory, shared read-write
if [ -n "$HOSTOUT" ]; then  # UML: the host directory itself
  mount -t hostfs -o "$HOSTOUT" none "$OUT" || echo "lab: no output directory"
else
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 labout "$OUT" || echo "lab: no output share"
fi
ip link set lo up
# Debian's kernel has these as modules; the UML kernel has them built in and no module tree
if [ -d "/lib/modules/$(uname -r)" ]; then
  for m in sch_netem sch_tbf sch_fq tcp_bbr tcp_vegas veth virtio_net; do modprobe "$m"; done
fi
export GEMINI_LAB_OUT="$OUT"
sh "$OUT/job.sh" > "$OUT/job.log" 2>&1
echo $? > "$OUT/rc"
dmesg > "$OUT/dmesg.txt"
sync
if [ -n "$HOSTOUT" ]; then
  # UML: power off now, in this call. The sysrq way below hands the power-off to a kernel
  # worker and spins; on a simulated clock spinning takes no time, so no tick ever preempts
  # the spin and the worker never runs.
  exec busybox poweroff -f
fi
echo 1 > /proc/sys/kernel/sysrq
echo o > /proc/sysrq-trigger
# PID 1 must not exit while the kernel powers off (that panics); spin on shell builtins only,
# since the root file system is going away under us
while :; do :; done
