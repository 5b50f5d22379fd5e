// load: 0x100000
// Host-profile perturbation guest (issue 19 item 5), AMD model: counter 0 counts cycles
// (USR|OS) while user code (CPL3: native on every host, also where guest kernel code is
// emulated) runs a fixed loop, ROUNDS times. The kernel reads the counter at each system call:
// a round is from the SYSRETQ that starts the user loop to the SYSCALL that ends it, read at
// CPL0 on both sides, so each round's count is the user loop plus one fixed system-call round
// trip. Run with and without `--host-profile`: the counts must agree (the sampler's own
// interruptions are not the guest's work).
// Report on COM2, 8-byte words: the counter's delta for each round (ROUNDS words), then ROUNDS.
#define ROUNDS 12
#define LOOP 30000000
#define USER_BASE 0x200000
#define USER_STACK 0x3ff000
#define EVTSEL0     0xc0010200
#define CTR0        0xc0010201
#define GLOBAL_CTRL 0xc0000301
#define EVT_CYCLES  0x76
#define EVT_USR (1 << 16)
#define EVT_OS  (1 << 17)
#define EVT_EN  (1 << 22)
#include "msr.inc"
#include "user_mode.inc"
    .code64
    .globl start
start:
    cli
    mov $0xff, %al                  // mask both PICs: no interrupt reaches user code
    out %al, $0x21
    out %al, $0xa1
    lea kstack_top(%rip), %rsp
    // --- page tables: 0-2 MiB supervisor, 2-4 MiB user
    lea pdpt(%rip), %rax
    or $7, %rax
    mov %rax, pml4(%rip)
    lea pd(%rip), %rax
    or $7, %rax
    mov %rax, pdpt(%rip)
    movq $0x83, pd(%rip)
    movq $(USER_BASE | 0x87), pd+8(%rip)
    lea pml4(%rip), %rax
    mov %rax, %cr3
    // --- GDT (Linux layout) with a 64-bit TSS at 0x40
    LINUX_GDT_SETUP
    // --- IDT: every exception ends the run with a marker; #PF's handler starts with three NOPs
    // as Linux 6.1's does (where the host's SYSCALL relay traps)
    lea idt(%rip), %rdi
    xor %ecx, %ecx
2:  lea fail(%rip), %rax
    cmp $14, %ecx
    jne 3f
    lea pf_handler(%rip), %rax
3:  IDT_GATE64 0x10
    inc %ecx
    cmp $32, %ecx
    jne 2b
    lea idt(%rip), %rax
    mov %rax, idtr_base(%rip)
    lidt idtr(%rip)
    // --- SYSCALL MSRs as Linux sets them; EFER.SCE
    LINUX_SYSCALL_SETUP syscall_entry, 1
    // An exit before user mode: the VMM sees LSTAR and the IDT and installs its relay.
    mov $0x80, %dx
    out %al, %dx
    // --- counter 0: cycles, user and kernel
    WRMSR64 GLOBAL_CTRL, 1
    WRMSR64 CTR0, 0
    WRMSR64 EVTSEL0, (EVT_CYCLES | EVT_USR | EVT_OS | EVT_EN)
    // --- user code to 2 MiB
    lea user_start(%rip), %rsi
    mov $USER_BASE, %rdi
    mov $(user_end - user_start), %ecx
    rep movsb
    xor %r15d, %r15d                // rounds done
    RDMSR64 CTR0
    mov %rax, %r14                  // the counter when this round's user loop starts
    pushq $0x2b                     // SS
    pushq $USER_STACK               // RSP
    pushq $0x2                      // RFLAGS: IF clear, IOPL 0
    pushq $0x33                     // CS
    pushq $USER_BASE                // RIP
    iretq

// ---------------------------------------------------------------------------------------------
// CPL0 system call entry (LSTAR): one round ended. Records its count, then starts the next
// round (SYSRETQ to the loop again) or reports and powers off.
syscall_entry:
    RDMSR64 CTR0
    mov %rax, %r8
    sub %r14, %rax
    lea rounds(%rip), %rdi
    mov %rax, (%rdi, %r15, 8)
    inc %r15
    cmp $ROUNDS, %r15
    je finish
    mov %r8, %r14
    mov $USER_BASE, %rcx            // SYSRETQ: RIP <- RCX, RFLAGS <- R11
    mov $0x2, %r11
    sysretq

finish:
    lea rounds(%rip), %rsi
    mov $ROUNDS, %r9d
1:  mov (%rsi), %rax
    call emit
    add $8, %rsi
    dec %r9d
    jnz 1b
    mov $ROUNDS, %eax
    call emit
    mov $((5 << 2) | (1 << 5)), %al // ACPI sleep: S5
    mov $0x600, %dx
    out %al, %dx
2:  hlt
    jmp 2b

pf_handler:
    nop
    nop
    nop
fail:
    movabs $0xdead0000dead, %rax
    call emit
    mov $((5 << 2) | (1 << 5)), %al
    mov $0x600, %dx
    out %al, %dx
1:  hlt
    jmp 1b

    EMIT_FUNCTION

// ---------------------------------------------------------------------------------------------
// User code (copied to USER_BASE; position independent): LOOP dependent multiply-adds (as
// cpu_split's), then a system call.
user_start:
    mov $LOOP, %ecx
    mov $1, %rax
    movabs $6364136223846793005, %rdx
1:  imul %rdx, %rax
    add $0x5bd1e995, %rax
    dec %ecx
    jnz 1b
    syscall
2:  jmp 2b
user_end:

    .balign 8
rounds:     .fill ROUNDS, 8, 0

    LINUX_GDT_DATA
    .balign 16
idt:        .fill 64, 8, 0
idtr:       .word 32 * 16 - 1
idtr_base:  .quad 0
    .balign 4096
pml4:       .fill 512, 8, 0
pdpt:       .fill 512, 8, 0
pd:         .fill 512, 8, 0
    .fill 1024, 8, 0
kstack_top:
