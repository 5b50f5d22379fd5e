//! Tier 2: the virtio-blk device driven by tiny guests (seconds; docs/virtio-blk.md):
//! negotiation, configuration, writes/flush/reads checked in the image file, GET_ID, bad
//! requests answered with IOERR/UNSUPP (never a VMM failure), a read-only disk; and, through
//! the `vpmu-vmm` binary, durability across SIGKILL after a guest FLUSH, the image lock, and
//! images that cannot be used.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{kvm_available, run_tiny_with};
use runtime::end::VmEnd;
use runtime::vm::DiskConfig;

const BIN: &str = env!("CARGO_BIN_EXE_vpmu-vmm");
const SECTORS: u64 = 64;

fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// An image whose sector k is filled with the byte k.
fn image(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    let data: Vec<u8> = (0..SECTORS * 512).map(|i| (i / 512) as u8).collect();
    std::fs::write(&p, data).unwrap();
    p
}

/// The guests' pattern: byte i = i * 7 + 3.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

fn run_blk_guest(path: &Path, readonly: bool) -> (common::TinyRun, Vec<u32>) {
    let r = run_tiny_with(&tiny_guests::VIRTIO_BLK64, Duration::from_secs(60), |c| {
        c.disks = vec![DiskConfig {
            path: path.to_path_buf(),
            readonly,
            access_cost_us: 0,
        }];
    });
    assert_eq!(r.report.end, VmEnd::PowerOff, "console: {}", r.console);
    assert_eq!(r.console, "tiny: virtio-blk requests done\n");
    let v = u32s(&r.serial2);
    (r, v)
}

const OK: u32 = 0;
const IOERR: u32 = 1;
const UNSUPP: u32 = 2;

#[test]
fn tiny_driver_writes_flushes_reads_and_gets_errors() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "blk.img");
    let (r, v) = run_blk_guest(&img, false);
    assert_eq!(v.len(), 12 + 2 * 9 + 1 + 5 + 1, "serial2: {v:x?}");
    assert_eq!(
        &v[..3],
        &[0x7472_6976, 2, 2],
        "magic, version 2, block device"
    );
    assert_eq!(v[3], 1, "features 63..32: VIRTIO_F_VERSION_1");
    let offered = (1 << 1) | (1 << 2) | (1 << 6) | (1 << 9) | (1 << 13) | (1 << 14);
    assert_eq!(
        v[4], offered,
        "SIZE_MAX SEG_MAX BLK_SIZE FLUSH DISCARD WRITE_ZEROES"
    );
    assert_eq!(v[5], 0xb, "FEATURES_OK stuck");
    assert_eq!(v[6], 256, "QueueNumMax");
    assert_eq!((v[7], v[8]), (SECTORS as u32, 0), "capacity");
    assert_eq!(
        (v[9], v[10], v[11]),
        (1 << 20, 254, 512),
        "size_max seg_max blk_size"
    );
    let req = &v[12..];
    assert_eq!(&req[0..2], &[OK, 1], "1 OUT");
    assert_eq!(&req[2..4], &[OK, 1], "2 FLUSH");
    assert_eq!(
        &req[4..7],
        &[OK, 1025, 1],
        "3 IN: data + status, read back the pattern"
    );
    assert_eq!(&req[7..9], &[OK, 21], "4 GET_ID");
    let id: Vec<u8> = req[9..14].iter().flat_map(|w| w.to_le_bytes()).collect();
    assert_eq!(&id, b"blk.img\0\0\0\0\0\0\0\0\0\0\0\0\0");
    assert_eq!(&req[14..16], &[IOERR, 1], "5 IN past the end");
    assert_eq!(&req[16..18], &[UNSUPP, 1], "6 unknown type");
    assert_eq!(
        &req[18..20],
        &[0xff, 0],
        "7 no status byte: returned unused"
    );
    assert_eq!(&req[20..22], &[OK, 1], "8 WRITE_ZEROES");
    assert_eq!(&req[22..25], &[OK, 1025, 1], "9 IN: pattern, then zeroes");

    let file = std::fs::read(&img).unwrap();
    assert_eq!(&file[512..1024], &pattern(512)[..], "sector 1 written");
    assert_eq!(&file[1024..1536], &[0u8; 512][..], "sector 2 zeroed");
    assert_eq!(&file[1536..2048], &[3u8; 512][..], "sector 3 untouched");
    assert_eq!(file.len() as u64, SECTORS * 512, "size kept");

    let d = &r.report.disks[0];
    let c = &d.counts;
    assert_eq!(d.status, 0xf, "driver OK: {d:?}");
    assert_eq!(
        (
            c.reads,
            c.writes,
            c.flushes,
            c.get_ids,
            c.write_zeroes,
            c.other
        ),
        (3, 1, 1, 1, 1, 1),
        "{c:?}"
    );
    assert_eq!((c.bytes_read, c.bytes_written), (2048, 1024), "{c:?}");
    assert_eq!(
        (c.io_errors, c.unsupported, c.no_status),
        (1, 1, 1),
        "{c:?}"
    );
    assert_eq!((d.bad_accesses, d.interrupts), (0, 0), "{d:?}");
    assert!(d.fault.is_none());
}

