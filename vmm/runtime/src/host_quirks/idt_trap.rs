//! Trapping one guest exception vector through a mark over the first instructions of its IDT
//! handler: which first instructions can be displaced (and stood in for), where the handler is
//! (the IDT gate), the patch itself — written into guest memory, re-checked after exits
//! (alternatives patching can rewrite the entry) and moved when the guest points the gate
//! elsewhere (a new IDT, or a new handler) — and what a trapped exception looks like to the VMM
//! (the vCPU stopped on the handler, its frame on the stack).
//!
//! The mark ([`Mark`], decided once from the host kind) is an instruction that exits to the VMM
//! wherever the handler runs: an `int3` on hosts whose KVM emulates guest kernel code (an
//! emulation failure there), `out %al, $TRAP_PORT` on VT-x/SVM hosts (a port-I/O exit to user
//! space on every host; an int3 would need KVM_SET_GUEST_DEBUG's #BP intercept, which QEMU's
//! emulator does not honour, and would send every guest int3 through the VMM). Both exits
//! arrive at the owner's one handler ([`VectorTrap::stopped_at_handler`]). Used by the SYSCALL
//! relay (#PF), the RDPMC trap (#GP, `pmu::rdpmc_trap`) and the XBEGIN trap (#UD).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter, Mnemonic, OpKind};
use kvm_bindings::kvm_regs;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::FixupCounts;
use crate::arch::x86::{ExceptionFrame, CR0_PG, EFER_LMA, RFLAGS_AC};
use crate::vcpu_access::{AccessError, VcpuAccess};

pub(crate) const INT3: u8 = 0xcc;

pub(crate) use crate::exit::TRAP_PORT;
/// `out %al, $imm8` (AL to an 8-bit port number: reads AL, changes no register or flag).
const OUT_IMM8_AL: u8 = 0xe6;

/// What the VMM writes over a trapped handler's first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// `int3` (one byte): an emulation failure on hosts that emulate guest kernel code (host
    /// quirks); RIP stays on it.
    Int3,
    /// `out %al, $TRAP_PORT` (two bytes): a KVM_EXIT_IO to user space on any host. The VMM
    /// completes the pending port write before it looks (KVM_RUN with `immediate_exit`), so
    /// RIP is then just past it.
    PortOut,
}

impl Mark {
    /// The mark of a host: int3 where guest kernel code is emulated, the port write elsewhere.
    pub fn for_host(host_quirks: bool) -> Mark {
        if host_quirks {
            Mark::Int3
        } else {
            Mark::PortOut
        }
    }

    /// The bytes written over the handler.
    pub fn bytes(self) -> &'static [u8] {
        match self {
            Mark::Int3 => &[INT3],
            Mark::PortOut => &[OUT_IMM8_AL, TRAP_PORT as u8],
        }
    }

    /// Where RIP is, past the handler's address, when the VMM looks at a trapped exception.
    pub(crate) fn rip_offset(self) -> u64 {
        match self {
            Mark::Int3 => 0,
            Mark::PortOut => self.bytes().len() as u64,
        }
    }
}

/// Why the handler's first instruction cannot be displaced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotDisplaceable {
    #[error("invalid bytes {0:02x?}")]
    Invalid(Vec<u8>),
    #[error("`{0}`")]
    Instruction(String),
}

/// Why the mark cannot be put over a handler (its owner then stays off, said once).
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("reading the handler at {gva:#x}: {source}")]
    Read {
        gva: u64,
        source: vm_memory::GuestMemoryError,
    },
    #[error("the handler at {gva:#x} starts with {what}, which the VMM cannot step over")]
    Refused { gva: u64, what: NotDisplaceable },
    #[error("patching the handler at {gva:#x}: {source}")]
    Write {
        gva: u64,
        source: vm_memory::GuestMemoryError,
    },
}

