//! Property-based fuzzing of the host-side readers a user feeds files to: COM2 result frames
//! (`guest_results::decode`), trace files (`trace::format::Trace::parse`), kallsyms tables in a
//! kernel image (`profile::kallsyms::from_image`), System.map (`SymbolTable::parse_system_map`)
//! and bzImage extraction (`boot::bzimage::extract`, every payload compression); since issue 33
//! also `task-layout` files (`TaskLayout::parse`), a kernel's BTF and symbols
//! (`btf_layout::from_vmlinux`), the guest's profiler outputs (`guest_reports`), the streaming
//! trace reader with the report's text views (which must print no control character), and
//! `--guest-files` ELF files (`user_symbols::GuestFiles`). Debug builds run them too (overflow
//! checks on).
//!
//! Inputs: valid files built here, then damaged (bit flips, byte overwrites, truncation,
//! insertions, length fields set to huge or boundary values), and plain random bytes. Each
//! reader must return (an error, or a result) without panicking, and must not make an
//! allocation out of proportion to its input: a counting global allocator records the largest
//! single allocation made on the reading thread, which must stay under [`alloc_cap`].
//!
//! Short mode (the default): a few hundred inputs per reader. Long mode: `VPMU_FUZZ_CASES=N`
//! (scripts/fuzz-long.sh); the cases run per reader are printed.

mod common;
mod fuzz_common;

use std::io::Write;

use fuzz_common::{cases, largest_allocation};

use analysis::bzimage;
use analysis::guest_results;
use analysis::profile::{kallsyms, symbols::SymbolTable};
use analysis::trace::format::{self, Header, Record, SampleClock, Trace};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// What a reader may allocate at once for an input of `len` bytes: a fixed allowance plus a
/// multiple of the input.
fn alloc_cap(len: usize, factor: usize) -> usize {
    (1 << 20) + factor * len
}

/// What the bzImage extractor may allocate at once: its output cap (`MIN_OUTPUT_CAP` plus
/// `MAX_EXPANSION` times the input), doubled for a growing buffer's last step.
fn bzimage_alloc_cap(len: usize) -> usize {
    2 * (bzimage::MIN_OUTPUT_CAP + bzimage::MAX_EXPANSION * len) + (1 << 20)
}

/// One way to damage an input.
#[derive(Debug, Clone)]
enum Damage {
    FlipBit(usize, u8),
    SetByte(usize, u8),
    /// Overwrite 2, 4 or 8 bytes at a position with a boundary value (huge lengths, counts).
    SetWord(usize, u8, u64),
    Truncate(usize),
    Insert(usize, Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    let word = prop::sample::select(vec![
        0u64,
        1,
        0x7f,
        0xff,
        0x7fff,
        0xffff,
        0x7fff_ffff,
        0xffff_ffff,
        1 << 32,
        u64::MAX,
        u64::MAX / 2,
        0xffff_8000_0000_0000,
    ]);
    prop_oneof![
        4 => (any::<usize>(), 0u8..8).prop_map(|(p, b)| Damage::FlipBit(p, b)),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Damage::SetByte(p, b)),
        3 => (any::<usize>(), prop::sample::select(vec![2u8, 4, 8]), word)
            .prop_map(|(p, w, v)| Damage::SetWord(p, w, v)),
        1 => any::<usize>().prop_map(Damage::Truncate),
        1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(p, v)| Damage::Insert(p, v)),
    ]
}

fn apply(mut b: Vec<u8>, damages: &[Damage]) -> Vec<u8> {
    for d in damages {
        if b.is_empty() {
            break;
        }
        let at = |p: usize| p % b.len();
        match d {
            Damage::FlipBit(p, bit) => {
                let i = at(*p);
                b[i] ^= 1 << bit;
            }
            Damage::SetByte(p, v) => {
                let i = at(*p);
                b[i] = *v;
            }
            Damage::SetWord(p, w, v) => {
                let i = at(*p);
                let n = usize::from(*w).min(b.len() - i);
                b[i..i + n].copy_from_slice(&v.to_le_bytes()[..n]);
            }
            Damage::Truncate(p) => {
                let n = at(*p);
                b.truncate(n);
            }
            Damage::Insert(p, v) => {
                let i = at(*p);
                b.splice(i..i, v.iter().copied());
            }
        }
    }
    b
}

/// Seeds damaged a little, or random bytes.
fn inputs(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => (prop::sample::select(seeds), prop::collection::vec(damage(), 0..6))
            .prop_map(|(s, d)| apply(s, &d)),
        1 => prop::collection::vec(any::<u8>(), 0..2048),
    ]
}

fn fuzz(name: &str, seeds: Vec<Vec<u8>>, cap: impl Fn(usize) -> usize, read: impl Fn(&[u8])) {
    fuzz_n(name, cases(), seeds, cap, read)
}

fn fuzz_n(
    name: &str,
    cases: u32,
    seeds: Vec<Vec<u8>>,
    cap: impl Fn(usize) -> usize,
    read: impl Fn(&[u8]),
) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let r = runner.run(&inputs(seeds), |input| {
        let biggest = largest_allocation(|| read(&input));
        let cap = cap(input.len());
        prop_assert!(
            biggest <= cap,
            "{}: a {}-byte input made a {}-byte allocation (cap {})",
            name,
            input.len(),
            biggest,
            cap
        );
        Ok(())
    });
    if let Err(e) = r {
        panic!("{name}: {e}");
    }
    println!("fuzz surface=reader-{name} cases={cases}");
}

// ---- seeds ----

