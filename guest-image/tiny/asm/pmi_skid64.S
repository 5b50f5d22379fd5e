// load: 0x100000
// Benchmark guest (AMD model): PMI skid in guest instructions. A loop of exactly 3 instructions
// per iteration (inc %r15; test %r14,%r14; jz) runs while counter 0 counts cycles from
// -PERIOD with INT set. The NMI handler reads the counter first thing (how far past zero it got:
// the overshoot, in cycles) and %r15 (iterations since the counter was armed), keeps both,
// re-arms and zeroes %r15. Since the loop ran r15 iterations in PERIOD + overshoot cycles, it
// ran r15 * overshoot / (PERIOD + overshoot) of them after the crossing: the skid (x3 for
// instructions; the handler's first 5 instructions are in the overshoot too).
// Reports on COM2: the count, then (r15, overshoot) per sample.
#define PERIOD 2600000
#define CTR_MAX 0x1000000000000
#define MAXS 200
#include "msr.inc"
    .code64
    .globl start
start:
    cli
    NMI_SETUP nmi
    xor %r14, %r14
    xor %r15, %r15
    WRMSR64 0xc0000301, 1           // PerfCntrGlobalCtl: counter 0
    call arm
    mov $0xc0010200, %ecx           // PERF_CTL0 = cycles | USR | OS | INT | EN
    mov $(0x76 | (1 << 16) | (1 << 17) | (1 << 20) | (1 << 22)), %eax
    xor %edx, %edx
    wrmsr
    xor %r15, %r15
1:  inc %r15
    test %r14, %r14
    jz 1b
    mov count(%rip), %rax
    call emit
    mov count(%rip), %r9
    lea samples(%rip), %rsi
2:  mov (%rsi), %rax
    call emit
    mov 8(%rsi), %rax
    call emit
    add $16, %rsi
    dec %r9
    jnz 2b
    mov $((5 << 2) | (1 << 5)), %al
    mov $0x600, %dx
    out %al, %dx
3:  hlt
    jmp 3b

arm:
    mov $0xc0010201, %ecx
    movabs $(CTR_MAX - PERIOD), %rax
    mov %rax, %rdx
    shr $32, %rdx
    wrmsr
    ret

nmi:
    push %rax
    push %rcx
    push %rdx
    mov $0xc0010201, %ecx
    rdmsr
    shl $32, %rdx
    or %rdx, %rax
    push %rbx
    mov count(%rip), %rbx
    cmp $MAXS, %rbx
    jae 1f
    shl $4, %rbx
    lea samples(%rip), %rcx
    mov %r15, (%rcx,%rbx)
    mov %rax, 8(%rcx,%rbx)
    incq count(%rip)
1:  mov $0xc0000302, %ecx           // PerfCntrGlobalStatusClr: counter 0
    mov $1, %eax
    xor %edx, %edx
    wrmsr
    cmpq $MAXS, count(%rip)
    jb 2f
    mov $0xc0010200, %ecx           // enough: stop counting, end the loop
    xor %eax, %eax
    xor %edx, %edx
    wrmsr
    mov $1, %r14
    jmp 3f
2:  call arm
3:  xor %r15, %r15
    pop %rbx
    pop %rdx
    pop %rcx
    pop %rax
    iretq

EMIT_FUNCTION
NMI_IDT_DATA
    .balign 8
count:  .quad 0
samples: .fill 2 * MAXS, 8, 0
