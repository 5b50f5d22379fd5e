//! The guest console as the VMM sees it: bytes go to our stdout (or a file) as they come, and the
//! last lines are kept so an abnormal end can show them. It also notices a guest kernel panic,
//! because with `panic=-1` a panicking Linux resets the machine just like a clean `reboot`, and
//! a kernel that halted the machine for good ("reboot: System halted": `halt`, or `poweroff` in
//! a kernel that found no way to power off, such as one without CONFIG_PCI, which loads no DSDT
//! and so has no `\_S5`), after which nothing runs again: the run ends there as a power-off. It
//! notices too a kernel that could not load the DSDT, for the run's report to say why its disks
//! and network card are missing.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};

use vpmu::guest_log::GuestLog;
use vpmu::guest_warn;

const KEPT_LINES: usize = 40;
const PANIC_MARKER: &str = "Kernel panic - not syncing";
/// Linux prints "Run /init as init process" once its boot work is done (init memory freed,
/// read-only data protected) and it hands the machine to init.
const INIT_MARKER: &str = " as init process";
/// What Linux's kernel_halt() prints last, before stopping every CPU with interrupts off.
const HALT_MARKER: &str = "reboot: System halted";
/// What Linux prints when ACPICA could not load the DSDT (`acpi_bus_init`); a kernel built
/// without CONFIG_PCI always does ("AE_BAD_PARAMETER, During Region initialization": it has no
/// PCI_Config address space handler), and then never sees the devices the DSDT describes.
const NO_DSDT_MARKER: &str = "ACPI: Unable to load the System Description Tables";

#[derive(Default)]
pub struct ConsoleLog {
    lines: VecDeque<String>,
    current: Vec<u8>,
    panic_line: Option<String>,
    init_started: bool,
    halted: bool,
    no_dsdt: bool,
}

impl ConsoleLog {
    pub fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&self.current)
                    .trim_end_matches('\r')
                    .to_string();
                self.current.clear();
                if self.panic_line.is_none() && line.contains(PANIC_MARKER) {
                    self.panic_line = Some(line.clone());
                }
                self.init_started |= line.contains(INIT_MARKER);
                self.halted |= line.ends_with(HALT_MARKER);
                self.no_dsdt |= line.contains(NO_DSDT_MARKER);
                if self.lines.len() == KEPT_LINES {
                    self.lines.pop_front();
                }
                self.lines.push_back(line);
            } else if self.current.len() < 4096 {
                self.current.push(b);
            }
        }
    }

    /// The kernel's panic line, if the guest panicked.
    pub(crate) fn panic_line(&self) -> Option<&str> {
        self.panic_line.as_deref()
    }

    /// Whether the guest kernel halted the machine for good (module comment).
    pub fn halted(&self) -> bool {
        self.halted
    }

    /// Whether the guest kernel said it could not load the ACPI DSDT (so it has none of the
    /// virtio-mmio devices it describes).
    pub(crate) fn no_dsdt(&self) -> bool {
        self.no_dsdt
    }

    /// Whether the guest kernel has started init (its boot work is over).
    pub(crate) fn init_started(&self) -> bool {
        self.init_started
    }

    /// The last `n` lines printed (an unfinished last line counts as one).
    pub fn tail(&self, n: usize) -> Vec<String> {
        let partial =
            (!self.current.is_empty()).then(|| String::from_utf8_lossy(&self.current).into_owned());
        let full = n.saturating_sub(usize::from(partial.is_some()));
        let mut v: Vec<String> = self
            .lines
            .iter()
            .skip(self.lines.len().saturating_sub(full))
            .cloned()
            .collect();
        v.extend(partial);
        v
    }
}

/// A file the guest writes into (`--console`, `--serial2`), holding at most `cap` bytes: then
/// one line says so and later writes are dropped (each counted as a guest-triggered event of
/// kind `output-file-full`, which the end-of-run report shows), so a guest printing forever
/// cannot fill the host's disk.
pub(crate) struct Capped<W: Write> {
    out: W,
    left: u64,
    cap: u64,
    path: std::path::PathBuf,
}

impl<W: Write> Capped<W> {
    pub(crate) fn new(out: W, cap: u64, path: std::path::PathBuf) -> Self {
        Capped {
            out,
            left: cap,
            cap,
            path,
        }
    }
}

