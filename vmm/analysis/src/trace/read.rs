//! Reading a trace without holding it: [`TraceFile`] checks a file's structure and reads its
//! end blocks first (block headers only, seeking past the records), then hands its records to
//! a view one block at a time, so `trace summary` and `report` need memory for what they show,
//! not for the file. [`Records`] is what the views read: a [`TraceFile`], or a
//! [`Trace`](super::format::Trace) held in memory (tests, hand-made traces); [`for_each_sample`]
//! gives each sample with the notes that follow it (task, executable, call stack);
//! [`Records::vcpu_records`] gives one vCPU's records by themselves (a `VcpuCursor` over the
//! file: `--dump` merges the vCPUs' streams in time order).
//!
//! Every error is one of [`FormatError`]'s, at the byte it concerns: the first pass finds a file
//! cut short or with a damaged block structure before any record is shown; a damaged record
//! (checksum, encoding) ends the second pass with an error, and the views print nothing then.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::format::{
    self, checksum, u16_at, u32_at, u64_at, FormatError, Header, Record, Trace, BLOCK_END,
    BLOCK_HEADER, BLOCK_RECORDS, BLOCK_TAG, CONTENTS_EXITS, CONTENTS_SAMPLES, MAX_BLOCK_RECORDS,
    RECORD_SIZE,
};
use crate::guest_task::GuestMapping;
use crate::guest_task::{GuestExe, GuestTask, Unresolved};

/// Read buffer of the record pass (the file is read in order, once per view).
const READ_BUFFER: usize = 1 << 20;

/// How one vCPU's part of the trace ended (its end block).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VcpuEnd {
    /// Records dropped because the writer fell behind (no free buffer).
    pub dropped: u64,
    pub end_tsc: u64,
    pub end_thread_cpu_ns: u64,
}

/// A trace as the views read it: header, each vCPU's end, records in file order.
pub trait Records {
    fn header(&self) -> &Header;
    /// One entry per vCPU of the header.
    fn vcpu_ends(&self) -> Vec<VcpuEnd>;
    /// Calls `f(vcpu, record)` for every record, each vCPU's in the order they were written.
    fn for_each(&self, f: &mut dyn FnMut(usize, &Record)) -> Result<(), FormatError>;
    /// One vCPU's records in the order they were written, read on demand (memory for one
    /// record at a time). For after a [`Self::for_each`] pass has checked the whole trace: a
    /// damaged record is then an error here too, but only once records before it were given.
    fn vcpu_records(
        &self,
        vcpu: usize,
    ) -> Box<dyn Iterator<Item = Result<Record, FormatError>> + '_>;

    fn has_exits(&self) -> bool {
        self.header().contents & CONTENTS_EXITS != 0
    }
    fn has_samples(&self) -> bool {
        self.header().contents & CONTENTS_SAMPLES != 0
    }
    /// The run's end: the latest end TSC of any vCPU.
    fn end_tsc(&self) -> u64 {
        self.vcpu_ends()
            .iter()
            .map(|v| v.end_tsc)
            .max()
            .unwrap_or(self.header().start_tsc)
    }
}

impl Records for Trace {
    fn header(&self) -> &Header {
        &self.header
    }
    fn vcpu_ends(&self) -> Vec<VcpuEnd> {
        self.vcpus
            .iter()
            .map(|v| VcpuEnd {
                dropped: v.dropped,
                end_tsc: v.end_tsc,
                end_thread_cpu_ns: v.end_thread_cpu_ns,
            })
            .collect()
    }
    fn for_each(&self, f: &mut dyn FnMut(usize, &Record)) -> Result<(), FormatError> {
        for (i, v) in self.vcpus.iter().enumerate() {
            v.records.iter().for_each(|r| f(i, r));
        }
        Ok(())
    }
    fn vcpu_records(
        &self,
        vcpu: usize,
    ) -> Box<dyn Iterator<Item = Result<Record, FormatError>> + '_> {
        let records = self.vcpus.get(vcpu).map_or(&[][..], |v| &v.records[..]);
        Box::new(records.iter().map(|r| Ok(*r)))
    }
}

/// Where a [`TraceFile`]'s bytes are.
#[derive(Debug)]
enum Source {
    File(PathBuf),
    Bytes(Vec<u8>),
}

