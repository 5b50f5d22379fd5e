// load: 0x100000
// vPMU tiny guest, AMD model (PerfCtrExtCore counters + PerfMonV2 global registers).
#define EVTSEL0     0xc0010200
#define CTR0        0xc0010201
#define CTR0_FULL   0xc0010201
#define GLOBAL_CTRL 0xc0000301
#define STATUS_MSR  0xc0000300
#define ACK_MSR     0xc0000302
#define EVT_CYCLES  0x76
#include "pmu_body.inc"
