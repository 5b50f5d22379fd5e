// load: 0x100000
// 64-bit: prints a Linux-style panic line on the console, then resets through the i8042 the
// way a panicking Linux with `panic=-1 reboot=k` does: the VMM must report a guest panic
// (exit code 3), not a reboot.
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
2:  mov $0xfe, %al
    out %al, $0x64
3:  hlt
    jmp 3b
msg: .asciz "tiny: about to panic\nKernel panic - not syncing: tiny guest panics on purpose\n"
