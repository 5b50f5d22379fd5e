//! Which file a user-space sample's RIP lies in when it is not the executable's code: a shared
//! library (issue 19, "where in user space"), the vDSO or anonymous memory (JIT code). Linux
//! 6.1 keeps a task's memory map in `mm->mm_mt`, a maple tree of `vm_area_struct`s keyed by
//! address; the VMM looks up the sample's RIP in it at sample time, as `mtree_load` would,
//! and records the VMA's start, page offset and file name (trace record kind 8). Offline,
//! `report --guest-files` turns (file, offset) into the library's function
//! (`profile::user_symbols`).
//!
//! The maple tree of 6.1 on 64-bit (`include/linux/maple_tree.h`, `lib/maple_tree.c`): a node
//! is 256 bytes, 256-aligned; a pointer to one (an "encoded node") carries the node type in
//! bits 3..=6 (1 leaf_64, 2 range_64, 3 arange_64; 0 dense is not used for VMAs), bit 2 when
//! a NULL lies somewhere below (MAPLE_ENODE_NULL, set by `mt_mk_node`), and the root pointer
//! also has bit 1 set. range_64 and leaf_64 nodes hold 15 pivots and 16 slots (the last
//! slot's bytes double as metadata: the index of the last used slot), arange_64 nodes 9 pivots,
//! 10 slots, 10 gaps and metadata. Slot `i` covers the indices up to `pivot[i]`. The offsets
//! and slot counts come from the kernel's build ([`MapLayout`], via `task-layout`), not from
//! this code.
//!
//! The guest is not trusted: the descent is at most [`MAPLE_HEIGHT_MAX`] nodes, each read
//! whole once; node pointers must be aligned kernel addresses of a known type; a node whose
//! parent pointer points at itself (freed under us) or whose metadata says more slots than it
//! has ends the lookup with a reason; the VMA found must contain the RIP.

use super::{
    kernel_pointer, read_u64, FileName, GuestMapping, GuestRead, Step, Unresolved, EXE_NAME_MAX,
};

/// Linux's MAPLE_HEIGHT_MAX: no tree is deeper.
pub(crate) const MAPLE_HEIGHT_MAX: usize = 31;
/// Bytes of a maple node.
const NODE: usize = 256;
const STEP: Step = Step::Mapping;

/// Where the memory map's pieces are (offsets from the kernel's build; `task-layout`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapLayout {
    /// mm_struct.mm_mt + maple_tree.ma_root.
    pub mm_root: u64,
    /// maple_range_64 (also leaf_64): pivot, slot and metadata offsets, slot count.
    pub range: NodeLayout,
    /// maple_arange_64.
    pub arange: NodeLayout,
    pub vma_start: u64,
    pub vma_end: u64,
    pub vma_file: u64,
    pub vma_pgoff: u64,
}

/// One maple node type's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLayout {
    pub pivot: u64,
    pub slot: u64,
    pub meta: u64,
    pub slots: u64,
}

impl NodeLayout {
    /// Whether every field lies inside a node (checked: the values come from a file).
    fn fits(&self) -> bool {
        let n = NODE as u64;
        let ends_inside = |at: u64, len: u64| at.checked_add(len).is_some_and(|end| end <= n);
        (2..=32).contains(&self.slots)
            && ends_inside(self.pivot, 8 * (self.slots - 1))
            && ends_inside(self.slot, 8 * self.slots)
            && self.meta < n
    }
}

