//! Guest: the farm's initramfs, booting a kernel in QEMU, the machine every
//! guest is, the choice of KVM or TCG, and the plan every farm guest is
//! started from.

pub mod accel;
pub mod boot;
pub mod cpio;
pub mod image;
pub mod machine;
pub mod plan;