fn results_stream() -> Vec<Vec<u8>> {
    let frame = |seq: u64, name: &str, payload: &[u8]| {
        let mut f = format!(
            "VPMU-FRAME v1 seq={seq} name={name} mode=cpu len={} crc32={:08x}\n",
            payload.len(),
            crc32fast::hash(payload)
        )
        .into_bytes();
        f.extend_from_slice(payload);
        f.extend_from_slice(format!("\nVPMU-FRAME-END seq={seq}\n").as_bytes());
        f
    };
    let mut s = b"kernel noise\nVPMU-RESULTS-BEGIN v1 experiments=a,b modes=cpu\n".to_vec();
    s.extend(frame(0, "a/perf.txt", b"# perf report\n 10.0% x  [k] f\n"));
    s.extend(b"[   1.0] a kernel line\r\n");
    s.extend(frame(1, "b.bin", &[0, 1, 2, 0xff, b'\n', b'\r']));
    s.extend(b"VPMU-RESULTS-END frames=2\n");
    let mut crlf = Vec::new();
    for &c in &s {
        if c == b'\n' {
            crlf.push(b'\r');
        }
        crlf.push(c);
    }
    // Frame numbers at the top of u64 (the sequence check's arithmetic).
    let mut top = s.clone();
    top.extend(frame(u64::MAX, "c.txt", b"z"));
    top.extend(frame(0, "d.txt", b"w"));
    vec![s, crlf, top]
}

fn trace_file() -> Vec<Vec<u8>> {
    let header = Header {
        vcpus: 2,
        contents: format::CONTENTS_EXITS | format::CONTENTS_SAMPLES,
        tsc_khz: 2_000_000,
        start_tsc: 1000,
        sample_clock: SampleClock::CpuSwitch,
        sample_period_ns: 1_000_000,
        kernel: "/boot/vmlinuz".into(),
    };
    let mut f = header.encode();
    let records = [
        Record::Clock {
            tsc: 1100,
            thread_cpu_ns: 5,
        },
        Record::Sample {
            rip: 0xffff_ffff_8100_0000,
            cpl: 0,
            tsc: 1200,
            during: None,
            mode: Some(vpmu::AccountingMode::CpuSwitch),
        },
    ];
    for vcpu in 0..2u16 {
        let mut body = Vec::new();
        for r in &records {
            let mut b = [0u8; format::RECORD_SIZE];
            r.encode(&mut b);
            body.extend_from_slice(&b);
        }
        f.extend(format::block_header(vcpu, false, 2, 0, &body));
        f.extend(&body);
        let end = format::end_record(2000, 0, 77);
        f.extend(format::block_header(vcpu, true, 1, 0, &end));
        f.extend(end);
    }
    Trace::parse(&f).expect("the seed trace is valid");
    vec![f]
}

/// A kernel image holding kallsyms tables (the layout of Linux 6.4+: offsets after the token
/// index), found by the reader's scan.
fn kallsyms_image() -> Vec<Vec<u8>> {
    let align8 = |b: &mut Vec<u8>| b.resize(b.len().next_multiple_of(8), 0);
    let n = 40usize;
    let base = 0xffff_ffff_8100_0000u64;
    let mut b = vec![0xeeu8; 64];
    b.extend_from_slice(&(n as u32).to_le_bytes());
    b.extend_from_slice(&[0; 4]);
    let mut names = Vec::new();
    let mut markers = Vec::new();
    for i in 0..n {
        if i % 256 == 0 {
            markers.push(names.len() as u32);
        }
        let codes = format!("Tf{i}").into_bytes();
        names.push(codes.len() as u8);
        names.extend_from_slice(&codes);
    }
    b.extend_from_slice(&names);
    align8(&mut b);
    for m in markers {
        b.extend_from_slice(&m.to_le_bytes());
    }
    align8(&mut b);
    let table_at = b.len();
    let mut index = Vec::new();
    for i in 0..256u32 {
        index.push((b.len() - table_at) as u16);
        match i {
            0x20..=0x7e => b.push(i as u8),
            _ => b.extend_from_slice(&[b'x', (i % 26) as u8 + b'a']),
        }
        b.push(0);
    }
    align8(&mut b);
    for i in index {
        b.extend_from_slice(&i.to_le_bytes());
    }
    align8(&mut b);
    for i in 0..n {
        b.extend_from_slice(&(0x10 * i as u32).to_le_bytes());
    }
    align8(&mut b);
    b.extend_from_slice(&base.to_le_bytes());
    b.extend_from_slice(&[0xee; 64]);
    let syms = kallsyms::from_vmlinux(&b).expect("the seed tables are found");
    assert_eq!(syms.len(), n);
    // The same bytes behind an ELF64 header whose section and program header fields point
    // into the file (the reader tries the ELF symbol table first).
    let mut elf = vec![0u8; 64];
    elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
    elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes()); // phoff
    elf[0x28..0x30].copy_from_slice(&64u64.to_le_bytes()); // shoff
    elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
    elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
    elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    elf[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
    let mut sh = vec![0u8; 128];
    sh[4] = 2; // SHT_SYMTAB
    sh[0x28..0x2c].copy_from_slice(&1u32.to_le_bytes()); // sh_link: the string table
    sh[0x18..0x20].copy_from_slice(&256u64.to_le_bytes());
    sh[0x20..0x28].copy_from_slice(&48u64.to_le_bytes());
    sh[64 + 0x18..64 + 0x20].copy_from_slice(&320u64.to_le_bytes());
    elf.extend(sh);
    elf.resize(256, 0);
    elf.extend(std::iter::repeat_n(0x41, 64));
    elf.extend_from_slice(&b);
    vec![b, elf]
}

fn system_map() -> Vec<Vec<u8>> {
    let mut s = String::new();
    for i in 0..50u64 {
        let kind = ["T", "t", "D", "W", "r"][i as usize % 5];
        s.push_str(&format!(
            "{:016x} {kind} sym_{i}\n",
            0xffff_ffff_8100_0000 + 0x40 * i
        ));
    }
    vec![s.into_bytes()]
}

const FAKE_ELF: &[u8] =
    b"\x7fELF\x02\x01\x01 a pretend kernel, repeated repeated repeated repeated";

fn bzimage_with(payload: &[u8]) -> Vec<u8> {
    let mut img = vec![0u8; 1024];
    img[0x1f1] = 1;
    img[0x201] = 0x6a;
    img[0x202..0x206].copy_from_slice(b"HdrS");
    img[0x206..0x208].copy_from_slice(&0x20fu16.to_le_bytes());
    img[0x248..0x24c].copy_from_slice(&16u32.to_le_bytes());
    img[0x24c..0x250].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    img.extend_from_slice(&[0u8; 16]);
    img.extend_from_slice(payload);
    img.extend_from_slice(&[0xaa; 64]);
    img
}