impl MapLayout {
    /// From a layout file's values (None: the file has no memory-map lines, an older build).
    pub(crate) fn from_values(
        get: &dyn Fn(&'static str) -> Option<u64>,
    ) -> Result<Option<MapLayout>, &'static str> {
        if get("mm_struct_mm_mt").is_none() {
            return Ok(None);
        }
        let need = |n: &'static str| get(n).ok_or(n);
        let l = MapLayout {
            mm_root: need("mm_struct_mm_mt")? + need("maple_tree_ma_root")?,
            range: NodeLayout {
                pivot: need("maple_range_64_pivot")?,
                slot: need("maple_range_64_slot")?,
                meta: need("maple_range_64_meta")?,
                slots: need("maple_range64_slots")?,
            },
            arange: NodeLayout {
                pivot: need("maple_arange_64_pivot")?,
                slot: need("maple_arange_64_slot")?,
                meta: need("maple_arange_64_meta")?,
                slots: need("maple_arange64_slots")?,
            },
            vma_start: need("vm_area_struct_vm_start")?,
            vma_end: need("vm_area_struct_vm_end")?,
            vma_file: need("vm_area_struct_vm_file")?,
            vma_pgoff: need("vm_area_struct_vm_pgoff")?,
        };
        let small = [l.mm_root, l.vma_start, l.vma_end, l.vma_file, l.vma_pgoff];
        if small.iter().any(|&o| o > 1 << 16) || !l.range.fits() || !l.arange.fits() {
            return Err("a memory-map offset outside its struct");
        }
        Ok(Some(l))
    }
}

/// The VMA of `mm` that contains `addr` (its guest address); None: no VMA covers it.
pub(crate) fn vma_at<M: GuestRead + ?Sized>(
    mem: &mut M,
    l: &MapLayout,
    mm: u64,
    addr: u64,
) -> Result<Option<u64>, Unresolved> {
    let root = read_u64(mem, mm + l.mm_root, STEP)?;
    // xa_is_node: an internal entry (low bits 10) above the reserved range. Anything else is
    // an empty tree or a single entry at index 0: no VMA there.
    if root & 3 != 2 || root <= 4096 {
        return Ok(None);
    }
    let mut enode = root & !2;
    let mut max = u64::MAX;
    let mut b = [0u8; NODE];
    for _ in 0..MAPLE_HEIGHT_MAX {
        let node = enode & !(NODE as u64 - 1);
        let (nl, leaf) = match (enode >> 3) & 0xf {
            1 => (l.range, true),
            2 => (l.range, false),
            3 => (l.arange, false),
            _ => return Err(Unresolved::BadValue(STEP)),
        };
        // Bits 0-1 are clear in a node pointer (bit 2, MAPLE_ENODE_NULL, says a NULL lies
        // somewhere below: a hint the lookup does not need).
        if !kernel_pointer(node, NODE as u64) || enode & 0x3 != 0 {
            return Err(Unresolved::BadPointer(STEP));
        }
        mem.read_virt(node, &mut b)
            .map_err(|_| Unresolved::NotMapped(STEP))?;
        // A dead node (freed while the guest changed its map) points at itself.
        if u64_in(&b, 0) & !(NODE as u64 - 1) == node {
            return Err(Unresolved::BadValue(STEP));
        }
        let pivots = (nl.slots - 1) as usize;
        let pivot = |i: usize| u64_in(&b, nl.pivot as usize + 8 * i);
        let meta_end = usize::from(b[nl.meta as usize]);
        // ma_data_end: the last slot in use.
        let end = if (enode >> 3) & 0xf == 3 || pivot(pivots - 1) == 0 {
            meta_end
        } else if pivot(pivots - 1) == max {
            pivots - 1
        } else {
            pivots
        };
        if end > pivots {
            return Err(Unresolved::BadValue(STEP));
        }
        let mut offset = 0;
        while offset < end && pivot(offset) < addr {
            offset += 1;
        }
        if offset < end && pivot(offset) != 0 {
            max = pivot(offset);
        }
        let slot = u64_in(&b, nl.slot as usize + 8 * offset);
        if leaf {
            return Ok((slot != 0).then_some(slot));
        }
        enode = slot;
    }
    Err(Unresolved::BadValue(STEP))
}

