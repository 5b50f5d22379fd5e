// load: 0x100000
// 64-bit: prints a line, then halts with interrupts off: nothing can wake it. The VMM must not
// spin (the vCPU sleeps in KVM) and --timeout must end the run.
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
2:  hlt
    jmp 2b
msg: .asciz "tiny: halting forever\n"