/// A trace file whose structure and end blocks were read; its records are read on demand.
#[derive(Debug)]
pub struct TraceFile {
    source: Source,
    header: Header,
    ends: Vec<VcpuEnd>,
    /// Where the first block starts.
    blocks_at: u64,
    /// The file's length when it was opened.
    len: u64,
}

/// A block header, checked against the file's header and length.
struct Block {
    at: u64,
    vcpu: usize,
    end: bool,
    count: u32,
    dropped: u32,
    sum: u32,
}

impl Block {
    fn body(&self) -> u64 {
        self.at + BLOCK_HEADER as u64
    }
    fn body_len(&self) -> usize {
        self.count as usize * RECORD_SIZE
    }
}

impl TraceFile {
    /// Opens `path`: reads its header, walks its block headers and reads every vCPU's end block.
    pub fn open(path: &Path) -> Result<TraceFile, FormatError> {
        let file = File::open(path).map_err(|e| io(path, e))?;
        let len = file.metadata().map_err(|e| io(path, e))?.len();
        let mut r = BufReader::with_capacity(64 << 10, file);
        let (header, ends, blocks_at) = scan(&mut r, len).map_err(|e| e.at(path))?;
        Ok(TraceFile {
            source: Source::File(path.to_path_buf()),
            header,
            ends,
            blocks_at,
            len,
        })
    }

    /// The same over bytes in memory.
    pub fn from_bytes(b: Vec<u8>) -> Result<TraceFile, FormatError> {
        let len = b.len() as u64;
        let (header, ends, blocks_at) =
            scan(&mut std::io::Cursor::new(&b), len).map_err(|e| e.at(Path::new("(memory)")))?;
        Ok(TraceFile {
            source: Source::Bytes(b),
            header,
            ends,
            blocks_at,
            len,
        })
    }

    /// Every record in memory (tests and small files; the views stream instead).
    pub fn load(&self) -> Result<Trace, FormatError> {
        let mut vcpus = vec![format::VcpuTrace::default(); self.ends.len()];
        for (v, e) in vcpus.iter_mut().zip(&self.ends) {
            v.dropped = e.dropped;
            v.end_tsc = e.end_tsc;
            v.end_thread_cpu_ns = e.end_thread_cpu_ns;
        }
        self.for_each(&mut |v, r| vcpus[v].records.push(*r))?;
        Ok(Trace {
            header: self.header.clone(),
            vcpus,
        })
    }

    fn records_pass(
        &self,
        r: &mut dyn Read,
        f: &mut dyn FnMut(usize, &Record),
    ) -> Result<(), ReadError> {
        let n = self.ends.len();
        let mut at = self.blocks_at;
        let mut ended = vec![false; n];
        let mut body = Vec::new();
        while at < self.len {
            let b = block_head(r, at, self.len, n, &ended)?;
            body.resize(b.body_len(), 0);
            r.read_exact(&mut body).map_err(|e| {
                ReadError::from_io(e, "block of records", b.body(), b.body_len(), self.len)
            })?;
            if checksum(&body) != b.sum {
                return Err(damaged(&b).into());
            }
            at = b.body() + b.body_len() as u64;
            if b.end {
                ended[b.vcpu] = true;
                continue;
            }
            for (i, chunk) in body.chunks_exact(RECORD_SIZE).enumerate() {
                let rec = Record::decode(chunk.try_into().expect("chunks of RECORD_SIZE"))
                    .map_err(|source| FormatError::BadRecord {
                        offset: (b.body() + (i * RECORD_SIZE) as u64) as usize,
                        source,
                    })?;
                f(b.vcpu, &rec);
            }
        }
        Ok(())
    }
}

