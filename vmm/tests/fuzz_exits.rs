//! Property-based fuzzing of the exit path: random port I/O, MMIO and MSR exits, of every size,
//! through `exit::handle` into the real devices (i8042, COM1, the ACPI sleep register, the vPMU
//! control port, virtio-mmio) and the VMM's MSR handler (`pmu::VcpuPmu` over the vPMU model,
//! with RDPMC sites), as a hostile guest would cause them.
//!
//! Invariants: no panic; the VM stops only for an OUT that asks for it (i8042 reset, an ACPI
//! sleep write); an MSR exit either gets a value or #GP, and the vPMU's own ranges never reach
//! "KVM" (the fake vCPU view) unless they are RDPMC indexes outside a rewritten site.
//! `VPMU_FUZZ_CASES` as for the other fuzz tests (docs/fuzzing.md).

mod fuzz_common;

use std::sync::{Arc, Mutex};

use fuzz_common::cases;
use kvm_ioctls::{MsrExitReason, ReadMsrExit, VcpuExit, WriteMsrExit};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use runtime::devices::acpi_pm::AcpiPm;
use runtime::devices::i8042::{I8042, I8042_BASE, I8042_LEN};
use runtime::devices::packet_gate::{PacketGate, PACKET_GATE_PORT};
use runtime::devices::serial::{Uart, COM1_BASE, UART_LEN};
use runtime::devices::virtio::mmio::MmioTransport;
use runtime::devices::virtio::net::VirtioNet;
use runtime::devices::vpmu_control::{VpmuControl, VPMU_CONTROL_PORT};
use runtime::devices::{MmioBus, PioBus};
use runtime::exit::{handle, ExitContext, ExitCounts, Outcome};
use runtime::net::pinger::GUEST_MAC;
use runtime::pmu::{mode::ModeSwitch, rdpmc, VcpuPmu};
use runtime::vcpu_access::fake::FakeVcpu;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;
use vpmu::{fake::FakeBackend, AccountingMode, Pmu, PmuConfig};

const ACPI_PORT: u16 = 0x600;
const VIRTIO_BASE: u64 = 0xd000_0000;
const SITE_RIP: u64 = 0xffff_ffff_8100_1000;

#[derive(Debug, Clone)]
enum Exit {
    In(u16, u8),
    Out(u16, Vec<u8>),
    MmioRead(u64, u8),
    MmioWrite(u64, Vec<u8>),
    Rdmsr(u32, bool),
    Wrmsr(u32, u64),
}

fn port() -> impl Strategy<Value = u16> {
    prop_oneof![
        3 => I8042_BASE..I8042_BASE + I8042_LEN + 1,
        3 => COM1_BASE..COM1_BASE + UART_LEN + 1,
        2 => Just(VPMU_CONTROL_PORT),
        1 => Just(PACKET_GATE_PORT),
        2 => ACPI_PORT..ACPI_PORT + 2,
        1 => any::<u16>(),
    ]
}

fn io_size() -> impl Strategy<Value = u8> {
    prop::sample::select(vec![1u8, 2, 4])
}

fn msr() -> impl Strategy<Value = u32> {
    prop_oneof![
        3 => 0xc1u32..0xc9,
        3 => 0x186u32..0x18e,
        2 => 0x309u32..0x30d,
        3 => 0x38du32..0x391,
        1 => 0x4c1u32..0x4c9,
        2 => 0u32..8,
        2 => 0x4000_0000u32..0x4000_0004,
        1 => any::<u32>(),
    ]
}

fn exit() -> impl Strategy<Value = Exit> {
    let bytes = |n: usize| prop::collection::vec(any::<u8>(), n..=n);
    prop_oneof![
        3 => (port(), io_size()).prop_map(|(p, n)| Exit::In(p, n)),
        // An OUT of 0xfe to 0x64 resets the VM: keep it rare so sequences run on.
        3 => (port(), io_size().prop_flat_map(move |n| bytes(usize::from(n))))
            .prop_map(|(p, mut d)| {
                if p == I8042_BASE + 4 && d[0] == 0xfe {
                    d[0] = 0xff;
                }
                Exit::Out(p, d)
            }),
        3 => (0u64..0x1100, prop::sample::select(vec![1u8, 2, 4, 8]))
            .prop_map(|(o, n)| Exit::MmioRead(VIRTIO_BASE + o, n)),
        3 => (0u64..0x1100, prop::sample::select(vec![1usize, 2, 4, 8]).prop_flat_map(bytes))
            .prop_map(|(o, d)| Exit::MmioWrite(VIRTIO_BASE + o, d)),
        4 => (msr(), any::<bool>()).prop_map(|(m, site)| Exit::Rdmsr(m, site)),
        4 => (msr(), any::<u64>()).prop_map(|(m, v)| Exit::Wrmsr(m, v)),
    ]
}

