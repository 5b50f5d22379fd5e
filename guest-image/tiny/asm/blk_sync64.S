// load: 0x100000
// 64-bit: writes 8 sectors of a pattern (byte i = i * 7 + 3) at sector 8 of the first
// `--disk`, FLUSHes, and says so on COM1 ("tiny: virtio-blk data flushed"; "... failed" if a
// status is not OK); then waits with interrupts off for ever, for a test to kill the VMM
// (vmm/tests/blk_tiny.rs: the data must be in the image file). Driver: blk_driver.inc.
    .code64
    .globl start
start:
    cli
    cld
    mov $BASE, %ebx
    call blk_init
    mov $4096, %ecx
    call fill
    mov $1, %r8d                // OUT, sectors 8-15
    mov $8, %r9
    mov $WBUF, %r10
    mov $4096, %r11d
    xor %r12d, %r12d
    call req3
    test %eax, %eax
    jnz 1f
    mov $4, %r8d                // FLUSH
    xor %r9, %r9
    call req2
    test %eax, %eax
    jnz 1f
    lea flushed(%rip), %rsi
    call puts
    jmp 2f
1:  lea failed(%rip), %rsi
    call puts
2:  cli
    hlt
    jmp 2b

#include "blk_driver.inc"

flushed: .asciz "tiny: virtio-blk data flushed\n"
failed:  .asciz "tiny: virtio-blk write failed\n"
