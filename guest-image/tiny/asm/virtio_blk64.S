// load: 0x100000
// 64-bit: a polled virtio-blk driver (blk_driver.inc) for the first `--disk`. Reports on COM2,
// as little-endian u32s: magic, version, device id, features 63..32 and 31..0 (all accepted),
// the status after FEATURES_OK, QueueNumMax; config capacity (low, high), size_max, seg_max,
// blk_size; then for each request its status byte and used length:
//   1 OUT 2 sectors at sector 1 (a pattern)     2 FLUSH
//   3 IN the 2 sectors back (+ 1 if they match) 4 GET_ID (+ the 20 ID bytes)
//   5 IN 2 sectors at capacity - 1 (past the end)  6 type 99 (unknown)
//   7 a chain whose status descriptor has length 0 (no status byte)
//   8 WRITE_ZEROES of sector 2 (one range)      9 IN sector 1..2 again (+ 1 if sector 1 is
//     still the pattern and sector 2 reads zero)
// Then a line on COM1 and power-off.
    .code64
    .globl start
start:
    cli
    cld
    mov $BASE, %ebx
    call blk_init
    mov 0x100(%rbx), %eax       // capacity, low word
    mov %eax, %ebp
    call put32
    mov 0x104(%rbx), %eax
    call put32
    mov 0x108(%rbx), %eax       // size_max
    call put32
    mov 0x10c(%rbx), %eax       // seg_max
    call put32
    mov 0x114(%rbx), %eax       // blk_size
    call put32

    mov $1024, %ecx
    call fill
    mov $1, %r8d                // 1: OUT, sectors 1-2
    mov $1, %r9
    mov $WBUF, %r10
    mov $1024, %r11d
    xor %r12d, %r12d
    call req3
    mov $4, %r8d                // 2: FLUSH
    xor %r9, %r9
    call req2
    xor %r8d, %r8d              // 3: IN, sectors 1-2
    mov $1, %r9
    mov $RBUF, %r10
    mov $1024, %r11d
    mov $2, %r12d
    call req3
    mov $WBUF, %esi
    mov $RBUF, %edi
    mov $1024, %ecx
    xor %eax, %eax
    repe cmpsb
    sete %al
    call put32
    mov $8, %r8d                // 4: GET_ID
    xor %r9, %r9
    mov $IDBUF, %r10
    mov $20, %r11d
    mov $2, %r12d
    call req3
    mov IDBUF, %eax
    call put32
    mov IDBUF+4, %eax
    call put32
    mov IDBUF+8, %eax
    call put32
    mov IDBUF+12, %eax
    call put32
    mov IDBUF+16, %eax
    call put32
    xor %r8d, %r8d              // 5: IN past the end
    lea -1(%rbp), %r9d
    mov $RBUF, %r10
    mov $1024, %r11d
    mov $2, %r12d
    call req3
    mov $99, %r8d               // 6: unknown type
    xor %r9, %r9
    call req2
    mov $4, %r8d                // 7: FLUSH whose status descriptor is 0 bytes long
    xor %r9, %r9
    call hdr
    movw $2, DESC+14
    movq $STATUS, DESC+32
    movl $0, DESC+40
    movw $2, DESC+44
    movw $0, DESC+46
    call submit
    movq $2, SEG                // 8: WRITE_ZEROES sector 2, one sector, no flags
    movl $1, SEG+8
    movl $0, SEG+12
    mov $13, %r8d
    xor %r9, %r9
    mov $SEG, %r10
    mov $16, %r11d
    xor %r12d, %r12d
    call req3
    movb $0xaa, RBUF+512        // 9: IN sectors 1-2 again
    xor %r8d, %r8d
    mov $1, %r9
    mov $RBUF, %r10
    mov $1024, %r11d
    mov $2, %r12d
    call req3
    mov $WBUF, %esi
    mov $RBUF, %edi
    mov $512, %ecx
    xor %eax, %eax
    repe cmpsb
    jne 2f
    mov $RBUF+512, %edi
    mov $512, %ecx
    xor %eax, %eax
    repe scasb
    jne 2f
    mov $1, %eax
2:  call put32

    lea done(%rip), %rsi
    call puts
    jmp poweroff

#include "blk_driver.inc"

done: .asciz "tiny: virtio-blk requests done\n"
