// load: 0x100000
// Event-filter tiny guest, AMD model (PerfCtrExtCore + PerfMonV2): counters 0 and 1 both count
// CPU cycles (0x76, the one event the soft backend counts on AMD).
#define EVTSEL0     0xc0010200
#define CTR0        0xc0010201
#define EVTSEL1     0xc0010202
#define CTR1        0xc0010203
#define GLOBAL_CTRL 0xc0000301
#define GLOBAL_ALL  0x3
#define SEL0        0x76
#define SEL1        0x76
#include "pmu_filter_body.inc"