#[test]
fn a_read_only_disk_offers_ro_and_refuses_writes() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "ro.img");
    let before = std::fs::read(&img).unwrap();
    let (r, v) = run_blk_guest(&img, true);
    let offered = (1 << 1) | (1 << 2) | (1 << 5) | (1 << 6) | (1 << 9);
    assert_eq!(v[4], offered, "RO, and neither DISCARD nor WRITE_ZEROES");
    let req = &v[12..];
    assert_eq!(&req[0..2], &[IOERR, 1], "1 OUT refused");
    assert_eq!(&req[2..4], &[OK, 1], "2 FLUSH: nothing to flush");
    assert_eq!(&req[4..7], &[OK, 1025, 0], "3 IN: the old data");
    assert_eq!(&req[20..22], &[IOERR, 1], "8 WRITE_ZEROES refused");
    assert_eq!(
        std::fs::read(&img).unwrap(),
        before,
        "the file is unchanged"
    );
    let c = &r.report.disks[0].counts;
    assert_eq!((c.bytes_written, c.io_errors), (0, 3), "{c:?}");
}

/// The tiny guest as an ELF `vpmu-vmm run --kernel` takes (loaded and entered at 0x100000).
fn guest_elf(dir: &Path, g: &tiny_guests::TinyGuest) -> PathBuf {
    let p = dir.join(format!("{}.elf", g.name));
    std::fs::write(&p, common::elf_exec(g.image, g.load_addr, g.load_addr, 0)).unwrap();
    p
}

