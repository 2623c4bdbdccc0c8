//! Guest: the farm's initramfs, booting a kernel in QEMU, and the choice of
//! KVM or TCG.

pub mod accel;
pub mod boot;
pub mod cpio;
pub mod image;
