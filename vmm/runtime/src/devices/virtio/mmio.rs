//! The virtio-mmio transport, version 2 (virtio 1.x "modern"): the 4 KiB register block a
//! guest finds through `virtio_mmio.device=4K@BASE:IRQ` on its command line. Registers are
//! 32-bit; the device's configuration space starts at 0x100. Interrupts go out through an
//! eventfd registered as an irqfd on the in-kernel IOAPIC (edge), with the reason latched in
//! InterruptStatus until the driver acknowledges it.

use std::time::Instant;

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};
use virtio_bindings::virtio_mmio::*;
use virtio_queue::QueueT;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use vpmu::guest_log::GuestLog;
use vpmu::guest_warn;

use super::{VirtioDevice, VIRTIO_F_VERSION_1};
use crate::devices::MmioDevice;
use crate::devices::Tick;

/// "virt" in little-endian ASCII.
pub const MAGIC: u32 = 0x7472_6976;
/// virtio-mmio version 2: the virtio 1.x register layout.
pub const VERSION: u32 = 2;
/// "VPMU" in little-endian ASCII.
pub const VENDOR_ID: u32 = 0x554d_5056;
/// Size of the register block (and of the `4K` on the command line).
pub(crate) const MMIO_LEN: u64 = 0x1000;

pub struct MmioTransport<D> {
    device: D,
    mem: GuestMemoryMmap,
    irq: EventFd,
    status: u32,
    device_features_sel: u32,
    driver_features: u64,
    driver_features_sel: u32,
    queue_sel: u32,
    interrupt_status: u32,
    /// Interrupts raised, and guest accesses that broke the rules (logged once each).
    pub interrupts: u64,
    pub bad_accesses: u64,
    /// Extra device-model work per register access, busy-waited on the vCPU thread
    /// (`--net-access-cost-us`; zero by default).
    access_cost: std::time::Duration,
}

impl<D: VirtioDevice> MmioTransport<D> {
    pub fn new(device: D, mem: GuestMemoryMmap, irq: EventFd) -> Self {
        MmioTransport {
            device,
            mem,
            irq,
            status: 0,
            device_features_sel: 0,
            driver_features: 0,
            driver_features_sel: 0,
            queue_sel: 0,
            interrupt_status: 0,
            interrupts: 0,
            bad_accesses: 0,
            access_cost: std::time::Duration::ZERO,
        }
    }

