// load: 0x100000
// 64-bit: a write to a driver that did not accept FLUSH (a write-through disk: each write must be
// durable before it completes), then waits for a test to kill the VMM (blk_sync_body.inc).
#define WRITE_THROUGH
#define DRIVER_FEATURES_LO_MASK (~(1 << 9)) /* VIRTIO_BLK_F_FLUSH not accepted */
#include "blk_sync_body.inc"
