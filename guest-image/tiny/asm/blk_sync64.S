// load: 0x100000
// 64-bit: a write and a FLUSH, then waits for a test to kill the VMM (blk_sync_body.inc).
#include "blk_sync_body.inc"
