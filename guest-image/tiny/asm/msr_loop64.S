// load: 0x100000
// Benchmark guest: times N reads of AMD counter 1's counter MSR (msr_loop_body.inc). Run once
// with the vPMU and once with that MSR answered by a constant in user space, for the cost of
// the vPMU itself.
#define ACCESS rdmsr
    .code64
#include "msr_loop_body.inc"
