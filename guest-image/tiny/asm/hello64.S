// load: 0x100000
// 64-bit: prints on COM1, sends a message over COM2, reads the TSC MSR (answered by KVM)
// twice and reports whether it advanced, then powers off through the ACPI sleep register.
    .code64
    .globl start
start:
    cli
    lea msg(%rip), %rsi
    mov $0x3f8, %dx
    call puts
    lea msg2(%rip), %rsi
    mov $0x2f8, %dx
    call puts
    mov $0x10, %ecx
    rdmsr
    shl $32, %rdx
    or %rax, %rdx
    mov %rdx, %rbx
    mov $0x10, %ecx
    rdmsr
    shl $32, %rdx
    or %rax, %rdx
    lea tsc_bad(%rip), %rsi
    cmp %rbx, %rdx
    jbe 1f
    lea tsc_ok(%rip), %rsi
1:  mov $0x3f8, %dx
    call puts
    mov $((5 << 2) | (1 << 5)), %al     // SLP_TYP=S5, SLP_EN
    mov $0x600, %dx
    out %al, %dx
2:  hlt
    jmp 2b

// puts: write the NUL-terminated string at %rsi to port %dx
puts:
    lodsb
    test %al, %al
    jz 1f
    out %al, %dx
    jmp puts
1:  ret

msg:     .asciz "tiny: hello from long mode\n"
msg2:    .asciz "tiny: serial2 channel works\n"
tsc_ok:  .asciz "tiny: rdmsr TSC advanced\n"
tsc_bad: .asciz "tiny: rdmsr TSC did not advance\n"
