#!/bin/busybox sh
# /init of the boot-check initramfs (`phyfarm boot`). It reports what the
# kernel registered, as key=value lines on the virtio port
# "org.phyfarm.result" (never through the console), then ends the guest.
# With phyfarm.mode=probe on the command line it only proves it ran (the
# accelerator probe).
/bin/busybox mkdir -p /proc /sys /dev /tmp
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev 2>/dev/null
/bin/busybox --install -s /bin

port=/dev/null
for p in /sys/class/virtio-ports/*; do
	[ "$(cat "$p/name" 2>/dev/null)" = org.phyfarm.result ] && port=/dev/${p##*/}
done
exec 3>"$port"

case " $(cat /proc/cmdline) " in
*" phyfarm.mode=probe "*)
	echo "probe=ok" >&3
	;;
*)
	echo "kernel=$(uname -r)" >&3
	echo "version=$(cat /proc/version)" >&3
	[ -d /sys/bus/usb/drivers/asix ] && echo "usb_driver_asix=1" >&3 || echo "usb_driver_asix=0" >&3
	[ -d "/sys/bus/mdio_bus/drivers/Asix Electronics AX88772A" ] \
		&& echo "phy_driver_ax88772a=1" >&3 || echo "phy_driver_ax88772a=0" >&3
	echo "phy_drivers=$(ls /sys/bus/mdio_bus/drivers | tr '\n' '|')" >&3
	echo "rust_phy_symbols=$(grep -c 'ax88796b_rust' /proc/kallsyms)" >&3
	echo "c_phy_symbols=$(grep -c -E ' (asix_soft_reset|asix_ax88772a_link_change_notify)$' /proc/kallsyms)" >&3
	echo "xhci=$([ -d /sys/bus/pci/drivers/xhci_hcd ] && echo 1 || echo 0)" >&3
	;;
esac
echo "done=1" >&3
exec 3>&-
sync
reboot -f