fn run(exits: &[Exit]) -> Result<(), TestCaseError> {
    let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let switch = Arc::new(ModeSwitch::new(AccountingMode::CpuSwitch));
    let mut pio = PioBus::builder();
    pio.insert(I8042_BASE, I8042_LEN, Arc::new(Mutex::new(I8042)))
        .and_then(|b| {
            let uart = Uart::new(irq.try_clone().unwrap(), std::io::sink());
            b.insert(COM1_BASE, UART_LEN, Arc::new(Mutex::new(uart)))
        })
        .and_then(|b| b.insert(ACPI_PORT, 1, Arc::new(Mutex::new(AcpiPm::default()))))
        .and_then(|b| {
            let control = VpmuControl::new(switch.clone(), Box::new(|| {}));
            b.insert(VPMU_CONTROL_PORT, 1, Arc::new(Mutex::new(control)))
        })
        .and_then(|b| {
            let gate = PacketGate::new(Default::default());
            b.insert(PACKET_GATE_PORT, 1, Arc::new(Mutex::new(gate)))
        })
        .expect("no overlaps");
    let pio = pio.build();
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let net = MmioTransport::new(VirtioNet::new(GUEST_MAC, None), mem, irq);
    let mut mmio = MmioBus::builder();
    mmio.insert(VIRTIO_BASE, 0x1000, Arc::new(Mutex::new(net)))
        .expect("an empty bus");
    let mmio = mmio.build();
    let model = Pmu::new(PmuConfig::intel(), Box::new(FakeBackend::new())).unwrap();
    let site = rdpmc::Site {
        vaddr: SITE_RIP,
        paddr: 0x1000,
        function: None,
    };
    let sites = Arc::new(rdpmc::RdpmcSites::new(model.rdpmc_ranges(), &[site]));
    let mut msrs = VcpuPmu::new(model, 1000, sites.clone(), switch);
    let mut counts = ExitCounts::default();
    let mut unclaimed_mmio = 0;
    for (i, e) in exits.iter().enumerate() {
        let view = FakeVcpu::default();
        let mut buf = [0u8; 8];
        let (mut error, mut data) = (0u8, 0u64);
        let (outcome, view) = {
            let mut view = view;
            let exit = match e {
                Exit::In(p, n) => VcpuExit::IoIn(*p, &mut buf[..usize::from(*n)]),
                Exit::Out(p, d) => VcpuExit::IoOut(*p, d),
                Exit::MmioRead(a, n) => VcpuExit::MmioRead(*a, &mut buf[..usize::from(*n)]),
                Exit::MmioWrite(a, d) => VcpuExit::MmioWrite(*a, d),
                Exit::Rdmsr(m, at_site) => {
                    if *at_site {
                        view.regs.rip = SITE_RIP;
                    }
                    VcpuExit::X86Rdmsr(ReadMsrExit {
                        error: &mut error,
                        reason: MsrExitReason::Filter,
                        index: *m,
                        data: &mut data,
                    })
                }
                Exit::Wrmsr(m, v) => VcpuExit::X86Wrmsr(WriteMsrExit {
                    error: &mut error,
                    reason: MsrExitReason::Filter,
                    index: *m,
                    data: *v,
                }),
            };
            let mut ctx = ExitContext {
                pio: &pio,
                mmio: &mmio,
                msrs: &mut msrs,
                cpu: &mut view,
                counts: &mut counts,
            };
            (handle(Ok(exit), &mut ctx), view)
        };
        let at = format!("exit {i} {e:x?}");
        match e {
            Exit::Out(p, d) if *p == ACPI_PORT || (*p == I8042_BASE + 4 && d[0] == 0xfe) => {}
            _ => prop_assert_eq!(&outcome, &Outcome::Continue, "{}", at),
        }
        prop_assert!(error <= 1, "{}", at);
        if let Exit::MmioRead(a, _) | Exit::MmioWrite(a, _) = e {
            // The card's registers end at VIRTIO_BASE + 0x1000; nothing is beyond.
            unclaimed_mmio += u64::from(*a >= VIRTIO_BASE + 0x1000);
        }
        prop_assert_eq!(counts.unclaimed_mmio, unclaimed_mmio, "{}", at);
        if let Exit::Rdmsr(m, at_site) = e {
            // Only an RDPMC index outside a rewritten site goes to KVM's own copy.
            let to_kvm = sites.is_index(*m) && !*at_site;
            prop_assert_eq!(view.msr_reads, u32::from(to_kvm), "{}", at);
        }
        if !matches!(outcome, Outcome::Continue) {
            break;
        }
    }
    Ok(())
}

#[test]
fn exits_of_a_hostile_guest_are_answered() {
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let ops = std::sync::atomic::AtomicU64::new(0);
    let r = runner.run(&prop::collection::vec(exit(), 1..200), |exits| {
        ops.fetch_add(exits.len() as u64, std::sync::atomic::Ordering::Relaxed);
        run(&exits)
    });
    if let Err(e) = r {
        panic!("{e}");
    }
    println!(
        "fuzz surface=exits cases={} ops={}",
        cases(),
        ops.into_inner()
    );
}
