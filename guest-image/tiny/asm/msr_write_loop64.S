// load: 0x100000
// Benchmark guest: as msr_loop64.S, but times N *writes* (of 0) to the counter MSR 0xC0010203,
// run with that MSR answered in user space (writes accepted): the bare user-space WRMSR exit,
// to set beside the bare RDMSR exit P2 counts its handler's two WRMSR exits in (benches/vpmu.rs).
#define N 5000
#define BATCH 20
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
    mov $-1, %r11
    mov $(N / BATCH), %r9d
3:  rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r10
    mov $BATCH, %r8d
1:  mov $0xc0010203, %ecx
    xor %eax, %eax
    xor %edx, %edx
    wrmsr
    dec %r8d
    jnz 1b
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    sub %r10, %rax
    cmp %r11, %rax
    cmovb %rax, %r11
    dec %r9d
    jnz 3b
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    sub %r12, %rax
    call emit
    mov $N, %rax
    call emit
    mov %r11, %rax
    call emit
    mov $BATCH, %rax
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
