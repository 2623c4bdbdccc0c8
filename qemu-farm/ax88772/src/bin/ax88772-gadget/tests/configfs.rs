//! Tests of the gadget's configfs tree: what is written, what a failed
//! set-up takes back, and the choice of controller.

use super::*;

#[test]
fn make_gadget_writes_the_models_identity_to_configfs() {
    let t = TempDir::new("configfs");
    let a = args(&["--configfs", t.0.to_str().unwrap()]);
    let (connect, iface, eps) = sample_identity();
    let id = Identity {
        connect,
        iface,
        eps,
        strings: ["ASIX".into(), "AX88772A".into(), "0001".into()],
    };
    let mut made = Made::default();
    let g = make_gadget(&a, &id, &mut made).unwrap();
    assert_eq!(g, t.0.join("usb_gadget/ax88772"));
    let attr = |p: &str| std::fs::read_to_string(g.join(p)).unwrap();
    assert_eq!(attr("idVendor"), "0x0b95");
    assert_eq!(attr("idProduct"), "0x772a");
    assert_eq!(attr("bcdDevice"), "0x0001");
    assert_eq!(attr("bcdUSB"), "0x0200");
    assert_eq!(attr("bDeviceClass"), "0xff");
    assert_eq!(attr("bDeviceSubClass"), "0xff");
    assert_eq!(attr("bDeviceProtocol"), "0x00");
    assert_eq!(attr("strings/0x409/manufacturer"), "ASIX");
    assert_eq!(attr("strings/0x409/product"), "AX88772A");
    assert_eq!(attr("strings/0x409/serialnumber"), "0001");
    assert_eq!(attr("configs/c.1/MaxPower"), "250");
    assert!(g.join("functions/ffs.ax88772").is_dir());
    let e = make_gadget(&a, &id, &mut Made::default()).unwrap_err();
    assert!(e.to_string().contains("exists already"), "{e}");
    assert!(g.is_dir(), "a refused start takes nothing of another's");
}

fn sample() -> Identity {
    let (connect, iface, eps) = sample_identity();
    Identity {
        connect,
        iface,
        eps,
        strings: ["ASIX".into(), "AX88772A".into(), "0001".into()],
    }
}

#[test]
fn a_failed_functionfs_mount_takes_back_the_gadget_tree_and_reports_the_mount() {
    let t = TempDir::new("cleanup-mount");
    // configfs has usb_gadget of its own: it stays.
    std::fs::create_dir(t.0.join("usb_gadget")).unwrap();
    std::fs::write(t.0.join("keep"), "x").unwrap();
    let before = tree(&t.0);
    let ffs = t.0.join("dev/ffs-ax88772");
    let a = args(&[
        "--configfs",
        t.0.to_str().unwrap(),
        "--ffs",
        ffs.to_str().unwrap(),
    ]);
    let d =
        gadget::descriptors(&sample().iface, &gadget::endpoints(&sample().eps).unwrap()).unwrap();
    let mut made = Made::default();
    let e = build(&a, &sample(), &d, &mut made, |p| {
        assert!(p.is_dir(), "the mount point is made first");
        bail!(
            "mounting functionfs {NAME} on {}: no such device",
            p.display()
        )
    })
    .unwrap_err();
    assert!(
        !made.steps.is_empty(),
        "the tree was built before the mount"
    );
    made.undo();
    assert!(e.to_string().starts_with("mounting functionfs"), "{e}");
    assert_eq!(tree(&t.0), before, "everything made is gone, nothing else");
    assert!(made.steps.is_empty());
}

#[test]
fn a_failure_after_the_mount_also_unmounts_last_first() {
    let t = TempDir::new("cleanup-ep0");
    let before = tree(&t.0);
    let ffs = t.0.join("ffs");
    let a = args(&[
        "--configfs",
        t.0.to_str().unwrap(),
        "--ffs",
        ffs.to_str().unwrap(),
    ]);
    static UNMOUNTED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let mut made = Made {
        unmount: |p| {
            // The function's tree still exists when FunctionFS goes.
            assert!(p.parent().unwrap().join("usb_gadget/ax88772").is_dir());
            UNMOUNTED.lock().unwrap().push(p.to_path_buf());
            Ok(())
        },
        ..Made::default()
    };
    // The "mount" leaves no ep0 behind: opening it fails.
    let e = build(&a, &sample(), &[], &mut made, |_| Ok(())).unwrap_err();
    assert_eq!(e.to_string(), "opening ep0");
    assert_eq!(made.steps.last(), Some(&Step::Mount(ffs.clone())));
    made.undo();
    assert_eq!(*UNMOUNTED.lock().unwrap(), [ffs]);
    assert_eq!(tree(&t.0), before);
}

#[test]
fn undo_keeps_going_past_what_it_cannot_remove() {
    let t = TempDir::new("cleanup-partial");
    let d = t.0.join("a");
    let mut made = Made::default();
    made.mkdir(&d.join("b")).unwrap();
    made.write_attr(&d, "attr", "1").unwrap();
    // Something the gadget did not make keeps `b` from going.
    std::fs::write(d.join("b/foreign"), "x").unwrap();
    made.undo();
    assert!(!d.join("attr").exists(), "later steps were taken back");
    assert!(d.join("b/foreign").exists(), "nothing foreign is removed");
    assert!(logged(&log(), "W: cleaning up: removing"));
}

#[test]
fn first_udc_is_the_first_controller_by_name() {
    let t = TempDir::new("udc");
    for n in ["musb-hdrc.1", "dummy_udc.1", "dummy_udc.0"] {
        std::fs::create_dir(t.0.join(n)).unwrap();
    }
    assert_eq!(first_udc(&t.0).unwrap(), "dummy_udc.0");
}

#[test]
fn first_udc_fails_without_a_controller() {
    let t = TempDir::new("noudc");
    let e = first_udc(&t.0).unwrap_err();
    assert!(e.to_string().contains("no USB device controller in"), "{e}");
    let e = first_udc(&t.0.join("absent")).unwrap_err();
    assert!(e.to_string().contains("(no USB device controller?)"), "{e}");
}