fn vmm_run(kernel: &Path, disk: &str, console: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.args(["run", "--memory", "64", "--timeout", "120", "--kernel"])
        .arg(kernel)
        .args(["--disk", disk])
        .arg("--console")
        .arg(console)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// What a tiny guest of blk_sync_body.inc said of its requests ("tiny: virtio-blk ..."), and
/// the VMM's stderr, from `vpmu-vmm run` with `fdatasync`/`fsync` made to fail with EIO by a
/// seccomp filter installed before exec (`fail_sync`). The VMM is killed once the guest spoke.
fn blk_sync_guest_says(guest: &tiny_guests::TinyGuest, fail_sync: bool) -> (String, String) {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let kernel = guest_elf(dir.path(), guest);
    let img = dir.path().join("sync.img");
    std::fs::write(&img, vec![0u8; (SECTORS * 512) as usize]).unwrap();
    let console = dir.path().join("console");
    let mut cmd = vmm_run(&kernel, img.to_str().unwrap(), &console);
    if fail_sync {
        let filter = seccompiler::SeccompFilter::new(
            [(libc::SYS_fdatasync, vec![]), (libc::SYS_fsync, vec![])]
                .into_iter()
                .collect(),
            seccompiler::SeccompAction::Allow,
            seccompiler::SeccompAction::Errno(libc::EIO as u32),
            seccompiler::TargetArch::x86_64,
        )
        .unwrap();
        let program: seccompiler::BpfProgram = filter.try_into().unwrap();
        // SAFETY: the closure runs in the forked child before exec; apply_filter makes two
        // system calls (prctl(PR_SET_NO_NEW_PRIVS), seccomp) on a program built before the fork
        // and allocates nothing on its way to them.
        unsafe {
            cmd.pre_exec(move || {
                seccompiler::apply_filter(&program).map_err(std::io::Error::other)
            });
        }
    }
    let mut vmm = cmd.spawn().unwrap();
    let t0 = Instant::now();
    let said = loop {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.starts_with("tiny: virtio-blk")) {
            break l.to_string();
        }
        if let Some(st) = vmm.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(vmm.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!(
                "{}: the VMM ended ({st}) before the guest spoke: {err}",
                guest.name
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "{}: {text:?}",
            guest.name
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    vmm.kill().unwrap();
    let out = vmm.wait_with_output().unwrap();
    (said, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The guest hears of a FLUSH (and, where the driver did not accept FLUSH, of each write) only
/// with the result of the `fdatasync` that made it durable: with that system call failing
/// (EIO, injected by a seccomp filter around the real binary), the guest must get IOERR. A VMM
/// that completed the request before calling fdatasync, without calling it, or ignoring its
/// result would tell the guest OK, and this test fails (the SIGKILL test below cannot tell:
/// the page cache outlives the process). Both guests are checked without the failure too.
#[test]
fn a_flush_or_write_through_completes_only_with_fdatasyncs_result() {
    if !kvm_available() {
        return;
    }
    let cases = [
        (&tiny_guests::BLK_SYNC64, "data flushed", "flush failed"),
        (
            &tiny_guests::BLK_WRITETHROUGH64,
            "data written",
            "write failed",
        ),
    ];
    for (guest, ok, failed) in cases {
        let (said, err) = blk_sync_guest_says(guest, false);
        assert_eq!(
            said,
            format!("tiny: virtio-blk {ok}"),
            "{}: {err}",
            guest.name
        );
        let (said, err) = blk_sync_guest_says(guest, true);
        assert_eq!(
            said,
            format!("tiny: virtio-blk {failed}"),
            "{}: {err}",
            guest.name
        );
        assert!(
            err.contains("fdatasync") && err.contains("Input/output error"),
            "{}: the VMM did not report the failed fdatasync: {err}",
            guest.name
        );
    }
}

/// `vpmu-vmm run` that must fail at setup: exit code 1 and `want` in its error.
fn refused(kernel: &Path, disk: &str, dir: &Path, want: &str) {
    let out = vmm_run(kernel, disk, &dir.join("console2"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "--disk {disk}: {stderr}");
    assert!(
        stderr.contains(want),
        "--disk {disk}: want {want:?}: {stderr}"
    );
}

#[test]
fn flushed_data_survives_sigkill_and_the_image_is_locked() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = guest_elf(dir.path(), &tiny_guests::BLK_SYNC64);
    let img = dir.path().join("sync.img");
    std::fs::write(&img, vec![0u8; (SECTORS * 512) as usize]).unwrap();
    let console = dir.path().join("console");
    let disk = img.to_str().unwrap().to_string();
    let mut vmm = vmm_run(&kernel, &disk, &console).spawn().unwrap();
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        if text.contains("tiny: virtio-blk data flushed") {
            break;
        }
        assert!(!text.contains("failed"), "{text}");
        if let Some(st) = vmm.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(vmm.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("the VMM ended ({st}) before the guest flushed: {err}");
        }
        assert!(t0.elapsed() < Duration::from_secs(90), "no flush: {text:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // While it runs, the image is taken: a second VMM is refused, read-only or not.
    let in_use = "the image is in use: another process holds a lock on it";
    refused(&kernel, &disk, dir.path(), in_use);
    refused(&kernel, &format!("{disk},readonly=on"), dir.path(), in_use);

    vmm.kill().unwrap(); // SIGKILL: no clean-up of any kind in the VMM
    let st = vmm.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(9));
    let file = std::fs::read(&img).unwrap();
    assert_eq!(
        &file[8 * 512..16 * 512],
        &pattern(4096)[..],
        "the flushed sectors"
    );
    assert!(
        file[..8 * 512].iter().all(|&b| b == 0),
        "nothing else written"
    );

    // Images that cannot be used: each a clear error and exit code 1.
    refused(
        &kernel,
        "/nonexistent/x.img",
        dir.path(),
        "--disk /nonexistent/x.img: No such file",
    );
    let d = dir.path().to_str().unwrap();
    refused(&kernel, d, dir.path(), "not a regular file");
    let odd = dir.path().join("odd.img");
    std::fs::write(&odd, [0u8; 1000]).unwrap();
    refused(
        &kernel,
        odd.to_str().unwrap(),
        dir.path(),
        "1000 bytes is not a whole number of 512-byte sectors",
    );
}
