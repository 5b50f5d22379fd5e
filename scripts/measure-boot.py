#!/usr/bin/env python3
"""Measure a guest boot with vpmu-vmm: wall time to each milestone line on the console, the VMM's
own start-up (process start to the vCPUs being ready, bzImage extraction included), and the
host-quirk fix-up counts. The VMM's figures come from its JSON report (`run --report-json`,
schema vpmu-run/1), not from its text. Prints one summary; rerun it any time.

  scripts/measure-boot.py --kernel PATH [--initrd PATH] [--cpus N] [--timeout SECS] [-- extra run args]
"""
import argparse, json, os, subprocess, sys, tempfile, time

MILESTONES = [
    ("console up", "Linux version"),
    ("perf driver", "Performance Events:"),
    ("SMP up", "smp: Brought up"),
    ("initramfs", "Unpacking initramfs"),
    ("free init memory", "Freeing unused kernel image"),
    ("init", "Run /init as init process"),
]

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--initrd")
    ap.add_argument("--cpus", default="1")
    ap.add_argument("--timeout", default="1500")
    ap.add_argument("--vmm", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "vpmu-vmm"))
    ap.add_argument("--log", help="also write the console here")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    if not os.path.exists(a.vmm):
        sys.exit(f"error: {a.vmm} not found: run `cargo build --release` first")
    report_dir = tempfile.TemporaryDirectory(prefix="measure-boot.")
    report = os.path.join(report_dir.name, "report.json")
    cmd = [a.vmm, "run", "--kernel", a.kernel, "--cpus", a.cpus, "--timeout", a.timeout,
           "--report-json", report] + a.extra
    if a.initrd:
        cmd += ["--initrd", a.initrd]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    seen = {}
    log = open(a.log, "w") if a.log else None
    for raw in p.stdout:
        line = raw.decode(errors="replace")
        if log:
            log.write(line)
        now = time.monotonic() - t0
        for name, needle in MILESTONES:
            if name not in seen and needle in line:
                seen[name] = now
                print(f"[measure] {now:7.1f} s  {name}", flush=True)
    err = p.stderr.read().decode(errors="replace")
    code = p.wait()
    total = time.monotonic() - t0
    try:
        with open(report) as f:
            r = json.load(f)
    except (OSError, ValueError) as e:
        sys.stderr.write(err)
        sys.exit(f"error: no report from the VMM ({e}); exit code {code}")
    fixups = ", ".join(f"{k} {n}" for k, n in r["host_quirk_fixups"].items()) or "none"
    print("\n== boot measurement ==")
    print(f"command        : {' '.join(cmd)}")
    print(f"VMM start-up   : {r['setup_secs'] * 1000:.1f} ms (process start to vCPUs ready)")
    for name, _ in MILESTONES:
        print(f"{name:15}: {'%.1f s' % seen[name] if name in seen else 'not reached'}")
    print(f"total wall     : {total:.1f} s, exit code {code}")
    print(f"VM exits       : {r['exits']['total']}")
    print(f"fix-ups        : {fixups}")
    tail = [l for l in err.splitlines() if l.startswith("[vpmu-vmm]")]
    print("\n".join(tail))

if __name__ == "__main__":
    main()