impl Records for TraceFile {
    fn header(&self) -> &Header {
        &self.header
    }
    fn vcpu_ends(&self) -> Vec<VcpuEnd> {
        self.ends.clone()
    }
    fn for_each(&self, f: &mut dyn FnMut(usize, &Record)) -> Result<(), FormatError> {
        match &self.source {
            Source::File(path) => {
                let mut file = File::open(path).map_err(|e| io(path, e))?;
                file.seek(SeekFrom::Start(self.blocks_at))
                    .map_err(|e| io(path, e))?;
                let mut r = BufReader::with_capacity(READ_BUFFER, file);
                self.records_pass(&mut r, f).map_err(|e| e.at(path))
            }
            Source::Bytes(b) => {
                let mut r = &b[self.blocks_at as usize..];
                self.records_pass(&mut r, f)
                    .map_err(|e| e.at(Path::new("(memory)")))
            }
        }
    }
    fn vcpu_records(
        &self,
        vcpu: usize,
    ) -> Box<dyn Iterator<Item = Result<Record, FormatError>> + '_> {
        let n = self.ends.len();
        match &self.source {
            Source::File(path) => match File::open(path) {
                Ok(file) => Box::new(CursorIter {
                    cursor: VcpuCursor::new(file, self.blocks_at, vcpu, n, self.len),
                    path: path.clone(),
                }),
                Err(e) => Box::new(std::iter::once(Err(io(path, e)))),
            },
            Source::Bytes(b) => Box::new(CursorIter {
                cursor: VcpuCursor::new(
                    std::io::Cursor::new(&b[..]),
                    self.blocks_at,
                    vcpu,
                    n,
                    self.len,
                ),
                path: PathBuf::from("(memory)"),
            }),
        }
    }
}

/// Read buffer of a [`VcpuCursor`] (small: it also reads the headers of the other vCPUs' blocks
/// it skips).
const CURSOR_BUFFER: usize = 16 << 10;

/// One vCPU's records in a checked trace, read block by block and record by record: the block
/// headers of other vCPUs are read and their bodies skipped.
struct VcpuCursor<R: Read + Seek> {
    r: BufReader<R>,
    /// Where `r` is.
    pos: u64,
    vcpu: usize,
    /// Where the next block header is.
    next_block: u64,
    /// Records left in the current block.
    left: u32,
    ended: Vec<bool>,
    len: u64,
    done: bool,
}

impl<R: Read + Seek> VcpuCursor<R> {
    fn new(inner: R, blocks_at: u64, vcpu: usize, vcpus: usize, len: u64) -> Self {
        VcpuCursor {
            r: BufReader::with_capacity(CURSOR_BUFFER, inner),
            pos: 0,
            vcpu,
            next_block: blocks_at,
            left: 0,
            ended: vec![false; vcpus],
            len,
            done: false,
        }
    }

    fn go_to(&mut self, at: u64) -> Result<(), ReadError> {
        // Forward within reach: keep what the buffer holds; anything else: a real seek.
        match i64::try_from(at.wrapping_sub(self.pos)) {
            Ok(d) if at >= self.pos => self.r.seek_relative(d).map_err(ReadError::Io)?,
            _ => {
                self.r.seek(SeekFrom::Start(at)).map_err(ReadError::Io)?;
            }
        }
        self.pos = at;
        Ok(())
    }

    fn next_record(&mut self) -> Result<Option<Record>, ReadError> {
        while self.left == 0 {
            if self.next_block >= self.len {
                return Ok(None);
            }
            let at = self.next_block;
            self.go_to(at)?;
            let b = block_head(&mut self.r, at, self.len, self.ended.len(), &self.ended)?;
            self.pos = b.body();
            self.next_block = b.body() + b.body_len() as u64;
            if b.end {
                self.ended[b.vcpu] = true;
                if b.vcpu == self.vcpu {
                    return Ok(None);
                }
            } else if b.vcpu == self.vcpu {
                self.left = b.count;
            }
        }
        let at = self.pos;
        let mut raw = [0u8; RECORD_SIZE];
        self.r
            .read_exact(&mut raw)
            .map_err(|e| ReadError::from_io(e, "record", at, RECORD_SIZE, self.len))?;
        self.pos += RECORD_SIZE as u64;
        self.left -= 1;
        Record::decode(&raw).map(Some).map_err(|source| {
            FormatError::BadRecord {
                offset: at as usize,
                source,
            }
            .into()
        })
    }
}

/// A [`VcpuCursor`] as an iterator, its errors named by `path`.
struct CursorIter<R: Read + Seek> {
    cursor: VcpuCursor<R>,
    path: PathBuf,
}

impl<R: Read + Seek> Iterator for CursorIter<R> {
    type Item = Result<Record, FormatError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.cursor.done {
            return None;
        }
        let item = self.cursor.next_record().map_err(|e| e.at(&self.path));
        self.cursor.done = !matches!(item, Ok(Some(_)));
        item.transpose()
    }
}

