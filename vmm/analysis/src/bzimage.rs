//! Extracting the vmlinux ELF from a bzImage without running the guest's own decompressor
//! (which costs minutes on hosts that emulate guest kernel code).
//!
//! The x86 boot protocol (Documentation/arch/x86/boot.rst) puts a setup header at 0x1f1;
//! `payload_offset`/`payload_length` locate the compressed kernel inside the protected-mode
//! part, which starts at `(setup_sects + 1) * 512`. The payload's format is found by its magic:
//! gzip, xz, lzma (legacy `.lzma`), bzip2, lz4 (legacy frame) and zstd are undone (flate2,
//! liblzma, bzip2, lz4_flex, zstd); lzo is refused by name (no maintained crate reads lzop).
//! Every compressed payload ends in the kernel's 4-byte uncompressed size (see [`decompress`]).

use std::io::Read;

/// Offset of the setup header in a bzImage.
pub(crate) const SETUP_HEADER_OFFSET: usize = 0x1f1;
const HDRS_MAGIC: &[u8; 4] = b"HdrS";

#[derive(Debug, thiserror::Error)]
pub enum BzImageError {
    #[error("not a bzImage: no 'HdrS' setup header")]
    NoSetupHeader,
    #[error("bzImage of {0} bytes is cut short inside its setup header (0x250 bytes)")]
    TruncatedHeader(usize),
    #[error("bzImage boot protocol {0:#x} is too old (2.08 or later has payload_offset)")]
    OldProtocol(u16),
    #[error("bzImage payload (offset {offset:#x}, length {length:#x}) lies outside the {file_len}-byte file")]
    PayloadOutOfBounds {
        offset: usize,
        length: usize,
        file_len: usize,
    },
    #[error("bzImage payload is compressed with {0}, which this VMM cannot undo: rebuild the kernel with another compression (CONFIG_KERNEL_GZIP, _XZ, _ZSTD, _LZ4, _LZMA or _BZIP2)")]
    UnsupportedCompression(&'static str),
    #[error("bzImage payload has an unknown format (first bytes {0:02x?})")]
    UnknownCompression(Vec<u8>),
    #[error("corrupt {format} payload: {source}")]
    Corrupt {
        format: &'static str,
        source: PayloadError,
    },
    #[error("the decompressed payload is not an ELF vmlinux")]
    NotElf,
}

/// What is wrong with a compressed payload.
#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    #[error("shorter than the 4-byte size that ends it")]
    NoSizeField,
    #[error("its size field says {claimed} bytes: expands past {cap} bytes ({MAX_EXPANSION}x the payload): not a kernel")]
    SizeTooLarge { claimed: usize, cap: usize },
    #[error("the stream gives more than the {0} bytes its size field says")]
    LongerThanClaimed(usize),
    #[error("the stream ends at byte {used:#x} of {len:#x}, not at the 4-byte size that ends the payload")]
    EndsEarly { used: usize, len: usize },
    #[error("the stream gave {got} bytes, its size field says {claimed}")]
    ShorterThanClaimed { got: usize, claimed: usize },
    #[error("the stream is cut short")]
    CutShort,
    #[error("decoder overran its input")]
    Overran,
    #[error(transparent)]
    Read(#[from] std::io::Error),
    #[error(transparent)]
    Lzma(#[from] liblzma::stream::Error),
    #[error("block header at {0:#x} is cut short")]
    Lz4HeaderCut(usize),
    #[error("block of {size} bytes at {at:#x} runs past the end")]
    Lz4BlockPastEnd { size: usize, at: usize },
    #[error("block at {at:#x}: {source}")]
    Lz4Block {
        at: usize,
        source: lz4_flex::block::DecompressError,
    },
    #[error("no data")]
    Empty,
}

/// What was found in a bzImage.
#[derive(Debug)]
pub struct Extracted {
    /// The embedded vmlinux ELF image.
    pub vmlinux: Vec<u8>,
    /// The raw setup header bytes (from 0x1f1 to the end of the header), to seed boot_params.
    pub setup_header: Vec<u8>,
    /// Name of the compression that was undone.
    pub compression: &'static str,
}

/// Is this image a bzImage (as opposed to an ELF vmlinux)?
pub fn is_bzimage(image: &[u8]) -> bool {
    image.len() > 0x206 && &image[0x202..0x206] == HDRS_MAGIC
}

/// Extracts and decompresses the vmlinux inside a bzImage.
pub fn extract(image: &[u8]) -> Result<Extracted, BzImageError> {
    if !is_bzimage(image) {
        return Err(BzImageError::NoSetupHeader);
    }
    if image.len() < 0x250 {
        return Err(BzImageError::TruncatedHeader(image.len()));
    }
    let u16_at = |o: usize| u16::from_le_bytes([image[o], image[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(image[o..o + 4].try_into().unwrap());
    let version = u16_at(0x206);
    if version < 0x208 {
        return Err(BzImageError::OldProtocol(version));
    }
    let setup_sects = match image[0x1f1] {
        0 => 4,
        n => n as usize,
    };
    let pm_start = (setup_sects + 1) * 512;
    let offset = pm_start + u32_at(0x248) as usize;
    let length = u32_at(0x24c) as usize;
    let payload = offset
        .checked_add(length)
        .filter(|&end| end <= image.len())
        .map(|end| &image[offset..end])
        .ok_or(BzImageError::PayloadOutOfBounds {
            offset,
            length,
            file_len: image.len(),
        })?;
    // The header's length is given by the byte at 0x201 (jump offset) + 0x202.
    let header_end = (0x202 + image[0x201] as usize)
        .clamp(0x250, 0x290)
        .min(image.len());
    let (compression, vmlinux) = decompress(payload)?;
    if vmlinux.len() < 4 || &vmlinux[..4] != b"\x7fELF" {
        return Err(BzImageError::NotElf);
    }
    Ok(Extracted {
        vmlinux,
        setup_header: image[SETUP_HEADER_OFFSET..header_end].to_vec(),
        compression,
    })
}

/// A payload may decompress to at most this many times its size (plus [`MIN_OUTPUT_CAP`]):
/// kernels compress 3-6x; a payload that expands further is corrupt or a decompression bomb,
/// and is refused before it is inflated into memory.
pub const MAX_EXPANSION: usize = 32;
/// The output allowance every payload gets, however small.
pub const MIN_OUTPUT_CAP: usize = 16 << 20;
/// The most memory the xz and lzma decoders may take (liblzma's memlimit): the kernel's xz
/// uses a 32 MiB dictionary and `lzma -9` a 64 MiB one; a header asking for more is refused.
pub(crate) const LZMA_MEMLIMIT: u64 = 128 << 20;
/// The largest zstd window accepted (2^27 = 128 MiB: what the kernel's `zstd -22 --ultra`
/// writes when it compresses from a pipe). A frame asking for more is refused.
pub(crate) const ZSTD_WINDOW_LOG_MAX: u32 = 27;

/// The most bytes `payload` may decompress to.
fn output_cap(payload: &[u8]) -> usize {
    payload
        .len()
        .saturating_mul(MAX_EXPANSION)
        .saturating_add(MIN_OUTPUT_CAP)
}

/// The compressions Linux offers for an x86 bzImage (arch/x86/boot/compressed/Makefile), by
/// the magic at the start of the payload (lib/decompress.c's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Gzip,
    Bzip2,
    Lzma,
    Xz,
    Lzo,
    Lz4,
    Zstd,
}

impl Format {
    fn detect(payload: &[u8]) -> Option<Format> {
        const MAGICS: [(&[u8], Format); 7] = [
            (&[0x1f, 0x8b], Format::Gzip),
            (b"BZh", Format::Bzip2),
            (&[0x5d, 0], Format::Lzma), // lc=3 lp=0 pb=2, then the dictionary size
            (&[0xfd, b'7', b'z', b'X', b'Z', 0], Format::Xz),
            (&[0x89, b'L', b'Z', b'O'], Format::Lzo),
            (&[0x02, 0x21, 0x4c, 0x18], Format::Lz4),
            (&[0x28, 0xb5, 0x2f, 0xfd], Format::Zstd),
        ];
        MAGICS
            .iter()
            .find(|(m, _)| payload.starts_with(m))
            .map(|&(_, f)| f)
    }

    fn name(self) -> &'static str {
        match self {
            Format::Gzip => "gzip",
            Format::Bzip2 => "bzip2",
            Format::Lzma => "lzma",
            Format::Xz => "xz",
            Format::Lzo => "lzo",
            Format::Lz4 => "lz4",
            Format::Zstd => "zstd",
        }
    }
}

/// Decompresses a kernel payload by its magic; returns the format name and the bytes.
///
/// The payload is laid out as the kernel's build lays it out (scripts/Makefile.lib): the
/// compressed stream, then the uncompressed size as 4 little-endian bytes — appended by
/// `size_append` for bzip2, lzma, xz, lzo, lz4 and zstd, and gzip's own ISIZE field for gzip —
/// which `mkpiggy` reads from the payload's last 4 bytes. Each stream is decoded up to its own
/// end; it must end exactly at those 4 bytes, and they must give the decoded length.
pub(crate) fn decompress(payload: &[u8]) -> Result<(&'static str, Vec<u8>), BzImageError> {
    if payload.starts_with(b"\x7fELF") {
        return Ok(("none", payload.to_vec()));
    }
    let Some(format) = Format::detect(payload) else {
        return Err(BzImageError::UnknownCompression(
            payload.iter().take(8).copied().collect(),
        ));
    };
    let name = format.name();
    let corrupt = |source: PayloadError| BzImageError::Corrupt {
        format: name,
        source,
    };
    if format == Format::Lzo {
        return Err(BzImageError::UnsupportedCompression(name));
    }
    let Some(size_at) = payload.len().checked_sub(4) else {
        return Err(corrupt(PayloadError::NoSizeField));
    };
    let claimed = u32::from_le_bytes(payload[size_at..].try_into().unwrap()) as usize;
    let cap = output_cap(payload);
    if claimed > cap {
        return Err(corrupt(PayloadError::SizeTooLarge { claimed, cap }));
    }
    // gzip's trailer is its own ISIZE: part of the stream. Every other stream stops before it.
    let stream = if format == Format::Gzip {
        payload
    } else {
        &payload[..size_at]
    };
    let (out, used) = match format {
        Format::Gzip => read_stream(flate2::bufread::GzDecoder::new(stream), stream, claimed)
            .map_err(corrupt)?,
        Format::Bzip2 => {
            read_stream(bzip2::bufread::BzDecoder::new(stream), stream, claimed).map_err(corrupt)?
        }
        Format::Xz => {
            let s = liblzma::stream::Stream::new_stream_decoder(LZMA_MEMLIMIT, 0)
                .map_err(|e| corrupt(e.into()))?;
            lzma_stream(s, stream, claimed).map_err(corrupt)?
        }
        Format::Lzma => {
            let s = liblzma::stream::Stream::new_lzma_decoder(LZMA_MEMLIMIT)
                .map_err(|e| corrupt(e.into()))?;
            lzma_stream(s, stream, claimed).map_err(corrupt)?
        }
        Format::Zstd => {
            let mut dec = zstd::stream::read::Decoder::with_buffer(stream)
                .map_err(|e| corrupt(e.into()))?
                .single_frame();
            dec.window_log_max(ZSTD_WINDOW_LOG_MAX)
                .map_err(|e| corrupt(e.into()))?;
            read_stream(dec, stream, claimed).map_err(corrupt)?
        }
        Format::Lz4 => (lz4_legacy(stream, claimed).map_err(corrupt)?, stream.len()),
        Format::Lzo => unreachable!("refused above"),
    };
    if used != stream.len() {
        return Err(corrupt(PayloadError::EndsEarly {
            used,
            len: stream.len(),
        }));
    }
    if out.len() != claimed {
        return Err(corrupt(PayloadError::ShorterThanClaimed {
            got: out.len(),
            claimed,
        }));
    }
    Ok((name, out))
}

/// A decoder reading from a slice: where in the slice it stopped.
trait SliceDecoder: Read {
    fn rest(&self) -> usize;
}
impl SliceDecoder for flate2::bufread::GzDecoder<&[u8]> {
    fn rest(&self) -> usize {
        self.get_ref().len()
    }
}
impl SliceDecoder for bzip2::bufread::BzDecoder<&[u8]> {
    fn rest(&self) -> usize {
        self.get_ref().len()
    }
}
impl SliceDecoder for zstd::stream::read::Decoder<'_, &[u8]> {
    fn rest(&self) -> usize {
        self.get_ref().len()
    }
}

/// Reads one stream of `stream` to its end, at most `limit` bytes of output (one more is an
/// error); returns the output and how many bytes of `stream` the decoder used.
fn read_stream(
    mut dec: impl SliceDecoder,
    stream: &[u8],
    limit: usize,
) -> Result<(Vec<u8>, usize), PayloadError> {
    let mut out = Vec::with_capacity(limit.min(stream.len().saturating_mul(4)));
    (&mut dec).take(limit as u64 + 1).read_to_end(&mut out)?;
    if out.len() > limit {
        return Err(PayloadError::LongerThanClaimed(limit));
    }
    Ok((out, stream.len() - dec.rest()))
}

/// Runs a liblzma decoder (xz or legacy .lzma) over `stream` up to the end of its one stream,
/// writing at most `limit` bytes (one more is an error); returns the output and the bytes used.
/// (liblzma's `Read` adapter reports trailing bytes after a stream as corruption, so the kernel's
/// size field would fail it: hence this loop.)
fn lzma_stream(
    mut s: liblzma::stream::Stream,
    stream: &[u8],
    limit: usize,
) -> Result<(Vec<u8>, usize), PayloadError> {
    use liblzma::stream::{Action, Status};
    const STEP: usize = 1 << 20;
    let mut out = Vec::with_capacity(limit.min(stream.len().saturating_mul(4)).max(64) + 1);
    loop {
        if out.len() > limit {
            return Err(PayloadError::LongerThanClaimed(limit));
        }
        if out.len() == out.capacity() {
            out.reserve(STEP.min(limit + 1 - out.len()));
        }
        let (in_before, out_before) = (s.total_in(), out.len());
        let used = usize::try_from(in_before).map_err(|_| PayloadError::Overran)?;
        let input = stream.get(used..).ok_or(PayloadError::Overran)?;
        let status = s.process_vec(input, &mut out, Action::Run)?;
        if status == Status::StreamEnd {
            break;
        }
        if s.total_in() == in_before && out.len() == out_before {
            return Err(PayloadError::CutShort);
        }
    }
    if out.len() > limit {
        return Err(PayloadError::LongerThanClaimed(limit));
    }
    let used = usize::try_from(s.total_in()).map_err(|_| PayloadError::Overran)?;
    Ok((out, used))
}

/// The LZ4 "legacy" frame format that the kernel's `lz4 -l` produces: a magic, then blocks each
/// preceded by its little-endian compressed size, each decompressing to at most 8 MiB. `stream`
/// stops before the kernel's 4-byte size; at most `limit` bytes come out.
fn lz4_legacy(stream: &[u8], limit: usize) -> Result<Vec<u8>, PayloadError> {
    const MAGIC: u32 = 0x184c_2102;
    const CHUNK: usize = 8 << 20;
    let mut out = Vec::with_capacity(limit.min(stream.len().saturating_mul(3)));
    let mut pos = 4;
    while pos < stream.len() {
        let size = stream
            .get(pos..pos + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .ok_or(PayloadError::Lz4HeaderCut(pos))?;
        if size == MAGIC {
            pos += 4;
            continue;
        }
        let size = size as usize;
        let block = stream
            .get(pos + 4..)
            .and_then(|rest| rest.get(..size))
            .ok_or(PayloadError::Lz4BlockPastEnd { size, at: pos })?;
        let start = out.len();
        if start >= limit {
            return Err(PayloadError::LongerThanClaimed(limit));
        }
        // An LZ4 block expands at most ~255x: room for that, not a whole chunk, per block.
        let room = CHUNK
            .min(size.saturating_mul(255).max(64))
            .min(limit - start);
        out.resize(start + room, 0);
        let n = lz4_flex::block::decompress_into(block, &mut out[start..])
            .map_err(|source| PayloadError::Lz4Block { at: pos, source })?;
        out.truncate(start + n);
        pos += 4 + size;
    }
    if out.is_empty() {
        return Err(PayloadError::Empty);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const FAKE_ELF: &[u8] =
        b"\x7fELF\x02\x01\x01 pretend this is a kernel, repeated repeated repeated";

    /// A bzImage around `payload` as the kernel's build fills the header: setup_sects, then
    /// payload_offset (from the protected-mode code's start) and payload_length.
    fn bzimage_with(payload: &[u8]) -> Vec<u8> {
        let setup_sects = 1usize;
        let mut img = vec![0u8; (setup_sects + 1) * 512];
        img[0x1f1] = setup_sects as u8;
        img[0x201] = 0x6a; // jump: header ends at 0x26c
        img[0x202..0x206].copy_from_slice(HDRS_MAGIC);
        img[0x206..0x208].copy_from_slice(&0x20fu16.to_le_bytes());
        img[0x248..0x24c].copy_from_slice(&16u32.to_le_bytes());
        img[0x24c..0x250].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        img.extend_from_slice(&[0u8; 16]);
        img.extend_from_slice(payload);
        img.extend_from_slice(&[0xaa; 64]); // trailing data after the payload
        img
    }

    /// `stream` followed by the uncompressed size, as `size_append` writes it.
    fn with_size(mut stream: Vec<u8>, size: usize) -> Vec<u8> {
        stream.extend_from_slice(&(size as u32).to_le_bytes());
        stream
    }

    /// `gzip -n -9` (the gzip stream ends in its own size: nothing is appended).
    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// The kernel's `xz_wrap.sh` on x86: `xz --check=crc32 --x86 --lzma2=,dict=32MiB` (here a
    /// 1 MiB dictionary: the encoder for 32 MiB takes ~370 MiB; the layout is the same).
    fn xz(data: &[u8]) -> Vec<u8> {
        use liblzma::stream::{Check, Filters, LzmaOptions, Stream};
        let mut opts = LzmaOptions::new_preset(6).unwrap();
        opts.dict_size(1 << 20);
        let mut filters = Filters::new();
        filters.x86();
        filters.lzma2(&opts);
        let s = Stream::new_stream_encoder(&filters, Check::Crc32).unwrap();
        let mut e = liblzma::write::XzEncoder::new_stream(Vec::new(), s);
        e.write_all(data).unwrap();
        with_size(e.finish().unwrap(), data.len())
    }

    /// `lzma -9` (legacy .lzma: 13-byte header, size unknown, end marker; 1 MiB dictionary).
    fn lzma(data: &[u8]) -> Vec<u8> {
        use liblzma::stream::{LzmaOptions, Stream};
        let mut opts = LzmaOptions::new_preset(9).unwrap();
        opts.dict_size(1 << 20);
        let s = Stream::new_lzma_encoder(&opts).unwrap();
        let mut e = liblzma::write::XzEncoder::new_stream(Vec::new(), s);
        e.write_all(data).unwrap();
        with_size(e.finish().unwrap(), data.len())
    }

    /// `bzip2 -9`.
    fn bzip2(data: &[u8]) -> Vec<u8> {
        let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
        e.write_all(data).unwrap();
        with_size(e.finish().unwrap(), data.len())
    }

    /// `lz4 -l -9`: the legacy frame, 8 MiB blocks.
    fn lz4_legacy_frame(data: &[u8]) -> Vec<u8> {
        let mut out = 0x184c_2102u32.to_le_bytes().to_vec();
        for chunk in data.chunks(8 << 20) {
            let block = lz4_flex::block::compress(chunk);
            out.extend_from_slice(&(block.len() as u32).to_le_bytes());
            out.extend_from_slice(&block);
        }
        with_size(out, data.len())
    }

    /// `zstd -22 --ultra` from a pipe: a frame with a 128 MiB window, no content size, a
    /// checksum (here at level 3: level 22's encoder tables take ~1 GiB).
    fn zstd(data: &[u8]) -> Vec<u8> {
        let mut e = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
        e.window_log(27).unwrap();
        e.include_checksum(true).unwrap();
        e.include_contentsize(false).unwrap();
        e.write_all(data).unwrap();
        with_size(e.finish().unwrap(), data.len())
    }

    fn kernel_payloads(data: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("gzip", gzip(data)),
            ("xz", xz(data)),
            ("lzma", lzma(data)),
            ("bzip2", bzip2(data)),
            ("lz4", lz4_legacy_frame(data)),
            ("zstd", zstd(data)),
        ]
    }

    #[test]
    fn extracts_each_supported_compression() {
        let mut payloads = kernel_payloads(FAKE_ELF);
        payloads.push(("none", FAKE_ELF.to_vec()));
        for (name, payload) in payloads {
            let x = extract(&bzimage_with(&payload)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(x.compression, name);
            assert_eq!(x.vmlinux, FAKE_ELF, "{name}");
            assert_eq!(x.setup_header.len(), 0x26c - SETUP_HEADER_OFFSET);
        }
        // More than one 8 MiB lz4 block.
        let mut big: Vec<u8> = FAKE_ELF.to_vec();
        big.extend(
            (0..(8u32 << 20) + 4096).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8 & 7),
        );
        let (n, out) = decompress(&lz4_legacy_frame(&big)).unwrap();
        assert_eq!(n, "lz4");
        assert!(out == big);
    }

    #[test]
    fn stream_must_end_at_the_size_and_the_size_must_agree() {
        for (name, payload) in kernel_payloads(FAKE_ELF) {
            let n = payload.len();
            // The size field off by one.
            let mut wrong = payload.clone();
            wrong[n - 4] ^= 1;
            let e = decompress(&wrong).unwrap_err().to_string();
            assert!(e.contains(name), "{name}: {e}");
            // A huge claimed size: refused before anything is decoded.
            let mut huge = payload.clone();
            huge[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
            let e = decompress(&huge).unwrap_err().to_string();
            assert!(e.contains("expands past"), "{name}: {e}");
            // Bytes between the stream and the size.
            let mut extra = payload[..n - 4].to_vec();
            extra.extend_from_slice(b"junk");
            extra.extend_from_slice(&payload[n - 4..]);
            assert!(decompress(&extra).is_err(), "{name}: junk before the size");
            // No size at all (a bare stream): the last bytes of the stream are not the size.
            if name != "gzip" {
                assert!(
                    decompress(&payload[..n - 4]).is_err(),
                    "{name}: bare stream"
                );
            }
            // Cut anywhere: an error, never a panic.
            for cut in 0..n {
                let r = decompress(&payload[..cut]);
                assert!(r.is_err(), "{name} cut at {cut} of {n}");
            }
        }
    }

    #[test]
    fn lzo_is_refused_by_name() {
        let lzop = with_size(b"\x89LZO\x00\x0d\x0a\x1a\x0a\x10\x30\x20\xa0".to_vec(), 100);
        let e = extract(&bzimage_with(&lzop)).unwrap_err();
        assert!(matches!(e, BzImageError::UnsupportedCompression("lzo")));
        assert!(e.to_string().contains("CONFIG_KERNEL_GZIP"), "{e}");
    }

    #[test]
    fn rejects_bad_images() {
        assert!(matches!(
            extract(b"not a kernel"),
            Err(BzImageError::NoSetupHeader)
        ));
        let mut truncated = bzimage_with(&gzip(FAKE_ELF));
        truncated.truncate(0x400 + 20);
        assert!(matches!(
            extract(&truncated),
            Err(BzImageError::PayloadOutOfBounds { .. })
        ));
        let mut corrupt = gzip(FAKE_ELF);
        let n = corrupt.len();
        corrupt[10..n - 8].iter_mut().for_each(|b| *b ^= 0x5a);
        assert!(matches!(
            extract(&bzimage_with(&corrupt)),
            Err(BzImageError::Corrupt { format: "gzip", .. })
        ));
        assert!(matches!(
            extract(&bzimage_with(b"\x01\x02\x03\x04")),
            Err(BzImageError::UnknownCompression(_))
        ));
        assert!(matches!(
            extract(&bzimage_with(&gzip(b"plain text"))),
            Err(BzImageError::NotElf)
        ));
        let mut lz = lz4_legacy_frame(FAKE_ELF);
        lz[4] = 0xff; // block size far past the end
        assert!(matches!(
            extract(&bzimage_with(&lz)),
            Err(BzImageError::Corrupt { format: "lz4", .. })
        ));
    }

    /// The payloads the kernel's own commands make (scripts/Makefile.lib, xz_wrap.sh; the size
    /// appended as `size_append` does), where the tools are installed: `cargo test -p vmm --lib
    /// boot::bzimage -- --ignored` (xz-utils, bzip2, lz4, zstd; lzma -9 and zstd -22 take
    /// ~700 MiB and ~1 GiB, so not in the default run).
    #[test]
    #[ignore]
    fn payloads_from_the_kernels_commands() {
        let mut data = FAKE_ELF.to_vec();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        data.extend((0..3 << 20).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 60) as u8 // 4 random bits a byte: compresses about 2x
        }));
        for (name, cmd, append) in [
            ("gzip", "gzip -n -f -9", false),
            ("bzip2", "bzip2 -9", true),
            ("lzma", "lzma -9", true),
            ("xz", "xz --check=crc32 --x86 --lzma2=,dict=32MiB", true),
            ("lz4", "lz4 -l -9 - -", true),
            ("zstd", "zstd -22 --ultra", true),
        ] {
            let tool = cmd.split(' ').next().unwrap();
            let Ok(mut child) = std::process::Command::new(tool)
                .args(cmd.split(' ').skip(1))
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
            else {
                testkit::not_checked(
                    &format!("a {name} bzImage's extraction"),
                    &format!("{tool} is not installed (scripts/deps.sh installs it)"),
                );
                continue;
            };
            let mut stdin = child.stdin.take().unwrap();
            let input = data.clone();
            let feeder = std::thread::spawn(move || stdin.write_all(&input).unwrap());
            let out = child.wait_with_output().unwrap();
            feeder.join().unwrap();
            assert!(out.status.success(), "{cmd}");
            let payload = if append {
                with_size(out.stdout, data.len())
            } else {
                out.stdout
            };
            let x = extract(&bzimage_with(&payload)).unwrap_or_else(|e| panic!("{cmd}: {e}"));
            assert_eq!(x.compression, name);
            assert!(x.vmlinux == data, "{cmd}");
            eprintln!("{cmd}: {} bytes -> {} ok", payload.len(), data.len());
        }
    }
}