    /// Makes every register access cost `d` of VMM work (a heavyweight device model).
    pub(crate) fn with_access_cost(mut self, d: std::time::Duration) -> Self {
        self.access_cost = d;
        self
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    pub fn status(&self) -> u32 {
        self.status
    }

    fn live(&self) -> bool {
        self.status & VIRTIO_CONFIG_S_DRIVER_OK != 0
            && self.status & (VIRTIO_CONFIG_S_FAILED | VIRTIO_CONFIG_S_NEEDS_RESET) == 0
    }

    /// After device work: if the device broke (the driver corrupted a queue), set
    /// DEVICE_NEEDS_RESET and, the driver being live, send a configuration change notification
    /// (virtio 1.x, "Device Status Field": both MUSTs). Queues stay unused until a reset.
    fn check_needs_reset(&mut self) {
        if !self.device.needs_reset() || self.status & VIRTIO_CONFIG_S_NEEDS_RESET != 0 {
            return;
        }
        let was_live = self.live();
        self.status |= VIRTIO_CONFIG_S_NEEDS_RESET;
        if was_live {
            self.interrupt_status |= VIRTIO_MMIO_INT_CONFIG;
            self.interrupts += 1;
            if let Err(e) = self.irq.write(1) {
                log::warn!("virtio-mmio: cannot signal the interrupt: {e}");
            }
        }
    }

    /// Latches "used buffer" in InterruptStatus and pulses the guest's IRQ line.
    fn raise(&mut self) {
        self.interrupt_status |= VIRTIO_MMIO_INT_VRING;
        self.interrupts += 1;
        if let Err(e) = self.irq.write(1) {
            log::warn!("virtio-mmio: cannot signal the interrupt: {e}");
        }
    }

    fn bad(&mut self, what: String) {
        if self.bad_accesses == 0 {
            log::warn!("virtio-mmio: {what} (further bad accesses are only counted)");
        }
        self.bad_accesses += 1;
    }

    fn queue_mut(&mut self) -> Option<&mut virtio_queue::Queue> {
        let sel = self.queue_sel as usize;
        self.device.queues_mut().get_mut(sel)
    }

    fn reset(&mut self) {
        self.status = 0;
        self.device_features_sel = 0;
        self.driver_features = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
        self.interrupt_status = 0;
        self.device.reset();
    }

    fn set_status(&mut self, v: u32, now: Instant) {
        if v == 0 {
            self.reset();
            return;
        }
        // The driver sets only its own bits; DEVICE_NEEDS_RESET (and anything above the
        // 8-bit field) is not the driver's to set.
        let driver_bits = VIRTIO_CONFIG_S_ACKNOWLEDGE
            | VIRTIO_CONFIG_S_DRIVER
            | VIRTIO_CONFIG_S_DRIVER_OK
            | VIRTIO_CONFIG_S_FEATURES_OK
            | VIRTIO_CONFIG_S_FAILED;
        if v & !driver_bits != 0 {
            self.bad(format!("status {v:#x} sets bits that are not the driver's"));
        }
        let mut v = v & driver_bits;
        if v & VIRTIO_CONFIG_S_FEATURES_OK != 0 && self.status & VIRTIO_CONFIG_S_FEATURES_OK == 0 {
            // Accept the features only if they are a subset of the offer and modern: otherwise
            // FEATURES_OK does not stick and the driver gives up, as the spec says.
            let offered = self.device.features();
            if self.driver_features & !offered != 0
                || self.driver_features & VIRTIO_F_VERSION_1 == 0
            {
                static REFUSED: GuestLog = GuestLog::new("virtio-features-refused");
                guest_warn!(
                    REFUSED,
                    "virtio-mmio: driver features {:#x} not acceptable (offered {offered:#x})",
                    self.driver_features
                );
                v &= !VIRTIO_CONFIG_S_FEATURES_OK;
            }
        }
        let was_live = self.live();
        // DEVICE_NEEDS_RESET is the device's to set; only a reset (0) clears it.
        self.status = v | (self.status & VIRTIO_CONFIG_S_NEEDS_RESET);
        if !was_live && self.live() {
            self.device.activate(self.driver_features, now);
        }
    }

    fn read_reg(&mut self, reg: u32) -> u32 {
        let sel = self.queue_sel as usize;
        let q = self.device.queues().get(sel);
        match reg {
            VIRTIO_MMIO_MAGIC_VALUE => MAGIC,
            VIRTIO_MMIO_VERSION => VERSION,
            VIRTIO_MMIO_DEVICE_ID => self.device.device_id(),
            VIRTIO_MMIO_VENDOR_ID => VENDOR_ID,
            VIRTIO_MMIO_DEVICE_FEATURES => match self.device_features_sel {
                0 => self.device.features() as u32,
                1 => (self.device.features() >> 32) as u32,
                _ => 0,
            },
            VIRTIO_MMIO_QUEUE_NUM_MAX => q.map_or(0, |q| u32::from(q.max_size())),
            VIRTIO_MMIO_QUEUE_READY => q.map_or(0, |q| u32::from(q.ready())),
            VIRTIO_MMIO_INTERRUPT_STATUS => self.interrupt_status,
            VIRTIO_MMIO_STATUS => self.status,
            VIRTIO_MMIO_CONFIG_GENERATION => 0,
            // No shared memory regions: length all ones means "none" to the driver.
            VIRTIO_MMIO_SHM_LEN_LOW | VIRTIO_MMIO_SHM_LEN_HIGH => u32::MAX,
            VIRTIO_MMIO_SHM_BASE_LOW | VIRTIO_MMIO_SHM_BASE_HIGH => u32::MAX,
            _ => {
                self.bad(format!("read of register {reg:#x}"));
                0
            }
        }
    }

    fn write_reg(&mut self, reg: u32, v: u32, now: Instant) {
        let queues_settable = !self.live();
        match reg {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = v,
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            VIRTIO_MMIO_DRIVER_FEATURES => {
                if self.status & VIRTIO_CONFIG_S_DRIVER == 0
                    || self.status & VIRTIO_CONFIG_S_FEATURES_OK != 0
                {
                    self.bad(format!(
                        "driver features written in status {:#x}",
                        self.status
                    ));
                    return;
                }
                match self.driver_features_sel {
                    0 => {
                        self.driver_features = (self.driver_features & !0xffff_ffff) | u64::from(v)
                    }
                    1 => {
                        self.driver_features =
                            (self.driver_features & 0xffff_ffff) | (u64::from(v) << 32)
                    }
                    _ => {}
                }
            }
            VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = v,
            VIRTIO_MMIO_QUEUE_NUM
            | VIRTIO_MMIO_QUEUE_READY
            | VIRTIO_MMIO_QUEUE_DESC_LOW
            | VIRTIO_MMIO_QUEUE_DESC_HIGH
            | VIRTIO_MMIO_QUEUE_AVAIL_LOW
            | VIRTIO_MMIO_QUEUE_AVAIL_HIGH
            | VIRTIO_MMIO_QUEUE_USED_LOW
            | VIRTIO_MMIO_QUEUE_USED_HIGH => {
                if !queues_settable {
                    self.bad(format!("queue register {reg:#x} written while live"));
                    return;
                }
                let mem = self.mem.clone();
                let sel = self.queue_sel;
                let Some(q) = self.queue_mut() else {
                    self.bad(format!("queue register {reg:#x} of a missing queue"));
                    return;
                };
                match reg {
                    VIRTIO_MMIO_QUEUE_NUM => q.set_size(v as u16),
                    VIRTIO_MMIO_QUEUE_READY => {
                        q.set_ready(v == 1);
                        if v == 1 && !q.is_valid(&mem) {
                            static INVALID: GuestLog = GuestLog::new("virtio-queue-invalid");
                            guest_warn!(INVALID, "virtio-mmio: queue {} set ready but is not valid (size {}, rings {:#x}/{:#x}/{:#x})",
                                sel, q.size(), q.desc_table(), q.avail_ring(), q.used_ring());
                        }
                    }
                    VIRTIO_MMIO_QUEUE_DESC_LOW => q.set_desc_table_address(Some(v), None),
                    VIRTIO_MMIO_QUEUE_DESC_HIGH => q.set_desc_table_address(None, Some(v)),
                    VIRTIO_MMIO_QUEUE_AVAIL_LOW => q.set_avail_ring_address(Some(v), None),
                    VIRTIO_MMIO_QUEUE_AVAIL_HIGH => q.set_avail_ring_address(None, Some(v)),
                    VIRTIO_MMIO_QUEUE_USED_LOW => q.set_used_ring_address(Some(v), None),
                    _ => q.set_used_ring_address(None, Some(v)),
                }
            }
            VIRTIO_MMIO_QUEUE_NOTIFY => {
                if !self.live() {
                    self.bad("queue notify before DRIVER_OK".to_string());
                    return;
                }
                if self.device.queue_notify(v as u16, &self.mem, now) {
                    self.raise();
                }
                self.check_needs_reset();
            }
            VIRTIO_MMIO_INTERRUPT_ACK => self.interrupt_status &= !v,
            VIRTIO_MMIO_STATUS => self.set_status(v, now),
            _ => self.bad(format!("write of register {reg:#x}")),
        }
    }
}

impl<D: VirtioDevice> MmioDevice for MmioTransport<D> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        crate::devices::delay::spin(self.access_cost);
        if offset >= u64::from(VIRTIO_MMIO_CONFIG) {
            self.device
                .read_config(offset - u64::from(VIRTIO_MMIO_CONFIG), data);
            return;
        }
        if data.len() != 4 || offset & 3 != 0 {
            self.bad(format!("{}-byte read at {offset:#x}", data.len()));
            data.fill(0);
            return;
        }
        let v = self.read_reg(offset as u32);
        data.copy_from_slice(&v.to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        crate::devices::delay::spin(self.access_cost);
        if offset >= u64::from(VIRTIO_MMIO_CONFIG) {
            // Both devices' configurations are read-only (the card's MAC; the disk's geometry
            // and limits: no VIRTIO_BLK_F_CONFIG_WCE).
            self.bad(format!("config space write at {offset:#x}"));
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            self.bad(format!("{}-byte write at {offset:#x}", data.len()));
            return;
        };
        if offset & 3 != 0 {
            self.bad(format!("unaligned write at {offset:#x}"));
            return;
        }
        self.write_reg(offset as u32, u32::from_le_bytes(bytes), Instant::now());
    }
}