impl<W: Write> Write for Capped<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        static FULL: GuestLog = GuestLog::new("output-file-full");
        if self.left == 0 {
            FULL.occur();
            return Ok(buf.len());
        }
        let n = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        self.out.write_all(&buf[..n])?;
        self.left -= n as u64;
        if self.left == 0 {
            writeln!(
                self.out,
                "\n[vpmu-vmm: this file reached its cap of {} bytes (--output-file-cap-mib); \
                 later guest output is dropped]",
                self.cap
            )?;
            self.out.flush()?;
            guest_warn!(
                FULL,
                "{}: the guest wrote {} bytes, the cap (--output-file-cap-mib): later output \
                 to it is dropped",
                self.path.display(),
                self.cap
            );
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// A `Write` that copies guest console output to `out` and into a shared [`ConsoleLog`].
pub(crate) struct Tee<W: Write> {
    out: W,
    log: Arc<Mutex<ConsoleLog>>,
}

impl<W: Write> Tee<W> {
    pub(crate) fn new(out: W, log: Arc<Mutex<ConsoleLog>>) -> Self {
        Tee { out, log }
    }
}

impl<W: Write> Write for Tee<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // A panic elsewhere while this was held must not silence the console: take it as it is.
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(buf);
        self.out.write_all(buf)?;
        if buf.contains(&b'\n') {
            self.out.flush()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_file_keeps_its_cap_then_one_line_and_drops_the_rest() {
        let mut c = Capped::new(Vec::new(), 1000, "/tmp/console.log".into());
        for _ in 0..10_000 {
            assert_eq!(
                c.write(b"0123456789abcdef").unwrap(),
                16,
                "taken, as a port is"
            );
        }
        let text = String::from_utf8(c.out).unwrap();
        assert!(text.starts_with("0123456789abcdef"));
        let (kept, note) = text.split_at(1000);
        assert!(kept.bytes().all(|b| b.is_ascii_hexdigit()), "{kept}");
        assert!(note.contains("reached its cap of 1000 bytes"), "{note}");
        assert!(text.len() < 1200, "{} bytes", text.len());
    }

    #[test]
    fn spots_a_kernel_that_loaded_no_dsdt() {
        let mut l = ConsoleLog::default();
        l.push(b"[    6.44] ACPI: Unable to load the System Description Tables\r\n");
        assert!(l.no_dsdt());
        let mut ok = ConsoleLog::default();
        ok.push(b"[    6.44] ACPI: 1 ACPI AML tables successfully acquired and loaded\n");
        assert!(!ok.no_dsdt());
    }

    #[test]
    fn keeps_tail_and_spots_panic() {
        let log = Arc::new(Mutex::new(ConsoleLog::default()));
        let mut tee = Tee::new(Vec::new(), log.clone());
        for i in 0..100 {
            writeln!(tee, "line {i}\r").unwrap();
        }
        write!(
            tee,
            "[ 1.0] Kernel panic - not syncing: VFS: Unable to mount root fs\npartial"
        )
        .unwrap();
        let l = log.lock().unwrap();
        assert_eq!(
            l.panic_line(),
            Some("[ 1.0] Kernel panic - not syncing: VFS: Unable to mount root fs")
        );
        let tail = l.tail(3);
        assert_eq!(
            tail,
            vec![
                "line 99",
                "[ 1.0] Kernel panic - not syncing: VFS: Unable to mount root fs",
                "partial"
            ]
        );
        assert_eq!(l.lines.len(), KEPT_LINES);
        assert!(!l.init_started());
    }

    #[test]
    fn notices_a_halted_kernel() {
        let mut l = ConsoleLog::default();
        l.push(b"[   20.1] reboot: System halted");
        assert!(!l.halted(), "only a whole line counts");
        l.push(b"\r\n");
        assert!(l.halted());
        let mut l = ConsoleLog::default();
        l.push(b"echo 'reboot: System halted' > /dev/null\n");
        assert!(!l.halted(), "the marker must end the line");
    }

    #[test]
    fn notices_the_start_of_init() {
        let mut l = ConsoleLog::default();
        l.push(b"[   30.1] Run /init as init pro");
        assert!(!l.init_started(), "only a whole line counts");
        l.push(b"cess\r\n");
        assert!(l.init_started());
    }
}
