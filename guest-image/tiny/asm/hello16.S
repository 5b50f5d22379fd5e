// load: 0x1000
// Real mode: prints a line on COM1, then resets the machine through the i8042.
    .code16
    .globl start
start:
    cli
    mov $msg, %si
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
msg: .asciz "tiny: hello from real mode\n"
