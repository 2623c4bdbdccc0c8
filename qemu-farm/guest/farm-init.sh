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
# guest's QEMU usb-redir chardev on the host). usbredirect exits when its
# device goes away (the model's unplug unbinds the gadget), as it does with
# a physical adapter: when the gadget comes back a new usbredirect serves
# it, and the relay splices it into the farm guest's session. Every step
# says on the console how it went; the harness reads "phyfarm-exporter:
# ready" or the failure.
if grep -q 'phyfarm.role=exporter' /proc/cmdline; then
	mount -t configfs configfs /sys/kernel/config
	/usr/bin/ax88772-gadget --model port:org.phyfarm.model \
		--relay org.phyfarm.usbredir=127.0.0.1:4000 &
	gadget=$!
	halt() { while :; do sleep 3600; done; }
	# Sets dev to the gadget's sysfs device, once enumerated (the first
	# time within 60 s).
	enumerated() {
		n=0
		until grep -qs 772a /sys/bus/usb/devices/*/idProduct; do
			if ! kill -0 "$gadget" 2>/dev/null; then
				wait "$gadget"
				echo "phyfarm-exporter: failed: ax88772-gadget exited with $?"
				halt
			fi
			n=$((n + 1))
			if [ "$1" = first ] && [ "$n" -gt 600 ]; then
				echo "phyfarm-exporter: failed: the gadget was not enumerated within 60 s"
				halt
			fi
			sleep 0.1
		done
		dev=$(dirname "$(grep -ls 772a /sys/bus/usb/devices/*/idProduct | head -n1)")
	}
	round=first
	while :; do
		enumerated "$round"
		num=$(cat "$dev/devnum" 2>/dev/null)
		echo "phyfarm-exporter: the gadget is enumerated as $dev (device $num)"
		usbredirect --device "0b95:$(cat "$dev/idProduct")" --as 127.0.0.1:4000 --verbose 3 &
		redirect=$!
		if [ "$round" = first ]; then
			n=0
			until netstat -ltn 2>/dev/null | grep -q ':4000 '; do
				if ! kill -0 "$redirect" 2>/dev/null; then
					wait "$redirect"
					echo "phyfarm-exporter: failed: usbredirect exited with $? before listening"
					halt
				fi
				n=$((n + 1))
				[ "$n" -gt 600 ] && { echo "phyfarm-exporter: failed: usbredirect did not listen within 60 s"; break; }
				sleep 0.1
			done
			echo "phyfarm-exporter: ready"
		fi
		# usbredirect notices its device going away only when a transfer
		# fails, and then exits or stays without one: a device number that
		# changed (or went) for half a second ends it here.
		odd=0
		while kill -0 "$redirect" 2>/dev/null; do
			now=
			read -r now 2>/dev/null <"$dev/devnum"
			if [ "$now" = "$num" ]; then
				odd=0
			else
				odd=$((odd + 1))
			fi
			if [ "$odd" -ge 5 ]; then
				echo "phyfarm-exporter: device $num went away (now '$now'); stopping usbredirect"
				kill "$redirect" 2>/dev/null
				n=0
				while kill -0 "$redirect" 2>/dev/null && [ "$n" -lt 20 ]; do
					sleep 0.1
					n=$((n + 1))
				done
				kill -9 "$redirect" 2>/dev/null
				break
			fi
			sleep 0.1
		done
		wait "$redirect"
		rc=$?
		# The same device still there: usbredirect failed, not an unplug.
		now=
		read -r now 2>/dev/null <"$dev/devnum"
		if [ "$now" = "$num" ]; then
			echo "phyfarm-exporter: usbredirect exited with $rc while its device was present"
			halt
		fi
		echo "phyfarm-exporter: the gadget went away (usbredirect ended with $rc); serving it again when it returns"
		round=again
	done
fi

echo "phyfarm-init: starting phyfarm-agent after $(cut -d' ' -f1 /proc/uptime)s"

# PID 1 must never exit (that panics the kernel): restart the agent if it dies.
while :; do
	/usr/bin/phyfarm-agent
	echo "phyfarm-init: phyfarm-agent exited with $?; restarting"
	sleep 1
done
