//! Results a guest sends over COM2 (`--serial2 FILE`) as checksummed frames: the decoder, and
//! `vpmu-vmm results FILE --out DIR`, which writes each verified payload to a file.
//!
//! The guest side is `guest-image/initramfs/experiments.sh`; the stream it writes is
//! ```text
//! VPMU-RESULTS-BEGIN v1 experiments=<list> modes=<list or ->\n
//! VPMU-FRAME v1 seq=<n> name=<name> mode=<tag> len=<bytes> crc32=<8 hex digits>\n
//! <exactly len bytes of payload>\n
//! VPMU-FRAME-END seq=<n>\n
//! ...
//! VPMU-RESULTS-END frames=<count>\n
//! ```
//! `seq` counts 0, 1, 2, ... with no gaps and `crc32` is zlib's CRC-32 of the payload, so a
//! damaged, truncated or missing frame is reported, never silently dropped. Bytes outside frames
//! (a kernel message that got in the way, say) are skipped and counted. Header lines may end in
//! `\r\n` (a serial port not in raw mode); the payload is taken byte for byte.
//! Pure code: no KVM, no devices.

use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

const BEGIN: &[u8] = b"VPMU-RESULTS-BEGIN v1";
const FRAME: &[u8] = b"VPMU-FRAME v1 ";
const END: &[u8] = b"VPMU-RESULTS-END ";

/// What can be wrong with a results stream, or with writing it out.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ResultsError {
    #[error("byte {offset}: bad frame header {line:?}: {why}")]
    BadHeader {
        offset: usize,
        line: String,
        why: String,
    },
    #[error("frame {seq} ({name}): the stream ends after {got} of its {len} payload bytes")]
    Truncated {
        seq: u64,
        name: String,
        len: usize,
        got: usize,
    },
    #[error("frame {seq} ({name}): no end marker after its {len} payload bytes (wrong length, or bytes lost)")]
    MissingEnd { seq: u64, name: String, len: usize },
    #[error("frame {seq} ({name}): checksum mismatch: header says crc32={want:08x}, payload has {got:08x}")]
    BadChecksum {
        seq: u64,
        name: String,
        want: u32,
        got: u32,
    },
    #[error("frames {from}..{to} missing (sequence jumps from {from} to {to})", from = .expected, to = .got)]
    Missing { expected: u64, got: u64 },
    #[error("no VPMU-RESULTS-END line: the guest stopped (or its output was cut) before the end")]
    NoEndMarker,
    #[error("the end line says {said} frames, {got} were seen")]
    CountMismatch { said: u64, got: u64 },
    #[error("no results in the stream (no VPMU-RESULTS-BEGIN line and no frames)")]
    Empty,
    #[error("frame {seq}: name {name:?} cannot be a file name under --out (allowed: [A-Za-z0-9._/-], no `..`, no leading `/`)")]
    UnsafeName { seq: u64, name: String },
    #[error("{path}: {msg}")]
    Io { path: PathBuf, msg: String },
}

/// One verified payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub seq: u64,
    pub name: String,
    /// The accounting mode the guest was counting in (`cpu-switch`, `domain-switch`), or `-`.
    pub mode: String,
    pub payload: Vec<u8>,
}

/// Everything found in a stream: the intact frames, and every problem met on the way.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The `VPMU-RESULTS-BEGIN` line's fields (`experiments=...`, `modes=...`), if seen.
    pub begin: Option<String>,
    pub frames: Vec<Frame>,
    pub problems: Vec<ResultsError>,
    /// Bytes outside any frame or marker line (skipped).
    pub stray_bytes: usize,
}

impl Decoded {
    pub(crate) fn is_complete(&self) -> bool {
        self.problems.is_empty()
    }
    /// The frame called `name` in `mode`.
    pub fn get(&self, mode: &str, name: &str) -> Option<&Frame> {
        self.frames
            .iter()
            .find(|f| f.mode == mode && f.name == name)
    }
}

