//! Writing a trace off the vCPUs' hot path, in bounded memory.
//!
//! Each vCPU owns a [`VcpuSink`] with a fixed pool of record buffers. A vCPU fills one buffer
//! (a `Vec` push, no lock, no syscall) and hands it, when full, to the writer thread over a
//! channel; the writer encodes it to the file and gives the emptied buffer back. If the writer
//! falls behind so that a vCPU has no free buffer, records are *dropped and counted*, never
//! queued: memory stays at `vcpus x buffers x records_per_buffer x 32` bytes whatever happens.
//! The counts of dropped records go into the file (each block and each vCPU's end block) and
//! the summary says so.

use std::io::{self, Write};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::thread::JoinHandle;

use analysis::trace::format::{self, Header, Record, RECORD_SIZE};

/// Pool size per vCPU.
#[derive(Debug, Clone, Copy)]
pub struct PoolConfig {
    pub buffers: usize,
    pub records_per_buffer: usize,
}

impl Default for PoolConfig {
    /// 8 x 4096 records x 32 bytes = 1 MiB per vCPU.
    fn default() -> Self {
        PoolConfig {
            buffers: 8,
            records_per_buffer: 4096,
        }
    }
}

enum Msg {
    Block {
        vcpu: u16,
        records: Vec<Record>,
        dropped: u32,
    },
    End {
        vcpu: u16,
        end_tsc: u64,
        dropped_total: u64,
        thread_cpu_ns: u64,
    },
}

/// What the writer thread did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WriterStats {
    pub records: u64,
    pub blocks: u64,
    pub bytes: u64,
    pub dropped: u64,
}

/// One vCPU's end of the writer: fills buffers, hands them over, drops (and counts) when none
/// is free.
pub(crate) struct VcpuSink {
    vcpu: u16,
    cap: usize,
    current: Option<Vec<Record>>,
    free: Receiver<Vec<Record>>,
    to_writer: SyncSender<Msg>,
    dropped_pending: u64,
    dropped_total: u64,
}

impl VcpuSink {
    #[inline]
    pub(crate) fn push(&mut self, r: Record) {
        if self.current.is_none() {
            self.current = self.free.try_recv().ok();
        }
        match &mut self.current {
            Some(buf) => {
                buf.push(r);
                if buf.len() >= self.cap {
                    self.hand_off();
                }
            }
            None => {
                self.dropped_pending += 1;
                self.dropped_total += 1;
            }
        }
    }

    fn hand_off(&mut self) {
        let Some(records) = self.current.take() else {
            return;
        };
        if records.is_empty() {
            self.current = Some(records);
            return;
        }
        let n = records.len() as u64;
        let dropped = self.dropped_pending.min(u64::from(u32::MAX)) as u32;
        // The channel holds as many messages as there are buffers (plus end messages), so
        // this never blocks; it fails only if the writer thread is gone (write error).
        match self.to_writer.try_send(Msg::Block {
            vcpu: self.vcpu,
            records,
            dropped,
        }) {
            Ok(()) => self.dropped_pending -= u64::from(dropped),
            Err(_) => {
                self.dropped_pending += n;
                self.dropped_total += n;
            }
        }
        self.current = self.free.try_recv().ok();
    }

    /// Hands over what is left and closes this vCPU's part of the file.
    pub(crate) fn finish(mut self, end_tsc: u64, thread_cpu_ns: u64) {
        self.hand_off();
        let _ = self.to_writer.try_send(Msg::End {
            vcpu: self.vcpu,
            end_tsc,
            dropped_total: self.dropped_total,
            thread_cpu_ns,
        });
    }

    #[cfg(test)]
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped_total
    }
}

/// The writer thread; [`TraceWriter::join`] after every sink has finished (or been dropped).
pub(crate) struct TraceWriter {
    handle: JoinHandle<io::Result<WriterStats>>,
}

impl TraceWriter {
    /// Writes the header now (so a bad path fails before the VM runs) and starts the thread.
    /// `out` should be buffered (a `BufWriter<File>`): the thread writes one block at a time.
    pub(crate) fn start<W: Write + Send + 'static>(
        mut out: W,
        header: &Header,
        pool: PoolConfig,
    ) -> io::Result<(TraceWriter, Vec<VcpuSink>)> {
        out.write_all(&header.encode())?;
        let vcpus = usize::from(header.vcpus);
        let (to_writer, from_vcpus) = sync_channel(vcpus * (pool.buffers + 1) + 1);
        let mut sinks = Vec::new();
        let mut returns: Vec<Sender<Vec<Record>>> = Vec::new();
        for v in 0..vcpus {
            let (ret, free) = channel();
            for _ in 0..pool.buffers {
                ret.send(Vec::with_capacity(pool.records_per_buffer))
                    .expect("receiver is alive");
            }
            returns.push(ret);
            sinks.push(VcpuSink {
                vcpu: v as u16,
                cap: pool.records_per_buffer.max(1),
                current: None,
                free,
                to_writer: to_writer.clone(),
                dropped_pending: 0,
                dropped_total: 0,
            });
        }
        drop(to_writer);
        let confine = crate::seccomp::for_new_thread(crate::seccomp::ThreadKind::TraceWriter);
        let handle = std::thread::Builder::new()
            .name("trace-writer".into())
            .spawn(move || {
                confine.apply();
                write_loop(out, from_vcpus, returns)
            })?;
        Ok((TraceWriter { handle }, sinks))
    }

    pub(crate) fn join(self) -> io::Result<WriterStats> {
        self.handle
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("trace writer thread panicked")))
    }
}

