// load: 0x100000
// Benchmark guest: as msr_loop64.S, but times N *writes* (of 0) to the counter MSR 0xC0010203,
// run with that MSR answered in user space (writes accepted): the bare user-space WRMSR exit,
// to set beside the bare RDMSR exit P2 counts its handler's two WRMSR exits in (benches/vpmu.rs).
#define ACCESS xor %eax, %eax; xor %edx, %edx; wrmsr
    .code64
#include "msr_loop_body.inc"
