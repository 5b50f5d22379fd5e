// load: 0x100000
// Gating pair guest, AMD model (PerfCtrExtCore counter 0, PerfMonV2 global control).
#define EVTSEL0     0xc0010200
#define CTR0        0xc0010201
#define CTR0_FULL   0xc0010201
#define GLOBAL_CTRL 0xc0000301
#define EVT_CYCLES  0x76
#include "gating_pair_body.inc"
