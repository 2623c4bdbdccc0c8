//! The gadget in configfs: its tree built from the model's identity,
//! FunctionFS mounted and linked, the controller chosen, and everything
//! made taken back, last first, when the set-up fails.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ax88772::gadget;

use crate::{Args, Identity};

pub(crate) const NAME: &str = "ax88772";

pub(crate) fn write_attr(dir: &Path, name: &str, value: &str) -> Result<()> {
    let p = dir.join(name);
    std::fs::write(&p, value).with_context(|| format!("writing {value:?} to {}", p.display()))
}

/// One thing the gadget's set-up made, and how it is taken back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// A directory it created (rmdir; in configfs that removes the
    /// attributes and default groups inside with it).
    Dir(PathBuf),
    /// A file a write created (a plain directory in configfs' place; real
    /// configfs attributes exist with their directory and are not this).
    File(PathBuf),
    /// The function's link into its configuration.
    Link(PathBuf),
    /// The FunctionFS mount.
    Mount(PathBuf),
    /// The gadget bound to a controller (its `UDC` attribute).
    Bound(PathBuf),
}

/// What the set-up has made so far: on a failure it is taken back, last
/// first, so that a failed start leaves no half-built gadget behind.
pub(crate) struct Made {
    pub(crate) steps: Vec<Step>,
    pub(crate) unmount: fn(&Path) -> std::io::Result<()>,
}

impl Default for Made {
    fn default() -> Self {
        Made {
            steps: Vec::new(),
            unmount: umount,
        }
    }
}

fn umount(p: &Path) -> std::io::Result<()> {
    let c = CString::new(p.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid NUL-terminated path. MNT_DETACH: the endpoint files
    // still open go with the process.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Made {
    /// Create `p` and whichever of its parents are missing, each recorded.
    pub(crate) fn mkdir(&mut self, p: &Path) -> Result<()> {
        let mut missing = Vec::new();
        let mut q = Some(p);
        while let Some(d) = q.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
            missing.push(d.to_path_buf());
            q = d.parent();
        }
        for d in missing.into_iter().rev() {
            std::fs::create_dir(&d).with_context(|| format!("creating {}", d.display()))?;
            self.steps.push(Step::Dir(d));
        }
        Ok(())
    }

    /// [`write_attr`], recording the file when the write created it.
    pub(crate) fn write_attr(&mut self, dir: &Path, name: &str, value: &str) -> Result<()> {
        let p = dir.join(name);
        let existed = p.exists();
        write_attr(dir, name, value)?;
        if !existed {
            self.steps.push(Step::File(p));
        }
        Ok(())
    }

    /// Take back everything, last first. Each failure is logged; the
    /// caller reports the error that made it give up.
    pub(crate) fn undo(&mut self) {
        while let Some(step) = self.steps.pop() {
            let (what, r) = match &step {
                Step::Bound(g) => (
                    "unbinding",
                    write_attr(g, "UDC", "\n").map_err(|e| std::io::Error::other(format!("{e:#}"))),
                ),
                Step::Link(p) | Step::File(p) => ("removing", std::fs::remove_file(p)),
                Step::Mount(p) => ("unmounting", (self.unmount)(p)),
                Step::Dir(p) => ("removing", std::fs::remove_dir(p)),
            };
            if let Err(e) = r {
                let p = match &step {
                    Step::Bound(p)
                    | Step::Link(p)
                    | Step::File(p)
                    | Step::Mount(p)
                    | Step::Dir(p) => p,
                };
                say!("W: cleaning up: {what} {}: {e}", p.display());
            }
        }
    }
}

/// The configfs gadget with its one FunctionFS function (not yet bound).
pub(crate) fn make_gadget(args: &Args, id: &Identity, made: &mut Made) -> Result<PathBuf> {
    let g = args.configfs.join("usb_gadget").join(NAME);
    if g.exists() {
        bail!("{} exists already: another gadget runs here", g.display());
    }
    made.mkdir(&g)?;
    let c = &id.connect;
    made.write_attr(&g, "idVendor", &format!("{:#06x}", c.vendor_id))?;
    made.write_attr(&g, "idProduct", &format!("{:#06x}", c.product_id))?;
    made.write_attr(&g, "bcdDevice", &format!("{:#06x}", c.device_version_bcd))?;
    made.write_attr(&g, "bcdUSB", "0x0200")?;
    made.write_attr(&g, "bDeviceClass", &format!("{:#04x}", c.device_class))?;
    made.write_attr(
        &g,
        "bDeviceSubClass",
        &format!("{:#04x}", c.device_subclass),
    )?;
    made.write_attr(
        &g,
        "bDeviceProtocol",
        &format!("{:#04x}", c.device_protocol),
    )?;
    let st = g.join("strings/0x409");
    made.mkdir(&st)?;
    for (name, v) in ["manufacturer", "product", "serialnumber"]
        .iter()
        .zip(&id.strings)
    {
        made.write_attr(&st, name, v)?;
    }
    let cfg = g.join("configs/c.1");
    made.mkdir(&cfg)?;
    made.write_attr(&cfg, "MaxPower", "250")?;
    let f = g.join("functions").join(format!("ffs.{NAME}"));
    made.mkdir(&f)?;
    Ok(g)
}

/// The gadget built up to binding: configfs tree, FunctionFS mounted
/// with `mount` on `args.ffs`, the function's descriptors written to its
/// `ep0` (returned) and the function linked into its configuration.
pub(crate) fn build(
    args: &Args,
    id: &Identity,
    descriptors: &[u8],
    made: &mut Made,
    mount: impl FnOnce(&Path) -> Result<()>,
) -> Result<(PathBuf, File)> {
    let g = make_gadget(args, id, made)?;
    made.mkdir(&args.ffs)?;
    mount(&args.ffs)?;
    made.steps.push(Step::Mount(args.ffs.clone()));
    let mut ep0 = OpenOptions::new()
        .read(true)
        .write(true)
        .open(args.ffs.join("ep0"))
        .context("opening ep0")?;
    ep0.write_all(descriptors)
        .context("writing the function's descriptors to ep0")?;
    ep0.write_all(&gadget::strings())
        .context("writing the function's strings to ep0")?;
    let link_name = g.join("configs/c.1").join(format!("ffs.{NAME}"));
    std::os::unix::fs::symlink(g.join("functions").join(format!("ffs.{NAME}")), &link_name)
        .with_context(|| format!("linking {}", link_name.display()))?;
    made.steps.push(Step::Link(link_name));
    Ok((g, ep0))
}

pub(crate) fn mount_ffs(dir: &Path) -> Result<()> {
    let src = CString::new(NAME).unwrap();
    let target = CString::new(dir.as_os_str().as_encoded_bytes()).context("mount point")?;
    let fstype = CString::new("functionfs").unwrap();
    // SAFETY: every pointer is a valid NUL-terminated string that outlives
    // the call; data may be null.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "mounting functionfs {NAME} on {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// The first USB device controller (by name) in `class`, /sys/class/udc.
pub(crate) fn first_udc(class: &Path) -> Result<String> {
    let mut names: Vec<String> = std::fs::read_dir(class)
        .with_context(|| format!("reading {} (no USB device controller?)", class.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names
        .into_iter()
        .next()
        .with_context(|| format!("no USB device controller in {}", class.display()))
}