/// The notes the recorder wrote after a sample: its guest task, executable and call stack.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notes {
    pub task: Option<Result<GuestTask, Unresolved>>,
    pub exe: Option<Result<GuestExe, Unresolved>>,
    /// The mapping of a user RIP outside the executable's code.
    pub mapping: Option<Result<GuestMapping, Unresolved>>,
    /// Files mapped at return addresses in other libraries (neither the executable nor the
    /// RIP's mapping).
    pub caller_mappings: Vec<GuestMapping>,
    /// Return addresses, innermost first.
    pub frames: Vec<u64>,
    pub stack_top: Option<[u64; 2]>,
}

impl Notes {
    /// Takes `r` if it is a note; false if it is not (it ends the notes of a sample).
    pub fn add(&mut self, r: &Record) -> bool {
        match r {
            Record::Task { task, .. } => self.task = Some(*task),
            Record::Exe(e) => self.exe = Some(*e),
            Record::Mapping(m) => self.mapping = Some(*m),
            Record::CallerMapping(m) => self.caller_mappings.push(*m),
            Record::CallFrames { count, addrs } => self
                .frames
                .extend_from_slice(&addrs[..usize::from(*count).min(3)]),
            Record::UserStackTop(words) => self.stack_top = Some(*words),
            _ => return false,
        }
        true
    }
}

/// Calls `f(vcpu, sample, notes)` for every sample record, with the notes that follow it on its
/// vCPU (notes after anything but a sample belong to nothing and are skipped).
pub fn for_each_sample(
    t: &dyn Records,
    f: &mut dyn FnMut(usize, &Record, &Notes),
) -> Result<(), FormatError> {
    let n = usize::from(t.header().vcpus);
    let mut pending: Vec<Option<(Record, Notes)>> = vec![None; n];
    t.for_each(&mut |v, r| {
        if r.is_sample_note() {
            if let Some((_, notes)) = &mut pending[v] {
                notes.add(r);
            }
            return;
        }
        if let Some((s, notes)) = pending[v].take() {
            f(v, &s, &notes);
        }
        if matches!(r, Record::Sample { .. }) {
            pending[v] = Some((*r, Notes::default()));
        }
    })?;
    for (v, p) in pending.into_iter().enumerate() {
        if let Some((s, notes)) = p {
            f(v, &s, &notes);
        }
    }
    Ok(())
}

/// A reading error before the file's name is known to it.
enum ReadError {
    Io(std::io::Error),
    Format(FormatError),
}

impl ReadError {
    /// A short read is the file cut short; anything else an I/O error.
    fn from_io(e: std::io::Error, what: &'static str, at: u64, need: usize, len: u64) -> Self {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            ReadError::Format(truncated(what, at, need, len))
        } else {
            ReadError::Io(e)
        }
    }

    fn at(self, path: &Path) -> FormatError {
        match self {
            ReadError::Io(e) => io(path, e),
            ReadError::Format(f) => f,
        }
    }
}

impl From<FormatError> for ReadError {
    fn from(f: FormatError) -> Self {
        ReadError::Format(f)
    }
}

/// The first pass: the header, every block header (checked), and the end blocks.
fn scan<R: Read + Seek>(r: &mut R, len: u64) -> Result<(Header, Vec<VcpuEnd>, u64), ReadError> {
    let header = read_header(r, len)?;
    let (header, blocks_at) = header;
    let n = usize::from(header.vcpus);
    // Every vCPU ends with an end block: a file too short for them is cut short (and the
    // per-vCPU state below is then never larger than the file).
    need(
        blocks_at,
        (n * (BLOCK_HEADER + RECORD_SIZE)) as u64,
        len,
        "end blocks of every vCPU",
    )?;
    let mut ends = vec![VcpuEnd::default(); n];
    let mut ended = vec![false; n];
    let mut at = blocks_at;
    while at < len {
        let b = block_head(r, at, len, n, &ended)?;
        let next = b.body() + b.body_len() as u64;
        if b.end {
            let mut rec = [0u8; RECORD_SIZE];
            r.read_exact(&mut rec)
                .map_err(|e| ReadError::from_io(e, "end block", b.body(), RECORD_SIZE, len))?;
            if checksum(&rec) != b.sum {
                return Err(damaged(&b).into());
            }
            if rec[0] != 4 {
                return Err(corrupt(b.body(), "end block without an end record".into()).into());
            }
            ends[b.vcpu] = VcpuEnd {
                dropped: u64_at(&rec, 8),
                end_tsc: u64_at(&rec, 16),
                end_thread_cpu_ns: u64_at(&rec, 24),
            };
            ended[b.vcpu] = true;
        } else {
            // Saturating: the counts are the file's.
            ends[b.vcpu].dropped = ends[b.vcpu].dropped.saturating_add(u64::from(b.dropped));
            r.seek(SeekFrom::Start(next)).map_err(ReadError::Io)?;
        }
        at = next;
    }
    if let Some(v) = ended.iter().position(|e| !e) {
        return Err(FormatError::NoEnd(v as u16).into());
    }
    Ok((header, ends, blocks_at))
}

