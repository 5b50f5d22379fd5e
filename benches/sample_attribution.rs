//! P3 of `benches/vpmu.rs`: what naming a host-side sample's guest task, executable and call
//! stack costs the VMM (`runtime::trace::recorder::annotate`, issue 19), on a synthetic guest: real
//! x86-64 4-level page tables in a `GuestMemoryMmap`, a task reached through the per-CPU area
//! as Linux 6.1 lays it out (the default kernel's offsets), its mm, exe_file, dentry and name,
//! a 6-frame user stack and a 10-frame kernel stack. The reads go through the same vCPU access
//! layer and page walk as in a run; what a run adds on top (the sampling exit itself, the
//! KVM_GET_REGS/SREGS that every sample already made before issue 19) is not in P3.

use std::sync::Arc;

use runtime::arch::x86::{CR0_PE, CR0_PG, CR4_PAE, EFER_LMA, EFER_LME};
use runtime::profile::guest_task::{TaskLayout, TaskReader};
use runtime::trace::recorder::annotate;
use runtime::vcpu_access::fake::FakeVcpu;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const DIRECT_MAP: u64 = 0xffff_8880_0000_0000;
const BANNER: &str = "Linux version 6.1.192 (bench) #1 SMP";

/// A guest memory with page tables built page by page.
struct Guest {
    mem: GuestMemoryMmap,
    next_table: u64,
    next_page: u64,
}

impl Guest {
    fn new() -> Guest {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        Guest {
            mem,
            next_table: 0x2000,
            next_page: 0x40_0000,
        }
    }

    fn u64_at(&self, pa: u64) -> u64 {
        self.mem.read_obj(GuestAddress(pa)).unwrap()
    }

    /// Maps the 4 KiB page at `va` to a fresh physical page (once); returns its address.
    fn map(&mut self, va: u64) -> u64 {
        let mut table = 0x1000u64;
        for level in (1..=4).rev() {
            let index = (va >> (12 + 9 * (level - 1))) & 0x1ff;
            let entry_at = table + index * 8;
            let mut entry = self.u64_at(entry_at);
            if entry & 1 == 0 {
                let next = if level == 1 {
                    self.next_page += 0x1000;
                    self.next_page
                } else {
                    self.next_table += 0x1000;
                    self.next_table
                };
                entry = next | 0x7;
                self.mem.write_obj(entry, GuestAddress(entry_at)).unwrap();
            }
            table = entry & 0x000f_ffff_ffff_f000;
        }
        table | (va & 0xfff)
    }

    fn put(&mut self, va: u64, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate() {
            let pa = self.map(va + i as u64);
            self.mem.write_obj(*b, GuestAddress(pa)).unwrap();
        }
    }

    fn put_u64(&mut self, va: u64, v: u64) {
        self.put(va, &v.to_le_bytes());
    }
}

/// The default kernel's layout (offsets from `guest-image/kernel/task-layout.c`'s build).
fn layout() -> TaskLayout {
    TaskLayout::parse(&format!(
        "banner {BANNER}\nsymbol __per_cpu_offset 0xffffffff8191c7a0\nsymbol current_task 0x1ac00\n\
         symbol linux_banner 0xffffffff8184fa40\nvalue nr_cpus 8\nvalue task_struct_pid 912\n\
         value task_struct_tgid 916\nvalue task_struct_comm 1400\nvalue task_struct_flags 44\n\
         value task_struct_size 6464\nvalue pf_kthread 2097152\nvalue task_struct_mm 768\n\
         value mm_struct_exe_file 840\nvalue mm_struct_start_code 240\n\
         value mm_struct_end_code 248\nvalue file_f_path 16\nvalue path_dentry 8\n\
         value dentry_d_name 32\nvalue qstr_name 8\n\
         value mm_struct_mm_mt 64\nvalue maple_tree_ma_root 8\nvalue maple_range_64_pivot 8\n\
         value maple_range_64_slot 128\nvalue maple_range_64_meta 248\n\
         value maple_arange_64_pivot 8\nvalue maple_arange_64_slot 80\n\
         value maple_arange_64_meta 240\nvalue maple_range64_slots 16\n\
         value maple_arange64_slots 10\nvalue vm_area_struct_vm_start 0\n\
         value vm_area_struct_vm_end 8\nvalue vm_area_struct_vm_file 112\n\
         value vm_area_struct_vm_pgoff 104\n"
    ))
    .expect("the bench's layout")
}

