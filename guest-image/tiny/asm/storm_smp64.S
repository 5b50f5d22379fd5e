// load: 0x100000
// PMI storm / soak guest (benches/storm_soak.rs, scripts/storm-soak.sh), AMD model, 2 vCPUs.
// The boot vCPU starts the second one (INIT + SIPI to a real-mode trampoline copied to 0x10000,
// which goes straight to long mode on the VMM's GDT-less identity map), then each vCPU:
//   - arms AMD counter 0 (cycles, INT) with period 1 and LVTPC -> NMI; its NMI handler counts the
//     NMI (and, if the global status shows counter 0's overflow, an overflow), acks and re-arms
//     with period 1 again: a PMI storm only the VMM's --pmi-limit holds back;
//   - loops reading the vPMU control port 0x511: the cycles each IN takes (max kept, and a
//     histogram by power of two: bucket i counts the INs of 2^i to 2^(i+1)-1 cycles) and, at
//     each change of the mode it returns, a record (TSC, mode) — the host pairs these with its
//     schedule's switch times;
//   - the boot vCPU also polls COM1: each byte received is echoed back at once (the host times
//     the round trip through its stdin thread), and `q` ends the run.
// At the end (after `q`): both counters stopped, then on COM2, 8-byte little-endian words:
//   ap_up, then per vCPU: nmis, overflows, max IN 0x511 cycles, records, the 64 histogram
//   buckets, then min(records, MAXREC) pairs (tsc, mode); then the ACPI power-off.
// Per-vCPU data lives in a 1 MiB block (vCPU i at DATA + i * 1 MiB) whose top is that vCPU's
// stack, so the NMI handler finds its block from RSP.
#define EVTSEL0     0xc0010200
#define CTR0        0xc0010201
#define GLOBAL_CTRL 0xc0000301
#define STATUS_MSR  0xc0000300
#define ACK_MSR     0xc0000302
#define EVT_SEL     (0x76 | (1 << 16) | (1 << 17) | (1 << 20) | (1 << 22))
#define CTR_MAX     0x1000000000000
#define DATA        0x400000
#define BLOCK       0x100000
#define STOP        0x3ff000
#define AP_UP       0x3ff008
#define TRAMP       0x10000
#define MAXREC      8192
// Offsets in a vCPU's block.
#define B_NMIS      0
#define B_OVF       8
#define B_MAXIN     16
#define B_NREC      24
#define B_MODE      32
#define B_DONE      40
#define B_REC       64
#define B_HIST      0x30000
#include "msr.inc"
#include "ap_start.inc"

    .code64
    .globl start
start:
    cli
    mov $(DATA + BLOCK - 64), %rsp
    NMI_SETUP nmi
    START_AP
    mov $3000000, %ecx
1:  cmpq $0, AP_UP
    jne 2f
    pause
    dec %ecx
    jnz 1b
2:  jmp cpu_main

// The second vCPU arrives here in 64-bit mode from the trampoline.
ap_main:
    mov $(DATA + 2 * BLOCK - 64), %rsp
    lidt idtr(%rip)
    mov $0xfee000f0, %ebx
    movl $0x1ff, (%rbx)
    mov $0xfee00340, %ebx
    movl $0x400, (%rbx)
    movq $1, AP_UP
    jmp cpu_main

// Both vCPUs. %rbp = this vCPU's block.
cpu_main:
    mov %rsp, %rbp
    and $-BLOCK, %rbp
    movq $0xff, B_MODE(%rbp)
    WRMSR64 GLOBAL_CTRL, 1
    WRMSR64 CTR0, (CTR_MAX - 1)
    WRMSR64 EVTSEL0, EVT_SEL
    cmp $DATA, %rbp
    jne loop
    mov $'R', %al                   // boot vCPU: ready
    mov $0x3f8, %dx
    out %al, %dx
loop:
    cmpq $0, STOP
    jne stop
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r8
    mov $0x511, %dx
    xor %eax, %eax
    in %dx, %al
    movzx %al, %r9d
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r10
    sub %r8, %rax
    bsr %rax, %rcx
    jnz 0f
    xor %ecx, %ecx
0:  incq B_HIST(%rbp,%rcx,8)
    cmp B_MAXIN(%rbp), %rax
    jbe 1f
    mov %rax, B_MAXIN(%rbp)
1:  cmp B_MODE(%rbp), %r9
    je 2f
    mov %r9, B_MODE(%rbp)
    mov B_NREC(%rbp), %rcx
    incq B_NREC(%rbp)
    cmp $MAXREC, %rcx
    jae 2f
    shl $4, %rcx
    mov %r10, B_REC(%rbp,%rcx)
    mov %r9, B_REC+8(%rbp,%rcx)
2:  cmp $DATA, %rbp                 // only the boot vCPU serves the console
    jne loop
    mov $0x3fd, %dx
    in %dx, %al
    test $1, %al
    jz loop
    mov $0x3f8, %dx
    in %dx, %al
    out %al, %dx                    // echo
    cmp $'q', %al
    jne loop
    movq $1, STOP
    jmp loop

stop:
    WRMSR64 EVTSEL0, 0
    movq $1, B_DONE(%rbp)
    cmp $DATA, %rbp
    je report
3:  hlt
    jmp 3b

report:
    mov $3000000, %ecx
1:  cmpq $0, DATA + BLOCK + B_DONE
    jne 2f
    pause
    dec %ecx
    jnz 1b
2:  mov AP_UP, %rax
    call emit
    mov $DATA, %rsi
    call emit_cpu
    mov $(DATA + BLOCK), %rsi
    call emit_cpu
    mov $((5 << 2) | (1 << 5)), %al
    mov $0x600, %dx
    out %al, %dx
3:  hlt
    jmp 3b

// One vCPU's figures; %rsi = its block.
emit_cpu:
    mov B_NMIS(%rsi), %rax
    call emit
    mov B_OVF(%rsi), %rax
    call emit
    mov B_MAXIN(%rsi), %rax
    call emit
    mov B_NREC(%rsi), %rax
    call emit
    xor %r9d, %r9d
0:  mov B_HIST(%rsi,%r9,8), %rax
    call emit
    inc %r9
    cmp $64, %r9
    jb 0b
    mov B_NREC(%rsi), %r9
    cmp $MAXREC, %r9
    jbe 1f
    mov $MAXREC, %r9
1:  lea B_REC(%rsi), %rdi
2:  test %r9, %r9
    jz 3f
    mov (%rdi), %rax
    call emit
    mov 8(%rdi), %rax
    call emit
    add $16, %rdi
    dec %r9
    jmp 2b
3:  ret

EMIT_FUNCTION

nmi:
    push %rax
    push %rbx
    push %rcx
    push %rdx
    mov %rsp, %rbx
    and $-BLOCK, %rbx
    incq B_NMIS(%rbx)
    RDMSR64 STATUS_MSR
    test $1, %al
    jz 1f
    incq B_OVF(%rbx)
1:  WRMSR64 ACK_MSR, 1
    cmpq $0, STOP
    jne 2f
    WRMSR64 CTR0, (CTR_MAX - 1)
2:  pop %rdx
    pop %rcx
    pop %rbx
    pop %rax
    iretq

NMI_IDT_DATA

AP_TRAMPOLINE