/// `stream` followed by the uncompressed size, as the kernel's `size_append` writes it.
fn with_size(mut stream: Vec<u8>, size: usize) -> Vec<u8> {
    stream.extend_from_slice(&(size as u32).to_le_bytes());
    stream
}

/// One bzImage per payload format, each laid out as the kernel's build lays it out (the
/// compressed stream, then its uncompressed size; gzip's own trailer is that size). Small
/// dictionaries and windows keep the cases fast: the layout is the kernel's.
fn bzimages() -> Vec<Vec<u8>> {
    use liblzma::stream::{Check, Filters, LzmaOptions, Stream};
    let n = FAKE_ELF.len();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(FAKE_ELF).unwrap();
    let gz = gz.finish().unwrap();
    let mut opts = LzmaOptions::new_preset(6).unwrap();
    opts.dict_size(1 << 16);
    let mut filters = Filters::new();
    filters.x86();
    filters.lzma2(&opts);
    let xz_stream = Stream::new_stream_encoder(&filters, Check::Crc32).unwrap();
    let mut xz = liblzma::write::XzEncoder::new_stream(Vec::new(), xz_stream);
    xz.write_all(FAKE_ELF).unwrap();
    let xz = with_size(xz.finish().unwrap(), n);
    let lzma_stream = Stream::new_lzma_encoder(&opts).unwrap();
    let mut lzma = liblzma::write::XzEncoder::new_stream(Vec::new(), lzma_stream);
    lzma.write_all(FAKE_ELF).unwrap();
    let lzma = with_size(lzma.finish().unwrap(), n);
    let mut bz2 = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
    bz2.write_all(FAKE_ELF).unwrap();
    let bz2 = with_size(bz2.finish().unwrap(), n);
    let mut zstd = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
    zstd.include_checksum(true).unwrap();
    zstd.write_all(FAKE_ELF).unwrap();
    let zstd = with_size(zstd.finish().unwrap(), n);
    let mut lz4 = 0x184c_2102u32.to_le_bytes().to_vec();
    let block = lz4_flex::block::compress(FAKE_ELF);
    lz4.extend_from_slice(&(block.len() as u32).to_le_bytes());
    lz4.extend_from_slice(&block);
    let lz4 = with_size(lz4, n);
    let seeds: Vec<Vec<u8>> = [FAKE_ELF.to_vec(), gz, xz, lzma, bz2, zstd, lz4]
        .iter()
        .map(|p| bzimage_with(p))
        .collect();
    for s in &seeds {
        bzimage::extract(s).expect("the seed bzImage is valid");
    }
    seeds
}

// ---- the fuzz tests ----

#[test]
fn guest_results_decoder_survives_damaged_streams() {
    fuzz(
        "guest-results",
        results_stream(),
        |n| alloc_cap(n, 4),
        |b| {
            let d = guest_results::decode(b);
            // Every frame it accepts is whole and checked.
            for f in &d.frames {
                assert!(guest_results::safe_name(&f.name));
            }
        },
    );
}

#[test]
fn trace_reader_survives_damaged_files() {
    fuzz(
        "trace",
        trace_file(),
        |n| alloc_cap(n, 4),
        |b| {
            let _ = Trace::parse(b).map_err(|e| e.to_string());
        },
    );
}

#[test]
fn kallsyms_reader_survives_damaged_images() {
    fuzz(
        "kallsyms",
        kallsyms_image(),
        |n| alloc_cap(n, 8),
        |b| {
            let _ = kallsyms::from_image(b).map_err(|e| e.to_string());
            let _ = kallsyms::from_vmlinux(b).map_err(|e| e.to_string());
        },
    );
}

#[test]
fn system_map_reader_survives_damaged_text() {
    fuzz(
        "system-map",
        system_map(),
        |n| alloc_cap(n, 4),
        |b| {
            let text = String::from_utf8_lossy(b);
            if let Ok(t) = SymbolTable::parse_system_map(&text, "fuzz") {
                for addr in [0, u64::MAX, 0xffff_ffff_8100_0040] {
                    let _ = t.resolve(addr);
                }
            }
        },
    );
}

#[test]
fn bzimage_extractor_survives_damaged_images() {
    fuzz("bzimage", bzimages(), bzimage_alloc_cap, |b| {
        let _ = bzimage::extract(b).map_err(|e| e.to_string());
    });
}

/// Regression: a gzip payload that inflates far beyond any kernel (a decompression bomb) is
/// refused with one error instead of being inflated into memory.
#[test]
fn bzimage_decompression_bomb_is_refused() {
    let zeros = vec![0u8; 64 << 20];
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(b"\x7fELF").unwrap();
    gz.write_all(&zeros).unwrap();
    let gz = gz.finish().unwrap();
    assert!(gz.len() < 1 << 20, "{} bytes", gz.len());
    let img = bzimage_with(&gz);
    let biggest = largest_allocation(|| {
        let e = bzimage::extract(&img).unwrap_err();
        assert!(e.to_string().contains("expands past"), "{e}");
    });
    assert!(
        biggest <= bzimage_alloc_cap(img.len()),
        "{biggest} bytes at once"
    );
}

/// Regression: ELF header fields near the top of the address space made the kallsyms reader's
/// offset arithmetic overflow (a panic in debug builds).
#[test]
fn kallsyms_elf_fields_at_the_top_of_the_address_space_are_refused() {
    let mut elf = kallsyms_image().pop().unwrap();
    for (at, len) in [(0x20, 8), (0x28, 8)] {
        let mut b = elf.clone();
        b[at..at + len].copy_from_slice(&u64::MAX.to_le_bytes()[..len]);
        let _ = kallsyms::from_vmlinux(&b);
    }
    // Symbol table offset and size at the top.
    elf[64 + 0x18..64 + 0x20].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
    let _ = kallsyms::from_vmlinux(&elf);
}

