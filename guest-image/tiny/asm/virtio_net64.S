// load: 0x100000
// 64-bit: a minimal virtio-net driver for the VMM's virtio-mmio card at 0xd0000000 (`--net`).
// Reports over COM2, as raw little-endian u32s: magic, version, device id, vendor id, device
// features (high word, low word), the status after FEATURES_OK, QueueNumMax of queue 0; then
// the 6 MAC bytes from the configuration space. Then it sets up the receive and transmit
// queues (8 entries, polled: interrupts suppressed), posts 4 receive buffers, and answers the
// first 3 frames it receives as ICMP echo requests (swap MACs and IPs, type 8 -> 0, patch the
// checksum) through the transmit queue. Prints a line on COM1 and powers off.
    .code64
    .set BASE,  0xd0000000
    .set RXD,   0x200000        // receive queue: descriptors, avail ring, used ring
    .set RXA,   0x201000
    .set RXU,   0x202000
    .set TXD,   0x210000        // transmit queue
    .set TXA,   0x211000
    .set TXU,   0x212000
    .set RXBUF, 0x300000        // 2 KiB buffers
    .set TXBUF, 0x400000
    .set QSIZE, 8
    .set NRX,   4
    .set NREPLIES, 3
    .globl start
start:
    cli
    mov $BASE, %ebx             // 32-bit move: zero-extends into %rbx
    mov 0x00(%rbx), %eax        // MagicValue
    call put32
    mov 0x04(%rbx), %eax        // Version
    call put32
    mov 0x08(%rbx), %eax        // DeviceID
    call put32
    mov 0x0c(%rbx), %eax        // VendorID
    call put32

    movl $0, 0x70(%rbx)         // Status: reset
    movl $1, 0x70(%rbx)         // ACKNOWLEDGE
    movl $3, 0x70(%rbx)         // | DRIVER
    movl $1, 0x14(%rbx)         // DeviceFeaturesSel = 1
    mov 0x10(%rbx), %eax
    call put32
    movl $0, 0x14(%rbx)         // DeviceFeaturesSel = 0
    mov 0x10(%rbx), %eax
    call put32
    movl $1, 0x24(%rbx)         // DriverFeaturesSel = 1: VIRTIO_F_VERSION_1 (bit 32)
    movl $1, 0x20(%rbx)
    movl $0, 0x24(%rbx)         // DriverFeaturesSel = 0: VIRTIO_NET_F_MAC (bit 5)
    movl $0x20, 0x20(%rbx)
    movl $0xb, 0x70(%rbx)       // | FEATURES_OK
    mov 0x70(%rbx), %eax        // still set if the device accepted the features
    call put32

    movl $0, 0x30(%rbx)         // QueueSel = 0 (receive)
    mov 0x34(%rbx), %eax        // QueueNumMax
    call put32
    movl $QSIZE, 0x38(%rbx)
    movl $RXD, 0x80(%rbx)
    movl $0, 0x84(%rbx)
    movl $RXA, 0x90(%rbx)
    movl $0, 0x94(%rbx)
    movl $RXU, 0xa0(%rbx)
    movl $0, 0xa4(%rbx)
    movl $1, 0x44(%rbx)         // QueueReady
    movl $1, 0x30(%rbx)         // QueueSel = 1 (transmit)
    movl $QSIZE, 0x38(%rbx)
    movl $TXD, 0x80(%rbx)
    movl $0, 0x84(%rbx)
    movl $TXA, 0x90(%rbx)
    movl $0, 0x94(%rbx)
    movl $TXU, 0xa0(%rbx)
    movl $0, 0xa4(%rbx)
    movl $1, 0x44(%rbx)
    movl $0xf, 0x70(%rbx)       // | DRIVER_OK

    xor %ecx, %ecx              // the MAC: config bytes 0..5, byte-wide reads
1:  movzbl 0x100(%rbx,%rcx), %eax
    mov $0x2f8, %dx
    out %al, %dx
    inc %ecx
    cmp $6, %ecx
    jne 1b

    xor %ecx, %ecx              // receive buffers: descriptors 0..NRX-1, device-writable
