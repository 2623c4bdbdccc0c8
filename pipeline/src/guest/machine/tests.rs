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
