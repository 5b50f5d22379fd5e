//! What the project's tests share beyond one crate.
//!
//! A check that cannot run on this host (no RTM, a host PMU that KVM may use itself, an image
//! that was not built) must not pass in silence: cargo hides the standard error of passing
//! tests. [`not_checked`] says it loudly *and* appends one line to the file named by
//! `VPMU_NOT_CHECKED_LOG`, which `scripts/test.sh` sets and prints at its end, counted, with
//! every tier's lines (README, "Tests").

use std::io::Write;

/// The environment variable naming the file [`not_checked`] appends to.
pub const LOG_VAR: &str = "VPMU_NOT_CHECKED_LOG";

/// Records that `check` was not made here, and `why`: on standard error, and as one line
/// `[binary] check: why` in `$VPMU_NOT_CHECKED_LOG` when that is set. The line is written with
/// one `write(2)` on an `O_APPEND` file, so test threads and processes never interleave it.
pub fn not_checked(check: &str, why: &str) {
    let line = format!("[{}] {check}: {why}", binary());
    eprintln!("\n*** NOT CHECKED {line} ***\n");
    let Some(path) = std::env::var_os(LOG_VAR) else {
        return;
    };
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(format!("{}\n", one_line(&line)).as_bytes()));
    if let Err(e) = appended {
        panic!(
            "{LOG_VAR}={}: cannot record a check that did not run ({e}): {line}",
            std::path::Path::new(&path).display()
        );
    }
}

/// Whether the caller promised every input of the slow tiers is there (`VPMU_IMAGES_BUILT=1`:
/// scripts/test.sh built the guest images first). Then a missing image is a failure, not a
/// check that was not made.
pub fn images_promised() -> bool {
    std::env::var("VPMU_IMAGES_BUILT").as_deref() == Ok("1")
}

/// A test's input that is not there: a failure where it was promised ([`images_promised`]),
/// else a check not made ([`not_checked`]). Returns (only) in the second case.
pub fn input_missing(check: &str, input: &str) {
    if images_promised() {
        panic!("{check}: {input} is missing, although VPMU_IMAGES_BUILT=1 says it was built");
    }
    not_checked(check, &format!("{input} is missing"));
}

/// The guest images `guest-image/build.sh paths` names (`DEFAULT_BZIMAGE`, `ROOTFS`, ...) that
/// exist: the cache outside the clone, shared by every test that reads a built image.
pub fn built_images() -> std::collections::HashMap<String, std::path::PathBuf> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../guest-image/build.sh");
    let out = std::process::Command::new("bash")
        .args([script, "paths"])
        .output()
        .unwrap_or_else(|e| panic!("{script} paths: {e}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), std::path::PathBuf::from(v)))
        .filter(|(_, p)| p.exists())
        .collect()
}

/// The test executable's name without cargo's hash (`multiboot_tiny-0123abcd` -> `multiboot_tiny`).
fn binary() -> String {
    let exe = std::env::current_exe().ok();
    let stem = exe
        .as_ref()
        .and_then(|p| p.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "?".into());
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name.to_string()
        }
        _ => stem,
    }
}

/// `text` on one line: a reason may be multi-line, the log is a line per check.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// How many standard deviations of binomial sampling noise a check of a sample share allows.
/// One `scripts/test.sh` run makes about a dozen such checks (the 3:1 controls of the tiny and
/// Linux comparisons, hot_75's share for each profiler and mode, active against passive); at 3 sd
/// each fails a correct build with probability 0.27%, so about one run in thirty failed by
/// chance alone (a run beside two busy loops failed two, at 3.0 and 2.9 sd: 68.0% of 359
/// samples, and an aliased control that random periods have since fixed). At 4 sd the whole
/// run fails by chance about once in a thousand, and a charging error of the size these checks
/// exist for (tens of points) still fails every time.
pub const NOISE_SDS: f64 = 4.0;

/// The standard deviation (in percentage points) of a share `p` (0..1) measured on `n` samples.
pub fn share_sd_pp(p: f64, n: u64) -> f64 {
    100.0 * (p * (1.0 - p) / n.max(1) as f64).sqrt()
}

/// The standard deviation (in percentage points) of the difference of two shares measured on
/// `n1` and `n2` samples, whose common share is `p` (0..1).
pub fn share_diff_sd_pp(p: f64, n1: u64, n2: u64) -> f64 {
    100.0 * (p * (1.0 - p) * (1.0 / n1.max(1) as f64 + 1.0 / n2.max(1) as f64)).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_per_check_in_the_named_file() {
        let dir = std::env::temp_dir().join(format!("testkit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        // The only test of this binary that touches the environment.
        std::env::set_var(LOG_VAR, &log);
        not_checked("the thing", "no such\n  hardware");
        not_checked("another", "why");
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].ends_with("] the thing: no such hardware"),
            "{text}"
        );
        assert!(lines[0].starts_with("[testkit]"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn multi_line_reasons_become_one_line() {
        assert_eq!(one_line(" a\n b\tc "), "a b c");
    }

    #[test]
    fn share_noise_is_binomial() {
        // 75% of 400 samples: sd = sqrt(0.1875 / 400) = 2.165 pp.
        assert!((share_sd_pp(0.75, 400) - 2.165).abs() < 0.001);
        // The difference of two such shares: sqrt(2) times that.
        assert!((share_diff_sd_pp(0.75, 400, 400) - 3.062).abs() < 0.001);
        assert!(share_sd_pp(0.75, 0).is_finite());
    }
}
