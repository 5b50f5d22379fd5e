// load: 0x100000
// Benchmark guest: enables AMD counter 1 (cycles), then times N reads of its counter MSR
// (0xC0010203) with RDTSC and sends the TSC delta and N over COM2. Run once with the vPMU and
// once with that MSR answered by a constant in user space, for the cost of the vPMU itself.
#define N 5000
    .code64
    .globl start
start:
    cli
    mov $0xc0010202, %ecx           // PERF_CTL1 = cycles | USR | OS | EN
    mov $(0x76 | (1 << 16) | (1 << 17) | (1 << 22)), %eax
    xor %edx, %edx
    wrmsr
    rdtsc
    shl $32, %rdx
    or %rax, %rdx
    mov %rdx, %r12
    mov $N, %r8d
1:  mov $0xc0010203, %ecx
    rdmsr
    dec %r8d
    jnz 1b
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    sub %r12, %rax
    call emit
    mov $N, %rax
    call emit
    mov $((5 << 2) | (1 << 5)), %al
    mov $0x600, %dx
    out %al, %dx
2:  hlt
    jmp 2b
emit:
    mov $8, %ecx
    mov $0x2f8, %dx
1:  out %al, %dx
    shr $8, %rax
    dec %ecx
    jnz 1b
    ret