/// Decodes a whole COM2 byte stream.
pub fn decode(bytes: &[u8]) -> Decoded {
    let mut d = Decoded::default();
    let mut pos = 0;
    let mut next_seq = 0u64;
    let mut ended = false;
    while pos < bytes.len() {
        let line_end = find(bytes, pos, b"\n").unwrap_or(bytes.len());
        let line = trim_cr(&bytes[pos..line_end]);
        let after_line = (line_end + 1).min(bytes.len());
        if line.starts_with(BEGIN) {
            d.begin = Some(
                String::from_utf8_lossy(&line[BEGIN.len()..])
                    .trim()
                    .to_string(),
            );
            pos = after_line;
        } else if line.starts_with(END) {
            ended = true;
            match field(line, "frames").and_then(|v| v.parse::<u64>().ok()) {
                Some(said) if said != next_seq => d.problems.push(ResultsError::CountMismatch {
                    said,
                    got: next_seq,
                }),
                Some(_) => {}
                None => d.problems.push(bad_header(pos, line, "no frames=<count>")),
            }
            pos = after_line;
        } else if line.starts_with(FRAME) {
            pos = frame(bytes, pos, line, after_line, &mut next_seq, &mut d);
        } else {
            // Not ours: skip to the next line that could be (a frame may follow mid-line if a
            // kernel message was cut short, so look for the tag itself, not just a newline).
            let next = [FRAME, BEGIN, END]
                .iter()
                .filter_map(|tag| find(bytes, pos + 1, tag))
                .min()
                .unwrap_or(bytes.len());
            d.stray_bytes += next - pos;
            pos = next;
        }
    }
    if d.begin.is_none() && d.frames.is_empty() && d.problems.is_empty() {
        d.problems.push(ResultsError::Empty);
    } else if !ended {
        d.problems.push(ResultsError::NoEndMarker);
    }
    d
}

/// One frame whose header line is `line` (starting at `start`); returns where to go on.
fn frame(
    bytes: &[u8],
    start: usize,
    line: &[u8],
    payload_at: usize,
    next_seq: &mut u64,
    d: &mut Decoded,
) -> usize {
    let header = match Header::parse(line) {
        Ok(h) => h,
        Err(why) => {
            d.problems.push(bad_header(start, line, &why.to_string()));
            return payload_at;
        }
    };
    if header.seq != *next_seq {
        if header.seq > *next_seq {
            d.problems.push(ResultsError::Missing {
                expected: *next_seq,
                got: header.seq,
            });
        } else {
            d.problems.push(bad_header(
                start,
                line,
                &format!(
                    "sequence number {} again (expected {})",
                    header.seq, next_seq
                ),
            ));
        }
    }
    // Saturating: the number is the guest's (u64::MAX: every later frame is "again").
    *next_seq = header.seq.max(*next_seq).saturating_add(1);
    let Header {
        seq,
        name,
        mode,
        len,
        crc32,
    } = header;
    let available = bytes.len() - payload_at;
    if available < len {
        d.problems.push(ResultsError::Truncated {
            seq,
            name,
            len,
            got: available,
        });
        return bytes.len();
    }
    let payload = &bytes[payload_at..payload_at + len];
    // The trailer, with the \r a serial port not in raw mode puts before each \n.
    let rest = &bytes[payload_at + len..];
    let rest = rest.strip_prefix(b"\r").unwrap_or(rest);
    let trailer = format!("\nVPMU-FRAME-END seq={seq}");
    let ok_end = rest.starts_with(trailer.as_bytes())
        && matches!(
            rest.get(trailer.len()..),
            Some([b'\n', ..]) | Some([b'\r', b'\n', ..]) | Some([])
        );
    if !ok_end {
        d.problems.push(ResultsError::MissingEnd { seq, name, len });
        // Resynchronise at the next thing that looks like ours.
        return [FRAME, END]
            .iter()
            .filter_map(|tag| find(bytes, payload_at, tag))
            .min()
            .unwrap_or(bytes.len());
    }
    let got = crc32fast::hash(payload);
    if got != crc32 {
        d.problems.push(ResultsError::BadChecksum {
            seq,
            name,
            want: crc32,
            got,
        });
    } else if !safe_name(&name) {
        d.problems.push(ResultsError::UnsafeName { seq, name });
    } else {
        d.frames.push(Frame {
            seq,
            name,
            mode,
            payload: payload.to_vec(),
        });
    }
    let after = bytes.len() - rest.len() + trailer.len();
    find(bytes, after, b"\n").map_or(bytes.len(), |i| i + 1)
}

