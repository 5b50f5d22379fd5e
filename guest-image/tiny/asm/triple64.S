// load: 0x100000
// 64-bit: loads an empty IDT and touches a non-canonical address: #GP cannot be delivered,
// nor #DF, so the CPU shuts down (triple fault).
    .code64
    .globl start
start:
    cli
    lea msg(%rip), %rsi
    mov $0x3f8, %dx
1:  lodsb
    test %al, %al
    jz 2f
    out %al, %dx
    jmp 1b
2:  lidt idtr(%rip)
    movabs $0x8000000000000000, %rax
    mov (%rax), %rax
3:  hlt
    jmp 3b
    .balign 8
idtr: .word 0
      .quad 0
msg: .asciz "tiny: about to triple-fault\n"
