// load: 0x100000
// Event-filter tiny guest, Intel model: PMC0 counts core cycles (0x3C/0x00), PMC1 reference
// cycles (0x3C/0x01), fixed counters 1 (core cycles) and 2 (reference cycles) count too.
#define EVTSEL0     0x186
#define EVTSEL1     0x187
#define CTR0        0x4c1
#define CTR1        0x4c2
#define FIXED1      0x30a
#define FIXED2      0x30b
#define FIXED_CTRL  0x38d
#define GLOBAL_CTRL 0x38f
#define GLOBAL_ALL  0x700000003
#define SEL0        0x003c
#define SEL1        0x013c
#include "pmu_filter_body.inc"