/// What is wrong with a frame's header line.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum HeaderError {
    #[error("no {0}=...")]
    Missing(&'static str),
    #[error("{0} is not a number")]
    NotANumber(&'static str),
    #[error("crc32 is not 8 hex digits")]
    Crc32,
}

struct Header {
    seq: u64,
    name: String,
    mode: String,
    len: usize,
    crc32: u32,
}

impl Header {
    fn parse(line: &[u8]) -> Result<Header, HeaderError> {
        let get = |key| field(line, key).ok_or(HeaderError::Missing(key));
        let seq = get("seq")?
            .parse()
            .map_err(|_| HeaderError::NotANumber("seq"))?;
        let len = get("len")?
            .parse()
            .map_err(|_| HeaderError::NotANumber("len"))?;
        let crc = get("crc32")?;
        if crc.len() != 8 {
            return Err(HeaderError::Crc32);
        }
        let crc32 = u32::from_str_radix(&crc, 16).map_err(|_| HeaderError::Crc32)?;
        Ok(Header {
            seq,
            name: get("name")?,
            mode: get("mode")?,
            len,
            crc32,
        })
    }
}

/// The value of ` key=value` in a header line.
fn field(line: &[u8], key: &str) -> Option<String> {
    let text = std::str::from_utf8(line).ok()?;
    text.split(' ')
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
}

fn bad_header(offset: usize, line: &[u8], why: &str) -> ResultsError {
    let mut text = String::from_utf8_lossy(line).to_string();
    if text.len() > 120 {
        let cut = (0..=120)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push_str("...");
    }
    ResultsError::BadHeader {
        offset,
        line: text,
        why: why.to_string(),
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn find(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    if from >= hay.len() {
        return None;
    }
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

/// A frame name usable as a relative path: `[A-Za-z0-9._/-]`, no empty, `.` or `..` component.
pub fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b))
        && name
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Where `frame` goes under `out`: `out/<mode>/<name>` (mode `-` is left out).
pub(crate) fn output_path(out: &Path, frame: &Frame) -> PathBuf {
    if frame.mode == "-" || !safe_name(&frame.mode) {
        out.join(&frame.name)
    } else {
        out.join(&frame.mode).join(&frame.name)
    }
}

/// What `write_out` did.
#[derive(Debug)]
pub struct Written {
    pub files: Vec<PathBuf>,
}

impl fmt::Display for Written {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.files {
            writeln!(f, "{}", p.display())?;
        }
        Ok(())
    }
}

/// Writes every verified frame of `d` under `out` (created if missing).
pub(crate) fn write_out(d: &Decoded, out: &Path) -> Result<Written, ResultsError> {
    let io = |path: &Path, e: std::io::Error| ResultsError::Io {
        path: path.to_path_buf(),
        msg: e.to_string(),
    };
    let mut files = Vec::new();
    for f in &d.frames {
        let path = output_path(out, f);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        }
        std::fs::write(&path, &f.payload).map_err(|e| io(&path, e))?;
        files.push(path);
    }
    Ok(Written { files })
}

/// `vpmu-vmm results FILE --out DIR [--format json]`: decode FILE, write the payloads, report
/// problems (as text, or with `json` as one [`to_json`] document). Returns whether the stream
/// was complete (every frame there and intact).
pub fn command(file: &Path, out: &Path, json: bool) -> Result<bool, ResultsError> {
    let bytes = std::fs::read(file).map_err(|e| ResultsError::Io {
        path: file.to_path_buf(),
        msg: e.to_string(),
    })?;
    let d = decode(&bytes);
    let written = write_out(&d, out)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&d, &written, out)).expect("plain values")
        );
        return Ok(d.is_complete());
    }
    if let Some(b) = &d.begin {
        println!("results: {b}");
    }
    for (f, path) in d.frames.iter().zip(&written.files) {
        println!(
            "frame {:3}  {:13}  {:7} bytes  {}",
            f.seq,
            f.mode,
            f.payload.len(),
            path.display()
        );
    }
    if d.stray_bytes > 0 {
        println!("({} bytes outside frames skipped)", d.stray_bytes);
    }
    for p in &d.problems {
        eprintln!("problem: {p}");
    }
    println!(
        "{} frames written to {}; {}",
        d.frames.len(),
        out.display(),
        if d.is_complete() {
            "stream complete".to_string()
        } else {
            format!("{} problem(s): INCOMPLETE", d.problems.len())
        }
    );
    Ok(d.is_complete())
}

