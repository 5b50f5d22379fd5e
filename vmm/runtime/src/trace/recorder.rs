//! Recording on the vCPU thread: what `run --trace` and `run --host-profile` add to the KVM_RUN
//! loop. Per exit: two RDTSCs and a `Vec` push (the record is completed with the re-entry TSC
//! just before the next KVM_RUN). Per sample: RIP and CPL through the vCPU access layer (KVM_GET_REGS + KVM_GET_SREGS, or
//! nothing if the exit path already read them). A clock record
//! (thread CPU time) at most every [`CLOCK_EVERY_MS`] ms of TSC time, and on both sides of
//! each interrupted exit.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

use super::writer::{PoolConfig, TraceWriter, VcpuSink, WriterStats};
use crate::profile::call_stack;
use crate::profile::guest_task::{LayoutError, TaskLayout, TaskReader};
use crate::profile::sampler::Sampler;
use crate::vcpu_access::VcpuAccess;
use analysis::trace::format::{
    ExitEvent, Header, Reason, Record, SampleClock, CONTENTS_EXITS, CONTENTS_SAMPLES,
};

/// At most one clock record per this many ms (one `clock_gettime` of thread CPU time).
pub(crate) const CLOCK_EVERY_MS: u64 = 1;
/// At most this many samples for one look at the sampler (a stretch of 10 s at 1000 Hz):
/// bounds the records one stalled moment can write.
const MAX_SAMPLES_AT_ONCE: u64 = 10_000;

/// Which clock drives the host-side profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum ProfileClock {
    /// The cycles counter, gated like `--vpmu` (off: domain-switch, i.e. thread CPU time).
    #[default]
    Auto,
    /// Cycles counter counting only inside KVM_RUN (guest time).
    CpuSwitch,
    /// Cycles counter counting all the vCPU thread's time (VMM exit handling charged to the guest).
    DomainSwitch,
    /// Wall-clock timer (halted time is sampled too, at the HLT).
    Wall,
}

