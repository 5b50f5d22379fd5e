//! Getting a guest into memory: the memory layout, kernel/initramfs/command-line loading,
//! bzImage extraction, Multiboot v1 kernels (kvm-unit-tests) and the ACPI tables.

pub mod acpi;
pub mod bzimage;
pub mod kernel;
pub mod layout;
pub mod multiboot;
