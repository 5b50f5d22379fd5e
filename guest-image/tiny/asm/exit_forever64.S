// load: 0x100000
// Writes to port 0x80 forever (ended by --timeout): the long run for the tracing memory bound.
    .code64
    .globl start
start:
    cli
    mov $0x80, %dx
1:  out %al, %dx
    jmp 1b