/// The mapping of `mm` that holds user address `rip`: its VMA's start, file offset and file
/// name (`file_name` reads a `struct file`'s name as the executable's is read), and the VMA's
/// end (what a later lookup for another address of the same sample can skip).
pub(crate) fn mapping_at<M: GuestRead + ?Sized>(
    mem: &mut M,
    l: &MapLayout,
    mm: u64,
    rip: u64,
    file_name: &dyn Fn(&mut M, u64) -> Result<FileName, Unresolved>,
) -> Result<(GuestMapping, u64), Unresolved> {
    let vma = vma_at(mem, l, mm, rip)?.ok_or(Unresolved::BadValue(STEP))?;
    if !kernel_pointer(vma, 8) || vma.checked_add(1 << 16).is_none() {
        return Err(Unresolved::BadPointer(STEP));
    }
    let start = read_u64(mem, vma + l.vma_start, STEP)?;
    let end = read_u64(mem, vma + l.vma_end, STEP)?;
    if !(start <= rip && rip < end) {
        return Err(Unresolved::BadValue(STEP));
    }
    let file = read_u64(mem, vma + l.vma_file, STEP)?;
    let pgoff = read_u64(mem, vma + l.vma_pgoff, STEP)?;
    let (name, name_len) = match file {
        0 => ([0u8; EXE_NAME_MAX], 0),
        f if kernel_pointer(f, 8) && f.checked_add(1 << 16).is_some() => file_name(mem, f)?,
        _ => return Err(Unresolved::BadPointer(STEP)),
    };
    let mapping = GuestMapping {
        name,
        name_len,
        vm_start: start,
        pgoff: u32::try_from(pgoff).unwrap_or(u32::MAX),
    };
    Ok((mapping, end))
}

