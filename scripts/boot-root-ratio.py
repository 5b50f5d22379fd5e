#!/usr/bin/env python3
"""Boot to "profilers ready", the default initramfs against the root filesystem disk (issue 18).

Alternates N boots of each (initramfs, disk, initramfs, disk, ...) so drift in the machine's load
falls on both, and prints per boot and as medians, with their ratio:
  init   wall seconds from process start to the kernel's "Run /init" / "Run /sbin/init" line;
  ready  wall seconds to /init's "vpmu: interactive shell" line (`vpmu.shell`; the VMM is then
         stopped with SIGTERM), which /init prints after it has given
         the profilers the kernel's symbols (`vpmu.kallsyms=snapshot`, set by the VMM where guest
         kernel code is emulated): read from /proc/kallsyms in emulated code with the initramfs,
         from the disk image's copy (guest-image/build.sh rootfs) with the disk.
Both images hold the same programs (perf, OProfile, workloads).

  eval "$(guest-image/build.sh paths)"
  scripts/boot-root-ratio.py --kernel "$DEFAULT_BZIMAGE" --initrd "$INITRAMFS" --disk "$ROOTFS" [-n 3]
"""
import argparse, os, statistics, subprocess, sys, time

def boot(vmm, kernel, root_args, timeout):
    cmd = [vmm, "run", "--kernel", kernel, "--cpus", "1", "--memory", "1024",
           "--timeout", str(timeout), "--cmdline", "vpmu.shell"] + root_args
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    init = ready = None
    for raw in p.stdout:
        line = raw.decode(errors="replace")
        now = time.monotonic() - t0
        if init is None and ("Run /init as init" in line or "Run /sbin/init as init" in line):
            init = now
        if ready is None and "vpmu: interactive shell" in line:
            ready = now
            p.terminate()  # the shell waits on the console: the measurement is taken
    code = p.wait()
    if code not in (0, 143) or init is None or ready is None:
        sys.exit(f"error: {' '.join(cmd)} ended with exit code {code} (init {init}, ready {ready})")
    return init, ready

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--initrd", required=True)
    ap.add_argument("--disk", required=True)
    ap.add_argument("-n", type=int, default=3, help="boots of each (default 3)")
    ap.add_argument("--timeout", type=int, default=3000)
    ap.add_argument("--vmm", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "vpmu-vmm"))
    a = ap.parse_args()
    if not os.path.exists(a.vmm):
        sys.exit(f"error: {a.vmm} not found: run `cargo build --release` first")
    roots = {"initramfs": ["--initrd", a.initrd], "disk": ["--disk", a.disk + ",readonly=on"]}
    got = {k: [] for k in roots}
    for i in range(a.n):
        for name, args in roots.items():
            init, ready = boot(a.vmm, a.kernel, args, a.timeout)
            got[name].append((init, ready))
            print(f"[boot {i + 1}/{a.n}] {name:9}: init {init:6.1f} s, profilers ready {ready:6.1f} s", flush=True)
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in got.items()}
    for k, (i, r) in med.items():
        print(f"median {k:9}: init {i:6.1f} s, profilers ready {r:6.1f} s")
    print(f"ratio initramfs/disk: init {med['initramfs'][0] / med['disk'][0]:.2f}x, "
          f"profilers ready {med['initramfs'][1] / med['disk'][1]:.2f}x (load average now {os.getloadavg()[0]:.1f})")

if __name__ == "__main__":
    main()
