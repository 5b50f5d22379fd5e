//! Readers for the profiler outputs a guest sends back (decoded by [`crate::guest_results`]):
//! `perf stat -x,` CSV, `perf report --stdio`, `opreport -l`, `ocount -f`. Used by the
//! guest-profiler test (vmm/tests/guest_profilers.rs) and by anyone comparing runs. Pure text.

/// The count of `event` in `perf stat -x,` output (`value,unit,event,...`), or None when perf
/// printed `<not supported>` / `<not counted>` or has no such line. `cycles` also matches a
/// modified name such as `cycles:u`.
pub fn perf_stat_count(csv: &str, event: &str) -> Option<f64> {
    csv.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let fields: Vec<&str> = l.split(',').collect();
        let name = *fields.get(2)?;
        let base = name.split(':').next()?;
        (name == event || base == event).then(|| fields[0].trim().parse::<f64>().ok())?
    })
}

/// Milliseconds of steal time between two `cpu` lines of the guest's /proc/stat (the first two
/// lines of `text`: before, after): the 8th number (`steal`, in USER_HZ = 100 ticks a second) is
/// the time the host kept the vCPU from running. None if the text is not two such lines or the
/// count went backwards.
pub fn proc_stat_steal_ms(text: &str) -> Option<f64> {
    let steal = |l: &str| -> Option<u64> {
        let mut w = l.split_whitespace();
        (w.next()? == "cpu").then_some(())?;
        w.nth(7)?.parse().ok()
    };
    let mut lines = text.lines();
    let (a, b) = (steal(lines.next()?)?, steal(lines.next()?)?);
    Some(b.checked_sub(a)? as f64 * 10.0)
}

/// The share (percent) of `symbol` in `perf report --stdio` output: the first column of the
/// line whose symbol column (after `[.]` or `[k]`) is `symbol`.
pub fn perf_report_share(report: &str, symbol: &str) -> Option<f64> {
    report
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .find_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let pct = words.first()?.strip_suffix('%')?.parse::<f64>().ok()?;
            let at = words.iter().position(|w| *w == "[.]" || *w == "[k]")?;
            (words.get(at + 1) == Some(&symbol)).then_some(pct)
        })
}

/// The share (percent) of `symbol` in `opreport -l` output (`samples  %  [image]  symbol`).
pub fn opreport_share(report: &str, symbol: &str) -> Option<f64> {
    report.lines().find_map(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        if words.last() != Some(&symbol) || words.len() < 3 {
            return None;
        }
        words[0].parse::<u64>().ok()?;
        words[1].parse::<f64>().ok()
    })
}

/// Samples per symbol from `perf report --stdio -n --sort symbol` (`OVERHEAD  SAMPLES  [k] NAME`
/// lines; `[k]` kernel, `[.]` user). perf separates columns by two or more spaces, so a name
/// with single spaces in it (a demangled C++ signature) stays whole; trailing IPC columns are
/// dropped. Addresses perf could not name (`0x...`) are summed per kind into
/// `[unresolved kernel address]` / `[unresolved user address]`.
pub fn perf_report_samples(report: &str) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for l in report.lines() {
        let t = l.trim_start();
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        let mut words = t.split_whitespace();
        let (Some(pct), Some(n)) = (words.next(), words.next()) else {
            continue;
        };
        if !pct.ends_with('%') {
            continue;
        }
        let Ok(n) = n.parse::<u64>() else { continue };
        let (kind, rest) = match (t.find("[k] "), t.find("[.] ")) {
            (Some(i), _) => ("kernel", &t[i + 4..]),
            (None, Some(i)) => ("user", &t[i + 4..]),
            _ => continue,
        };
        let name = rest.split("  ").next().unwrap_or("").trim();
        if name.is_empty() {
            continue;
        }
        let name = if name.starts_with("0x") {
            format!("[unresolved {kind} address]")
        } else {
            name.to_string()
        };
        match out.iter_mut().find(|(k, _)| *k == name) {
            Some((_, c)) => *c += n,
            None => out.push((name, n)),
        }
    }
    out
}

/// Samples per symbol from `opreport -l`: the header line (`samples  %  [image name]  [app
/// name]  symbol name`) says how many name columns come before the symbol; rows are
/// `SAMPLES  PERCENT  [IMAGE]  [APP]  SYMBOL` (a symbol may contain spaces). Summed by symbol.
pub fn opreport_samples(report: &str) -> Vec<(String, u64)> {
    let mut skip = None;
    let mut out: Vec<(String, u64)> = Vec::new();
    for l in report.lines() {
        let words: Vec<&str> = l.split_whitespace().collect();
        if words.first() == Some(&"samples") {
            // "image name", "app name": each one column before "symbol name".
            skip = Some(
                words
                    .iter()
                    .filter(|w| **w == "name")
                    .count()
                    .saturating_sub(1),
            );
            continue;
        }
        let Some(skip) = skip else { continue };
        if words.len() < 3 + skip {
            continue;
        }
        let (Ok(n), Ok(_)) = (words[0].parse::<u64>(), words[1].parse::<f64>()) else {
            continue;
        };
        let name = words[2 + skip..].join(" ");
        match out.iter_mut().find(|(k, _)| *k == name) {
            Some((_, c)) => *c += n,
            None => out.push((name, n)),
        }
    }
    out
}