2:  mov %ecx, %eax
    shl $11, %eax
    add $RXBUF, %eax
    mov %rcx, %rdi
    shl $4, %rdi
    add $RXD, %rdi
    mov %rax, (%rdi)            // addr
    movl $2048, 8(%rdi)         // len
    movw $2, 12(%rdi)           // VIRTQ_DESC_F_WRITE
    movw $0, 14(%rdi)
    movw %cx, RXA+4(,%rcx,2)    // avail ring[i] = i
    inc %ecx
    cmp $NRX, %ecx
    jne 2b
    movw $1, RXA                // VIRTQ_AVAIL_F_NO_INTERRUPT: this driver polls
    movw $1, TXA
    movw $NRX, RXA+2            // avail idx
    movl $0, 0x50(%rbx)         // QueueNotify(0)

    xor %r12d, %r12d            // receive used entries consumed
    xor %r13d, %r13d            // transmit avail idx
    mov $NRX, %r14d             // receive avail idx
    xor %r15d, %r15d            // replies sent
wait:
    pause
    movzwl RXU+2, %eax          // used idx
    cmp %r12w, %ax
    je wait
    mov %r12d, %eax
    and $(QSIZE - 1), %eax
    mov RXU+4(,%rax,8), %r8d    // used element: id (descriptor = buffer number)
    mov RXU+8(,%rax,8), %r9d    // bytes written: 12-byte header + frame
    inc %r12d

    mov %r8d, %esi              // copy header + frame into the next transmit buffer
    shl $11, %esi
    add $RXBUF, %esi
    mov %r13d, %edi
    and $(QSIZE - 1), %edi
    shl $11, %edi
    add $TXBUF, %edi
    mov %rdi, %r10
    mov %r9, %rcx
    cld
    rep movsb

    mov 12(%r10), %eax          // swap destination and source MAC (frame at +12)
    mov 16(%r10), %dx
    mov 18(%r10), %r11d
    mov 22(%r10), %cx
    mov %r11d, 12(%r10)
    mov %cx, 16(%r10)
    mov %eax, 18(%r10)
    mov %dx, 22(%r10)
    mov 38(%r10), %eax          // swap IPv4 source and destination (IP header at +26)
    mov 42(%r10), %edx
    mov %edx, 38(%r10)
    mov %eax, 42(%r10)
    movb $0, 46(%r10)           // ICMP type: echo request (8) -> echo reply (0)
    mov 48(%r10), %ax           // checksum (big-endian) += 0x0800, end-around carry
    xchg %al, %ah
    add $0x0800, %ax
    adc $0, %ax
    xchg %al, %ah
    mov %ax, 48(%r10)

    mov %r13d, %eax             // transmit descriptor t = idx % QSIZE
    and $(QSIZE - 1), %eax
    mov %rax, %rdi
    shl $4, %rdi
    add $TXD, %rdi
    mov %r10, (%rdi)
    mov %r9d, 8(%rdi)
    movw $0, 12(%rdi)
    movw %ax, TXA+4(,%rax,2)
    inc %r13d
    movw %r13w, TXA+2
    movl $1, 0x50(%rbx)         // QueueNotify(1)

    mov %r14d, %eax             // give the receive buffer back
    and $(QSIZE - 1), %eax
    movw %r8w, RXA+4(,%rax,2)
    inc %r14d
    movw %r14w, RXA+2
    movl $0, 0x50(%rbx)         // QueueNotify(0)

    inc %r15d
    cmp $NREPLIES, %r15d
    jne wait

    lea done(%rip), %rsi
    mov $0x3f8, %dx
3:  lodsb
    test %al, %al
    jz 4f
    out %al, %dx
    jmp 3b
4:  mov $((5 << 2) | (1 << 5)), %al     // SLP_TYP=S5, SLP_EN
    mov $0x600, %dx
    out %al, %dx
5:  hlt
    jmp 5b

// put32: the 4 bytes of %eax, little-endian, to COM2
put32:
    mov $0x2f8, %dx
    mov $4, %ecx
1:  out %al, %dx
    shr $8, %eax
    dec %ecx
    jnz 1b
    ret

done: .asciz "tiny: virtio-net answered 3 echo requests\n"