impl ProfileClock {
    pub fn resolve(self, vpmu: crate::pmu::VpmuSetting) -> SampleClock {
        use crate::pmu::VpmuSetting;
        match (self, vpmu) {
            (ProfileClock::Auto, VpmuSetting::CpuSwitch) | (ProfileClock::CpuSwitch, _) => {
                SampleClock::CpuSwitch
            }
            (ProfileClock::Auto, _) | (ProfileClock::DomainSwitch, _) => SampleClock::DomainSwitch,
            (ProfileClock::Wall, _) => SampleClock::Wall,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ProfileConfig {
    pub path: PathBuf,
    pub hz: u32,
    pub clock: ProfileClock,
    /// The guest kernel's task layout (`profile::guest_task`), to name the task each sample
    /// interrupted. None: `task-layout` beside the kernel, if there is one.
    pub task_layout: Option<PathBuf>,
}

/// `run --trace` / `--host-profile` (both off by default).
#[derive(Debug, Clone, Default)]
pub struct RecordConfig {
    pub trace: Option<PathBuf>,
    pub profile: Option<ProfileConfig>,
    pub pool: PoolConfig,
    /// Leave the host profile's interruptions and sample work in the guest's own counts (as
    /// before issue 19 item 5; `VcpuRecorder::after_exit` then has the vPMU forget nothing):
    /// for measuring what the correction takes away (tests, benches). Off: they are forgotten.
    pub keep_sampler_time: bool,
}

impl RecordConfig {
    pub(crate) fn is_on(&self) -> bool {
        self.trace.is_some() || self.profile.is_some()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot create {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--task-layout: {0}")]
    TaskLayout(#[from] LayoutError),
}

/// The calling thread's CPU time in ns.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One vCPU's recorder, owned by its thread.
pub(crate) struct VcpuRecorder {
    exits: Option<VcpuSink>,
    /// Samples' own file (None: no profile, or samples share the exits' file).
    samples: Option<VcpuSink>,
    sampler: Option<Sampler>,
    /// Names the guest task of each sample (None: the run knows no task layout).
    tasks: Option<TaskReader>,
    /// Task reads made, resolved, and the TSC ticks they took (logged at the end).
    task_reads: (u64, u64, u64),
    /// The last exit, waiting for the re-entry TSC.
    pending: Option<(ExitEvent, u64)>,
    clock_every: u64,
    last_clock: u64,
    sampler_failed: bool,
    vcpu: u32,
    /// `RecordConfig::keep_sampler_time`.
    keep_sampler_time: bool,
    /// The host emulates guest kernel code (host quirks on): the guest's kernel runs on for
    /// the PMI skid after the sampler's notification, so its interruption cannot be told
    /// apart from guest time. On a VT-x/SVM host guest kernel code runs natively, like user
    /// code: nothing of it runs between the notification and the exit.
    guest_kernel_emulated: bool,
}

use crate::pmu::{SamplerTime, VcpuPmu};

impl VcpuRecorder {
    /// Before KVM_RUN, outside the accounting gate (`vcpu::run_loop`): completes the last
    /// exit's record with this re-entry TSC, and writes a clock record when one is due.
    #[inline]
    pub(crate) fn before_run(&mut self) {
        let t = crate::tsc::now();
        if let Some(sink) = &mut self.exits {
            match self.pending.take() {
                Some((event, exit_tsc)) => {
                    sink.push(Record::Exit {
                        event,
                        exit_tsc,
                        entry_tsc: t,
                    });
                    if event.reason == Reason::Interrupted {
                        self.last_clock = t;
                        sink.push(Record::Clock {
                            tsc: t,
                            thread_cpu_ns: thread_cpu_ns(),
                        });
                    }
                }
                None => {
                    self.last_clock = t;
                    sink.push(Record::Clock {
                        tsc: t,
                        thread_cpu_ns: thread_cpu_ns(),
                    });
                }
            }
        }
    }

    /// The profile counter's part of the gate: right before KVM_RUN (cpu-switch: resume it).
    #[inline]
    pub(crate) fn enter_guest(&mut self) {
        if let Some(s) = &mut self.sampler {
            if let Err(e) = s.enter_guest() {
                self.stop_sampling(e);
            }
        }
    }

    /// The profile counter's part of the gate: right after KVM_RUN returned (pause it).
    #[inline]
    pub(crate) fn leave_guest(&mut self) {
        if let Some(s) = &mut self.sampler {
            s.leave_guest();
        }
    }

    /// After KVM_RUN returned and the gate closed, before the exit is handled: `event` is the
    /// exit's classification ([`crate::exit::kind::classify`], done once by the vCPU loop).
    #[inline]
    pub(crate) fn after_run(&mut self, event: ExitEvent) {
        let t = crate::tsc::now();
        self.pending = Some((event, t));
        if let Some(sink) = &mut self.exits {
            // Interrupted exits (kicks, overflow signals, profile samples) are bracketed by
            // clock records: the host often preempts the thread right there, and the summary
            // tells that off-CPU time apart from the VMM's own work.
            if event.reason == Reason::Interrupted
                || t.wrapping_sub(self.last_clock) >= self.clock_every
            {
                self.last_clock = t;
                sink.push(Record::Clock {
                    tsc: t,
                    thread_cpu_ns: thread_cpu_ns(),
                });
            }
        }
    }

    /// After the exit was handled, before re-entering: takes a profile sample if one is due,
    /// and has the guest's counters (`pmu`) leave out what the sample cost them. The VMM's
    /// sample work is left out by the backend, whatever it counts
    /// ([`crate::pmu::backend::PerfBackend::host_work_begins`]: only domain-switch counts it). The
    /// interruption before the exit is forgotten where the sampler measured it (see
    /// [`SamplerTime`]): a cycles-counter trigger interrupted guest code that runs natively,
    /// so nothing of the guest ran between the sampler's notification and the exit: user code
    /// (CPL 3) on every host, kernel code too on a VT-x/SVM host. Guest kernel code on hosts
    /// that emulate it (`guest_kernel_emulated`) runs on for a while after the notification
    /// (the PMI skid), so there it is not (docs/tracing.md, Limits).
    pub(crate) fn after_exit(&mut self, cpu: &mut dyn VcpuAccess, mut pmu: Option<&mut VcpuPmu>) {
        let Some(s) = self.sampler.as_mut() else {
            return;
        };
        let due = match s.due() {
            Ok(d) => d,
            Err(e) => {
                self.stop_sampling(e);
                return;
            }
        };
        if !due.signal {
            return;
        }
        if due.samples == 0 && due.interruption_ns.is_none() {
            s.rearm();
            return;
        }
        let mode = s.mode();
        if self.keep_sampler_time {
            pmu = None;
        }
        // The sample's work, from the sampler's re-arm on (each may cost a system call or an
        // ioctl: several microseconds on hosts like this project's).
        if let Some(p) = pmu.as_deref_mut() {
            p.host_work_begins();
        }
        s.rearm();
        let regs = match (cpu.rip(), cpu.cpl()) {
            (Ok(rip), Ok(cpl)) => Ok((rip, cpl)),
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        if let (Ok((rip, cpl)), true) = (&regs, due.samples > 0) {
            self.record_sample(cpu, *rip, *cpl, due.samples, mode);
        }
        if let Some(p) = pmu.as_deref_mut() {
            p.host_work_ends();
        }
        let cpl = match regs {
            Ok((_, cpl)) => cpl,
            Err(e) => {
                log::warn!(
                    "vCPU {}: reading registers for a profile sample: {e}",
                    self.vcpu
                );
                return;
            }
        };
        let native = cpl == 3 || !self.guest_kernel_emulated;
        if let (Some(p), Some(mode), Some(ns), true) = (pmu, mode, due.interruption_ns, native) {
            p.forget_sampler_time(SamplerTime { mode, ns });
        }
    }

    /// Writes `n` sample records of (`rip`, `cpl`), each with the task, executable and call
    /// stack notes when the run knows the guest's task layout.
    fn record_sample(
        &mut self,
        cpu: &mut dyn VcpuAccess,
        rip: u64,
        cpl: u8,
        n: u64,
        mode: Option<vpmu::AccountingMode>,
    ) {
        let during = self
            .pending
            .filter(|(e, _)| e.reason != Reason::Interrupted);
        let rec = Record::Sample {
            rip,
            cpl,
            tsc: crate::tsc::now(),
            during,
            mode,
        };
        let mut notes: Vec<Record> = Vec::new();
        if let Some(r) = self.tasks.as_mut() {
            let t0 = crate::tsc::now();
            notes = annotate(r, cpu, rip, cpl);
            let (reads, resolved, ticks) = &mut self.task_reads;
            *reads += 1;
            *resolved += u64::from(matches!(notes[0], Record::Task { task: Ok(_), .. }));
            *ticks += crate::tsc::now().saturating_sub(t0);
        }
        // Each sample period that passed is a sample of this RIP (Sampler::due).
        if let (Some(sink), _) | (None, Some(sink)) = (&mut self.samples, &mut self.exits) {
            for _ in 0..n.min(MAX_SAMPLES_AT_ONCE) {
                sink.push(rec);
                for note in &notes {
                    sink.push(*note);
                }
            }
        }
    }

    fn stop_sampling(&mut self, e: crate::profile::sampler::SamplerError) {
        if !self.sampler_failed {
            log::warn!(
                "vCPU {}: {e}; no more profile samples from this vCPU",
                self.vcpu
            );
        }
        self.sampler_failed = true;
        self.sampler = None;
    }

    /// At the end of the vCPU thread.
    pub(crate) fn finish(mut self) {
        self.close();
    }

    /// Writes this vCPU's end blocks (once): from [`Self::finish`], or from drop when the
    /// vCPU thread unwinds, so the file stays complete and readable whatever ended the run.
    fn close(&mut self) {
        if self.exits.is_none() && self.samples.is_none() {
            return;
        }
        let t = crate::tsc::now();
        let cpu = thread_cpu_ns();
        self.sampler = None;
        let (reads, resolved, ticks) = self.task_reads;
        if reads > 0 {
            log::info!(
                "vCPU {}: host profile named the guest task of {resolved} of {reads} samples; \
                 reading it took {:.2} us per sample",
                self.vcpu,
                ticks as f64 * 1000.0 / self.clock_every.max(1) as f64 / reads as f64
                    * CLOCK_EVERY_MS as f64
            );
        }
        if let Some(mut sink) = self.exits.take() {
            if let Some((event, exit_tsc)) = self.pending.take() {
                sink.push(Record::Exit {
                    event,
                    exit_tsc,
                    entry_tsc: 0,
                });
            }
            sink.push(Record::Clock {
                tsc: t,
                thread_cpu_ns: cpu,
            });
            sink.finish(t, cpu);
        }
        if let Some(sink) = self.samples.take() {
            sink.finish(t, cpu);
        }
    }
}

impl Drop for VcpuRecorder {
    fn drop(&mut self) {
        self.close();
    }
}

/// The records that follow a sample when the run knows the guest's task layout: the task; for a
/// user-space sample of a task with an mm, its executable, the mapping of a RIP outside the
/// executable's code, and, when the executable was read, the user stack's return addresses by
/// frame pointers (three per record) and the mappings of those in other libraries (one record
/// each). `rip` is the sample's, which the caller already read.
pub fn annotate(r: &mut TaskReader, cpu: &mut dyn VcpuAccess, rip: u64, cpl: u8) -> Vec<Record> {
    let cr3 = cpu.sregs().map(|s| s.cr3 & !0xfff).unwrap_or(0);
    if cpl != 3 {
        let task = r.current(cpu);
        let resolved = task.is_ok();
        let mut out = vec![Record::Task { cr3, task }];
        if resolved {
            let rbp = cpu.regs().map(|r| r.rbp).unwrap_or(0);
            out.extend(frames(call_stack::walk(
                cpu,
                rbp,
                call_stack::Space::Kernel,
            )));
        }
        return out;
    }
    let mut view = match r.current_user(cpu, rip) {
        Ok(view) => view,
        Err(u) => return vec![Record::Task { cr3, task: Err(u) }],
    };
    let mut out = vec![Record::Task {
        cr3,
        task: Ok(view.task),
    }];
    if let Some(exe) = view.exe {
        let walk = exe.is_ok();
        out.push(Record::Exe(exe));
        out.extend(view.mapping.map(Record::Mapping));
        if walk {
            let (rbp, rsp) = cpu.regs().map(|r| (r.rbp, r.rsp)).unwrap_or((0, 0));
            let mut top = [0u8; 16];
            if rsp < 0x0000_8000_0000_0000 - 16
                && crate::profile::guest_task::GuestRead::read_virt(cpu, rsp, &mut top).is_ok()
            {
                out.push(Record::UserStackTop([
                    u64::from_le_bytes(top[..8].try_into().unwrap()),
                    u64::from_le_bytes(top[8..].try_into().unwrap()),
                ]));
            }
            let stack = call_stack::walk(cpu, rbp, call_stack::Space::User);
            let callers = r.caller_mappings(cpu, &mut view, &stack);
            out.extend(frames(stack));
            out.extend(callers.into_iter().map(Record::CallerMapping));
        }
    }
    out
}

/// Return addresses as call-frame records, three to a record.
fn frames(addrs: Vec<u64>) -> Vec<Record> {
    addrs
        .chunks(3)
        .map(|chunk| {
            let mut addrs = [0u64; 3];
            addrs[..chunk.len()].copy_from_slice(chunk);
            Record::CallFrames {
                count: chunk.len() as u8,
                addrs,
            }
        })
        .collect()
}

/// The task layout a profile uses: the one named (an error if unreadable), else `task-layout`
/// beside the kernel (a warning if unreadable), else none (said once).
fn task_layout(
    p: &ProfileConfig,
    kernel: &str,
) -> Result<Option<std::sync::Arc<TaskLayout>>, RecordError> {
    if let Some(path) = &p.task_layout {
        return Ok(Some(std::sync::Arc::new(TaskLayout::load(path)?)));
    }
    let beside = (!kernel.is_empty())
        .then(|| TaskLayout::beside(std::path::Path::new(kernel)))
        .flatten();
    match beside.map(|path| (TaskLayout::load(&path), path)) {
        Some((Ok(l), path)) => {
            log::info!(
                "host profile: guest tasks named with {} ({})",
                path.display(),
                l.banner
            );
            Ok(Some(std::sync::Arc::new(l)))
        }
        Some((Err(e), _)) => {
            log::warn!("host profile: {e}; samples name no guest task");
            Ok(None)
        }
        // No file: the kernel's own BTF and kallsyms (distribution kernels have both).
        None if !kernel.is_empty() => {
            let derived = crate::profile::btf_layout::from_kernel(std::path::Path::new(kernel))
                .map_err(|e| e.to_string())
                .and_then(|text| TaskLayout::parse(&text).map_err(|e| e.to_string()));
            match derived {
                Ok(l) => {
                    log::info!(
                        "host profile: guest tasks named with the layout of the kernel's BTF ({})",
                        l.banner
                    );
                    Ok(Some(std::sync::Arc::new(l)))
                }
                Err(e) => {
                    log::info!(
                        "host profile: no task-layout beside the kernel, and none from the kernel \
                         itself ({e}); --task-layout FILE names one: samples name no guest task"
                    );
                    Ok(None)
                }
            }
        }
        None => Ok(None),
    }
}

/// What the recorders need to know of the host.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordHost {
    /// The vCPUs' TSC rate.
    pub tsc_khz: u32,
    /// Guest kernel code is emulated here (host quirks on): its samples' interruptions are not
    /// forgotten ([`VcpuRecorder::after_exit`]).
    pub guest_kernel_emulated: bool,
    /// What one notification costs the vCPU thread here (`vm::host_probe`; 0: not measured).
    pub notify_cost_ns: u64,
}

/// The writers of one run and the recorders not yet handed to vCPU threads.
pub(crate) struct Recording {
    writers: Vec<(PathBuf, TraceWriter)>,
    vcpus: std::vec::IntoIter<VcpuRecorder>,
}

impl Recording {
    /// Creates the file(s), writes their headers and starts the writer thread(s).
    pub(crate) fn start(
        cfg: &RecordConfig,
        vcpus: u32,
        host: RecordHost,
        vpmu: crate::pmu::VpmuSetting,
        kernel: Option<&std::path::Path>,
        follow: Option<std::sync::Arc<crate::pmu::mode::ModeSwitch>>,
    ) -> Result<Option<Recording>, RecordError> {
        if !cfg.is_on() {
            return Ok(None);
        }
        let RecordHost {
            tsc_khz,
            guest_kernel_emulated,
            notify_cost_ns,
        } = host;
        let kernel = kernel
            .map(|k| {
                std::fs::canonicalize(k)
                    .unwrap_or_else(|_| k.to_path_buf())
                    .display()
                    .to_string()
            })
            .unwrap_or_default();
        let clock = cfg
            .profile
            .as_ref()
            .map(|p| p.clock.resolve(vpmu))
            .unwrap_or(SampleClock::None);
        let hz = cfg.profile.as_ref().map(|p| p.hz.max(1)).unwrap_or(1);
        let same_file = match (&cfg.trace, &cfg.profile) {
            (Some(t), Some(p)) => t == &p.path,
            _ => false,
        };
        let header = |contents: u16, sampling: bool| Header {
            vcpus: vcpus as u16,
            contents,
            tsc_khz,
            start_tsc: crate::tsc::now(),
            sample_clock: if sampling { clock } else { SampleClock::None },
            sample_period_ns: if sampling {
                1_000_000_000 / u64::from(hz)
            } else {
                0
            },
            kernel: kernel.clone(),
        };
        let open =
            |path: &PathBuf, h: &Header| -> Result<(TraceWriter, Vec<VcpuSink>), RecordError> {
                let file = File::create(path).map_err(|source| RecordError::Create {
                    path: path.clone(),
                    source,
                })?;
                TraceWriter::start(BufWriter::with_capacity(1 << 16, file), h, cfg.pool).map_err(
                    |source| RecordError::Write {
                        path: path.clone(),
                        source,
                    },
                )
            };
        let mut writers = Vec::new();
        let mut exit_sinks: Vec<Option<VcpuSink>> = (0..vcpus).map(|_| None).collect();
        let mut sample_sinks: Vec<Option<VcpuSink>> = (0..vcpus).map(|_| None).collect();
        if let Some(path) = &cfg.trace {
            let contents = CONTENTS_EXITS | if same_file { CONTENTS_SAMPLES } else { 0 };
            let (w, sinks) = open(path, &header(contents, same_file))?;
            writers.push((path.clone(), w));
            exit_sinks = sinks.into_iter().map(Some).collect();
        }
        if let Some(p) = cfg.profile.as_ref().filter(|_| !same_file) {
            let (w, sinks) = open(&p.path, &header(CONTENTS_SAMPLES, true))?;
            writers.push((p.path.clone(), w));
            sample_sinks = sinks.into_iter().map(Some).collect();
        }
        let layout = match cfg.profile.as_ref() {
            Some(p) => task_layout(p, kernel.as_str())?,
            None => None,
        };
        let recorders: Vec<VcpuRecorder> = exit_sinks
            .into_iter()
            .zip(sample_sinks)
            .enumerate()
            .map(|(i, (exits, samples))| VcpuRecorder {
                exits,
                samples,
                sampler: cfg.profile.as_ref().map(|p| {
                    let follow = follow.clone().filter(|_| p.clock == ProfileClock::Auto);
                    Sampler::new(clock, p.hz, tsc_khz, notify_cost_ns, follow)
                }),
                tasks: layout.clone().map(|l| TaskReader::new(l, i as u32)),
                task_reads: (0, 0, 0),
                pending: None,
                clock_every: u64::from(tsc_khz) * CLOCK_EVERY_MS,
                last_clock: 0,
                sampler_failed: false,
                vcpu: i as u32,
                keep_sampler_time: cfg.keep_sampler_time,
                guest_kernel_emulated,
            })
            .collect();
        Ok(Some(Recording {
            writers,
            vcpus: recorders.into_iter(),
        }))
    }

    /// The next vCPU's recorder (in vCPU order).
    pub(crate) fn take_vcpu(&mut self) -> Option<VcpuRecorder> {
        self.vcpus.next()
    }

    /// Waits for the writers (after every vCPU thread finished) and logs what was written.
    pub(crate) fn finish(self) -> Result<Vec<(PathBuf, WriterStats)>, RecordError> {
        drop(self.vcpus);
        let mut out = Vec::new();
        for (path, w) in self.writers {
            let stats = w.join().map_err(|source| RecordError::Write {
                path: path.clone(),
                source,
            })?;
            out.push((path, stats));
        }
        Ok(out)
    }
}