fn read_header<R: Read>(r: &mut R, len: u64) -> Result<(Header, u64), ReadError> {
    let fixed = (len as usize).min(format::HEADER_FIXED);
    let mut b = vec![0u8; fixed];
    r.read_exact(&mut b).map_err(ReadError::Io)?;
    if fixed == format::HEADER_FIXED && &b[..8] == format::MAGIC {
        // The kernel path: at most u16::MAX bytes, and no more than the file holds.
        let path_len = usize::from(u16_at(&b, 40));
        let more = path_len.min(len as usize - fixed);
        b.resize(fixed + more, 0);
        r.read_exact(&mut b[fixed..]).map_err(ReadError::Io)?;
    }
    let (h, at) = Header::decode(&b)?;
    Ok((h, at as u64))
}

/// Reads and checks the block header at `at` (the reader is there), and that its body fits.
fn block_head(
    r: &mut dyn Read,
    at: u64,
    len: u64,
    n: usize,
    ended: &[bool],
) -> Result<Block, ReadError> {
    need(at, BLOCK_HEADER as u64, len, "block header")?;
    let mut h = [0u8; BLOCK_HEADER];
    r.read_exact(&mut h)
        .map_err(|e| ReadError::from_io(e, "block header", at, BLOCK_HEADER, len))?;
    if &h[0..4] != BLOCK_TAG {
        return Err(corrupt(at, "block tag is not \"VBLK\"".into()).into());
    }
    let vcpu = u16_at(&h, 4);
    let kind = u16_at(&h, 6);
    let count = u32_at(&h, 8);
    let v = usize::from(vcpu);
    if v >= n {
        return Err(corrupt(
            at + 4,
            format!("block for vCPU {vcpu}, but the header says {n} vCPU(s)"),
        )
        .into());
    }
    if ended[v] {
        return Err(corrupt(at, format!("block for vCPU {vcpu} after its end block")).into());
    }
    let end = match kind {
        BLOCK_RECORDS if count == 0 || count > MAX_BLOCK_RECORDS => {
            return Err(corrupt(at + 8, format!("block of {count} records")).into())
        }
        BLOCK_RECORDS => false,
        BLOCK_END if count != 1 => {
            return Err(corrupt(at + 8, format!("end block of {count} records")).into())
        }
        BLOCK_END => true,
        k => return Err(corrupt(at + 6, format!("unknown block kind {k}")).into()),
    };
    let b = Block {
        at,
        vcpu: v,
        end,
        count,
        dropped: u32_at(&h, 12),
        sum: u32_at(&h, 16),
    };
    let what = if end { "end block" } else { "block of records" };
    need(b.body(), b.body_len() as u64, len, what)?;
    Ok(b)
}

fn need(at: u64, n: u64, len: u64, what: &'static str) -> Result<(), FormatError> {
    if len.saturating_sub(at) < n {
        return Err(truncated(what, at, n as usize, len));
    }
    Ok(())
}

fn truncated(what: &'static str, at: u64, need: usize, len: u64) -> FormatError {
    format::truncated(what, at as usize, need, len.saturating_sub(at) as usize)
}

fn corrupt(at: u64, what: String) -> FormatError {
    format::corrupt(at as usize, what)
}

fn damaged(b: &Block) -> FormatError {
    corrupt(
        b.body(),
        format!(
            "checksum mismatch in a block of vCPU {} (damaged records)",
            b.vcpu
        ),
    )
}

