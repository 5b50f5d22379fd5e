// load: 0x100000
// SYSCALL relay guest: a tiny kernel with Linux's GDT layout and SYSCALL MSRs drops to CPL3 and
// checks what user code sees: N system calls (return value, CS, callee-saved registers, IF back
// on after SYSRETQ; the kernel side checks it runs at CPL0 with SS = KERNEL_DS or null, IF clear), a
// user #PF on a not-present page, a user read of a supervisor page, a user jump to LSTAR (a
// real #PF, not a system call), M `ud2` round trips (the floor a relayed system call is compared
// with), and one kernel #PF. The #PF handler starts with three NOPs, as Linux 6.1's does.
// Report on COM2 (8-byte words), sent by the kernel at the final system call (RAX = -1):
//   0 system calls seen by the kernel (excluding the final one)   1 user-side errors
//   2 kernel-side errors (wrong CS/SS/IF at the entry)             3 user #PFs   4 kernel #PFs
//   5 #UDs   6-9 the #PF error codes in order   10-13 CR2 of each   14 LSTAR
//   15 TSC cycles for the N system calls   16 TSC cycles for the M ud2 round trips   17 N  18 M
#define N 1000
#define M 1000
#define USER_BASE 0x200000
#define USER_STACK 0x3ff000
#define NOT_PRESENT 0x400000
#define SUPERVISOR 0x600000
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
    // --- page tables: 0-2 MiB supervisor, 2-4 MiB user, 4-6 MiB absent, 6-8 MiB supervisor
    lea pdpt(%rip), %rax
    or $7, %rax
    mov %rax, pml4(%rip)
    lea pd(%rip), %rax
    or $7, %rax
    mov %rax, pdpt(%rip)
    movq $0x83, pd(%rip)
    movq $(USER_BASE | 0x87), pd+8(%rip)
    movq $(SUPERVISOR | 0x83), pd+24(%rip)
    lea pml4(%rip), %rax
    mov %rax, %cr3
    // --- SSE for user code (CR4.OSFXSR | OSXMMEXCPT; CR0.MP, EM clear)
    mov %cr4, %rax
    or $0x600, %rax
    mov %rax, %cr4
    mov %cr0, %rax
    and $~4, %rax
    or $2, %rax
    mov %rax, %cr0
    // --- GDT (Linux layout) with a 64-bit TSS at 0x40
    LINUX_GDT_SETUP
    // --- IDT: every exception fails the test except #UD and #PF
    lea idt(%rip), %rdi
    xor %ecx, %ecx
2:  lea fail(%rip), %rax
    cmp $6, %ecx
    jne 3f
    lea ud_handler(%rip), %rax
3:  cmp $14, %ecx
    jne 4f
    lea pf_handler(%rip), %rax
4:  IDT_GATE64 0x10
    inc %ecx
    cmp $32, %ecx
    jne 2b
    lea idt(%rip), %rax
    mov %rax, idtr_base(%rip)
    lidt idtr(%rip)
    // --- SYSCALL MSRs as Linux sets them; EFER.NXE (as Linux: fetch faults report I/D), SCE
    LINUX_SYSCALL_SETUP syscall_entry, ((1 << 11) | 1)
    // An exit before any #PF: the VMM sees LSTAR and the IDT and installs its relay.
    mov $0x80, %dx
    out %al, %dx
    // --- one kernel #PF
    lea 5f(%rip), %r15
    mov NOT_PRESENT, %rax
5:
    // --- user code to 2 MiB
    lea user_start(%rip), %rsi
    mov $USER_BASE, %rdi
    mov $(user_end - user_start), %ecx
    rep movsb
    lea syscall_entry(%rip), %rbp   // user code jumps here (LSTAR) once
    pushq $0x2b                     // SS
    pushq $USER_STACK               // RSP
    pushq $0x202                    // RFLAGS: IF, IOPL 0
    pushq $0x33                     // CS
    pushq $USER_BASE                // RIP
    iretq

// ---------------------------------------------------------------------------------------------
// CPL0 system call entry (LSTAR). RSP is still the user's; only checks, counts and SYSRETQ.
syscall_entry:
    cmp $-1, %rax
    je finish
    incq syscalls(%rip)
    mov %cs, %r8d
    cmp $0x10, %r8d
    jne 1f
    mov %ss, %r8d                   // KERNEL_DS, or null where the relay completed it
    cmp $0x18, %r8d                 // (SS as the #PF delivery left it: see syscall_relay.rs)
    je 2f
    test %r8d, %r8d
    jnz 1f
2:  pushfq
    pop %r8
    test $0x200, %r8
    jnz 1f
    add %rdi, %rax
    sysretq