/// An instruction the mark displaces, and what stepping over it must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Displaced {
    /// NOP forms and ENDBR64: nothing.
    Nop(u8),
    /// CLAC: clear RFLAGS.AC.
    Clac(u8),
    /// `push imm` (64-bit operand size): push the sign-extended immediate. The entry stubs of
    /// Linux's early IDT and of kvm-unit-tests start with one (`pushq $13`).
    Push(u8, u64),
}

impl Displaced {
    /// Bytes to step over (an instruction: never 0).
    pub fn length(self) -> u8 {
        match self {
            Displaced::Nop(n) | Displaced::Clac(n) | Displaced::Push(n, _) => n,
        }
    }
}

/// The handler's first instructions, as many as cover `len` bytes (at most
/// [`MAX_DISPLACED`]), if the VMM can stand in for each; else the first it cannot (for the
/// message that says why the trap is off).
pub(crate) fn displace(
    bytes: &[u8],
    ip: u64,
    len: usize,
) -> Result<Vec<Displaced>, NotDisplaceable> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < len {
        if out.len() == MAX_DISPLACED {
            return Err(NotDisplaceable::Invalid(bytes[..at].to_vec()));
        }
        let d = displaceable(&bytes[at..], ip.wrapping_add(at as u64))?;
        at += usize::from(d.length());
        out.push(d);
    }
    Ok(out)
}

/// At most this many instructions are stood in for (Linux's `90 90 90` is three).
pub(crate) const MAX_DISPLACED: usize = 4;

/// Decodes the handler's first instruction; Ok if the VMM can stand in for it, else what it
/// is (for the message that says why the trap is off).
pub fn displaceable(bytes: &[u8], ip: u64) -> Result<Displaced, NotDisplaceable> {
    let mut dec = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let instr = dec.decode();
    let len = instr.len() as u8;
    match instr.mnemonic() {
        _ if instr.is_invalid() => Err(NotDisplaceable::Invalid(
            bytes[..bytes.len().min(4)].to_vec(),
        )),
        Mnemonic::Nop | Mnemonic::Endbr64 => Ok(Displaced::Nop(len)),
        Mnemonic::Clac => Ok(Displaced::Clac(len)),
        Mnemonic::Push
            if matches!(
                instr.op0_kind(),
                OpKind::Immediate8to64 | OpKind::Immediate32to64
            ) =>
        {
            Ok(Displaced::Push(len, instr.immediate(0)))
        }
        _ => {
            let mut text = String::new();
            IntelFormatter::new().format(&instr, &mut text);
            Err(NotDisplaceable::Instruction(text))
        }
    }
}

/// The handler address in a 16-byte 64-bit IDT gate, if the gate is a present interrupt or trap
/// gate.
pub fn idt_gate_target(gate: &[u8; 16]) -> Option<u64> {
    let attr = gate[5];
    let present = attr & 0x80 != 0;
    let kind = attr & 0x1f;
    if !present || !(kind == 0x0e || kind == 0x0f) {
        return None;
    }
    let lo = u64::from(u16::from_le_bytes([gate[0], gate[1]]));
    let mid = u64::from(u16::from_le_bytes([gate[6], gate[7]]));
    let hi = u64::from(u32::from_le_bytes(gate[8..12].try_into().unwrap()));
    Some(lo | (mid << 16) | (hi << 32))
}

/// Where the mark sits (shared by all vCPUs: the handler is in the guest's shared kernel text).
struct Patch {
    mark: Mark,
    /// Guest-virtual address of the handler (0: not installed).
    gva: AtomicU64,
    /// Its guest-physical address.
    gpa: AtomicU64,
    /// The instructions the mark displaced, and the bytes it replaced (put back when the guest
    /// moves its handler). Read only when a trapped exception is given to the guest.
    displaced: Mutex<(Vec<Displaced>, Vec<u8>)>,
}

impl Patch {
    fn new(mark: Mark) -> Self {
        Patch {
            mark,
            gva: AtomicU64::new(0),
            gpa: AtomicU64::new(0),
            displaced: Mutex::new((Vec::new(), Vec::new())),
        }
    }

