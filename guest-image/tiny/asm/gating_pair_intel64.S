// load: 0x100000
// Gating pair guest, Intel model (architectural perfmon v2, full-width counter writes).
#define EVTSEL0     0x186
#define CTR0        0xc1
#define CTR0_FULL   0x4c1
#define GLOBAL_CTRL 0x38f
#define EVT_CYCLES  0x3c
#include "gating_pair_body.inc"
