//! Guest memory for the sample-time readers' unit tests (`guest_task`, its `maps`): what a
//! guest's page tables would map, served from a map by virtual page.

use std::collections::HashMap;

use super::GuestRead;
use crate::kvm_error::AccessError;

/// Guest memory by virtual page: a page is mapped once anything was put on it (the rest of it
/// reads as zeros), as a guest's page tables map whole pages.
#[derive(Default)]
pub(super) struct Mem(HashMap<u64, Box<[u8; 4096]>>);

impl Mem {
    pub(super) fn put(&mut self, at: u64, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate() {
            let a = at + i as u64;
            let page = self.0.entry(a >> 12).or_insert_with(|| Box::new([0; 4096]));
            page[(a & 0xfff) as usize] = *b;
        }
    }

    pub(super) fn put_u64(&mut self, at: u64, v: u64) {
        self.put(at, &v.to_le_bytes());
    }
}

impl GuestRead for Mem {
    fn read_virt(&mut self, gva: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        for (i, b) in buf.iter_mut().enumerate() {
            let a = gva.wrapping_add(i as u64);
            let page = self.0.get(&(a >> 12)).ok_or(AccessError::NotMapped(a))?;
            *b = page[(a & 0xfff) as usize];
        }
        Ok(())
    }
}

/// Layout values of a 6.1 x86-64 build for the memory map (`task-layout` lines).
pub(super) const MAP_LAYOUT_LINES: &str = "value mm_struct_mm_mt 64\n\
    value maple_tree_ma_root 8\n\
    value maple_range_64_pivot 8\n\
    value maple_range_64_slot 128\n\
    value maple_range_64_meta 248\n\
    value maple_arange_64_pivot 8\n\
    value maple_arange_64_slot 80\n\
    value maple_arange_64_meta 240\n\
    value maple_range64_slots 16\n\
    value maple_arange64_slots 10\n\
    value vm_area_struct_vm_start 0\n\
    value vm_area_struct_vm_end 8\n\
    value vm_area_struct_vm_file 160\n\
    value vm_area_struct_vm_pgoff 152\n";

pub(super) const ROOT_NODE: u64 = 0xffff_8880_0600_0000;
pub(super) const LEAF_LOW: u64 = 0xffff_8880_0600_0100;
pub(super) const LEAF_HIGH: u64 = 0xffff_8880_0600_0200;
pub(super) const VMA_EXE: u64 = 0xffff_8880_0700_0000;
pub(super) const VMA_LIBC: u64 = 0xffff_8880_0700_0100;
pub(super) const VMA_ANON: u64 = 0xffff_8880_0700_0200;
pub(super) const VMA_LIBB: u64 = 0xffff_8880_0700_0300;
pub(super) const LIBC_START: u64 = 0x7f00_0000_1000;
pub(super) const LIBB_START: u64 = 0x7e00_0000_1000;
pub(super) const ANON_START: u64 = 0x7fff_0000_1000;

/// A two-level maple tree as 6.1 builds one for a small process, at `mm` (node pointers as
/// `mt_mk_node` makes them: type in bits 3-6 and MAPLE_ENODE_NULL, bit 2): an arange_64 root
/// whose two leaves hold the VMAs [0x401000, 0x4b2000) (the executable), [LIBB_START,
/// +0x10000) (a second library's text at page offset 1: `libb_file`), [LIBC_START, +0x1f000)
/// (a file at page offset 0x26: `libc_file`) and [ANON_START, +0x20000) (anonymous), with gaps
/// (empty slots) between them.
pub(super) fn maple_tree(m: &mut Mem, mm: u64, libc_file: u64, libb_file: u64) {
    let (mt_root, r_piv, r_slot, r_meta, a_piv, a_slot, a_meta) = (72, 8, 128, 248, 8, 80, 240);
    m.put_u64(mm + mt_root, ROOT_NODE | (3 << 3) | 4 | 2);
    // Root: two slots split at 0x7fff_0000_0000; parent = the tree (| 1), not itself.
    m.put_u64(ROOT_NODE, (mm + 64) | 1);
    m.put_u64(ROOT_NODE + a_piv, 0x7fff_0000_0000);
    m.put_u64(ROOT_NODE + a_slot, LEAF_LOW | (1 << 3) | 4);
    m.put_u64(ROOT_NODE + a_slot + 8, LEAF_HIGH | (1 << 3) | 4);
    m.put(ROOT_NODE + a_meta, &[1]);
    // Low leaf: gap, exe, gap, libb, gap, libc, gap (to the node's max).
    m.put_u64(LEAF_LOW, ROOT_NODE | (3 << 3));
    let low = [
        (0x40_0fff, 0),
        (0x4b_1fff, VMA_EXE),
        (LIBB_START - 1, 0),
        (LIBB_START + 0xffff, VMA_LIBB),
        (LIBC_START - 1, 0),
        (LIBC_START + 0x1_efff, VMA_LIBC),
    ];
    for (i, (pivot, vma)) in low.iter().enumerate() {
        m.put_u64(LEAF_LOW + r_piv + 8 * i as u64, *pivot);
        m.put_u64(LEAF_LOW + r_slot + 8 * i as u64, *vma);
    }
    m.put(LEAF_LOW + r_meta, &[6]);
    // High leaf: anonymous memory, then a gap to the end.
    m.put_u64(LEAF_HIGH, ROOT_NODE | (3 << 3));
    m.put_u64(LEAF_HIGH + r_piv, ANON_START + 0x1_ffff);
    m.put_u64(LEAF_HIGH + r_slot, VMA_ANON);
    m.put(LEAF_HIGH + r_meta, &[1]);
    for (vma, start, len, file, pgoff) in [
        (VMA_EXE, 0x40_1000u64, 0xb_1000u64, 0u64, 1u64),
        (VMA_LIBB, LIBB_START, 0x1_0000, libb_file, 1),
        (VMA_LIBC, LIBC_START, 0x1_f000, libc_file, 0x26),
        (VMA_ANON, ANON_START, 0x2_0000, 0, ANON_START >> 12),
    ] {
        m.put_u64(vma, start);
        m.put_u64(vma + 8, start + len);
        m.put_u64(vma + 160, file);
        m.put_u64(vma + 152, pgoff);
    }
}