    /// The handler's guest-virtual address, once installed.
    fn installed_at(&self) -> Option<u64> {
        match self.gva.load(Ordering::Acquire) {
            0 => None,
            a => Some(a),
        }
    }

    fn gpa(&self) -> u64 {
        self.gpa.load(Ordering::Acquire)
    }

    /// Marks the patch gone (the guest rewrote the entry with something not displaceable).
    fn uninstall(&self) {
        self.gva.store(0, Ordering::Release);
    }

    fn displaced(&self) -> Vec<Displaced> {
        self.lock().0.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Vec<Displaced>, Vec<u8>)> {
        self.displaced.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the mark is still at the patched bytes (one guest-memory read).
    fn intact(&self, mem: &GuestMemoryMmap) -> bool {
        let want = self.mark.bytes();
        let mut got = [0u8; 2];
        let got = &mut got[..want.len()];
        mem.read_slice(got, GuestAddress(self.gpa())).is_ok() && got == want
    }

    /// Patches the handler at `gva` (physical `gpa`) if its first instructions can be displaced.
    fn patch_at(
        &self,
        mem: &GuestMemoryMmap,
        gva: u64,
        gpa: u64,
    ) -> Result<Vec<Displaced>, PatchError> {
        let mut bytes = [0u8; 15];
        let n = (0x1000 - (gpa & 0xfff) as usize).min(15);
        mem.read_slice(&mut bytes[..n], GuestAddress(gpa))
            .map_err(|source| PatchError::Read { gva, source })?;
        let mark = self.mark.bytes();
        let d = displace(&bytes[..n], gva, mark.len())
            .map_err(|what| PatchError::Refused { gva, what })?;
        mem.write_slice(mark, GuestAddress(gpa))
            .map_err(|source| PatchError::Write { gva, source })?;
        *self.lock() = (d.clone(), bytes[..mark.len()].to_vec());
        self.gpa.store(gpa, Ordering::Release);
        self.gva.store(gva, Ordering::Release);
        Ok(d)
    }

    /// Puts the displaced bytes back (the guest moved its handler away from them) if the mark
    /// is still there, and marks the patch gone.
    fn restore(&self, mem: &GuestMemoryMmap) {
        if self.intact(mem) {
            let original = self.lock().1.clone();
            let _ = mem.write_slice(&original, GuestAddress(self.gpa()));
        }
        self.uninstall();
    }
}

/// What a trap calls itself in its log lines and in the fix-up report.
#[derive(Debug, Clone, Copy)]
pub struct TrapNames {
    /// The owner, as log lines start: "syscall relay".
    pub owner: &'static str,
    /// The vector's name: "#PF".
    pub exception: &'static str,
    /// What the guest loses while the trap is off (said once when it is refused).
    pub without: &'static str,
    /// The fix-up report's name for a re-installation after the guest rewrote the entry.
    pub reinstalled: &'static str,
    /// ... and for a move after the guest pointed its gate at another handler.
    pub moved: &'static str,
}

/// Why a trapped exception could not be looked at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TrapError {
    #[error("{0}")]
    Access(#[from] AccessError),
    #[error("cannot read the exception frame at RSP {rsp:#x}: {source}")]
    Frame { rsp: u64, source: AccessError },
}

/// The vCPU stopped on the trapped handler: its registers and the exception frame.
#[derive(Debug, Clone, Copy)]
pub struct Stopped {
    pub handler: u64,
    pub regs: kvm_regs,
    pub frame: ExceptionFrame,
}

/// The mark over one vector's handler, shared by every vCPU of a VM.
pub struct VectorTrap {
    vector: u8,
    names: TrapNames,
    patch: Patch,
    /// Serialises (re)installation.
    install: Mutex<()>,
    /// The handler last refused (its entry cannot be displaced; 0: none): not tried again
    /// until the guest's gate names another one (an early-boot handler is often refused, the
    /// final one not).
    refused_at: AtomicU64,
    /// Refusals said at warning level so far (a guest flipping its gate cannot flood the log).
    warnings: AtomicU64,
    fixups: Arc<FixupCounts>,
}

impl VectorTrap {
    pub fn new(vector: u8, mark: Mark, names: TrapNames, fixups: Arc<FixupCounts>) -> Self {
        VectorTrap {
            vector,
            names,
            patch: Patch::new(mark),
            install: Mutex::new(()),
            refused_at: AtomicU64::new(0),
            warnings: AtomicU64::new(0),
            fixups,
        }
    }

