//! 16550A UARTs (vm-superio): COM1 is the guest console (to our stdout, from our stdin), COM2 a
//! byte channel to a host file (`--serial2`). Interrupts go to the in-kernel irqchip by irqfd.

use std::io::Write;
use std::sync::{Arc, Mutex};

use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::{DeviceEvent, PioDevice};

pub const COM1_BASE: u16 = 0x3f8;
pub(crate) const COM1_GSI: u32 = 4;
pub(crate) const COM2_BASE: u16 = 0x2f8;
pub(crate) const COM2_GSI: u32 = 3;
pub const UART_LEN: u16 = 8;

/// Raises the UART's interrupt line through an irqfd.
pub(crate) struct IrqLine(pub EventFd);

impl Trigger for IrqLine {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

pub struct Uart<W: Write + Send> {
    inner: Serial<IrqLine, vm_superio::serial::NoEvents, W>,
}

impl<W: Write + Send> Uart<W> {
    pub fn new(irq: EventFd, out: W) -> Self {
        Uart {
            inner: Serial::new(IrqLine(irq), out),
        }
    }

    /// Queues input bytes for the guest to read; returns how many fitted in the FIFO.
    pub(crate) fn enqueue_input(&mut self, bytes: &[u8]) -> usize {
        self.inner.enqueue_raw_bytes(bytes).unwrap_or(0)
    }
}

impl<W: Write + Send> PioDevice for Uart<W> {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        if let Some(b) = data.first_mut() {
            *b = self.inner.read(offset as u8);
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<DeviceEvent> {
        if let Some(&b) = data.first() {
            if let Err(e) = self.inner.write(offset as u8, b) {
                log::warn!("serial write failed: {e:?}");
            }
        }
        None
    }
}

/// Feeds our stdin to COM1 on a background thread, at the pace the guest drains the FIFO.
pub(crate) fn spawn_stdin_reader<W: Write + Send + 'static>(uart: Arc<Mutex<Uart<W>>>) {
    use std::io::Read;
    let confine = crate::seccomp::for_new_thread(crate::seccomp::ThreadKind::Stdin);
    let _ = std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            confine.apply();
            let mut buf = [0u8; 64];
            let mut stdin = std::io::stdin();
            while let Ok(n) = stdin.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut rest = &buf[..n];
                while !rest.is_empty() {
                    let took = super::lock_device(&uart).enqueue_input(rest);
                    rest = &rest[took..];
                    if !rest.is_empty() {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                }
            }
        });
}
