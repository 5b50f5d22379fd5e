//! Getting a guest into memory: the memory layout, kernel/initramfs/command-line loading,
//! bzImage extraction and the ACPI tables.

pub mod acpi;
pub mod bzimage;
pub mod kernel;
pub mod layout;
