// load: 0x100000
// RDPMC trap guest, AMD model (see rdpmc_trap_body.inc).
#define EVTSEL0     0xc0010200
#define CTR0_FULL   0xc0010201
#define WIDTH_MSR   0xc0010201
#define WIDTH_VAL   0xffffffffffffffff
#include "rdpmc_trap_body.inc"
