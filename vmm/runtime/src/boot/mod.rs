//! Getting a guest into memory: the memory layout, kernel/initramfs/command-line loading,
//! Multiboot v1 kernels (kvm-unit-tests) and the ACPI tables. A bzImage's vmlinux is extracted
//! by `analysis::bzimage` (the symbol readers read it too).

pub(crate) mod acpi;
pub mod kernel;
pub mod layout;
pub mod multiboot;