/// The `schema` field of `results --format json` (docs/guest.md, "Result frames").
pub(crate) const RESULTS_SCHEMA: &str = "vpmu-results/1";

/// What `results` found, as one JSON document: the begin line, each frame written (seq, name,
/// mode, payload bytes, CRC-32, file), bytes outside frames, the problems, complete or not.
pub fn to_json(d: &Decoded, written: &Written, out: &Path) -> serde_json::Value {
    let doc = ResultsDoc {
        schema: RESULTS_SCHEMA,
        begin: &d.begin,
        out: out.display().to_string(),
        frames: d
            .frames
            .iter()
            .zip(&written.files)
            .map(|(f, path)| FrameDoc {
                seq: f.seq,
                name: &f.name,
                mode: &f.mode,
                bytes: f.payload.len(),
                crc32: format!("{:08x}", crc32fast::hash(&f.payload)),
                file: path.display().to_string(),
            })
            .collect(),
        stray_bytes: d.stray_bytes,
        problems: d.problems.iter().map(|p| p.to_string()).collect(),
        complete: d.is_complete(),
    };
    serde_json::to_value(doc).expect("plain values")
}

/// The `vpmu-results/1` document.
#[derive(serde::Serialize)]
struct ResultsDoc<'a> {
    schema: &'static str,
    begin: &'a Option<String>,
    out: String,
    frames: Vec<FrameDoc<'a>>,
    stray_bytes: usize,
    problems: Vec<String>,
    complete: bool,
}