    pub fn names(&self) -> &TrapNames {
        &self.names
    }

    pub fn fixups(&self) -> &FixupCounts {
        &self.fixups
    }

    /// The patched handler's guest-virtual address, once installed.
    pub(crate) fn installed_at(&self) -> Option<u64> {
        self.patch.installed_at()
    }

    /// The instructions the mark displaced (empty before it is installed).
    pub(crate) fn displaced(&self) -> Vec<Displaced> {
        self.patch.displaced()
    }

    pub fn mark(&self) -> Mark {
        self.patch.mark
    }

    /// Whether the trap is off because the handler the guest's gate named last was refused.
    pub fn refused(&self) -> bool {
        self.installed_at().is_none() && self.refused_at.load(Ordering::Acquire) != 0
    }

    /// Leaves `handler` alone (the trap stays off until the gate names another handler), saying
    /// why (at warning level for the first few).
    fn refuse(&self, handler: u64, why: impl std::fmt::Display) {
        if self.refused_at.swap(handler, Ordering::AcqRel) == handler {
            return;
        }
        if self.warnings.fetch_add(1, Ordering::Relaxed) < MAX_REFUSAL_WARNINGS {
            log::warn!(
                "{}: {} will NOT work on this host while the guest's {} handler is the one at \
                 {handler:#x}: {why}",
                self.names.owner,
                self.names.without,
                self.names.exception
            );
        } else {
            log::debug!(
                "{}: refused the handler at {handler:#x}: {why}",
                self.names.owner
            );
        }
    }

    /// The handler the guest's IDT names for the vector now, and its guest-physical address;
    /// None until the guest is in long mode with paging and a present gate for the vector.
    pub(crate) fn handler_in_idt(&self, cpu: &mut dyn VcpuAccess) -> Option<(u64, u64)> {
        let sregs = cpu.sregs().ok()?;
        if sregs.cr0 & CR0_PG == 0 || sregs.efer & EFER_LMA == 0 {
            return None;
        }
        let offset = u64::from(self.vector) * 16;
        if u64::from(sregs.idt.limit) < offset + 15 {
            return None;
        }
        let mut gate = [0u8; 16];
        cpu.read_virt(sregs.idt.base.wrapping_add(offset), &mut gate)
            .ok()?;
        let handler = idt_gate_target(&gate)?;
        let gpa = cpu.translate(handler).ok()?;
        Some((handler, gpa))
    }

    /// Installs the mark once the guest has a gate for the vector. Returns whether it is
    /// installed now.
    pub(crate) fn try_install(&self, cpu: &mut dyn VcpuAccess) -> bool {
        if self.installed_at().is_some() {
            return true;
        }
        let Some((handler, gpa)) = self.handler_in_idt(cpu) else {
            return false;
        };
        if self.refused_at.load(Ordering::Acquire) == handler {
            return false;
        }
        let mem = cpu.memory();
        let _g = self.install.lock().unwrap_or_else(|e| e.into_inner());
        if self.installed_at().is_some() {
            return true;
        }
        match self.patch.patch_at(mem, handler, gpa) {
            Ok(d) => {
                log::info!(
                    "{}: {:?} over the guest's {} handler at {handler:#x} ({d:?})",
                    self.names.owner,
                    self.mark(),
                    self.names.exception
                );
                true
            }
            Err(why) => {
                self.refuse(handler, why);
                false
            }
        }
    }

