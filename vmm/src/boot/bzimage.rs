//! Extracting the vmlinux ELF from a bzImage without running the guest's own decompressor
//! (which costs minutes on hosts that emulate guest kernel code).
//!
//! The x86 boot protocol (Documentation/arch/x86/boot.rst) puts a setup header at 0x1f1;
//! `payload_offset`/`payload_length` locate the compressed kernel inside the protected-mode
//! part, which starts at `(setup_sects + 1) * 512`. The payload's format is found by its magic.

use std::io::Read;

/// Offset of the setup header in a bzImage.
pub const SETUP_HEADER_OFFSET: usize = 0x1f1;
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
    #[error("bzImage payload is compressed with {0}, which is not supported (gzip, xz, lz4, zstd and uncompressed are)")]
    UnsupportedCompression(&'static str),
    #[error("bzImage payload has an unknown format (first bytes {0:02x?})")]
    UnknownCompression(Vec<u8>),
    #[error("corrupt {format} payload: {detail}")]
    Corrupt {
        format: &'static str,
        detail: String,
    },
    #[error("the decompressed payload is not an ELF vmlinux")]
    NotElf,
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

/// The most bytes `payload` may decompress to.
fn output_cap(payload: &[u8]) -> usize {
    payload
        .len()
        .saturating_mul(MAX_EXPANSION)
        .saturating_add(MIN_OUTPUT_CAP)
}

/// Reads a decoder to its end, refusing to go past [`output_cap`].
fn read_capped(
    dec: impl Read,
    format: &'static str,
    cap: usize,
    out: &mut Vec<u8>,
) -> Result<(), BzImageError> {
    let corrupt = |detail: String| BzImageError::Corrupt { format, detail };
    dec.take(cap as u64 + 1)
        .read_to_end(out)
        .map_err(|e| corrupt(e.to_string()))?;
    if out.len() > cap {
        return Err(corrupt(format!(
            "expands past {cap} bytes ({MAX_EXPANSION}x the payload): not a kernel"
        )));
    }
    Ok(())
}

/// Decompresses a kernel payload by its magic; returns the format name and the bytes.
pub fn decompress(payload: &[u8]) -> Result<(&'static str, Vec<u8>), BzImageError> {
    let starts = |magic: &[u8]| payload.starts_with(magic);
    let cap = output_cap(payload);
    let mut out = Vec::with_capacity(payload.len() * 4);
    if starts(b"\x7fELF") {
        return Ok(("none", payload.to_vec()));
    } else if starts(&[0x1f, 0x8b]) {
        read_capped(flate2::read::GzDecoder::new(payload), "gzip", cap, &mut out)?;
        return Ok(("gzip", out));
    } else if starts(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        read_capped(xz2::read::XzDecoder::new(payload), "xz", cap, &mut out)?;
        return Ok(("xz", out));
    } else if starts(&[0x02, 0x21, 0x4c, 0x18]) {
        return lz4_legacy(payload, cap).map(|v| ("lz4", v));
    } else if starts(&[0x28, 0xb5, 0x2f, 0xfd]) {
        let dec = ruzstd::decoding::StreamingDecoder::new(payload).map_err(|e| {
            BzImageError::Corrupt {
                format: "zstd",
                detail: e.to_string(),
            }
        })?;
        read_capped(dec, "zstd", cap, &mut out)?;
        return Ok(("zstd", out));
    }
    let name = if starts(b"BZh") {
        "bzip2"
    } else if starts(&[0x5d, 0, 0]) {
        "lzma"
    } else if starts(&[0x89, b'L', b'Z', b'O']) {
        "lzo"
    } else {
        return Err(BzImageError::UnknownCompression(
            payload.iter().take(8).copied().collect(),
        ));
    };
    Err(BzImageError::UnsupportedCompression(name))
}

/// The LZ4 "legacy" frame format that the kernel's `lz4 -l` produces: a magic, then blocks each
/// preceded by its little-endian compressed size, each decompressing to at most 8 MiB. The
/// kernel appends the 4-byte uncompressed size after the last block.
fn lz4_legacy(payload: &[u8], cap: usize) -> Result<Vec<u8>, BzImageError> {
    const MAGIC: u32 = 0x184c_2102;
    const CHUNK: usize = 8 << 20;
    let corrupt = |detail: String| BzImageError::Corrupt {
        format: "lz4",
        detail,
    };
    let mut out = Vec::with_capacity(payload.len() * 3);
    let mut pos = 4;
    while payload.len() - pos >= 4 {
        let size = u32::from_le_bytes(payload[pos..pos + 4].try_into().unwrap());
        if size == MAGIC {
            pos += 4;
            continue;
        }
        let size = size as usize;
        if payload.len() - pos - 4 < size {
            // Only the trailing uncompressed-size word may remain.
            if payload.len() - pos == 4 && !out.is_empty() {
                break;
            }
            return Err(corrupt(format!(
                "block of {size} bytes at {pos:#x} runs past the end"
            )));
        }
        let block = &payload[pos + 4..pos + 4 + size];
        let start = out.len();
        if start > cap {
            return Err(corrupt(format!(
                "expands past {cap} bytes ({MAX_EXPANSION}x the payload): not a kernel"
            )));
        }
        // An LZ4 block expands at most ~255x: room for that, not a whole chunk, per block.
        out.resize(start + CHUNK.min(size.saturating_mul(255).max(64)), 0);
        let n = lz4_flex::block::decompress_into(block, &mut out[start..])
            .map_err(|e| corrupt(format!("block at {pos:#x}: {e}")))?;
        out.truncate(start + n);
        pos += 4 + size;
    }
    if out.is_empty() {
        return Err(corrupt("no data".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const FAKE_ELF: &[u8] =
        b"\x7fELF\x02\x01\x01 pretend this is a kernel, repeated repeated repeated";

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

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn lz4_legacy_frame(data: &[u8]) -> Vec<u8> {
        let mut out = 0x184c_2102u32.to_le_bytes().to_vec();
        for chunk in data.chunks(8 << 20) {
            let block = lz4_flex::block::compress(chunk);
            out.extend_from_slice(&(block.len() as u32).to_le_bytes());
            out.extend_from_slice(&block);
        }
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out
    }

    #[test]
    fn extracts_each_supported_compression() {
        let mut xz = Vec::new();
        xz2::read::XzEncoder::new(FAKE_ELF, 6)
            .read_to_end(&mut xz)
            .unwrap();
        let zstd = ruzstd::encoding::compress_to_vec(
            FAKE_ELF,
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        for (name, payload) in [
            ("none", FAKE_ELF.to_vec()),
            ("gzip", gzip(FAKE_ELF)),
            ("xz", xz),
            ("lz4", lz4_legacy_frame(FAKE_ELF)),
            ("zstd", zstd),
        ] {
            let x = extract(&bzimage_with(&payload)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(x.compression, name);
            assert_eq!(x.vmlinux, FAKE_ELF, "{name}");
            assert_eq!(x.setup_header.len(), 0x26c - SETUP_HEADER_OFFSET);
        }
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
            extract(&bzimage_with(b"BZh91AY&SY")),
            Err(BzImageError::UnsupportedCompression("bzip2"))
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
}
