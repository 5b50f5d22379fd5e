// load: 0x100000
// Accounting-mode switch from the guest (vPMU control port 0x511), AMD model: the same loop of
// 100 port writes to the VMM's delay device (0x510) runs once in cpu-switch and once in
// domain-switch, counted by one cycles counter that keeps running across the switch.
// Reports on COM2 (8-byte words): mode read back (1), cycles of loop 1, mode read back (2),
// cycles of loop 2, then powers off.
#define CTL0        0xc0010200
#define CTR0        0xc0010201
#define GLOBAL_CTRL 0xc0000301
#define CYCLES_ON   0x530076
#include "msr.inc"

.macro SET_MODE m
    mov $0x511, %dx
    mov $\m, %al
    out %al, %dx
.endm

.macro IO_LOOP
    mov $100, %r8d
    mov $0x510, %dx
1:  out %al, %dx
    dec %r8d
    jnz 1b
.endm

    .code64
    .globl start
start:
    cli
    SET_MODE 1
    WRMSR64 GLOBAL_CTRL, 1
    WRMSR64 CTR0, 0
    WRMSR64 CTL0, CYCLES_ON
    mov $0x511, %dx
    in %dx, %al
    movzbl %al, %r9d
    RDMSR64 CTR0
    mov %rax, %r12
    IO_LOOP
    RDMSR64 CTR0
    sub %r12, %rax
    mov %rax, %r13
    SET_MODE 2
    mov $0x511, %dx
    in %dx, %al
    movzbl %al, %r10d
    RDMSR64 CTR0
    mov %rax, %r12
    IO_LOOP
    RDMSR64 CTR0
    sub %r12, %rax
    mov %rax, %r14
    mov %r9, %rax
    call emit
    mov %r13, %rax
    call emit
    mov %r10, %rax
    call emit
    mov %r14, %rax
    call emit
    mov $((5 << 2) | (1 << 5)), %al
    mov $0x600, %dx
    out %al, %dx
2:  hlt
    jmp 2b

EMIT_FUNCTION
