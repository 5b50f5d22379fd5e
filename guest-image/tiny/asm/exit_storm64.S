// load: 0x100000
// Exit-heavy guest for the tracing overhead bench: 100000 port writes to 0x80 (nothing
// there), then the ACPI power-off.
#define WRITES 100000
    .code64
    .globl start
start:
    cli
    mov $WRITES, %ecx
    mov $0x80, %dx
1:  out %al, %dx
    dec %ecx
    jnz 1b
    mov $((5 << 2) | (1 << 5)), %al
    mov $0x600, %dx
    out %al, %dx
2:  hlt
    jmp 2b
