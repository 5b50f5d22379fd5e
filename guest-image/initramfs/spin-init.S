// A /init that never makes a system call: it spins in user mode forever (`pause; jmp`).
// Packed alone into spin-initramfs.cpio by guest-image/build.sh. On hosts where guest user
// space cannot make system calls (guest kernel code emulated, SYSCALL at CPL3 never reaches
// the kernel), a busybox /init dies at its first syscall and the kernel panics; this one
// keeps PID 1 alive, so the kernel goes on scheduling, taking interrupts and running
// softirqs (the network stack answers pings, docs/virtio-net.md) for as long as the VM runs.
    .text
    .globl _start
_start:
1:  pause
    jmp 1b