fn u64_in(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes inside the node"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::guest_task::fake::*;

    const MM: u64 = 0xffff_8880_0200_0000;
    const LIBC_FILE: u64 = 0xffff_8880_0300_0100;

    /// The test layout's memory-map lines, by name.
    fn values() -> std::collections::HashMap<&'static str, u64> {
        MAP_LAYOUT_LINES
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f[1], f[2].parse().unwrap())
            })
            .collect()
    }

    fn layout() -> MapLayout {
        let values = values();
        MapLayout::from_values(&|n| values.get(n).copied())
            .unwrap()
            .unwrap()
    }

    fn name_of(_: &mut Mem, f: u64) -> Result<FileName, Unresolved> {
        assert_eq!(f, LIBC_FILE);
        let mut n = [0u8; EXE_NAME_MAX];
        n[..9].copy_from_slice(b"libc.so.6");
        Ok((n, 9))
    }

    #[test]
    fn the_vma_of_an_address_is_found_as_mtree_load_finds_it() {
        let l = layout();
        let mut m = Mem::default();
        maple_tree(&mut m, MM, LIBC_FILE, LIBC_FILE + 0x100);
        let at = |m: &mut Mem, a| vma_at(m, &l, MM, a).unwrap();
        assert_eq!(at(&mut m, 0x40_1000), Some(VMA_EXE));
        assert_eq!(at(&mut m, 0x4b_1fff), Some(VMA_EXE));
        assert_eq!(at(&mut m, LIBC_START + 0x5123), Some(VMA_LIBC));
        assert_eq!(at(&mut m, LIBB_START + 0xfff8), Some(VMA_LIBB));
        assert_eq!(at(&mut m, ANON_START + 0x1_fff0), Some(VMA_ANON));
        // Gaps: below the executable, between mappings, past the last one.
        for gap in [
            0x1000,
            0x4b_2000,
            LIBB_START - 1,
            LIBB_START + 0x1_0000,
            LIBC_START - 1,
            0x7ffe_0000_0000,
            u64::MAX,
        ] {
            assert_eq!(at(&mut m, gap), None, "{gap:#x}");
        }
        let (libc, end) = mapping_at(&mut m, &l, MM, LIBC_START + 0x5123, &name_of).unwrap();
        assert_eq!(end, LIBC_START + 0x1_f000);
        assert_eq!(
            (libc.name(), libc.vm_start, libc.pgoff, libc.anonymous()),
            ("libc.so.6".into(), LIBC_START, 0x26, false)
        );
        assert_eq!(libc.file_offset(LIBC_START + 0x5123), 0x26_000 + 0x5123);
        let (anon, _) = mapping_at(&mut m, &l, MM, ANON_START + 8, &name_of).unwrap();
        assert!(anon.anonymous());
        // An address in no mapping is a reason, not a guess.
        assert_eq!(
            mapping_at(&mut m, &l, MM, 0x1000, &name_of),
            Err(Unresolved::BadValue(Step::Mapping))
        );
        // An empty tree.
        m.put_u64(MM + l.mm_root, 0);
        assert_eq!(at(&mut m, 0x40_1000), None);
    }

    #[test]
    fn a_hostile_tree_gets_a_reason_never_a_hang() {
        let l = layout();
        let fresh = || {
            let mut m = Mem::default();
            maple_tree(&mut m, MM, LIBC_FILE, LIBC_FILE + 0x100);
            m
        };
        let walk = |m: &mut Mem| vma_at(m, &l, MM, LIBC_START + 8);
        // A node that is its own child: the descent stops at MAPLE_HEIGHT_MAX.
        let mut m = fresh();
        m.put_u64(ROOT_NODE + l.arange.slot, ROOT_NODE | (3 << 3));
        assert_eq!(walk(&mut m), Err(Unresolved::BadValue(Step::Mapping)));
        // A dead node (its parent is itself), an unknown node type (also what a pointer into
        // the middle of a node decodes as), a dense node.
        for (at, v) in [
            (LEAF_LOW, LEAF_LOW),
            (ROOT_NODE + l.arange.slot, LEAF_LOW | (7 << 3)),
            (ROOT_NODE + l.arange.slot, (LEAF_LOW + 0x40) | (1 << 3)),
            (ROOT_NODE + l.arange.slot, LEAF_LOW),
        ] {
            let mut m = fresh();
            m.put_u64(at, v);
            assert_eq!(
                walk(&mut m),
                Err(Unresolved::BadValue(Step::Mapping)),
                "{at:#x}"
            );
        }
        // Metadata claiming more slots than the node has.
        let mut m = fresh();
        m.put(ROOT_NODE + l.arange.meta, &[200]);
        assert_eq!(walk(&mut m), Err(Unresolved::BadValue(Step::Mapping)));
        // Child pointers into user space, with flag bits set, or unmapped.
        for bad in [0x7000_0000_0000u64 | (1 << 3), LEAF_LOW | (1 << 3) | 1] {
            let mut m = fresh();
            m.put_u64(ROOT_NODE + l.arange.slot, bad);
            assert_eq!(
                walk(&mut m),
                Err(Unresolved::BadPointer(Step::Mapping)),
                "{bad:#x}"
            );
        }
        let mut m = fresh();
        m.put_u64(ROOT_NODE + l.arange.slot, 0xffff_8880_7700_0000 | (1 << 3));
        assert_eq!(walk(&mut m), Err(Unresolved::NotMapped(Step::Mapping)));
        // A VMA that does not hold the address, or whose file is a user pointer.
        let mut m = fresh();
        m.put_u64(VMA_LIBC + 8, LIBC_START + 4);
        assert_eq!(
            mapping_at(&mut m, &l, MM, LIBC_START + 8, &name_of),
            Err(Unresolved::BadValue(Step::Mapping))
        );
        let mut m = fresh();
        m.put_u64(VMA_LIBC + l.vma_file, 0x5000);
        assert_eq!(
            mapping_at(&mut m, &l, MM, LIBC_START + 8, &name_of),
            Err(Unresolved::BadPointer(Step::Mapping))
        );
    }

    #[test]
    fn a_layout_without_map_lines_has_no_map_and_a_bad_one_is_refused() {
        assert_eq!(MapLayout::from_values(&|_| None), Ok(None));
        assert_eq!(
            MapLayout::from_values(&|n| (n == "mm_struct_mm_mt").then_some(64)),
            Err("maple_tree_ma_root")
        );
        let big = |n: &str| Some(if n.ends_with("slots") { 64 } else { 8 });
        assert!(MapLayout::from_values(&big).is_err());
    }

    #[test]
    fn offsets_that_wrap_past_the_node_are_refused_not_sliced() {
        // A crafted task-layout file: a pivot offset near 2^64, so that offset + 8 * slots
        // wraps below the node's size. Taken as it was, the lookup sliced out of the node.
        for field in [
            "maple_range_64_pivot",
            "maple_range_64_slot",
            "maple_arange_64_pivot",
        ] {
            let values = values();
            let wrap = |n: &str| match n {
                n if n == field => Some(u64::MAX - 7),
                n => values.get(n).copied(),
            };
            assert!(
                MapLayout::from_values(&wrap).is_err(),
                "{field} = 2^64 - 8 was taken"
            );
        }
    }
}