1:  incq kerrors(%rip)
    add %rdi, %rax
    sysretq

finish:
    mov %rdi, uerrors(%rip)
    mov %rsi, cyc_sys(%rip)
    mov %rdx, cyc_ud(%rip)
    lea report(%rip), %rsi
    mov $((report_end - report) / 8), %r9d
6:  mov (%rsi), %rax
    call emit
    add $8, %rsi
    dec %r9d
    jnz 6b
    mov $((5 << 2) | (1 << 5)), %al // ACPI sleep: S5
    mov $0x600, %dx
    out %al, %dx
7:  hlt
    jmp 7b

// #PF: three NOPs first, as in Linux 6.1's asm_exc_page_fault. Records the error code and CR2,
// then resumes at R15 (the test sets it before each expected fault).
pf_handler:
    nop
    nop
    nop
    push %rax
    push %rbx
    mov 16(%rsp), %rax              // error code
    mov npf(%rip), %rbx
    cmp $4, %rbx
    jae 1f
    lea pf_err(%rip), %r8
    mov %rax, (%r8, %rbx, 8)
    mov %cr2, %rax
    lea pf_cr2(%rip), %r8
    mov %rax, (%r8, %rbx, 8)
1:  incq npf(%rip)
    testq $3, 32(%rsp)              // CS
    jz 2f
    incq pf_user(%rip)
    jmp 3f
2:  incq pf_kernel(%rip)
3:  mov %r15, 24(%rsp)              // RIP
    pop %rbx
    pop %rax
    add $8, %rsp
    iretq

ud_handler:
    incq uds(%rip)
    addq $2, (%rsp)
    iretq

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
// User code (copied to USER_BASE; position independent). R12: errors; RBP: LSTAR.
user_start:
    xor %r12, %r12
    mov $0x1234abcd, %rbx
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r14                  // TSC at start
    mov $N, %r13
1:  movq %r13, %xmm0                // SSE state must survive the relay's exit to the VMM
    movq %r13, %xmm7
    mov %r13, %rax
    mov $7, %rdi
    syscall
    lea 7(%r13), %rcx               // expected return (RCX is free after SYSCALL)
    cmp %rcx, %rax
    je 2f
    inc %r12
2:  cmp $0x1234abcd, %rbx
    je 3f
    inc %r12
3:  mov %cs, %eax
    cmp $0x33, %eax
    je 4f
    inc %r12
4:  pushfq
    pop %rax
    test $0x200, %rax
    jnz 5f
    inc %r12
5:  movq %xmm0, %rax
    cmp %r13, %rax
    je 11f
    inc %r12
11: movq %xmm7, %rax
    cmp %r13, %rax
    je 12f
    inc %r12
12: dec %r13
    jnz 1b
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    sub %r14, %rax
    push %rax                       // cycles for N system calls
    // user #PF: not present (with a pattern in xmm0 that must survive it)
    mov $0x5a5a1234, %eax
    movq %rax, %xmm0
    lea 13f(%rip), %r15
    mov NOT_PRESENT, %rax
13: movq %xmm0, %rax
    cmp $0x5a5a1234, %rax
    je 6f
    inc %r12
6:  // user read of a supervisor page
    lea 7f(%rip), %r15
    mov SUPERVISOR, %rax
7:  // a jump to LSTAR: a real #PF (IF is set), the kernel resumes at R15
    lea 8f(%rip), %r15
    jmp *%rbp
8:  rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r14
    mov $M, %r13
9:  ud2
    dec %r13
    jnz 9b
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    sub %r14, %rax
    mov %rax, %rdx                  // cycles for M ud2 round trips
    pop %rsi                        // cycles for N system calls
    mov %r12, %rdi
    mov $-1, %rax
    syscall
10: jmp 10b
user_end:

    .balign 8
report:
syscalls:   .quad 0
uerrors:    .quad 0
kerrors:    .quad 0
pf_user:    .quad 0
pf_kernel:  .quad 0
uds:        .quad 0
pf_err:     .quad 0, 0, 0, 0
pf_cr2:     .quad 0, 0, 0, 0
lstar:      .quad syscall_entry
cyc_sys:    .quad 0
cyc_ud:     .quad 0
            .quad N
            .quad M
report_end:
npf:        .quad 0

    LINUX_GDT_DATA
    .balign 16
idt:        .fill 64, 8, 0
idtr:       .word 32 * 16 - 1
idtr_base:  .quad 0
    .balign 4096
pml4:       .fill 512, 8, 0
pdpt:       .fill 512, 8, 0
pd:         .fill 512, 8, 0
kstack:     .fill 1024, 8, 0
kstack_top:
