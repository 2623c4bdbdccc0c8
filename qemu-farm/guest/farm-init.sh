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
# The exporter guest of the forwarded-gadget path (phyfarm.role=exporter):
# the model (ax88772-emu on the host, reached through the virtio-serial port
# org.phyfarm.model) becomes a USB gadget on dummy_hcd, this guest's USB host
# stack enumerates it, and the real usbredirect exports it on 127.0.0.1:4000,
# which ax88772-gadget relays to the port org.phyfarm.usbredir (the farm
# guest's QEMU usb-redir chardev on the host). Every step says on the console
# how it went; the harness reads "phyfarm-exporter: ready" or the failure.
if grep -q 'phyfarm.role=exporter' /proc/cmdline; then
	mount -t configfs configfs /sys/kernel/config
	/usr/bin/ax88772-gadget --model port:org.phyfarm.model \
		--relay org.phyfarm.usbredir=127.0.0.1:4000 &
	gadget=$!
	n=0
	until grep -qs 772a /sys/bus/usb/devices/*/idProduct; do
		if ! kill -0 "$gadget" 2>/dev/null; then
			wait "$gadget"
			echo "phyfarm-exporter: failed: ax88772-gadget exited with $?"
			while :; do sleep 3600; done
		fi
		n=$((n + 1))
		if [ "$n" -gt 600 ]; then
			echo "phyfarm-exporter: failed: the gadget was not enumerated within 60 s"
			while :; do sleep 3600; done
		fi
		sleep 0.1
	done
	dev=$(grep -ls 772a /sys/bus/usb/devices/*/idProduct | head -n1)
	echo "phyfarm-exporter: the gadget is enumerated as $(dirname "$dev")"
	usbredirect --device "0b95:$(cat "$dev")" --as 127.0.0.1:4000 --verbose 3 &
	redirect=$!
	n=0
	until netstat -ltn 2>/dev/null | grep -q ':4000 '; do
		if ! kill -0 "$redirect" 2>/dev/null; then
			wait "$redirect"
			echo "phyfarm-exporter: failed: usbredirect exited with $? before listening"
			while :; do sleep 3600; done
		fi
		n=$((n + 1))
		[ "$n" -gt 600 ] && { echo "phyfarm-exporter: failed: usbredirect did not listen within 60 s"; break; }
		sleep 0.1
	done
	echo "phyfarm-exporter: ready"
	wait "$redirect"
	echo "phyfarm-exporter: usbredirect exited with $?"
	while :; do sleep 3600; done
fi

echo "phyfarm-init: starting phyfarm-agent after $(cut -d' ' -f1 /proc/uptime)s"

# PID 1 must never exit (that panics the kernel): restart the agent if it dies.
while :; do
	/usr/bin/phyfarm-agent
	echo "phyfarm-init: phyfarm-agent exited with $?; restarting"
	sleep 1
done
