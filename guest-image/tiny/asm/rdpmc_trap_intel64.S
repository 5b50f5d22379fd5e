// load: 0x100000
// RDPMC trap guest, Intel model (see rdpmc_trap_body.inc).
#define EVTSEL0     0x186
#define CTR0_FULL   0x4c1
#define WIDTH_MSR   0xc1                // legacy counter write: sign-extended from 32 bits
#define WIDTH_VAL   0x80000000
#define FIXED_CTR0  0x309
#define GP_ENTRY_PUSH                   // the #GP entry starts with pushq $13
#include "rdpmc_trap_body.inc"
