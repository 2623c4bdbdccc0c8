use super::*;
use crate::guest::machine::{confinement_args, machine_description, machine_template, QemuVersion};

fn report(rust: u32, c: u32) -> BTreeMap<String, String> {
    parse_report(&format!(
        "kernel=6.12.118\nusb_driver_asix=1\nphy_driver_ax88772a=1\nphy_drivers=Asix Electronics AX88772A|Generic PHY|\nrust_phy_symbols={rust}\nc_phy_symbols={c}\ndone=1\n"
    ))
}

#[test]
fn judge_accepts_the_expected_implementation() {
    assert!(judge(&report(12, 0), Some(Variant::Rust))
        .iter()
        .all(|c| c.ok));
    assert!(judge(&report(0, 2), Some(Variant::C)).iter().all(|c| c.ok));
}

#[test]
fn judge_fails_the_wrong_implementation() {
    let checks = judge(&report(0, 2), Some(Variant::Rust));
    let bad: Vec<_> = checks.iter().filter(|c| !c.ok).collect();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].name, "phy driver is the Rust one");
    assert!(bad[0]
        .detail
        .contains("0 ax88796b_rust symbols, 2 C driver symbols"));
}

#[test]
fn judge_fails_missing_drivers() {
    let mut r = report(1, 0);
    r.insert("usb_driver_asix".into(), "0".into());
    r.insert("phy_driver_ax88772a".into(), "0".into());
    let failed: Vec<_> = judge(&r, None).into_iter().filter(|c| !c.ok).collect();
    assert_eq!(failed.len(), 2);
}

/// A TCG boot-check guest's QEMU command line.
fn boot_check_argv(probe: bool) -> Vec<String> {
    qemu_argv(
        Path::new("/k/bzImage"),
        Path::new("/g/i.cpio"),
        Accel::Tcg,
        256,
        Path::new("/o/console.log"),
        Path::new("/o/result.txt"),
        probe,
    )
}

#[test]
fn qemu_argv_reports_on_a_virtio_port_and_never_reboots() {
    let v = boot_check_argv(false);
    let s = v.join(" ");
    assert!(s.starts_with("qemu-system-x86_64 -accel tcg"), "{s}");
    assert!(s.contains("-no-reboot"));
    assert!(s.contains("panic=-1"));
    assert!(s.contains("virtserialport,chardev=result,name=org.phyfarm.result"));
    assert!(!s.contains("phyfarm.mode=probe"));
}

#[test]
fn guests_are_sandboxed_and_drop_root() {
    let v = confinement_args(Some("phyfarm-qemu"), QemuVersion(7, 2)).join(" ");
    assert_eq!(
        v,
        "-sandbox on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny -runas phyfarm-qemu"
    );
    // -runas is spelled -run-with user= from QEMU 9.1 on.
    let v = confinement_args(Some("phyfarm-qemu"), QemuVersion(9, 1)).join(" ");
    assert!(
        v.ends_with(" -run-with user=phyfarm-qemu") && !v.contains("-runas"),
        "{v}"
    );
    let v = confinement_args(Some("phyfarm-qemu"), QemuVersion(9, 0)).join(" ");
    assert!(v.ends_with(" -runas phyfarm-qemu"), "{v}");
    let v = confinement_args(None, QemuVersion(9, 2)).join(" ");
    assert!(
        v.contains("elevateprivileges=deny") && !v.contains("-runas") && !v.contains("-run-with"),
        "{v}"
    );
    // Every guest's machine is confined, the boot check's and the farm's.
    let argv = qemu_argv(
        Path::new("/k"),
        Path::new("/i"),
        Accel::Tcg,
        256,
        Path::new("/c"),
        Path::new("/r"),
        false,
    );
    assert_eq!(
        argv.iter().filter(|a| *a == "-sandbox").count(),
        1,
        "{argv:?}"
    );
    let t = machine_template(Accel::Tcg);
    assert_eq!(t.iter().filter(|a| *a == "-sandbox").count(), 1, "{t:?}");
    let d = machine_description(Accel::Tcg);
    assert!(
        t.ends_with(&d.confinement),
        "{t:?} does not end with {:?}",
        d.confinement
    );
}

#[test]
fn initramfs_has_init_console_and_busybox() {
    let e = boot_entries(vec![0x7f, b'E', b'L', b'F']);
    let names: Vec<String> = e
        .iter()
        .map(|e| match e {
            Entry::Dir { path, .. }
            | Entry::File { path, .. }
            | Entry::Symlink { path, .. }
            | Entry::CharDev { path, .. } => path.clone(),
        })
        .collect();
    for n in ["init", "bin/busybox", "dev/console", "bin/sh"] {
        assert!(names.contains(&n.to_string()), "{n} missing");
    }
    assert!(BOOT_INIT.contains(RESULT_PORT));
}

#[test]
fn guest_timeout_is_enforced() {
    let (end, _) = run_guest(&["sleep".into(), "30".into()], Duration::from_millis(200)).unwrap();
    assert_eq!(end, GuestEnd::TimedOut);
}

#[test]
fn kernel_args_time_the_apic_only_under_tcg_and_start_the_guests_command_line() {
    let tcg = kernel_args(Accel::Tcg);
    let kvm = kernel_args(Accel::Kvm);
    for a in [&tcg, &kvm] {
        assert!(a.starts_with("console=ttyS0 panic=-1 oops=panic"), "{a}");
        for opt in [
            "retain_initrd",
            "no_timer_check",
            "usbcore.old_scheme_first=1",
        ] {
            assert!(a.split(' ').any(|w| w == opt), "{opt} missing in {a}");
        }
    }
    // KVM guests keep the local APIC timer (TSC-deadline, no calibration).
    assert!(tcg.split(' ').any(|w| w == "noapictimer"), "{tcg}");
    assert!(!kvm.contains("noapictimer"), "{kvm}");
    let v = boot_check_argv(true);
    let i = v.iter().position(|a| a == "-append").unwrap();
    assert_eq!(v[i + 1], format!("{tcg} phyfarm.mode=probe"));
    let d = machine_description(Accel::Kvm);
    assert_eq!(d.kernel_args, kvm);
}
