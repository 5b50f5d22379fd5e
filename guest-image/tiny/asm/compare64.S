// load: 0x100000
// The tiny-guest variant of `vpmu-vmm compare` (no Linux needed), AMD model. The guest profiles
// itself the way a driver-based profiler does: counter 0 counts cycles with an interrupt every
// PERIOD; its NMI handler files the interrupted RIP under the function it lies in. Workloads:
//   io:      per round, io_heavy (10 port writes to the VMM's delay device 0x510, whose
//            emulation takes a fixed time on the vCPU thread) then cpu_a and cpu_b;
//   control: per round, cpu_a (3 parts) and cpu_b (1 part) only: no exits.
// Each workload runs in cpu-switch, then in domain-switch (switched through the vPMU control
// port 0x511). After each (mode, workload) the histogram goes to COM2 as 4 words:
// io_heavy, cpu_a, cpu_b, other. Order: cpu/io, cpu/control, domain/io, domain/control.
// Each period is drawn at random from PERIOD - 1M .. PERIOD + 1M cycles (xorshift64): a round
// lasts ~1.8 ms, about one period, and with one fixed period the samples fell on a few phases
// of the round (aliasing: 79.8% of them in cpu_a in one mode and 71.8% in the other on a busy
// host, where the rounds' length had come out different), not independently as the test's
// sampling-noise bar assumes.
#define CTL0        0xc0010200
#define CTR0        0xc0010201
#define STATUS_CLR  0xc0000302
#define GLOBAL_CTRL 0xc0000301
#define SAMPLE_ON   0x530076 | (1 << 20)
#define CTR_MAX     0x1000000000000
#define PERIOD      2600000
#define JITTER_MASK 0x1fffff
#define ROUNDS      480
#include "msr.inc"

.macro SET_MODE m
    mov $0x511, %dx
    mov $\m, %al
    out %al, %dx
.endm

// PROFILE workload: clear the histogram, sample ROUNDS rounds of `workload`, emit it.
.macro PROFILE workload
    movq $0, hist(%rip)
    movq $0, hist+8(%rip)
    movq $0, hist+16(%rip)
    movq $0, hist+24(%rip)
    call arm_counter
    WRMSR64 CTL0, SAMPLE_ON
    mov $ROUNDS, %r15d
3:  call \workload
    dec %r15d
    jnz 3b
    WRMSR64 CTL0, 0
    call emit_hist
.endm

    .code64
    .globl start
start:
    cli
    NMI_SETUP nmi_handler
    CALIBRATE_BUSY
    WRMSR64 GLOBAL_CTRL, 1

    SET_MODE 1
    PROFILE io_round
    PROFILE control_round
    SET_MODE 2
    PROFILE io_round
    PROFILE control_round

    mov $((5 << 2) | (1 << 5)), %al
    mov $0x600, %dx
    out %al, %dx
4:  hlt
    jmp 4b

io_round:
    call io_heavy
    call cpu_a
    call cpu_b
    ret

control_round:
    call cpu_a
    call cpu_b
    ret

io_heavy:
    mov $10, %r8d
    mov $0x510, %dx
1:  out %al, %dx
    dec %r8d
    jnz 1b
    ret
io_heavy_end:

cpu_a:
    BUSY_US 1350
    ret
cpu_a_end:

cpu_b:
    BUSY_US 450
    ret
cpu_b_end:

// arm_counter: counter 0 overflows after the next random period. Clobbers RAX, RBX, RCX, RDX.
arm_counter:
    mov rng(%rip), %rax
    mov %rax, %rbx
    shl $13, %rbx
    xor %rbx, %rax
    mov %rax, %rbx
    shr $7, %rbx
    xor %rbx, %rax
    mov %rax, %rbx
    shl $17, %rbx
    xor %rbx, %rax
    mov %rax, rng(%rip)
    and $JITTER_MASK, %rax
    add $(PERIOD - (JITTER_MASK + 1) / 2), %rax
    neg %rax
    movabs $CTR_MAX, %rbx
    add %rbx, %rax
    WRMSR_RAX CTR0
    ret

emit_hist:
    mov hist(%rip), %rax
    call emit
    mov hist+8(%rip), %rax
    call emit
    mov hist+16(%rip), %rax
    call emit
    mov hist+24(%rip), %rax
    call emit
    ret

EMIT_FUNCTION

// FILE lo, hi, slot: if lo <= %rax < hi, count it in hist[slot] and go to 9f.
.macro FILE lo, hi, slot
    lea \lo(%rip), %rbx
    cmp %rbx, %rax
    jb 8f
    lea \hi(%rip), %rbx
    cmp %rbx, %rax
    jae 8f
    incq hist+\slot*8(%rip)
    jmp 9f
8:
.endm

nmi_handler:
    push %rax
    push %rbx
    push %rcx
    push %rdx
    mov 32(%rsp), %rax          // interrupted RIP
    FILE io_heavy, io_heavy_end, 0
    FILE cpu_a, cpu_a_end, 1
    FILE cpu_b, cpu_b_end, 2
    incq hist+24(%rip)
9:  WRMSR64 STATUS_CLR, 1
    call arm_counter
    pop %rdx
    pop %rcx
    pop %rbx
    pop %rax
    iretq

NMI_IDT_DATA
BUSY_DATA
    .balign 8
hist:   .quad 0, 0, 0, 0
rng:    .quad 0x9e3779b97f4a7c15
