// load: 0x100000
// 64-bit: a line on COM1, a line on COM2, then port writes to 0x80 forever: a run that only
// --timeout ends, in the middle of its exit trace, host profile and COM2 output.
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
    mov $0x80, %dx
1:  out %al, %dx
    jmp 1b

// puts: write the NUL-terminated string at %rsi to port %dx
puts:
    lodsb
    test %al, %al
    jz 1f
    out %al, %dx
    jmp puts
1:  ret

msg:  .asciz "tiny: busy until the timeout\n"
msg2: .asciz "tiny: serial2 line before the timeout\n"
