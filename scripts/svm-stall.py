#!/usr/bin/env python3
"""Is a hang on the SVM host the known stall of the nested guest (issue 32)?

usage: svm-stall.py SAMPLES SYSTEM_MAP...   (exit 0: the known stall; 1: not it; 2: bad input)
       svm-stall.py --self-test

SAMPLES holds QEMU's `info registers` answers, taken from outside L1 while a test hung
(scripts/svm-host.sh writes them on request of scripts/svm-tier.sh). The known stall, seen in
every hang of a stock-Linux boot on that host so far (scripts/svm-tier.sh, notes): the nested
guest's vCPU spinning at CPL 0 with interrupts off (RFLAGS.IF = 0) in the kernel's spinlock slow
path (`native_queued_spin_lock_slowpath`, `__pv_queued_spin_lock_slowpath`) or rwlock slow path
(`queued_write_lock_slowpath`), minutes at the same place, on one vCPU too. The same guest on 2
vCPUs stalls the same way under QEMU -accel kvm in the same L1 (scripts/svm-stall-control.sh):
the nested host stalls such guests whatever their VMM.
The verdict needs at least half of the samples (and 4) at CPL 0, IF = 0, in such a function of
one of the guest kernels' System.map files. Anything else is not it, and the hang stays a
failure. One line on stdout says what the samples showed.
"""
import bisect
import re
import sys

# Spinlock and rwlock slow paths: the stall has shown both (a 2-vCPU guest forking processes spun
# in queued_write_lock_slowpath on tasklist_lock, beside __pv_queued_spin_lock_slowpath).
SPIN = re.compile(r"spin_lock_slowpath|queued_(read|write)_lock_slowpath")
IF = 1 << 9


def samples(text):
    """(rip, rflags, cpl) of each register dump."""
    return [
        (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3)))
        for m in re.finditer(r"RIP=([0-9a-f]+) RFL=([0-9a-f]+) .*?CPL=(\d)", text)
    ]


def load_map(path):
    addrs, names = [], []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[1] in "tTwW":
                try:
                    addrs.append(int(parts[0], 16))
                except ValueError:
                    continue
                names.append(parts[2])
    order = sorted(range(len(addrs)), key=addrs.__getitem__)
    return [addrs[i] for i in order], [names[i] for i in order]


def symbol(tables, rip):
    for addrs, names in tables:
        i = bisect.bisect_right(addrs, rip) - 1
        if i >= 0 and rip - addrs[i] < 0x10000 and SPIN.search(names[i]):
            return f"{names[i]}+{rip - addrs[i]:#x}"
    return None


def verdict(text, tables):
    s = samples(text)
    hits = [(rip, symbol(tables, rip)) for rip, fl, cpl in s if cpl == 0 and not fl & IF]
    hits = [(rip, name) for rip, name in hits if name]
    where = sorted({name for _, name in hits})
    line = (
        f"{len(hits)} of {len(s)} register samples at CPL 0 with IF=0 in a lock slow path"
        + (f" ({', '.join(where)})" if where else "")
    )
    return len(s) > 0 and len(hits) >= max(4, (len(s) + 1) // 2), line


def self_test():
    stall = "\n".join(
        f"RAX=0000000000000101 RBX=ffff8880001463e0\n"
        f"RIP={rip} RFL=00000002 [-------] CPL=0 II=0 A20=1 SMM=0 HLT=0\n"
        for rip in ["ffffffff813fd26c"] * 5
    ) + "RIP=000055da207ab020 RFL=00000202 [-------] CPL=3 II=0 A20=1 SMM=0 HLT=0\n"
    table = ([0xFFFFFFFF813FD210, 0xFFFFFFFF813FD400], ["native_queued_spin_lock_slowpath", "x"])
    ok, line = verdict(stall, [table])
    assert ok and "5 of 6" in line and "native_queued_spin_lock_slowpath+0x5c" in line, line
    # IF set: a spinning lock with interrupts on is not the stall.
    assert not verdict(stall.replace("RFL=00000002", "RFL=00000202"), [table])[0]
    # Another function (a guest halted, a VMM loop): not it.
    other = ([0xFFFFFFFF813FD210], ["default_idle"])
    assert not verdict(stall, [other])[0]
    # Too few samples in it.
    assert not verdict(stall.replace("ffffffff813fd26c", "ffffffff81000000", 3), [table])[0]
    assert not verdict("", [table])[0]
    # The rwlock slow path counts too (tasklist_lock: fork and exit on 2 vCPUs).
    rw = ([0xFFFFFFFF813FD210, 0xFFFFFFFF813FD400], ["queued_write_lock_slowpath", "x"])
    assert verdict(stall, [rw])[0]
    print("svm-stall.py: self-test passed")


def main(argv):
    if argv[1:] == ["--self-test"]:
        self_test()
        return 0
    if len(argv) < 3:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        text = open(argv[1]).read()
        tables = [load_map(p) for p in argv[2:]]
    except OSError as e:
        print(f"svm-stall.py: {e}", file=sys.stderr)
        return 2
    ok, line = verdict(text, tables)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
