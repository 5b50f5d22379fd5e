// load: 0x200000 elf32
// The XBEGIN trap (vmm/runtime/src/host_quirks/xbegin_abort.rs) end to end: a Multiboot v1 kernel, as
// kvm-unit-tests' x86/pmu is, that enters long mode and runs at CPL 0
//   1. XBEGIN whose fallback is the next instruction (kvm-unit-tests' `xbegin 1f; 1:`),
//   2. XBEGIN whose fallback lies further on (the instructions between must not run),
//   3. UD2 (its #UD must reach this guest's handler),
// with RAX = -1 before each XBEGIN. Its #UD handler starts with `pushq $6`, as kvm-unit-tests'
// entry stubs do (the VMM stands in for it), counts the #UDs that reach it, records the last
// one's RIP and resumes at `ud_resume`. It prints on COM1
//   xb: eax1=... eax2=... bad=... ud=... udrip=... ud2at=...   (16 hex digits each)
// and writes 0 to the isa-debug-exit port. With the trap, eax1 = eax2 = 0 (an abort without a
// status bit), bad = 0 and one #UD (the UD2's); without it, the XBEGINs' #UDs reach the handler.
#include "msr.inc"

// FIELD name, op, x: prints the string `name`, then `op x(%rip), %rax` as 16 hex digits.
.macro FIELD name, op, x
    lea \name(%rip), %rsi
    \op \x(%rip), %rax
    call field
.endm

    .code32
    .text
    .align 4
mb_header:
    .long 0x1BADB002, 0x3, -(0x1BADB002 + 0x3)

    .globl start
start:
    cli
    mov $stack_top, %esp
    // Identity map the first 4 MiB with two 2 MiB pages (this image is at 2 MiB).
    mov $pdpt, %eax
    or $3, %eax
    mov %eax, pml4
    mov $pd, %eax
    or $3, %eax
    mov %eax, pdpt
    movl $0x83, pd
    movl $0x200083, pd+8
    mov $pml4, %eax
    mov %eax, %cr3
    mov %cr4, %eax
    or $0x20, %eax                  // PAE
    mov %eax, %cr4
    mov $0xc0000080, %ecx
    rdmsr
    or $0x100, %eax                 // EFER.LME
    wrmsr
    lgdt gdtr
    mov %cr0, %eax
    or $0x80000001, %eax            // PG, PE
    mov %eax, %cr0
    ljmp $0x08, $long_mode

    .code64
long_mode:
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    lea stack_top(%rip), %rsp
    // IDT: every exception ends the test except #UD (6).
    lea idt(%rip), %rdi
    xor %ecx, %ecx
1:  lea fail(%rip), %rax
    cmp $6, %ecx
    jne 2f
    lea ud_handler(%rip), %rax
2:  IDT_GATE64 0x08
    inc %ecx
    cmp $32, %ecx
    jne 1b
    lea idt(%rip), %rax
    mov %rax, idtr_base(%rip)
    lidt idtr(%rip)
    // Exits until the VMM has put its int3 over the #UD handler (it looks now and then);
    // without the trap, on after 200,000 exits.
    mov $200000, %r8d
3:  cmpb $0xcc, ud_handler(%rip)
    je 4f
    out %al, $0x80
    dec %r8d
    jnz 3b
4:
    // 1. Fallback at the next instruction.
    lea 5f(%rip), %rax
    mov %rax, ud_resume(%rip)
    mov $-1, %rax
    xbegin 5f
    xend                            // in a transaction only if XBEGIN started one
5:  mov %rax, eax1(%rip)
    // 2. Fallback further on.
    lea 6f(%rip), %rax
    mov %rax, ud_resume(%rip)
    mov $-1, %rax
    xbegin 6f
    xend
    movq $1, bad(%rip)
6:  mov %rax, eax2(%rip)
    // 3. UD2: the guest's handler takes it.
    lea 7f(%rip), %rax
    mov %rax, ud_resume(%rip)
ud2_at:
    ud2
7:
    FIELD s_eax1, mov, eax1
    FIELD s_eax2, mov, eax2
    FIELD s_bad, mov, bad
    FIELD s_ud, mov, ud_count
    FIELD s_udrip, mov, ud_rip
    FIELD s_ud2at, lea, ud2_at       // the UD2's address itself
    mov $'\n', %al
    call putc
    xor %eax, %eax
    mov $0xf4, %dx
    outl %eax, %dx
8:  hlt
    jmp 8b

// #UD: kvm-unit-tests' entry stub shape, then count, record RIP, resume at ud_resume.
ud_handler:
    pushq $6
    add $8, %rsp
    incq ud_count(%rip)
    push %rax
    mov 8(%rsp), %rax               // the frame's RIP (no error code), above RAX
    mov %rax, ud_rip(%rip)
    mov ud_resume(%rip), %rax
    mov %rax, 8(%rsp)
    pop %rax
    iretq

// Any other exception: say so and end with value 2.
fail:
    lea s_fail(%rip), %rsi
    call puts
    mov $2, %eax
    mov $0xf4, %dx
    outl %eax, %dx
1:  hlt
    jmp 1b

// field: the string at %rsi, then %rax as 16 hex digits.
field:
    call puts
    mov $16, %ecx
1:  rol $4, %rax
    push %rax
    and $0xf, %eax
    lea hexdigits(%rip), %rdx
    mov (%rdx, %rax), %al
    call putc
    pop %rax
    loop 1b
    ret

puts:
    push %rax
1:  lodsb
    test %al, %al
    jz 2f
    call putc
    jmp 1b
2:  pop %rax
    ret

putc:
    push %rdx
    mov $0x3f8, %dx
    out %al, %dx
    pop %rdx
    ret

hexdigits: .ascii "0123456789abcdef"
s_eax1:    .asciz "xb: eax1="
s_eax2:    .asciz " eax2="
s_bad:     .asciz " bad="
s_ud:      .asciz " ud="
s_udrip:   .asciz " udrip="
s_ud2at:   .asciz " ud2at="
s_fail:    .asciz "xb: unexpected exception\n"

    .align 8
gdt:
    .quad 0
    .quad 0x00af9a000000ffff        // 0x08: 64-bit code
    .quad 0x00cf92000000ffff        // 0x10: data
gdtr:
    .word gdtr - gdt - 1
    .long gdt
    .align 8
idtr:
    .word 32 * 16 - 1
idtr_base:
    .quad 0

    // Data in .text too: RIP-relative references within one section need no relocation, which
    // an ELF32 object could not express for 64-bit code.
    .align 4096
pml4: .space 4096
pdpt: .space 4096
pd:   .space 4096
idt:  .space 32 * 16
    .align 8
ud_resume: .quad 0
ud_count:  .quad 0
ud_rip:    .quad 0
eax1:      .quad 0
eax2:      .quad 0
bad:       .quad 0
    .align 16
    .space 4096
stack_top:
