// load: 0x100000
// Interrupts delivered while PMIs are (vmm/tests/vpmu_tiny.rs, `no_interrupt_is_lost_to_a_pmi`),
// Intel model, 2 vCPUs. The boot vCPU (BSP) starts the second one (AP) as storm_smp64.S does,
// arms Intel counter 0 (cycles, INT) with period 1 and LVTPC -> NMI, and spins with interrupts
// on: its NMI handler counts the PMI, acks it (IA32_PERF_GLOBAL_OVF_CTRL), re-arms period 1 and
// unmasks LVTPC, as Linux's does, so PMIs come as fast as the VMM's --pmi-limit lets them; its
// vector 0x40 handler counts the interrupt and EOIs. The AP sends SENDS fixed IPIs, vector
// 0x40, to the BSP, one at a time: each waits until the BSP has counted it, at most
// WAIT_CYCLES TSC cycles (a lost one ends that wait; after MAX_LATE such waits the AP stops
// sending). Then the report on COM2, 8-byte little-endian words: ap_up, IPIs
// sent, IPIs received, waits that ran out, PMIs the BSP took; then the ACPI power-off.
// An interrupt the VMM loses while it delivers a PMI (a KVM_SET_LAPIC writing back an IRR read
// before the IPI arrived) shows as received < sent.
#define EVTSEL0     0x186
#define CTR0_FULL   0x4c1
#define GLOBAL_CTRL 0x38f
#define ACK_MSR     0x390
#define EVT_SEL     (0x3c | (1 << 16) | (1 << 17) | (1 << 20) | (1 << 22))
#define CTR_MAX     0x1000000000000
#define VECTOR      0x40
#define SENDS       500
#define WAIT_CYCLES 2000000000
#define MAX_LATE    5
#define STACK0      0x400000
#define STACK1      0x500000
#define STOP        0x3ff000
#define AP_UP       0x3ff008
#define SENT        0x3ff010
#define RECEIVED    0x3ff018
#define LATE        0x3ff020
#define PMIS        0x3ff028
#define TRAMP       0x10000
#include "msr.inc"
#include "ap_start.inc"

    .code64
    .globl start
start:
    cli
    mov $STACK0, %rsp
    // IDT: vector 2 (NMI) and VECTOR.
    lea nmi(%rip), %rax
    lea idt+2*16(%rip), %rdi
    IDT_GATE64 0x08
    lea ipi(%rip), %rax
    lea idt+VECTOR*16(%rip), %rdi
    IDT_GATE64 0x08
    lea idt(%rip), %rax
    mov %rax, idtr_base(%rip)
    lidt idtr(%rip)
    mov $0xfee000f0, %ebx
    movl $0x1ff, (%rbx)             // APIC software-enabled
    mov $0xfee00340, %ebx
    movl $0x400, (%rbx)             // LVTPC -> NMI
    START_AP
    // PMIs: counter 0, period 1, re-armed by the NMI handler.
    WRMSR64 CTR0_FULL, (CTR_MAX - 1)
    WRMSR64 EVTSEL0, EVT_SEL
    WRMSR64 GLOBAL_CTRL, 1
    sti
1:  cmpq $0, STOP
    je 1b
    cli
    WRMSR64 GLOBAL_CTRL, 0
    WRMSR64 EVTSEL0, 0
    mov AP_UP, %rax
    call emit
    mov SENT, %rax
    call emit
    mov RECEIVED, %rax
    call emit
    mov LATE, %rax
    call emit
    mov PMIS, %rax
    call emit
    mov $((5 << 2) | (1 << 5)), %al
    mov $0x600, %dx
    out %al, %dx
2:  hlt
    jmp 2b

// The AP, in 64-bit mode from the trampoline, interrupts off: sends the IPIs.
ap_main:
    mov $STACK1, %rsp
    lidt idtr(%rip)
    mov $0xfee000f0, %ebx
    movl $0x1ff, (%rbx)
    movq $1, AP_UP
    mov $0xfee00310, %ebx
    movl $0, (%rbx)                 // ICR high: APIC ID 0
0:  cmpq $SENDS, SENT
    jae 3f
    cmpq $MAX_LATE, LATE
    jae 3f
    incq SENT
    mov $0xfee00300, %ebx
    movl $VECTOR, (%rbx)            // fixed, physical: send
    call wait_for_bsp
    jmp 0b
3:  movq $1, STOP
4:  hlt
    jmp 4b

// Waits until RECEIVED == SENT, at most WAIT_CYCLES; counts a wait that ran out in LATE.
wait_for_bsp:
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r8
1:  mov RECEIVED, %rax
    cmp SENT, %rax
    jae 2f
    pause
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    sub %r8, %rax
    cmp $WAIT_CYCLES, %rax
    jb 1b
    incq LATE
2:  ret

EMIT_FUNCTION

nmi:
    push %rax
    push %rbx
    push %rcx
    push %rdx
    incq PMIS
    WRMSR64 ACK_MSR, 1
    WRMSR64 CTR0_FULL, (CTR_MAX - 1)
    mov $0xfee00340, %ebx
    movl $0x400, (%rbx)             // unmask LVTPC, as Linux's handler does
    pop %rdx
    pop %rcx
    pop %rbx
    pop %rax
    iretq

ipi:
    push %rbx
    lock incq RECEIVED
    mov $0xfee000b0, %ebx
    movl $0, (%rbx)                 // EOI
    pop %rbx
    iretq

    .balign 16
idt:    .fill (VECTOR + 1) * 2, 8, 0
idtr:   .word (VECTOR + 1) * 16 - 1
idtr_base: .quad 0

AP_TRAMPOLINE
