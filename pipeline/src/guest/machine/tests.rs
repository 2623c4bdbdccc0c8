use super::*;

#[test]
fn qemu_versions_parse_and_pick_option_spellings() {
    let v = QemuVersion::parse("QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u16)");
    assert_eq!(v, Some(QemuVersion(7, 2)));
    assert_eq!(
        QemuVersion::parse("QEMU emulator version 10.0.2"),
        Some(QemuVersion(10, 0))
    );
    assert_eq!(QemuVersion::parse("qemu: command not found"), None);
    assert_eq!(QemuVersion::parse("version x.y"), None);
    assert_eq!(QemuVersion(7, 2).chardev_reconnect(), "reconnect=1");
    assert_eq!(QemuVersion(9, 1).chardev_reconnect(), "reconnect=1");
    assert_eq!(QemuVersion(9, 2).chardev_reconnect(), "reconnect-ms=1000");
    assert!(QemuVersion(10, 0) > QemuVersion(9, 2));
}

#[test]
fn the_machine_boots_qboot_when_qemu_ships_it() {
    let t = machine_template(Accel::Tcg);
    let bios = t.iter().position(|a| a == "-bios");
    let d = machine_description(Accel::Tcg);
    match firmware() {
        Some(f) => {
            assert!(f.ends_with("qboot.rom"), "{f:?}");
            assert_eq!(t[bios.unwrap() + 1], f.display().to_string());
            assert_eq!(d.firmware, f.display().to_string());
        }
        None => {
            assert_eq!(bios, None, "{t:?}");
            assert_eq!(d.firmware, "seabios");
        }
    }
}

#[test]
fn each_role_device_leaves_only_declared_slots_and_every_slot_is_used() {
    let d = device_templates(QemuVersion(10, 0));
    // The {name} slots of one value.
    let slots = |v: &str| -> Vec<String> {
        v.split('{')
            .skip(1)
            .filter_map(|t| t.split_once('}').map(|(s, _)| format!("{{{s}}}")))
            .collect()
    };
    let mut used = std::collections::BTreeSet::new();
    for (name, argv) in &d {
        // Options and their values alternate: -device X, -chardev Y, ...
        assert!(argv.len() % 2 == 0, "{name}: {argv:?}");
        for pair in argv.chunks(2) {
            assert!(
                ["-device", "-chardev", "-netdev"].contains(&pair[0].as_str()),
                "{name}: {pair:?}"
            );
            for s in slots(&pair[1]) {
                assert!(DEVICE_SLOTS.contains(&s.as_str()), "{name}: {s}");
                used.insert(s);
            }
        }
    }
    assert_eq!(used.len(), DEVICE_SLOTS.len(), "unused slots: {used:?}");
    // The reconnecting chardevs are spelled for the QEMU at hand.
    assert!(d["usb_redir_unix"][1].ends_with(",reconnect-ms=1000"));
    let old = device_templates(QemuVersion(7, 2));
    assert!(
        old["exporter"][3].ends_with(",reconnect=1"),
        "{:?}",
        old["exporter"]
    );
    assert_eq!(machine_description(Accel::Tcg).devices.len(), 7);
}