fn io(path: &Path, source: std::io::Error) -> FormatError {
    FormatError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl Trace {
    /// Reads a whole file into memory ([`TraceFile`] reads it without).
    pub fn read_file(path: &Path) -> Result<Trace, FormatError> {
        TraceFile::open(path)?.load()
    }

    pub fn parse(b: &[u8]) -> Result<Trace, FormatError> {
        TraceFile::from_bytes(b.to_vec())?.load()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_task::{GuestTask, COMM_MAX};
    use crate::trace::format::{block_header, end_record, ExitEvent, Reason, SampleClock};

    fn header(vcpus: u16) -> Header {
        Header {
            vcpus,
            contents: CONTENTS_EXITS | CONTENTS_SAMPLES,
            tsc_khz: 1000,
            start_tsc: 0,
            sample_clock: SampleClock::DomainSwitch,
            sample_period_ns: 1_000_000,
            kernel: String::new(),
        }
    }

    fn sample(tsc: u64) -> Record {
        Record::Sample {
            rip: 0x40_0000 + tsc,
            cpl: 3,
            tsc,
            during: None,
            mode: None,
        }
    }

    fn task(pid: u32) -> Record {
        Record::Task {
            cr3: 0x1000,
            task: Ok(GuestTask {
                pid,
                tgid: pid,
                comm: [b'a'; COMM_MAX],
                kernel_thread: false,
            }),
        }
    }

    /// A file of `blocks` (vCPU, records) in that order, then every vCPU's end block.
    fn file(vcpus: u16, blocks: &[(u16, Vec<Record>)]) -> Vec<u8> {
        let mut f = header(vcpus).encode();
        for (v, recs) in blocks {
            let mut body = Vec::new();
            for r in recs {
                let mut b = [0u8; RECORD_SIZE];
                r.encode(&mut b);
                body.extend_from_slice(&b);
            }
            f.extend_from_slice(&block_header(*v, false, recs.len() as u32, 1, &body));
            f.extend_from_slice(&body);
        }
        for v in 0..vcpus {
            let end = end_record(9000 + u64::from(v), 7, 42);
            f.extend_from_slice(&block_header(v, true, 1, 0, &end));
            f.extend_from_slice(&end);
        }
        f
    }

    fn exit(tsc: u64) -> Record {
        Record::Exit {
            event: ExitEvent::new(Reason::Hlt),
            exit_tsc: tsc,
            entry_tsc: tsc + 1,
        }
    }

    #[test]
    fn a_sample_keeps_its_notes_across_blocks_and_other_vcpus_blocks() {
        // vCPU 0's sample ends one block; its task note starts its next block, after a block of
        // vCPU 1 with a sample and notes of its own.
        let f = file(
            2,
            &[
                (0, vec![exit(1), sample(2)]),
                (1, vec![sample(3), task(11), exit(4)]),
                (0, vec![task(10), sample(5)]),
                (1, vec![task(12)]),
            ],
        );
        let t = TraceFile::from_bytes(f).unwrap();
        assert_eq!(t.end_tsc(), 9001);
        assert_eq!(t.vcpu_ends()[1].dropped, 7, "the end block's total");
        let mut seen = Vec::new();
        for_each_sample(&t, &mut |v, r, notes| {
            let pid = match notes.task {
                Some(Ok(t)) => t.pid,
                _ => 0,
            };
            seen.push((v, r.tsc(), pid));
        })
        .unwrap();
        seen.sort();
        assert_eq!(seen, vec![(0, 2, 10), (0, 5, 0), (1, 3, 11)]);
        // An orphan note (after an exit) belongs to nothing: vCPU 1's task(12) follows exit(4).
    }

    #[test]
    fn streaming_and_loading_see_the_same_records() {
        let blocks: Vec<(u16, Vec<Record>)> = (0..50)
            .map(|i| (i % 3, (0..7).map(|j| sample(i as u64 * 10 + j)).collect()))
            .collect();
        let bytes = file(3, &blocks);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.trace");
        std::fs::write(&path, &bytes).unwrap();
        let on_disk = TraceFile::open(&path).unwrap();
        let mut streamed: Vec<Vec<Record>> = vec![Vec::new(); 3];
        on_disk.for_each(&mut |v, r| streamed[v].push(*r)).unwrap();
        let loaded = Trace::parse(&bytes).unwrap();
        for (v, recs) in streamed.iter().enumerate() {
            assert_eq!(recs, &loaded.vcpus[v].records, "vCPU {v}");
        }
        assert_eq!(on_disk.load().unwrap(), loaded);
    }

    #[test]
    fn each_vcpus_cursor_reads_its_own_blocks_in_order() {
        let blocks: Vec<(u16, Vec<Record>)> = (0..40u64)
            .map(|i| {
                (
                    (i % 3) as u16,
                    (0..(i % 5 + 1)).map(|j| sample(i * 10 + j)).collect(),
                )
            })
            .collect();
        let bytes = file(3, &blocks);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.trace");
        std::fs::write(&path, &bytes).unwrap();
        let loaded = Trace::parse(&bytes).unwrap();
        let on_disk = TraceFile::open(&path).unwrap();
        let in_memory = TraceFile::from_bytes(bytes).unwrap();
        for v in 0..3 {
            for t in [&on_disk as &dyn Records, &in_memory, &loaded] {
                let recs: Vec<Record> = t.vcpu_records(v).map(Result::unwrap).collect();
                assert_eq!(recs, loaded.vcpus[v].records, "vCPU {v}");
            }
        }
        // Cut after opening: the cursor's error, after the records before the cut.
        let full = std::fs::read(&path).unwrap();
        std::fs::write(&path, &full[..full.len() / 2]).unwrap();
        let items: Vec<_> = on_disk.vcpu_records(2).collect();
        assert!(items.last().unwrap().is_err(), "{items:?}");
        assert!(items.iter().rev().skip(1).all(Result::is_ok));
    }

    /// `trace summary --dump` over a file equals it over the loaded trace, is in time order
    /// (ties: lower vCPU first), keeps each note right after its sample, and loses no record,
    /// although each vCPU's exit record is written after the samples taken while the VMM
    /// handled that exit (later in time), as the recorder writes them.
    #[test]
    fn the_dump_streams_in_time_order() {
        let mut blocks: Vec<(u16, Vec<Record>)> = Vec::new();
        for i in 0..60u64 {
            let v = (i % 3) as u16;
            let t0 = i * 100 + u64::from(v);
            // An exit at t0 handled until t0 + 50, a sample (and its note) at t0 + 20 during it.
            let exit = Record::Exit {
                event: ExitEvent::new(Reason::Hlt),
                exit_tsc: t0,
                entry_tsc: t0 + 50,
            };
            blocks.push((v, vec![sample(t0 + 20), task(i as u32), exit]));
        }
        let bytes = file(3, &blocks);
        let loaded = Trace::parse(&bytes).unwrap();
        let on_disk = TraceFile::from_bytes(bytes).unwrap();
        let mut a = Vec::new();
        crate::trace::summary::dump(&on_disk, &mut a).unwrap();
        let mut b = Vec::new();
        crate::trace::summary::dump(&loaded, &mut b).unwrap();
        assert_eq!(a, b);
        let text = String::from_utf8(a).unwrap();
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(lines.len(), 180, "{text}");
        let key = |l: &str| {
            let mut f = l.split(' ');
            let t: f64 = f.next().unwrap().parse().unwrap();
            let v: u32 = f.next().unwrap()[4..].parse().unwrap();
            ((t * 1e6).round() as u64, v)
        };
        assert!(lines.windows(2).all(|w| key(w[0]) <= key(w[1])), "{text}");
        for (i, l) in lines.iter().enumerate() {
            if l.contains(" task ") {
                assert!(lines[i - 1].contains(" sample "), "{text}");
                assert_eq!(key(l), key(lines[i - 1]));
            }
        }
        assert!(!text.contains("shown late"));
    }

    #[test]
    fn a_file_cut_or_damaged_after_opening_is_an_error_not_a_panic() {
        let bytes = file(1, &[(0, vec![sample(1), sample(2)])]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.trace");
        std::fs::write(&path, &bytes).unwrap();
        let t = TraceFile::open(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 40]).unwrap();
        let e = t.for_each(&mut |_, _| {}).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        let mut bad = bytes.clone();
        let rec = header(1).encode().len() + BLOCK_HEADER;
        bad[rec + 16] ^= 0xff;
        std::fs::write(&path, &bad).unwrap();
        let e = t.for_each(&mut |_, _| {}).unwrap_err().to_string();
        assert!(e.contains("checksum mismatch"), "{e}");
        let e = TraceFile::open(&dir.path().join("none")).unwrap_err();
        assert!(e.to_string().contains("cannot read"), "{e}");
    }
}