    /// After every exit, once installed: puts the mark back if the guest rewrote the handler's
    /// first bytes (one guest-memory read when nothing changed).
    pub(crate) fn recheck_entry(&self, cpu: &mut dyn VcpuAccess) {
        let Some(gva) = self.patch.installed_at() else {
            return;
        };
        let mem = cpu.memory();
        if self.patch.intact(mem) {
            return;
        }
        let _g = self.install.lock().unwrap_or_else(|e| e.into_inner());
        if self.installed_at() != Some(gva) || self.patch.intact(mem) {
            return;
        }
        match self.patch.patch_at(mem, gva, self.patch.gpa()) {
            Ok(d) => {
                if self.fixups.record(self.names.reinstalled) {
                    log::info!(
                        "{}: the guest rewrote its {} handler entry; mark put back over {d:?}",
                        self.names.owner,
                        self.names.exception
                    );
                }
            }
            Err(why) => {
                self.patch.uninstall();
                self.refuse(gva, format!("after the guest rewrote it, {why}"));
            }
        }
    }

    /// Now and then, once installed: if the guest's IDT now names another handler for the
    /// vector (a new IDT, or a new gate), the displaced byte goes back and the new handler is
    /// patched.
    pub(crate) fn recheck_gate(&self, cpu: &mut dyn VcpuAccess) {
        let Some(gva) = self.patch.installed_at() else {
            return;
        };
        let Some((handler, gpa)) = self.handler_in_idt(cpu) else {
            return;
        };
        if handler == gva && gpa == self.patch.gpa() {
            return;
        }
        let mem = cpu.memory();
        let _g = self.install.lock().unwrap_or_else(|e| e.into_inner());
        if self.installed_at() != Some(gva) {
            return;
        }
        self.patch.restore(mem);
        match self.patch.patch_at(mem, handler, gpa) {
            Ok(d) => {
                if self.fixups.record(self.names.moved) {
                    log::info!(
                        "{}: the guest's {} gate moved from {gva:#x} to {handler:#x}; mark moved ({d:?})",
                        self.names.owner,
                        self.names.exception
                    );
                }
            }
            Err(why) => self.refuse(handler, format!("after the guest moved its handler, {why}")),
        }
    }

    /// At an emulation failure (the int3 mark) or a completed write to [`TRAP_PORT`] (the port
    /// mark): None if the vCPU is not on the patched handler (not this trap's), else its
    /// registers and the exception frame.
    pub(crate) fn stopped_at_handler(
        &self,
        cpu: &mut dyn VcpuAccess,
    ) -> Result<Option<Stopped>, TrapError> {
        let Some(handler) = self.installed_at() else {
            return Ok(None);
        };
        let regs = cpu.regs()?;
        if regs.rip != handler.wrapping_add(self.mark().rip_offset()) {
            return Ok(None);
        }
        let mut raw = [0u8; ExceptionFrame::LEN];
        let len = ExceptionFrame::len_for(self.vector);
        cpu.read_virt(regs.rsp, &mut raw[..len])
            .map_err(|source| TrapError::Frame {
                rsp: regs.rsp,
                source,
            })?;
        Ok(Some(Stopped {
            handler,
            regs,
            frame: ExceptionFrame::for_vector(self.vector, &raw),
        }))
    }

