//! Tier 2: the vCPU access layer (`runtime::vcpu_access::KvmVcpu`) against a real KVM vCPU: each
//! raw ioctl it makes (registers, special registers, MSRs, FPU, vCPU events) round-trips, writes
//! wait for `commit`, and a guest-virtual read walks the guest's page tables in software.

mod common;

use std::os::fd::AsRawFd;

use kvm_ioctls::Kvm;
use runtime::arch::x86;
use runtime::vcpu_access::{AccessError, KvmVcpu, VcpuAccess};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

#[test]
fn kvm_vcpu_state_round_trips_through_the_access_layer() {
    if !common::kvm_available() {
        return;
    }
    let kvm = Kvm::new().expect("open /dev/kvm");
    let vm = kvm.create_vm().expect("KVM_CREATE_VM");
    let vcpu = vm.create_vcpu(0).expect("KVM_CREATE_VCPU");
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap();
    let fd = vcpu.as_raw_fd();

    // Registers: a change is kept until commit, then KVM has it.
    let mut cpu = KvmVcpu::new(fd, &mem);
    let mut regs = cpu.regs().expect("KVM_GET_REGS");
    regs.rip = 0x1234;
    regs.rax = 0xfeed;
    cpu.set_regs(&regs).unwrap();
    assert_ne!(
        vcpu.get_regs().unwrap().rip,
        0x1234,
        "not written before commit"
    );
    cpu.commit().expect("KVM_SET_REGS");
    assert_eq!(vcpu.get_regs().unwrap().rax, 0xfeed);

    // Special registers: long mode with one identity-mapped 2 MiB page.
    let pml4 = 0x1000u64;
    let pdpt = 0x2000u64;
    let pd = 0x3000u64;
    mem.write_obj(pdpt | 3, GuestAddress(pml4)).unwrap();
    mem.write_obj(pd | 3, GuestAddress(pdpt)).unwrap();
    mem.write_obj(0x83u64, GuestAddress(pd)).unwrap(); // 0 -> 0, 2 MiB, present, writable
    let mut cpu = KvmVcpu::new(fd, &mem);
    let mut sregs = cpu.sregs().expect("KVM_GET_SREGS");
    sregs.cr3 = pml4;
    sregs.cr4 |= x86::CR4_PAE;
    sregs.cr0 |= x86::CR0_PE | x86::CR0_PG;
    sregs.efer |= x86::EFER_LME | x86::EFER_LMA;
    sregs.cs.l = 1;
    cpu.set_sregs(&sregs).unwrap();
    cpu.commit().expect("KVM_SET_SREGS");
    let back = vcpu.get_sregs().unwrap();
    assert_eq!((back.cr3, back.efer & x86::EFER_LMA), (pml4, x86::EFER_LMA));

    // A fresh cache reads the new state; virtual reads go through the guest's tables.
    let mut cpu = KvmVcpu::new(fd, &mem);
    mem.write_slice(b"vpmu", GuestAddress(0x5000)).unwrap();
    let mut b = [0u8; 4];
    cpu.read_virt(0x5000, &mut b).unwrap();
    assert_eq!(&b, b"vpmu");
    assert_eq!(cpu.translate(0x1f_fffe), Ok(0x1f_fffe));
    assert_eq!(
        cpu.translate(0x4000_0000),
        Err(AccessError::NotMapped(0x4000_0000))
    );

    // MSRs: one KVM knows, and the count stops at one it does not.
    assert!(cpu.msr(x86::MSR_LSTAR).expect("KVM_GET_MSRS").is_some());
    let mut out = [0u64; 2];
    assert_eq!(cpu.msrs(&[x86::MSR_STAR, 0x4000_1234], &mut out), Ok(1));

    // FPU: both calls work and agree with the VcpuFd's own. (MXCSR does not read back what was
    // set on this project's hosts, on a vCPU that has not run, through either path, so the test
    // does not ask for a round trip.)
    let fpu = cpu.fpu().expect("KVM_GET_FPU");
    cpu.set_fpu(&fpu).expect("KVM_SET_FPU");
    assert_eq!(cpu.fpu().unwrap().mxcsr, vcpu.get_fpu().unwrap().mxcsr);

    // Events: setting them writes pending registers first (KVM_SET_REGS after
    // KVM_SET_VCPU_EVENTS would drop the exception).
    let mut regs = cpu.regs().unwrap();
    regs.rip = 0x4321;
    cpu.set_regs(&regs).unwrap();
    let mut ev = cpu.vcpu_events().expect("KVM_GET_VCPU_EVENTS");
    ev.exception.injected = 1;
    ev.exception.nr = x86::VECTOR_UD;
    ev.flags = 0;
    cpu.set_vcpu_events(&ev).expect("KVM_SET_VCPU_EVENTS");
    assert_eq!(vcpu.get_regs().unwrap().rip, 0x4321, "registers went first");
    let ev = vcpu.get_vcpu_events().unwrap();
    assert_eq!(
        (ev.exception.injected, ev.exception.nr),
        (1, x86::VECTOR_UD)
    );
}
