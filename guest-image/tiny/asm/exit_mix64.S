// load: 0x100000
// Trace test guest with a known exit mix: 1000 port writes to 0x80 (nothing there: an
// unclaimed port), 10 port reads from 0x80, 100 reads of MSR 0xC0010004 (the test sends it to
// user space with VmConfig::const_msrs), then the ACPI power-off write (port 0x600, 1 exit).
#define WRITES 1000
#define READS 10
#define MSR_READS 100
    .code64
    .globl start
start:
    cli
    mov $WRITES, %ecx
    mov $0x80, %dx
1:  out %al, %dx
    dec %ecx
    jnz 1b
    mov $READS, %ecx
2:  in %dx, %al
    dec %ecx
    jnz 2b
    mov $MSR_READS, %r8d
3:  mov $0xc0010004, %ecx
    rdmsr
    dec %r8d
    jnz 3b
    mov $((5 << 2) | (1 << 5)), %al
    mov $0x600, %dx
    out %al, %dx
4:  hlt
    jmp 4b
