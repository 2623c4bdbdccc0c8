#!/bin/busybox sh
# /init of the farm guest image (`phyfarm guest image`): mount the pseudo
# file systems, bring up lo, and start phyfarm-agent on the virtio port
# "org.phyfarm.agent". Everything the tests learn comes through the agent;
# the serial console is only a log.
/bin/busybox mkdir -p /proc /sys /dev /tmp /run
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev 2>/dev/null
/bin/busybox mount -t tmpfs -o mode=1777 tmpfs /tmp
/bin/busybox mount -t tmpfs -o mode=755 tmpfs /run
/bin/busybox mkdir -p /run/netns
/bin/busybox --install -s /bin

export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
export HOME=/root
hostname phyfarm
ip link set lo up
echo "phyfarm-init: starting phyfarm-agent after $(cut -d' ' -f1 /proc/uptime)s"

# PID 1 must never exit (that panics the kernel): restart the agent if it dies.
while :; do
	/usr/bin/phyfarm-agent
	echo "phyfarm-init: phyfarm-agent exited with $?; restarting"
	sleep 1
done