const USER_RBP: u64 = 0x7ffc_0000_1000;
/// The library sample's stack: its innermost caller in a second library (libb).
const LIB_RBP: u64 = 0x7ffc_0000_2000;
/// A RIP in the executable's code, and one in a shared library (libc's text mapping).
const EXE_RIP: u64 = 0x40_1100;
const LIB_RIP: u64 = 0x7f00_0000_5123;
/// A return address in libb's text.
const LIBB_RET: u64 = 0x7e00_0000_2345;
const KERNEL_RBP: u64 = 0xffff_c900_0001_3000;

/// The task's memory map as a two-level 6.1 maple tree (an arange_64 root over two leaves),
/// the shape a small process has: the executable, libb's text at LIBB_RET's page, then libc's
/// text at LIB_RIP's page.
fn maple_tree(g: &mut Guest, l: &TaskLayout, mm: u64) {
    let m = l
        .maps
        .as_ref()
        .expect("the bench's layout has the memory map");
    let (root, low, high) = (
        DIRECT_MAP + 0x80_0000,
        DIRECT_MAP + 0x80_0100,
        DIRECT_MAP + 0x80_0200,
    );
    let (vma_exe, vma_lib, vma_libb, file, dentry, name) = (
        DIRECT_MAP + 0x90_0000,
        DIRECT_MAP + 0x90_0100,
        DIRECT_MAP + 0x90_0200,
        DIRECT_MAP + 0xa0_0000,
        DIRECT_MAP + 0xa1_0000,
        DIRECT_MAP + 0xa2_0000,
    );
    let (file_b, dentry_b, name_b) = (file + 0x100, dentry + 0x100, name + 0x100);
    g.put_u64(mm + m.mm_root, root | (3 << 3) | 4 | 2);
    g.put_u64(root, (mm + 64) | 1);
    g.put_u64(root + m.arange.pivot, 0x7fff_0000_0000);
    g.put_u64(root + m.arange.slot, low | (1 << 3) | 4);
    g.put_u64(root + m.arange.slot + 8, high | (1 << 3) | 4);
    g.put(root + m.arange.meta, &[1]);
    let lib = LIB_RIP & !0xfff_ffff;
    let libb = LIBB_RET & !0xfff_ffff;
    for (i, (pivot, slot)) in [
        (0x40_0fffu64, 0u64),
        (0x4b_1fff, vma_exe),
        (libb - 1, 0),
        (libb + 0xf_ffff, vma_libb),
        (lib - 1, 0),
        (lib + 0x1ff_ffff, vma_lib),
    ]
    .into_iter()
    .enumerate()
    {
        g.put_u64(low + m.range.pivot + 8 * i as u64, pivot);
        g.put_u64(low + m.range.slot + 8 * i as u64, slot);
    }
    g.put(low + m.range.meta, &[6]);
    g.put_u64(high, root | (3 << 3));
    for (vma, start, end, f) in [
        (vma_exe, 0x40_1000u64, 0x4b_2000u64, 0u64),
        (vma_lib, lib, lib + 0x200_0000, file),
        (vma_libb, libb, libb + 0x10_0000, file_b),
    ] {
        g.put_u64(vma + m.vma_start, start);
        g.put_u64(vma + m.vma_end, end);
        g.put_u64(vma + m.vma_file, f);
        g.put_u64(vma + m.vma_pgoff, 0x26);
    }
    g.put_u64(file + l.file_dentry, dentry);
    g.put_u64(dentry + l.dentry_name, name);
    g.put(name, b"libc.so.6\0");
    g.put_u64(file_b + l.file_dentry, dentry_b);
    g.put_u64(dentry_b + l.dentry_name, name_b);
    g.put(name_b, b"libb.so\0");
}