fn write_loop<W: Write>(
    mut out: W,
    from_vcpus: Receiver<Msg>,
    returns: Vec<Sender<Vec<Record>>>,
) -> io::Result<WriterStats> {
    let mut stats = WriterStats::default();
    let mut bytes = Vec::new();
    for msg in from_vcpus {
        bytes.clear();
        match msg {
            Msg::Block {
                vcpu,
                mut records,
                dropped,
            } => {
                bytes.resize(format::BLOCK_HEADER, 0);
                let mut rec = [0u8; RECORD_SIZE];
                for r in &records {
                    r.encode(&mut rec);
                    bytes.extend_from_slice(&rec);
                }
                let head = format::block_header(
                    vcpu,
                    false,
                    records.len() as u32,
                    dropped,
                    &bytes[format::BLOCK_HEADER..],
                );
                bytes[..format::BLOCK_HEADER].copy_from_slice(&head);
                stats.records += records.len() as u64;
                stats.blocks += 1;
                out.write_all(&bytes)?;
                stats.bytes += bytes.len() as u64;
                // Back to the vCPU only once written: a slow disk shows up as drops.
                records.clear();
                let _ = returns[usize::from(vcpu)].send(records);
                continue;
            }
            Msg::End {
                vcpu,
                end_tsc,
                dropped_total,
                thread_cpu_ns,
            } => {
                let end = format::end_record(end_tsc, dropped_total, thread_cpu_ns);
                bytes.extend_from_slice(&format::block_header(vcpu, true, 1, 0, &end));
                bytes.extend_from_slice(&end);
                stats.dropped += dropped_total;
            }
        }
        out.write_all(&bytes)?;
        stats.bytes += bytes.len() as u64;
    }
    out.flush()?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use analysis::trace::format::{ExitEvent, Reason, SampleClock, Trace, CONTENTS_EXITS};
    use std::sync::{Arc, Condvar, Mutex};

    /// A `Write` into shared memory that can be held shut (a writer that falls behind).
    /// Bytes written so far, and whether writes may proceed.
    type Shared = (Mutex<(Vec<u8>, bool)>, Condvar);
    #[derive(Clone, Default)]
    struct Gate {
        inner: Arc<Shared>,
    }
    impl Gate {
        fn open(&self) {
            self.inner.0.lock().unwrap().1 = true;
            self.inner.1.notify_all();
        }
        fn bytes(&self) -> Vec<u8> {
            self.inner.0.lock().unwrap().0.clone()
        }
    }
    impl Write for Gate {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let mut g = self.inner.0.lock().unwrap();
            while !g.1 {
                g = self.inner.1.wait(g).unwrap();
            }
            g.0.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn header(vcpus: u16) -> Header {
        Header {
            vcpus,
            contents: CONTENTS_EXITS,
            tsc_khz: 1_000_000,
            start_tsc: 0,
            sample_clock: SampleClock::None,
            sample_period_ns: 0,
            kernel: String::new(),
        }
    }

    fn exit(i: u64) -> Record {
        Record::Exit {
            event: ExitEvent {
                detail: i as u32,
                ..ExitEvent::new(Reason::IoOut)
            },
            exit_tsc: 10 * i + 1,
            entry_tsc: 10 * i + 2,
        }
    }

    #[test]
    fn records_from_several_vcpus_come_back_in_order() {
        let gate = Gate::default();
        gate.open();
        let pool = PoolConfig {
            buffers: 2,
            records_per_buffer: 3,
        };
        let (w, sinks) = TraceWriter::start(gate.clone(), &header(2), pool).unwrap();
        let threads: Vec<_> = sinks
            .into_iter()
            .map(|mut s| {
                std::thread::spawn(move || {
                    for i in 0..10 {
                        s.push(exit(i));
                        // Let the writer keep up: this test is about order, not drops.
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    s.finish(1000, 7);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let stats = w.join().unwrap();
        assert_eq!((stats.records, stats.dropped), (20, 0));
        let t = Trace::parse(&gate.bytes()).unwrap();
        for v in &t.vcpus {
            assert_eq!(v.records, (0..10).map(exit).collect::<Vec<_>>());
            assert_eq!((v.dropped, v.end_tsc, v.end_thread_cpu_ns), (0, 1000, 7));
        }
    }

    #[test]
    fn a_stalled_writer_costs_dropped_records_not_memory() {
        let gate = Gate::default();
        let pool = PoolConfig {
            buffers: 2,
            records_per_buffer: 4,
        };
        // The header write happens before the thread starts: open for it, then shut.
        gate.open();
        let (w, mut sinks) = TraceWriter::start(gate.clone(), &header(1), pool).unwrap();
        gate.inner.0.lock().unwrap().1 = false;
        let mut s = sinks.pop().unwrap();
        for i in 0..1000 {
            s.push(exit(i));
        }
        // Two buffers of 4 were filled and handed over; the rest had nowhere to go.
        assert_eq!(s.dropped(), 1000 - 8);
        gate.open();
        s.finish(5, 0);
        let stats = w.join().unwrap();
        assert_eq!(stats.records, 8);
        let t = Trace::parse(&gate.bytes()).unwrap();
        assert_eq!(t.vcpus[0].records.len(), 8);
        assert_eq!(t.vcpus[0].dropped, 992);
    }
}