impl<D: VirtioDevice> Tick for MmioTransport<D> {
    fn tick(&mut self, now: Instant) {
        if self.live() && self.device.tick(&self.mem, now) {
            self.raise();
        }
        self.check_needs_reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::net::{VirtioNet, QUEUE_SIZE};
    use vm_memory::GuestAddress;

    fn transport() -> MmioTransport<VirtioNet> {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        MmioTransport::new(VirtioNet::new([1, 2, 3, 4, 5, 6], None), mem, irq)
    }

    fn rd(t: &mut MmioTransport<VirtioNet>, reg: u32) -> u32 {
        let mut b = [0u8; 4];
        t.read(u64::from(reg), &mut b);
        u32::from_le_bytes(b)
    }

    fn wr(t: &mut MmioTransport<VirtioNet>, reg: u32, v: u32) {
        t.write(u64::from(reg), &v.to_le_bytes());
    }

    fn negotiate(t: &mut MmioTransport<VirtioNet>, high: u32, low: u32) -> u32 {
        wr(t, VIRTIO_MMIO_STATUS, 0);
        wr(t, VIRTIO_MMIO_STATUS, 1);
        wr(t, VIRTIO_MMIO_STATUS, 3);
        wr(t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        wr(t, VIRTIO_MMIO_DRIVER_FEATURES, high);
        wr(t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        wr(t, VIRTIO_MMIO_DRIVER_FEATURES, low);
        wr(t, VIRTIO_MMIO_STATUS, 0xb);
        rd(t, VIRTIO_MMIO_STATUS)
    }

    #[test]
    fn identity_features_and_config() {
        let mut t = transport();
        assert_eq!(rd(&mut t, VIRTIO_MMIO_MAGIC_VALUE), MAGIC);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_VERSION), 2);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_DEVICE_ID), 1);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_VENDOR_ID), VENDOR_ID);
        wr(&mut t, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_DEVICE_FEATURES), 1, "VERSION_1");
        wr(&mut t, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_DEVICE_FEATURES), 1 << 5, "MAC");
        assert_eq!(rd(&mut t, VIRTIO_MMIO_QUEUE_NUM_MAX), u32::from(QUEUE_SIZE));
        wr(&mut t, VIRTIO_MMIO_QUEUE_SEL, 2);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_QUEUE_NUM_MAX), 0, "no third queue");
        let mut mac = [0u8; 8];
        t.read(0x100, &mut mac[..6]);
        t.read(0x106, &mut mac[6..]);
        assert_eq!(mac, [1, 2, 3, 4, 5, 6, 0, 0]);
        assert_eq!(t.bad_accesses, 0);
        let mut half = [0u8; 2];
        t.read(0, &mut half);
        t.write(0x100, &[9]);
        assert_eq!(t.bad_accesses, 2, "2-byte register read, config write");
    }

    #[test]
    fn features_must_be_offered_and_modern() {
        let mut t = transport();
        assert_eq!(
            negotiate(&mut t, 0, 1 << 5),
            3,
            "legacy driver: no FEATURES_OK"
        );
        assert_eq!(
            negotiate(&mut t, 1 | 1 << 8, 0),
            3,
            "unoffered feature: no FEATURES_OK"
        );
        assert_eq!(negotiate(&mut t, 1, 1 << 5), 0xb);
    }

    #[test]
    fn queues_are_fixed_while_live_and_reset_clears_everything() {
        let mut t = transport();
        assert_eq!(negotiate(&mut t, 1, 0), 0xb);
        wr(&mut t, VIRTIO_MMIO_QUEUE_SEL, 0);
        wr(&mut t, VIRTIO_MMIO_QUEUE_NUM, 8);
        wr(&mut t, VIRTIO_MMIO_QUEUE_READY, 1);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_QUEUE_READY), 1);
        wr(&mut t, VIRTIO_MMIO_STATUS, 0xf);
        assert_eq!(t.status(), 0xf);
        wr(&mut t, VIRTIO_MMIO_QUEUE_NUM, 4);
        assert_eq!(t.device().queues()[0].size(), 8, "ignored while live");
        assert_eq!(t.bad_accesses, 1);
        wr(&mut t, VIRTIO_MMIO_STATUS, 0);
        assert_eq!(t.status(), 0);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_QUEUE_READY), 0);
        assert_eq!(t.device().queues()[0].size(), QUEUE_SIZE);
    }

    #[test]
    fn interrupts_latch_until_acknowledged() {
        let mut t = transport();
        t.raise();
        assert_eq!(t.irq.read().unwrap(), 1, "the irqfd was signalled");
        assert_eq!(
            rd(&mut t, VIRTIO_MMIO_INTERRUPT_STATUS),
            VIRTIO_MMIO_INT_VRING
        );
        wr(&mut t, VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INT_VRING);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_INTERRUPT_STATUS), 0);
        assert_eq!(t.interrupts, 1);
    }
}