/// The synthetic guest and a vCPU whose registers point into it.
fn guest(l: &TaskLayout) -> FakeVcpu {
    let mut g = Guest::new();
    let (pcpu, task, mm, file, dentry, name) = (
        DIRECT_MAP + 0x20_0000,
        DIRECT_MAP + 0x30_0000,
        DIRECT_MAP + 0x40_0000,
        DIRECT_MAP + 0x50_0000,
        DIRECT_MAP + 0x60_0000,
        DIRECT_MAP + 0x70_0000,
    );
    g.put(l.linux_banner, BANNER.as_bytes());
    g.put_u64(l.per_cpu_offset, pcpu);
    g.put_u64(pcpu + l.current_task, task);
    g.put(task + l.task_pid, &1234u32.to_le_bytes());
    g.put(task + l.task_tgid, &1234u32.to_le_bytes());
    g.put(task + l.task_flags, &0u32.to_le_bytes());
    g.put(task + l.task_comm, b"cpu_split\0\0\0\0\0\0");
    g.put_u64(task + l.task_mm, mm);
    g.put_u64(mm + l.mm_start_code, 0x40_1000);
    g.put_u64(mm + l.mm_end_code, 0x4b_2000);
    g.put_u64(mm + l.mm_exe_file, file);
    g.put_u64(file + l.file_dentry, dentry);
    g.put_u64(dentry + l.dentry_name, name);
    g.put(name, b"cpu_split\0");
    maple_tree(&mut g, l, mm);
    for (base, ret, n) in [
        (USER_RBP, 0x40_1010u64, 6u64),
        (LIB_RBP, 0x40_1010u64, 6u64),
        (KERNEL_RBP, 0xffff_ffff_8100_0000, 10),
    ] {
        for i in 0..n {
            let fp = base + 0x40 * i;
            let next = if i + 1 == n { 0 } else { fp + 0x40 };
            g.put_u64(fp, next);
            g.put_u64(fp + 8, ret + 0x10 * i);
        }
    }
    g.put_u64(LIB_RBP + 8, LIBB_RET);
    g.put_u64(LIB_RBP - 0x20, LIBB_RET); // [rsp]
    g.put_u64(LIB_RBP - 0x18, 0);
    g.put_u64(USER_RBP - 0x20, 0x40_1234); // [rsp]
    g.put_u64(USER_RBP - 0x18, 0);
    let mut v = FakeVcpu::new(g.mem);
    v.sregs.cr0 = CR0_PE | CR0_PG;
    v.sregs.cr4 = CR4_PAE;
    v.sregs.efer = EFER_LME | EFER_LMA;
    v.sregs.cr3 = 0x1000;
    v
}

/// Nanoseconds per `annotate` of a user-space sample in the executable, of one in a shared
/// library called from another library (the memory map's maple tree walked twice: the RIP's
/// mapping and its caller's), and of a kernel sample (each the fastest of 20 batches of 2000).
pub(crate) fn measure() -> (f64, f64, f64) {
    let l = Arc::new(layout());
    let mut v = guest(&l);
    let mut reader = TaskReader::new(l, 0);
    let mut time = |cpl: u8, rip: u64, rbp: u64, rsp: u64| {
        v.regs.rbp = rbp;
        v.regs.rsp = rsp;
        let mut best = f64::MAX;
        let mut records = Vec::new();
        for _ in 0..20 {
            let t0 = std::time::Instant::now();
            for _ in 0..2000 {
                records = std::hint::black_box(annotate(&mut reader, &mut v, rip, cpl));
            }
            best = best.min(t0.elapsed().as_nanos() as f64 / 2000.0);
        }
        (best, records)
    };
    let (user, user_records) = time(3, EXE_RIP, USER_RBP, USER_RBP - 0x20);
    let (lib, lib_records) = time(3, LIB_RIP, LIB_RBP, LIB_RBP - 0x20);
    let (kernel, kernel_records) = time(0, 0xffff_ffff_8100_0000, KERNEL_RBP, KERNEL_RBP - 0x20);
    // task + exe + stack top + 2 frame records (6 frames); the same + a resolved mapping;
    // task + 4 frame records (10 frames).
    assert_eq!(
        (user_records.len(), kernel_records.len()),
        (5, 5),
        "the synthetic guest's chains did not resolve"
    );
    assert!(
        matches!(lib_records[2], analysis::trace::format::Record::Mapping(Ok(m)) if m.name() == "libc.so.6"),
        "the library sample's mapping did not resolve: {:?}",
        lib_records[2]
    );
    assert!(
        matches!(lib_records.last(), Some(analysis::trace::format::Record::CallerMapping(m)) if m.name() == "libb.so"),
        "the library sample's caller in libb did not resolve: {:?}",
        lib_records.last()
    );
    (user, lib, kernel)
}