/// Regression: a header claiming 65535 vCPUs made the reader allocate state for all of them
/// before it looked at the (tiny) rest of the file.
#[test]
fn trace_with_more_vcpus_than_the_file_can_hold_is_truncated() {
    let mut f = trace_file().pop().unwrap();
    f[12..14].copy_from_slice(&u16::MAX.to_le_bytes());
    let biggest = largest_allocation(|| {
        let e = Trace::parse(&f).unwrap_err();
        assert!(e.to_string().contains("end blocks"), "{e}");
    });
    assert!(biggest < 64 << 10, "{biggest} bytes at once");
}

/// Regression: kallsyms tables close to the start of the image (no room for the pre-6.4
/// offsets table before them) were not found at all.
#[test]
fn kallsyms_tables_near_the_start_of_the_image_are_found() {
    let b = kallsyms_image().swap_remove(0);
    assert_eq!(kallsyms::from_vmlinux(&b).unwrap()[3].name, "f3");
}

/// Regression: a bzImage cut off right after its "HdrS" magic (0x207 bytes) panicked reading
/// the protocol version.
#[test]
fn bzimage_cut_inside_the_setup_header_is_an_error() {
    let img = bzimages().swap_remove(0);
    for len in [0x207, 0x208, 0x24f] {
        let e = bzimage::extract(&img[..len]).unwrap_err();
        assert!(e.to_string().contains("cut short"), "{len:#x}: {e}");
    }
}

/// The frames a guest transmits reach the pinger (`Pinger::from_guest`, `packet::parse`): echo
/// replies and ARP requests, damaged, and random bytes. It must count every frame and answer
/// at most an ARP reply, never panic.
#[test]
fn guest_frames_reach_the_pinger_safely() {
    use runtime::net::packet;
    use runtime::net::pinger::{Pinger, ECHO_ID, GUEST_IP, GUEST_MAC, HOST_IP, HOST_MAC};
    let mut seeds = Vec::new();
    for seq in 0..4u16 {
        let payload: Vec<u8> = (0..56).map(|i| (seq as u8).wrapping_add(i)).collect();
        seeds.push(packet::echo(
            true, GUEST_MAC, HOST_MAC, GUEST_IP, HOST_IP, ECHO_ID, seq, &payload,
        ));
    }
    seeds.push(packet::arp(false, GUEST_MAC, GUEST_IP, [0; 6], HOST_IP));
    let pinger = std::cell::RefCell::new(Pinger::new(1));
    let now = std::time::Instant::now();
    pinger.borrow_mut().start(now);
    fuzz(
        "guest-frames",
        seeds,
        |n| alloc_cap(n, 4),
        |b| {
            let mut p = pinger.borrow_mut();
            let before = p.stats().tx_frames;
            let _ = packet::parse(b).map_err(|e| e.to_string());
            if let Some(answer) = p.from_guest(b, now) {
                assert!(matches!(
                    packet::parse(&answer),
                    Ok(packet::Frame::Arp { reply: true, .. })
                ));
            }
            assert_eq!(p.stats().tx_frames, before + 1);
        },
    );
}

/// A minimal x86-64 ELF vmlinux: one PT_LOAD segment of `code` at 1 MiB, entry at its start.
fn tiny_vmlinux(code: &[u8]) -> Vec<u8> {
    common::elf_exec(code, 0x10_0000, 0x10_0000, 0x1000)
}

/// The kernel loader (`boot::kernel::load`: bzImage extraction, then linux-loader's ELF loader
/// into guest memory, then the zero page) on damaged ELF and bzImage kernels.
#[test]
fn kernel_loader_survives_damaged_kernels() {
    use vm_memory::{GuestAddress, GuestMemoryMmap};
    let elf = tiny_vmlinux(&[0xf4; 256]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&elf).unwrap();
    let bz = bzimage_with(&gz.finish().unwrap());
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kernel");
    for seed in [&elf, &bz] {
        std::fs::write(&path, seed).unwrap();
        runtime::boot::kernel::load(&mem, &path, None, "console=ttyS0", None)
            .expect("the seed kernel loads");
    }
    // A tenth of the cases: each one writes a file and loads it into guest memory.
    let n = (cases() / 10).max(30);
    fuzz_n("kernel-loader", n, vec![elf, bz], bzimage_alloc_cap, |b| {
        std::fs::write(&path, b).unwrap();
        let _ = runtime::boot::kernel::load(&mem, &path, None, "console=ttyS0", None)
            .map_err(|e| e.to_string());
    });
}

/// The RDPMC site finder (`pmu::rdpmc::find_sites`, `find_sites_flat`) on damaged kernels: it
/// decodes the guest kernel's code, which the user supplies.
#[test]
fn rdpmc_site_finder_survives_damaged_kernels() {
    use runtime::pmu::rdpmc;
    // mov ecx, 0x40000000; rdpmc; ret, between halts.
    let code = [
        &[0xf4u8; 16][..],
        &[0xb9, 0x00, 0x00, 0x00, 0x40, 0x0f, 0x33, 0xc3],
        &[0xf4; 16],
    ]
    .concat();
    let elf = tiny_vmlinux(&code);
    let sites = rdpmc::find_sites(&elf).expect("the seed kernel decodes");
    assert_eq!(sites.len(), 1, "{sites:?}");
    fuzz(
        "rdpmc-sites",
        vec![elf, code],
        |n| alloc_cap(n, 64),
        |b| {
            let _ = rdpmc::find_sites(b).map_err(|e| e.to_string());
            let _ = rdpmc::find_sites_flat(b, 0x10_0000).map_err(|e| e.to_string());
            let _ = rdpmc::find_sites_flat(b, u64::MAX - 8).map_err(|e| e.to_string());
        },
    );
}

/// Regression: code whose addresses wrap past 2^64 (a flat image at the top of the address
/// space, or an ELF section or segment placed there) made the RDPMC site finder's offset
/// arithmetic overflow (a panic in debug builds).
#[test]
fn rdpmc_code_that_wraps_the_address_space_is_refused() {
    use runtime::pmu::rdpmc;
    let code = [0xb9, 0x00, 0x00, 0x00, 0x40, 0x0f, 0x33, 0xc3];
    let e = rdpmc::find_sites_flat(&code, u64::MAX - 4).unwrap_err();
    assert!(e.to_string().contains("wraps"), "{e}");
    let mut elf = tiny_vmlinux(&code);
    // The segment's vaddr near the top: no section headers, so the segment is the code.
    elf[64 + 16..64 + 24].copy_from_slice(&(u64::MAX - 4).to_le_bytes());
    let e = rdpmc::find_sites(&elf).unwrap_err();
    assert!(e.to_string().contains("wraps"), "{e}");
}

// ---- issue 33: the other files a user hands in ----

/// A task-layout file as guest-image/build.sh writes one (6.1, x86-64, with the memory map).
const TASK_LAYOUT: &str = "# vpmu task layout v1\n\
    banner Linux version 6.1.0 (fuzz) #1 SMP\n\
    symbol __per_cpu_offset 0xffffffff82000000\n\
    symbol current_task 0x1fc40\n\
    symbol linux_banner 0xffffffff81e00100\n\
    value nr_cpus 8\n\
    value task_struct_pid 1000\n\
    value task_struct_tgid 1004\n\
    value task_struct_comm 1800\n\
    value task_struct_flags 44\n\
    value task_struct_size 4096\n\
    value pf_kthread 2097152\n\
    value task_struct_mm 900\n\
    value mm_struct_exe_file 900\n\
    value mm_struct_start_code 300\n\
    value mm_struct_end_code 308\n\
    value file_f_path 16\n\
    value path_dentry 8\n\
    value dentry_d_name 32\n\
    value qstr_name 8\n\
    value mm_struct_mm_mt 64\n\
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

/// The layout with one number replaced by each boundary value (the byte-level damage rarely
/// writes a whole number).
fn task_layouts() -> Vec<Vec<u8>> {
    let mut seeds = vec![TASK_LAYOUT.as_bytes().to_vec()];
    let lines: Vec<&str> = TASK_LAYOUT.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let Some((head, _)) = line.rsplit_once(' ') else {
            continue;
        };
        if !(line.starts_with("value") || line.starts_with("symbol")) {
            continue;
        }
        for v in [
            "0",
            "18446744073709551615",
            "18446744073709551608",
            "0x8000000000000000",
            "65536",
            "255",
        ] {
            let mut l = lines.clone();
            let new = format!("{head} {v}");
            l[i] = &new;
            seeds.push((l.join("\n") + "\n").into_bytes());
        }
    }
    seeds
}

/// `task-layout` files (read automatically from beside the kernel): a layout is accepted whole
/// and checked, or refused with a typed error.
#[test]
fn task_layout_reader_survives_damaged_files() {
    use runtime::profile::guest_task::TaskLayout;
    let seeds = task_layouts();
    assert!(TaskLayout::parse(TASK_LAYOUT).unwrap().maps.is_some());
    fuzz(
        "task-layout",
        seeds,
        |n| alloc_cap(n, 4),
        |b| {
            let text = String::from_utf8_lossy(b);
            if let Ok(l) = TaskLayout::parse(&text) {
                // What the sample-time reader relies on.
                assert!(l.task_size <= 1 << 16 && (1..=8192).contains(&l.nr_cpus));
                assert!(l.task_comm + 15 <= l.task_size && l.task_mm + 8 <= l.task_size);
                assert!(l.file_dentry <= 1 << 16 && l.dentry_name <= 1 << 16);
                // A layout that is taken steers the sample-time reader on the vCPU thread:
                // over any guest memory its lookups end with a reason, never out of bounds
                // (__per_cpu_offset may be any address: the reader adds to it checked).
                let l = std::sync::Arc::new(l);
                for seed in 0..4u64 {
                    let mut r =
                        runtime::profile::guest_task::TaskReader::new(l.clone(), seed as u32);
                    let mut mem = JunkMemory(
                        seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                        l.linux_banner,
                        l.banner.as_bytes().to_vec(),
                    );
                    for rip in [0x40_1000, 0x7f00_0000_1234, u64::MAX, 0] {
                        let _ = r.current_user(&mut mem, rip);
                    }
                }
            }
        },
    );
}