    /// Lets the guest's own handler take the exception: steps over the displaced instructions
    /// (doing what they do) and resumes after them.
    pub fn deliver(&self, cpu: &mut dyn VcpuAccess, stopped: &Stopped) -> Result<(), AccessError> {
        let mut regs = stopped.regs;
        regs.rip = stopped.handler;
        for d in self.displaced() {
            regs.rip = regs.rip.wrapping_add(u64::from(d.length()));
            match d {
                Displaced::Nop(_) => {}
                Displaced::Clac(_) => regs.rflags &= !RFLAGS_AC,
                Displaced::Push(_, value) => {
                    regs.rsp = regs.rsp.wrapping_sub(8);
                    cpu.write_virt(regs.rsp, &value.to_le_bytes())?;
                }
            }
        }
        cpu.set_regs(&regs)
    }
}

/// Refusals logged at warning level (the rest at debug level).
const MAX_REFUSAL_WARNINGS: u64 = 4;

/// Host TSC cycles between a vCPU's looks at a trap that is not installed yet, and between its
/// looks at the IDT gate once it is (about 2 ms): looking after every exit cost ~10 us per exit
/// in guests that never set up the vector, VMM work that domain-switch then charged.
pub(crate) const POLL_INTERVAL_TSC: u64 = 5_000_000;

/// One vCPU's side of a trap: when it looks at the guest's IDT next.
pub(crate) struct TrapPoll {
    next: u64,
    /// The wait after the next look (doubles at each look, up to [`MAX_POLL_INTERVAL_TSC`]).
    interval: u64,
}

/// Each look doubles the wait before the next one, up to this (about 64 ms at 2.6 GHz): a guest
/// that never sets LSTAR (a tiny guest, a kernel without user space) then pays ~12 us per 64 ms
/// instead of per 2 ms. The ~12 us fell on the PMI exit of every sample of the PMI benchmark
/// guest, whose only exits are PMIs ~2 ms apart: half the VMM's cost per delivered sample
/// (issue 20 item 2, P2). A Linux guest sets LSTAR and moves its IDT gates early in boot, tens of
/// seconds here before its first system call from user space.
pub(crate) const MAX_POLL_INTERVAL_TSC: u64 = 32 * POLL_INTERVAL_TSC;

impl Default for TrapPoll {
    fn default() -> Self {
        Self::new()
    }
}

impl TrapPoll {
    pub(crate) fn new() -> Self {
        TrapPoll {
            next: 0,
            interval: POLL_INTERVAL_TSC,
        }
    }

    /// Whether a look is due now (and, if so, when the next one is: the wait doubles).
    pub(crate) fn due(&mut self) -> bool {
        let now = crate::tsc::now();
        if now < self.next {
            return false;
        }
        self.next = now.saturating_add(self.interval);
        self.interval = (2 * self.interval).min(MAX_POLL_INTERVAL_TSC);
        true
    }

