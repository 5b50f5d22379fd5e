// load: 0x100000
// 64-bit: an int3 whose #BP handler is that same int3. Where the host cannot emulate int3 at
// CPL 0 (kvm_pvm), every #BP is an emulation failure the VMM completes (RIP + 1, inject #BP),
// and the guest comes back to the same RIP with no other exit: a fix-up that makes no
// progress, which the VMM must end (exit code 6) instead of spinning. Each round pushes an
// interrupt frame (40 bytes): the stack starts at 16 MiB, far above the code.
    .code64
    .globl start
start:
    cli
    mov $0x1000000, %rsp
    lea msg(%rip), %rsi
    mov $0x3f8, %dx
1:  lodsb
    test %al, %al
    jz 2f
    out %al, %dx
    jmp 1b
2:  // IDT gate 3: a 64-bit interrupt gate to `again`, selector = our CS.
    lea idt(%rip), %rdi
    lea again(%rip), %rax
    mov %ax, 48(%rdi)               // offset 15:0
    mov %cs, %cx
    mov %cx, 50(%rdi)               // selector
    movw $0x8e00, 52(%rdi)          // present, DPL 0, interrupt gate, IST 0
    shr $16, %rax
    mov %ax, 54(%rdi)               // offset 31:16
    shr $16, %rax
    mov %eax, 56(%rdi)              // offset 63:32
    lidt idtr(%rip)
again:
    int3
    jmp again
    .balign 16
idt: .fill 4 * 16, 1, 0
idtr: .word 4 * 16 - 1
      .quad idt
msg: .asciz "tiny: int3 with itself as the #BP handler\n"