/// The readers of the profilers' outputs a guest sends back (`guest_reports`): text from the
/// guest, any bytes.
fn guest_report_texts() -> Vec<Vec<u8>> {
    [
        "# Samples: 1K of event 'cycles'\n# Event count (approx.): 123\n#\n# Overhead  Command  Shared Object  Symbol\n    40.00%  spin  spin  [.] spin_loop\n    10.00%  spin  [kernel.kallsyms]  [k] do_syscall_64\n",
        "CPU: Intel, speed 2000 MHz\nsamples  %        image name  symbol name\n4000     80.0000  spin        spin_loop\n1000     20.0000  vmlinux     do_idle\n",
        "123456,,cycles,1000,100.00,,\n<not supported>,,instructions,0,100.00,,\n99,,cycles:u,1000,100.00,,\n",
        "Event counts (actual) for /bin/spin:\n\tEvent\tCount\t% time counted\n\tCPU_CLK_UNHALTED\t123,456\t100.00\n",
        "cpu  1 2 3 4 5 6 7 8 9 10\ncpu  2 3 4 5 6 7 8 900 9 10\n",
        "step perf: ok\nstep operf: FAIL (rc=1)\nstep ocount: ok\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

#[test]
fn guest_report_readers_survive_damaged_text() {
    use analysis::guest_reports as g;
    fuzz(
        "guest-reports",
        guest_report_texts(),
        |n| alloc_cap(n, 8),
        |b| {
            let text = String::from_utf8_lossy(b);
            let _ = g::perf_stat_count(&text, "cycles");
            let _ = g::proc_stat_steal_ms(&text);
            let _ = g::perf_report_share(&text, "spin_loop");
            let _ = g::opreport_share(&text, "spin_loop");
            let _ = g::perf_report_samples(&text);
            let _ = g::opreport_samples(&text);
            let _ = g::ocount_counts(&text);
            for line in text.lines() {
                let _ = g::failed_steps(line);
                let _ = g::step_log(line);
            }
            let _ = g::log_tail(&text, 5);
        },
    );
}

/// A trace whose samples name a task, an executable and a mapping, with names a hostile guest
/// could give (ESC sequences, a newline, bytes that are not UTF-8).
fn trace_with_tasks() -> Vec<Vec<u8>> {
    use runtime::profile::guest_task::GuestMapping;
    use runtime::profile::guest_task::{GuestExe, GuestTask, EXE_NAME_MAX};
    let header = Header {
        vcpus: 1,
        contents: format::CONTENTS_SAMPLES,
        tsc_khz: 2_000_000,
        start_tsc: 1000,
        sample_clock: SampleClock::CpuSwitch,
        sample_period_ns: 1_000_000,
        kernel: "/boot/vmlinuz".into(),
    };
    let mut comm = [0u8; 15];
    comm[..9].copy_from_slice(b"\x1b[2J\nab\xff\x07");
    let mut name = [0u8; EXE_NAME_MAX];
    name[..8].copy_from_slice(b"\x1b]0;x\x07\n\xfe");
    let sample = |rip| Record::Sample {
        rip,
        cpl: 3,
        tsc: 1200,
        during: None,
        mode: Some(vpmu::AccountingMode::CpuSwitch),
    };
    let records = [
        sample(0x40_1000),
        Record::Task {
            cr3: 0x5000,
            task: Ok(GuestTask {
                pid: 7,
                tgid: 7,
                comm,
                kernel_thread: false,
            }),
        },
        Record::Exe(Ok(GuestExe {
            name,
            name_len: 8,
            start_code: 0x40_0000,
            code_size: 0x2000,
        })),
        sample(0x7f00_0000_1000),
        Record::Task {
            cr3: 0x5000,
            task: Ok(GuestTask {
                pid: 7,
                tgid: 7,
                comm,
                kernel_thread: false,
            }),
        },
        Record::Mapping(Ok(GuestMapping {
            name,
            name_len: 8,
            vm_start: 0x7f00_0000_0000,
            pgoff: 1,
        })),
    ];
    let mut f = header.encode();
    let mut body = Vec::new();
    for r in &records {
        let mut b = [0u8; format::RECORD_SIZE];
        r.encode(&mut b);
        body.extend_from_slice(&b);
    }
    f.extend(format::block_header(
        0,
        false,
        records.len() as u32,
        0,
        &body,
    ));
    f.extend(&body);
    let end = format::end_record(2000, 0, 77);
    f.extend(format::block_header(0, true, 1, 0, &end));
    f.extend(end);
    Trace::parse(&f).expect("the seed trace is valid");
    vec![f]
}

/// The streaming trace reader (`trace::read`, what `report` and `trace summary` use) and the
/// report's views over it: whatever the file says, the text views print no control byte but
/// the newline ending each row.
#[test]
fn streaming_trace_reader_and_report_views_survive_damaged_files() {
    use analysis::profile::{report, stacks};
    use analysis::trace::read::{for_each_sample, Records, TraceFile};
    let mut seeds = trace_file();
    seeds.extend(trace_with_tasks());
    fuzz(
        "trace-stream",
        seeds,
        |n| alloc_cap(n, 8),
        |b| {
            let Ok(t) = TraceFile::from_bytes(b.to_vec()) else {
                return;
            };
            let _ = t.load().map_err(|e| e.to_string());
            let _ = for_each_sample(&t, &mut |_, _, _| {});
            for v in 0..usize::from(t.header().vcpus) {
                for r in t.vcpu_records(v).take(64) {
                    if r.is_err() {
                        break;
                    }
                }
            }
            if let Ok(s) = analysis::trace::summary::summarize(&t) {
                let _ = analysis::trace::summary::render(&t, &s, "fuzz");
            }
            let _ = analysis::trace::summary::dump(&t, &mut std::io::sink());
            if let Ok(rows) = report::system_wide(&t, None) {
                let _ = report::render_system_wide(&t, &rows, 0);
            }
            if let Ok(per_sample) = stacks::samples(&t, None, None, None) {
                let rows = stacks::by_process(&per_sample);
                let text = report::render_by_process(&rows, 0) + &stacks::folded(&per_sample);
                assert!(
                    !text.chars().any(|c| c.is_control() && c != '\n'),
                    "a control character in the text views: {text:?}"
                );
            }
        },
    );
}

/// A section header's fields: (name, type, flags, addr, offset, size, link, info, entsize).
type ElfSection = (String, u32, u64, u64, u64, u64, u32, u32, u64);

/// A 64-bit ELF with one executable PT_LOAD segment (`code` at `vaddr`) and sections: `.text`,
/// a symbol table of `symbols` (name, address, size; functions in `.text`), and `extra`
/// (name, bytes) sections such as `.BTF`.
fn elf_with_symbols(
    code: &[u8],
    vaddr: u64,
    symbols: &[(&str, u64, u64)],
    extra: &[(&str, Vec<u8>)],
) -> Vec<u8> {
    let mut f = common::elf_exec(code, vaddr, vaddr, 0x1000);
    let align8 = |f: &mut Vec<u8>| f.resize(f.len().next_multiple_of(8), 0);
    let mut sections: Vec<ElfSection> = vec![(
        ".text".into(),
        1,
        6,
        vaddr,
        0x78,
        code.len() as u64,
        0,
        0,
        0,
    )];
    let mut strtab = vec![0u8];
    let mut symtab = vec![0u8; 24];
    for (name, addr, size) in symbols {
        let mut s = [0u8; 24];
        s[0..4].copy_from_slice(&(strtab.len() as u32).to_le_bytes());
        s[4] = 0x12; // STB_GLOBAL, STT_FUNC
        s[6..8].copy_from_slice(&1u16.to_le_bytes()); // .text
        s[8..16].copy_from_slice(&addr.to_le_bytes());
        s[16..24].copy_from_slice(&size.to_le_bytes());
        symtab.extend_from_slice(&s);
        strtab.extend_from_slice(name.as_bytes());
        strtab.push(0);
    }
    align8(&mut f);
    sections.push((
        ".symtab".into(),
        2,
        0,
        0,
        f.len() as u64,
        symtab.len() as u64,
        3,
        1,
        24,
    ));
    f.extend(&symtab);
    sections.push((
        ".strtab".into(),
        3,
        0,
        0,
        f.len() as u64,
        strtab.len() as u64,
        0,
        0,
        0,
    ));
    f.extend(&strtab);
    for (name, bytes) in extra {
        align8(&mut f);
        sections.push((
            name.to_string(),
            1,
            0,
            0,
            f.len() as u64,
            bytes.len() as u64,
            0,
            0,
            0,
        ));
        f.extend(bytes);
    }
    let mut shstrtab = vec![0u8];
    let mut names = Vec::new();
    for s in sections
        .iter()
        .map(|s| s.0.clone())
        .chain([".shstrtab".to_string()])
    {
        names.push(shstrtab.len() as u32);
        shstrtab.extend_from_slice(s.as_bytes());
        shstrtab.push(0);
    }
    sections.push((
        ".shstrtab".into(),
        3,
        0,
        0,
        f.len() as u64,
        shstrtab.len() as u64,
        0,
        0,
        0,
    ));
    f.extend(&shstrtab);
    align8(&mut f);
    let shoff = f.len() as u64;
    f.extend([0u8; 64]);
    for (i, (_, ty, flags, addr, off, size, link, info, entsize)) in sections.iter().enumerate() {
        let mut h = [0u8; 64];
        h[0..4].copy_from_slice(&names[i].to_le_bytes());
        h[4..8].copy_from_slice(&ty.to_le_bytes());
        h[8..16].copy_from_slice(&flags.to_le_bytes());
        h[16..24].copy_from_slice(&addr.to_le_bytes());
        h[24..32].copy_from_slice(&off.to_le_bytes());
        h[32..40].copy_from_slice(&size.to_le_bytes());
        h[40..44].copy_from_slice(&link.to_le_bytes());
        h[44..48].copy_from_slice(&info.to_le_bytes());
        h[48..56].copy_from_slice(&8u64.to_le_bytes());
        h[56..64].copy_from_slice(&entsize.to_le_bytes());
        f.extend(h);
    }
    f[40..48].copy_from_slice(&shoff.to_le_bytes());
    f[58..60].copy_from_slice(&64u16.to_le_bytes()); // shentsize
    f[60..62].copy_from_slice(&((sections.len() + 1) as u16).to_le_bytes());
    f[62..64].copy_from_slice(&(sections.len() as u16).to_le_bytes()); // shstrndx
    f
}

/// `--guest-files`: ELF files from the guest's root filesystem, parsed when a sample names
/// them. Each case is one file in a directory, looked up as an executable and as a library.
#[test]
fn guest_files_reader_survives_damaged_elf_files() {
    use analysis::profile::user_symbols::{exe_name_bytes, GuestFiles, UserFrame};
    use runtime::profile::guest_task::GuestExe;
    use runtime::profile::guest_task::GuestMapping;
    let vaddr = 0x40_1000u64;
    let mut code = vec![0x90u8; 0x100];
    code[..8].copy_from_slice(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5]);
    code[0x40..0x45].copy_from_slice(&[0xe8, 0, 0, 0, 0]);
    let symbols = [
        ("main", vaddr, 0x40),
        ("leaf", vaddr + 0x40, 0x40),
        ("top", u64::MAX - 8, u64::MAX),
    ];
    let seed = elf_with_symbols(&code, vaddr, &symbols, &[]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prog");
    let (name, name_len) = exe_name_bytes("prog");
    let exe = GuestExe {
        name,
        name_len,
        start_code: vaddr,
        code_size: code.len() as u32,
    };
    let mapping = GuestMapping {
        name,
        name_len,
        vm_start: vaddr,
        pgoff: 0,
    };
    std::fs::write(&path, &seed).unwrap();
    let mut files = GuestFiles::open(dir.path()).unwrap();
    assert!(
        matches!(files.resolve(&exe, vaddr + 8), UserFrame::Resolved { function, .. } if function == "main")
    );
    let n = (cases() / 10).max(30);
    fuzz_n(
        "guest-files",
        n,
        vec![seed],
        |n| alloc_cap(n, 8),
        |b| {
            std::fs::write(&path, b).unwrap();
            let mut files = GuestFiles::open(dir.path()).unwrap();
            for rip in [vaddr, vaddr + 0x45, u64::MAX, 0] {
                let _ = files.resolve(&exe, rip);
                let _ = files.frameless_caller(&exe, rip, [vaddr + 0x45, u64::MAX]);
                let _ = files.resolve_mapping(&mapping, rip);
                let _ = files.caller_in_mapping(&mapping, rip);
            }
        },
    );
}

/// A struct's members: (name, type id, byte offset).
type BtfMembers = &'static [(&'static str, u32, u32)];

/// A minimal `.BTF` section: an 8-byte int, a 16-element array of it, and the structs
/// `btf_layout` reads (task_struct, mm_struct, file, path, dentry) with their members.
fn btf_section() -> Vec<u8> {
    let mut strings = vec![0u8];
    let mut name = |s: &str| {
        let at = strings.len() as u32;
        strings.extend_from_slice(s.as_bytes());
        strings.push(0);
        at
    };
    let mut types = Vec::new();
    let put = |t: &mut Vec<u8>, words: &[u32]| {
        for w in words {
            t.extend_from_slice(&w.to_le_bytes());
        }
    };
    // 1: int "long", 8 bytes, 64 bits.
    put(&mut types, &[name("long"), 1 << 24, 8, 64]);
    // 2: long[16].
    put(&mut types, &[0, 3 << 24, 0, 1, 1, 16]);
    let structs: [(&str, u32, BtfMembers); 5] = [
        (
            "task_struct",
            4096,
            &[
                ("stack", 1, 24),
                ("flags", 1, 44),
                ("mm", 1, 900),
                ("pid", 1, 1000),
                ("tgid", 1, 1004),
                ("group_leader", 1, 1100),
                ("comm", 2, 1800),
            ],
        ),
        (
            "mm_struct",
            1024,
            &[
                ("pgd", 1, 80),
                ("start_code", 1, 300),
                ("end_code", 1, 308),
                ("exe_file", 1, 900),
            ],
        ),
        ("file", 256, &[("f_path", 1, 16)]),
        ("path", 16, &[("dentry", 1, 8)]),
        ("dentry", 192, &[("d_name", 1, 32)]),
    ];
    for (s, size, members) in structs {
        put(
            &mut types,
            &[name(s), (4 << 24) | members.len() as u32, size],
        );
        for (m, ty, off) in members {
            put(&mut types, &[name(m), *ty, off * 8]);
        }
    }
    let mut b = Vec::new();
    b.extend_from_slice(&0xeb9fu16.to_le_bytes());
    b.extend_from_slice(&[1, 0]);
    for w in [
        24u32,
        0,
        types.len() as u32,
        types.len() as u32,
        strings.len() as u32,
    ] {
        b.extend_from_slice(&w.to_le_bytes());
    }
    b.extend(types);
    b.extend(strings);
    b
}

/// Kallsyms tables (Linux 6.1's layout, absolute per-CPU symbols) for `syms` (kind and name,
/// offset as the kernel stores it) and `base`; returns the bytes and where each table starts, in
/// the order `kallsyms::from_vmlinux` looks the ELF symbols up: num_syms, names, markers,
/// token_table, token_index, offsets, relative_base.
fn kallsyms_tables(syms: &[(&str, i32)], base: u64) -> (Vec<u8>, [usize; 7]) {
    let align8 = |b: &mut Vec<u8>| b.resize(b.len().next_multiple_of(8), 0);
    let mut at = [0usize; 7];
    let mut b = (syms.len() as u32).to_le_bytes().to_vec();
    align8(&mut b);
    at[1] = b.len();
    for (name, _) in syms {
        // Each byte is a token standing for itself (the token table below).
        b.push(name.len() as u8);
        b.extend_from_slice(name.as_bytes());
    }
    align8(&mut b);
    at[2] = b.len();
    b.extend_from_slice(&0u32.to_le_bytes());
    align8(&mut b);
    at[3] = b.len();
    let mut index = Vec::new();
    for i in 0..256u32 {
        index.push((b.len() - at[3]) as u16);
        match i {
            0x20..=0x7e => b.push(i as u8),
            _ => b.extend_from_slice(&[b'x', (i % 26) as u8 + b'a']),
        }
        b.push(0);
    }
    align8(&mut b);
    at[4] = b.len();
    for i in index {
        b.extend_from_slice(&i.to_le_bytes());
    }
    align8(&mut b);
    at[5] = b.len();
    for (_, off) in syms {
        b.extend_from_slice(&off.to_le_bytes());
    }
    align8(&mut b);
    at[6] = b.len();
    b.extend_from_slice(&base.to_le_bytes());
    (b, at)
}

/// `task-layout KERNEL`: the kernel's BTF and symbols (a vmlinux the user hands in).
#[test]
fn btf_layout_reader_survives_damaged_kernels() {
    use runtime::profile::btf_layout;
    let vaddr = 0xffff_ffff_8100_0000u64;
    // Kernel symbols at vaddr + k are stored as -1 - k (absolute per-CPU mode); current_task
    // is a per-CPU offset, stored as itself.
    let (tables, at) = kallsyms_tables(
        &[
            ("T_stext", -1),
            ("Dlinux_banner", -1 - 0x100),
            ("D__per_cpu_offset", -1 - 0x180),
            ("Dcurrent_task", 0x1fc40),
            ("Dnext_symbol", -1 - 0x1c0),
        ],
        vaddr,
    );
    let mut code = vec![0u8; 0x200];
    let banner = b"Linux version 6.1.0 (fuzz) #1 SMP\n";
    code[0x100..0x100 + banner.len()].copy_from_slice(banner);
    let tables_at = code.len() as u64;
    code.extend(tables);
    let names = [
        "kallsyms_num_syms",
        "kallsyms_names",
        "kallsyms_markers",
        "kallsyms_token_table",
        "kallsyms_token_index",
        "kallsyms_offsets",
        "kallsyms_relative_base",
    ];
    let symbols: Vec<(&str, u64, u64)> = names
        .iter()
        .zip(at)
        .map(|(n, a)| (*n, vaddr + tables_at + a as u64, 0))
        .collect();
    let seed = elf_with_symbols(&code, vaddr, &symbols, &[(".BTF", btf_section())]);
    let text = btf_layout::from_vmlinux(&seed).expect("the seed kernel gives a layout");
    assert!(
        text.contains("value task_struct_comm 1800") && text.contains("value nr_cpus 8"),
        "{text}"
    );
    fuzz(
        "btf-layout",
        vec![seed],
        |n| alloc_cap(n, 16),
        |b| {
            let _ = btf_layout::from_vmlinux(b).map_err(|e| e.to_string());
        },
    );
}

/// Guest memory of junk: every address reads as bytes derived from it, its 8-byte words
/// often kernel pointers (with maple-node type bits), so lookups walk deep; the banner reads
/// as the layout's, so the kernel is taken as verified.
struct JunkMemory(u64, u64, Vec<u8>);

impl runtime::profile::guest_task::GuestRead for JunkMemory {
    fn read_virt(
        &mut self,
        gva: u64,
        buf: &mut [u8],
    ) -> Result<(), runtime::kvm_error::AccessError> {
        if gva == self.1 && buf.len() == self.2.len() {
            buf.copy_from_slice(&self.2);
            return Ok(());
        }
        for (i, b) in buf.iter_mut().enumerate() {
            let at = gva.wrapping_add(i as u64);
            let mut x = (at & !7) ^ self.0;
            x ^= x >> 33;
            x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
            x ^= x >> 33;
            let word = if x.is_multiple_of(3) {
                0xffff_8880_0000_0000 | (x & 0x00ff_ff00) | ((x >> 40) & 0x1e)
            } else {
                x
            };
            *b = word.to_le_bytes()[(at & 7) as usize];
        }
        Ok(())
    }
}