/// One frame as written to a file.
#[derive(serde::Serialize)]
struct FrameDoc<'a> {
    seq: u64,
    name: &'a str,
    mode: &'a str,
    bytes: usize,
    crc32: String,
    file: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream as experiments.sh writes it.
    fn stream(frames: &[(&str, &str, &[u8])]) -> Vec<u8> {
        let mut s = b"VPMU-RESULTS-BEGIN v1 experiments=all modes=-\n".to_vec();
        for (seq, (name, mode, payload)) in frames.iter().enumerate() {
            s.extend(frame_bytes(seq as u64, name, mode, payload));
        }
        s.extend(format!("VPMU-RESULTS-END frames={}\n", frames.len()).bytes());
        s
    }

    fn frame_bytes(seq: u64, name: &str, mode: &str, payload: &[u8]) -> Vec<u8> {
        let mut s = format!(
            "VPMU-FRAME v1 seq={seq} name={name} mode={mode} len={} crc32={:08x}\n",
            payload.len(),
            crc32fast::hash(payload)
        )
        .into_bytes();
        s.extend_from_slice(payload);
        s.extend(format!("\nVPMU-FRAME-END seq={seq}\n").bytes());
        s
    }

    #[test]
    fn crc32_is_zlibs_as_busybox_computes_it() {
        // `printf hello | busybox crc32` prints 3610a686.
        assert_eq!(crc32fast::hash(b"hello"), 0x3610_a686);
    }

    #[test]
    fn decodes_frames_with_binary_payloads() {
        let bin: Vec<u8> = (0..=255u8)
            .chain(b"\nVPMU-FRAME-END seq=9\n".iter().copied())
            .collect();
        let s = stream(&[
            ("perf-stat/cpu_split.csv", "cpu-switch", b"123,,cycles\n"),
            ("perf-record/perf.data", "domain-switch", &bin),
            ("system/empty", "-", b""),
        ]);
        let d = decode(&s);
        assert!(d.is_complete(), "{:?}", d.problems);
        assert_eq!(d.begin.as_deref(), Some("experiments=all modes=-"));
        assert_eq!(d.frames.len(), 3);
        assert_eq!(
            d.get("cpu-switch", "perf-stat/cpu_split.csv")
                .unwrap()
                .payload,
            b"123,,cycles\n"
        );
        assert_eq!(
            d.get("domain-switch", "perf-record/perf.data")
                .unwrap()
                .payload,
            bin
        );
        assert_eq!(d.get("-", "system/empty").unwrap().payload, b"");
        assert_eq!(d.stray_bytes, 0);
    }

    #[test]
    fn stray_bytes_between_frames_are_skipped_and_counted() {
        let mut s = b"[  1.0] some kernel line\n".to_vec();
        s.extend(stream(&[("a", "-", b"x")]));
        let d = decode(&s);
        assert!(d.is_complete(), "{:?}", d.problems);
        assert_eq!(d.stray_bytes, 25);
        assert_eq!(d.frames[0].payload, b"x");
    }

    #[test]
    fn crlf_header_lines_are_accepted() {
        let s = String::from_utf8(stream(&[("a", "-", b"xy")]))
            .unwrap()
            .replace("\n", "\r\n");
        // The payload "xy" has no newline, but the framing newlines became \r\n.
        let d = decode(s.as_bytes());
        assert!(d.problems.is_empty(), "{:?}", d.problems);
        assert_eq!(d.frames[0].payload, b"xy");
    }

    #[test]
    fn a_flipped_payload_byte_is_a_checksum_error() {
        let mut s = stream(&[("a", "-", b"hello"), ("b", "-", b"world")]);
        let at = find(&s, 0, b"hello").unwrap();
        s[at] = b'j';
        let d = decode(&s);
        assert_eq!(d.frames.len(), 1, "only b survives");
        assert_eq!(d.frames[0].name, "b");
        assert!(matches!(
            d.problems.as_slice(),
            [ResultsError::BadChecksum { seq: 0, .. }]
        ));
    }

    #[test]
    fn a_lost_payload_byte_is_reported_and_the_next_frame_still_decodes() {
        let mut s = stream(&[("a", "-", b"hello"), ("b", "-", b"world")]);
        let at = find(&s, 0, b"hello").unwrap();
        s.remove(at);
        let d = decode(&s);
        assert_eq!(d.frames.len(), 1);
        assert_eq!(d.frames[0].name, "b");
        assert!(matches!(
            d.problems.as_slice(),
            [ResultsError::MissingEnd { seq: 0, .. }]
        ));
    }

    #[test]
    fn a_missing_frame_is_a_sequence_gap_and_a_count_mismatch() {
        let mut s = b"VPMU-RESULTS-BEGIN v1 experiments=x modes=-\n".to_vec();
        s.extend(frame_bytes(0, "a", "-", b"1"));
        s.extend(frame_bytes(2, "c", "-", b"3"));
        s.extend(b"VPMU-RESULTS-END frames=3\n");
        let d = decode(&s);
        assert_eq!(d.frames.len(), 2);
        assert_eq!(
            d.problems,
            vec![ResultsError::Missing {
                expected: 1,
                got: 2
            }]
        );
        // The count on the end line agrees with the sequence numbers (3), so that is all.
        let mut s2 = b"VPMU-RESULTS-BEGIN v1\n".to_vec();
        s2.extend(frame_bytes(0, "a", "-", b"1"));
        s2.extend(b"VPMU-RESULTS-END frames=2\n");
        assert_eq!(
            decode(&s2).problems,
            vec![ResultsError::CountMismatch { said: 2, got: 1 }]
        );
    }

    #[test]
    fn truncated_streams_are_reported() {
        let s = stream(&[("a", "-", b"hello world")]);
        // Cut inside the payload.
        let cut = find(&s, 0, b"world").unwrap();
        let d = decode(&s[..cut]);
        assert!(d.frames.is_empty());
        assert!(d.problems.contains(&ResultsError::Truncated {
            seq: 0,
            name: "a".into(),
            len: 11,
            got: 6
        }));
        assert!(d.problems.contains(&ResultsError::NoEndMarker));
        // Cut after a whole frame, before the end line.
        let end = find(&s, 0, b"VPMU-RESULTS-END").unwrap();
        let d = decode(&s[..end]);
        assert_eq!(d.frames.len(), 1);
        assert_eq!(d.problems, vec![ResultsError::NoEndMarker]);
        // Nothing at all.
        assert_eq!(decode(b"").problems, vec![ResultsError::Empty]);
        assert_eq!(
            decode(b"just a console\n").problems,
            vec![ResultsError::Empty]
        );
    }

    #[test]
    fn bad_headers_are_reported() {
        for (header, why) in [
            (
                "VPMU-FRAME v1 seq=0 name=a mode=- len=x crc32=00000000",
                "len",
            ),
            ("VPMU-FRAME v1 seq=0 name=a mode=- len=1 crc32=zz", "crc32"),
            ("VPMU-FRAME v1 seq=0 mode=- len=1 crc32=00000000", "name"),
        ] {
            let s = format!("{header}\nx\nVPMU-FRAME-END seq=0\nVPMU-RESULTS-END frames=0\n");
            let d = decode(s.as_bytes());
            assert!(d.frames.is_empty());
            assert!(
                matches!(&d.problems[0], ResultsError::BadHeader { why: w, .. } if w.contains(why)),
                "{header}: {:?}",
                d.problems
            );
        }
    }

    #[test]
    fn names_that_escape_the_output_directory_are_refused() {
        for bad in ["../x", "/etc/passwd", "a/../../b", "a b", "", "a//b", "."] {
            assert!(!safe_name(bad), "{bad:?}");
        }
        for good in ["perf-stat/cpu_split.csv", "system/dmesg.txt", "a"] {
            assert!(safe_name(good), "{good:?}");
        }
        let d = decode(&stream(&[("../evil", "-", b"x")]));
        assert!(d.frames.is_empty());
        assert!(matches!(d.problems[0], ResultsError::UnsafeName { .. }));
    }

    #[test]
    fn write_out_puts_frames_under_their_mode() {
        let dir = std::env::temp_dir().join(format!("vpmu-results-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let d = decode(&stream(&[
            ("system/cmdline", "-", b"console=ttyS0\n"),
            ("perf-stat/x.csv", "cpu-switch", b"1\n"),
        ]));
        let w = write_out(&d, &dir).unwrap();
        assert_eq!(w.files.len(), 2);
        assert_eq!(
            std::fs::read(dir.join("system/cmdline")).unwrap(),
            b"console=ttyS0\n"
        );
        assert_eq!(
            std::fs::read(dir.join("cpu-switch/perf-stat/x.csv")).unwrap(),
            b"1\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn json_document_lists_the_frames_written_and_the_problems() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = stream(&[
            ("system/cmdline", "-", b"console=ttyS0\n"),
            ("perf-stat/x.csv", "cpu-switch", b"1\n"),
        ]);
        let end = find(&s, 0, b"VPMU-RESULTS-END").unwrap();
        s.truncate(end);
        let d = decode(&s);
        let w = write_out(&d, dir.path()).unwrap();
        let j: serde_json::Value =
            serde_json::from_str(&to_json(&d, &w, dir.path()).to_string()).unwrap();
        assert_eq!(j["schema"], RESULTS_SCHEMA);
        assert_eq!(j["begin"].as_str(), d.begin.as_deref());
        assert_eq!(j["complete"], false);
        assert_eq!(j["problems"][0], ResultsError::NoEndMarker.to_string());
        let frames = j["frames"].as_array().unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1]["name"], "perf-stat/x.csv");
        assert_eq!(frames[1]["mode"], "cpu-switch");
        assert_eq!(frames[1]["bytes"], 2);
        assert_eq!(
            frames[1]["crc32"],
            format!("{:08x}", crc32fast::hash(b"1\n"))
        );
        let file = frames[1]["file"].as_str().unwrap();
        assert_eq!(std::fs::read(file).unwrap(), b"1\n");
    }

    /// Regression (issue 33): a frame numbered u64::MAX overflowed the next expected number
    /// (a panic in debug builds).
    #[test]
    fn a_frame_numbered_at_the_top_of_u64_is_a_problem_not_a_panic() {
        let mut s = frame_bytes(u64::MAX, "a.txt", "cpu", b"x");
        s.extend(frame_bytes(0, "b.txt", "cpu", b"y"));
        s.extend(b"VPMU-RESULTS-END frames=2\n");
        let d = decode(&s);
        assert!(d.problems.iter().any(|p| matches!(
            p,
            ResultsError::Missing {
                expected: 0,
                got: u64::MAX
            }
        )));
        assert_eq!(d.frames.len(), 2);
    }
}