    /// The next look is due at once, and the waits start again from [`POLL_INTERVAL_TSC`].
    #[cfg(test)]
    pub(crate) fn reset(&mut self) {
        *self = Self::new();
    }
}

/// After every exit, for a trap whose owner has nothing more to check first: installs it when
/// the guest is ready and a look is due (also after a refusal: the guest may change its gate); once installed, re-checks the entry (every exit) and
/// the gate (when a look is due).
pub(crate) fn after_exit(trap: &VectorTrap, poll: &mut TrapPoll, cpu: &mut dyn VcpuAccess) {
    if trap.installed_at().is_none() {
        if poll.due() {
            trap.try_install(cpu);
        }
        return;
    }
    trap.recheck_entry(cpu);
    if poll.due() {
        trap.recheck_gate(cpu);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_back_off_to_the_cap_and_start_again_on_reset() {
        let mut p = TrapPoll::new();
        let mut waits = Vec::new();
        for _ in 0..8 {
            p.next = 0;
            let before = crate::tsc::now();
            assert!(p.due());
            waits.push((p.next - before) / POLL_INTERVAL_TSC);
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 32, 32]);
        assert!(!p.due(), "not due again before its wait");
        p.reset();
        assert!(p.due());
        assert_eq!(p.interval, 2 * POLL_INTERVAL_TSC);
    }

    #[test]
    fn only_instructions_with_no_effect_or_clac_are_displaced() {
        assert_eq!(displaceable(&[0x90, 0x90, 0x90], 0), Ok(Displaced::Nop(1)));
        assert_eq!(displaceable(&[0x0f, 0x1f, 0x00], 0), Ok(Displaced::Nop(3)));
        assert_eq!(displaceable(&[0x66, 0x90], 0), Ok(Displaced::Nop(2)));
        assert_eq!(
            displaceable(&[0xf3, 0x0f, 0x1e, 0xfa], 0),
            Ok(Displaced::Nop(4))
        );
        assert_eq!(displaceable(&[0x0f, 0x01, 0xca], 0), Ok(Displaced::Clac(3)));
        // push imm8 / imm32, sign-extended (kvm-unit-tests' and Linux's early entry stubs).
        assert_eq!(displaceable(&[0x6a, 0x0d], 0), Ok(Displaced::Push(2, 13)));
        assert_eq!(
            displaceable(&[0x6a, 0xff], 0),
            Ok(Displaced::Push(2, u64::MAX))
        );
        assert_eq!(
            displaceable(&[0x68, 0x78, 0x56, 0x34, 0x12], 0),
            Ok(Displaced::Push(5, 0x1234_5678))
        );
        // A 16-bit push and a register push are not stood in for.
        assert!(displaceable(&[0x66, 0x6a, 0x0d], 0).is_err());
        assert!(displaceable(&[0x50], 0).is_err());
        let e = displaceable(&[0x48, 0x89, 0xe5], 0).unwrap_err();
        assert!(e.to_string().contains("mov"), "{e}");
        assert!(displaceable(&[0x0f, 0xff], 0).is_err());
        assert!(displaceable(&[], 0).is_err());
    }

    #[test]
    fn the_port_mark_displaces_whole_instructions_covering_two_bytes() {
        let two = |b: &[u8]| displace(b, 0, Mark::PortOut.bytes().len());
        // Linux 6.1's asm_exc_page_fault: three 1-byte NOPs (two are displaced).
        assert_eq!(two(&[0x90, 0x90, 0x90]), Ok(vec![Displaced::Nop(1); 2]));
        assert_eq!(two(&[0xf3, 0x0f, 0x1e, 0xfa]), Ok(vec![Displaced::Nop(4)]));
        assert_eq!(two(&[0x6a, 0x0d]), Ok(vec![Displaced::Push(2, 13)]));
        assert_eq!(two(&[0x0f, 0x01, 0xca]), Ok(vec![Displaced::Clac(3)]));
        // A NOP then something the VMM cannot stand in for: refused.
        assert!(two(&[0x90, 0x48, 0x89, 0xe5]).is_err());
        // Only one byte readable (the handler's page ends): refused, not read past.
        assert!(two(&[0x90]).is_err());
        assert_eq!(
            displace(&[0x90, 0x90], 0, 1),
            Ok(vec![Displaced::Nop(1)]),
            "the int3 mark displaces one instruction"
        );
        assert!(displace(&[0x90; 8], 0, 8).is_err(), "at most MAX_DISPLACED");
    }

    #[test]
    fn marks() {
        assert_eq!(Mark::for_host(true), Mark::Int3);
        assert_eq!(Mark::for_host(false), Mark::PortOut);
        assert_eq!(Mark::PortOut.bytes(), &[0xe6, 0xf5]);
        assert_eq!(Mark::PortOut.rip_offset(), 2);
        assert_eq!(Mark::Int3.rip_offset(), 0);
    }

    #[test]
    fn idt_gates_decode() {
        let target: u64 = 0xffff_ffff_8160_0b20;
        let mut g = [0u8; 16];
        g[0..2].copy_from_slice(&(target as u16).to_le_bytes());
        g[2..4].copy_from_slice(&0x10u16.to_le_bytes());
        g[5] = 0x8e;
        g[6..8].copy_from_slice(&((target >> 16) as u16).to_le_bytes());
        g[8..12].copy_from_slice(&((target >> 32) as u32).to_le_bytes());
        assert_eq!(idt_gate_target(&g), Some(target));
        g[5] = 0x8f;
        assert_eq!(idt_gate_target(&g), Some(target));
        g[5] = 0x0e; // not present
        assert_eq!(idt_gate_target(&g), None);
        g[5] = 0x85; // task gate
        assert_eq!(idt_gate_target(&g), None);
    }
}