/// The counts `ocount -f` wrote: (event, count) for each line `EVENT  COUNT  ...` whose count
/// is a number (thousands separators allowed).
pub fn ocount_counts(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let event = words.next()?;
            let count = words.next()?.replace(',', "").parse::<u64>().ok()?;
            Some((event.to_string(), count))
        })
        .collect()
}

/// The `exit=N<TAB>...` lines of an experiment's status.txt frame that are not `exit=0`.
pub fn failed_steps(status: &str) -> Vec<&str> {
    status
        .lines()
        .filter(|l| l.starts_with("exit=") && !l.starts_with("exit=0\t"))
        .collect()
}

/// The name of the log a status line's step wrote (its `log=FILE` field; images older than that
/// field have none).
pub fn step_log(status_line: &str) -> Option<&str> {
    status_line
        .split('\t')
        .find_map(|f| f.strip_prefix("log="))
        .filter(|name| !name.is_empty())
}

/// The last `n` lines of a step's log, for an error message.
pub fn log_tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real output of Debian's perf 6.1 (from the guest image, run in a chroot on the build host
    // with software events: guest-image/check-initramfs.sh).
    const STAT: &str = "# started on Mon Nov 23 02:31:25 2026\n\n\
        446.49,msec,task-clock,446489605,100.00,0.475,CPUs utilized\n\
        446.42,msec,cpu-clock,446489605,100.00,0.475,CPUs utilized\n\
        <not supported>,,cycles,0,100.00,,\n";
    const REPORT: &str = "# Samples: 1K of event 'cpu-clock'\n\
        #\n\
        # Overhead  Command    Shared Object      Symbol                          IPC   [IPC Coverage]\n\
        # ........  .........  .................  ..............................  ....................\n\
        #\n    74.22%  cpu_split  cpu_split          [.] hot_75                      -      -            \n\
        \x20   24.92%  cpu_split  cpu_split          [.] cold_25                     -      -            \n\
        \x20    0.21%  cpu_split  [kernel.kallsyms]  [k] finish_task_switch.isra.0   -      -            \n";
    const REPORT_SYMBOLS: &str = "# Overhead  Symbol          IPC   [IPC Coverage]\n\
        # ........  ..............  ....................\n\
        #\n    74.78%  [.] hot_75      -      -            \n\
        \x20   25.11%  [.] cold_25     -      -            \n\
        \x20    0.05%  [.] main        -      -            \n";

    #[test]
    fn perf_stat_counts_and_unsupported_events() {
        assert_eq!(perf_stat_count(STAT, "task-clock"), Some(446.49));
        assert_eq!(perf_stat_count(STAT, "cycles"), None, "<not supported>");
        assert_eq!(perf_stat_count(STAT, "instructions"), None, "absent");
        assert_eq!(
            perf_stat_count("123456,,cycles:u,1000,100.00,,\n", "cycles"),
            Some(123456.0)
        );
    }

    #[test]
    fn steal_between_two_proc_stat_lines() {
        let t = "cpu  115 0 3711 0 0 0 39 10383 0 0\ncpu  838 0 3778 0 0 0 42 11794 0 0\n";
        assert_eq!(proc_stat_steal_ms(t), Some(14110.0));
        assert_eq!(proc_stat_steal_ms("cpu  1 2 3 4 5 6 7 8 9 10\n"), None);
        assert_eq!(
            proc_stat_steal_ms("cpu0 1 2 3 4 5 6 7 8\ncpu0 1 2 3 4 5 6 7 9\n"),
            None
        );
        assert_eq!(
            proc_stat_steal_ms("cpu 1 2 3 4 5 6 7 9\ncpu 1 2 3 4 5 6 7 8\n"),
            None
        );
        assert_eq!(proc_stat_steal_ms("cpu 1 2 3\ncpu 1 2 3\n"), None);
        assert_eq!(proc_stat_steal_ms(""), None);
    }

    #[test]
    fn perf_report_shares() {
        assert_eq!(perf_report_share(REPORT, "hot_75"), Some(74.22));
        assert_eq!(perf_report_share(REPORT, "cold_25"), Some(24.92));
        assert_eq!(
            perf_report_share(REPORT, "finish_task_switch.isra.0"),
            Some(0.21)
        );
        assert_eq!(perf_report_share(REPORT_SYMBOLS, "hot_75"), Some(74.78));
        assert_eq!(perf_report_share(REPORT_SYMBOLS, "hot"), None);
        assert_eq!(perf_report_share("", "hot_75"), None);
    }

    // OProfile's formats as its documentation shows them (not captured here: without a PMU,
    // operf and ocount stop before writing anything).
    #[test]
    fn opreport_and_ocount() {
        let op = "CPU: AMD64 generic, speed 2600 MHz (estimated)\n\
            samples  %        symbol name\n\
            3021     75.1119  hot_75\n\
            1001     24.8881  cold_25\n";
        assert_eq!(opreport_share(op, "hot_75"), Some(75.1119));
        assert_eq!(opreport_share(op, "name"), None);
        let oc = "Events were actively counted for 1000 nanoseconds.\n\
            Event counts (actual) for /usr/bin/cpu_split:\n\
            \tEvent                 Count                    % time counted\n\
            \tCPU_CLK_UNHALTED      1,234,567                100.00\n";
        assert_eq!(
            ocount_counts(oc),
            vec![("CPU_CLK_UNHALTED".to_string(), 1_234_567)]
        );
        assert!(ocount_counts("").is_empty());
    }

    // Real output of Debian's perf 6.1 (`perf report --stdio -n --sort symbol`), recorded with
    // cpu-clock on the build host: system-wide (kernel symbols) and on a stripped static binary
    // (unresolved user addresses).
    const REPORT_SYSTEM: &str = include_str!("../tests/fixtures/perf-report-system.txt");
    const REPORT_CONTROL: &str = include_str!("../tests/fixtures/perf-report-control.txt");

    #[test]
    fn perf_report_samples_per_symbol() {
        let s = perf_report_samples(REPORT_SYSTEM);
        assert_eq!(s[0], ("pv_native_safe_halt".to_string(), 7940));
        assert_eq!(s[1], ("paging64_walk_addr_generic".to_string(), 987));
        assert!(s
            .iter()
            .all(|(k, _)| !k.contains(' ') && !k.starts_with('-')));
        let c = perf_report_samples(REPORT_CONTROL);
        let unresolved = c
            .iter()
            .find(|(k, _)| k == "[unresolved user address]")
            .unwrap();
        assert_eq!(unresolved.1, 85 + 80 + 64 + 51 + 49);
        assert!(c
            .iter()
            .any(|(k, n)| k == "std::sys::backtrace::__rust_begin_short_backtrace" && *n == 1));
        assert!(perf_report_samples("").is_empty());
    }

    // OProfile's `opreport -l` layouts as its documentation shows them (operf cannot run on the
    // build hosts: no PMU).
    #[test]
    fn opreport_samples_with_and_without_image_columns() {
        let system = "CPU: AMD64 generic, speed 2600 MHz (estimated)\n\
            Counted CPU_CLK_UNHALTED events (Cycles outside of halt state) with a unit mask of 0x00 (No unit mask) count 100000\n\
            samples  %        image name               symbol name\n\
            3021     60.1119  vmlinux                  vm_interrupt\n\
            1001     19.9180  cpu_split                hot_75\n\
            1000     19.8980  libstdc++.so.6           operator new(unsigned long)\n\
            3        0.0597   vmlinux                  vm_interrupt\n";
        let s = opreport_samples(system);
        assert_eq!(
            s,
            vec![
                ("vm_interrupt".to_string(), 3024),
                ("hot_75".to_string(), 1001),
                ("operator new(unsigned long)".to_string(), 1000)
            ]
        );
        let one_image =
            "samples  %        symbol name\n3021     75.1119  hot_75\n1001     24.8881  cold_25\n";
        assert_eq!(
            opreport_samples(one_image)[1],
            ("cold_25".to_string(), 1001)
        );
        assert!(
            opreport_samples("3021 75.1 hot_75\n").is_empty(),
            "no header, no rows"
        );
    }

    #[test]
    fn failed_steps_are_the_nonzero_exits() {
        let s = "exit=0\tperf stat x\nexit=1\tocount y\nexit=10\toperf z\n";
        assert_eq!(
            failed_steps(s),
            vec!["exit=1\tocount y", "exit=10\toperf z"]
        );
    }

    #[test]
    fn a_failed_step_names_its_log_and_the_error_shows_its_end() {
        let s = "exit=2\tsecs=12\tlog=operf-system.log\toperf x\nexit=1\tsecs=2\told image\n";
        let failed = failed_steps(s);
        assert_eq!(step_log(failed[0]), Some("operf-system.log"));
        assert_eq!(step_log(failed[1]), None, "an image without the log= field");
        assert_eq!(step_log("exit=1\tlog=\tx"), None);
        assert_eq!(log_tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(log_tail("a", 5), "a");
        assert_eq!(log_tail("", 5), "");
    }
}
