// load: 0x100000
// Host-profile test guest: alternates a compute loop (`compute`) with an I/O loop
// (`io_heavy`: writes to the delay port 0x510, whose emulation the test makes slow). First it
// sends the bounds of both functions over COM2 (4 x 8 bytes: compute, compute_end, io_heavy,
// io_heavy_end) so the test can tell where each sample landed.
#define ROUNDS 12
#define COMPUTE_ITERS 8000
#define IO_WRITES 40
    .code64
    .globl start
start:
    cli
    lea compute(%rip), %rax
    call emit
    lea compute_end(%rip), %rax
    call emit
    lea io_heavy(%rip), %rax
    call emit
    lea io_heavy_end(%rip), %rax
    call emit
    mov $ROUNDS, %r12d
1:  call compute
    call io_heavy
    dec %r12d
    jnz 1b
    mov $((5 << 2) | (1 << 5)), %al
    mov $0x600, %dx
    out %al, %dx
2:  hlt
    jmp 2b

compute:
    mov $COMPUTE_ITERS, %ecx
1:  dec %ecx
    jnz 1b
    ret
compute_end:

io_heavy:
    mov $IO_WRITES, %ecx
    mov $0x510, %dx
1:  out %al, %dx
    dec %ecx
    jnz 1b
    ret
io_heavy_end:

// Writes %rax to COM2 as 8 little-endian bytes.
emit:
    mov $8, %ecx
    mov $0x2f8, %dx
1:  out %al, %dx
    shr $8, %rax
    dec %ecx
    jnz 1b
    ret
