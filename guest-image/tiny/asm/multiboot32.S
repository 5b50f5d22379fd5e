// load: 0x200000 elf32
// A Multiboot v1 kernel (ELF32, like kvm-unit-tests' x86/*.flat) for the VMM's Multiboot loader
// and its isa-debug-exit port: prints what it was given on COM1 -- EAX, CR0, EFER, CS, the
// information block's flags and memory fields, the command line, the module's text (the
// environment), the boot loader name and the memory map -- then writes the last character of
// its command line minus '0' to port 0xf4 (so "... 0" ends with value 0, "... 3" with 3).
    .code32
    .text
    .align 4
mb_header:
    .long 0x1BADB002, 0x3, -(0x1BADB002 + 0x3)   // flags: page-aligned modules, memory info

    .globl start
start:
    cli
    mov $stack_top, %esp
    mov %ebx, %ebp                  // the information block
    mov %eax, %edi
    mov $s_eax, %esi
    call puts
    mov %edi, %eax
    call puthex
    call newline

    mov $s_cr0, %esi
    call puts
    mov %cr0, %eax
    call puthex
    mov $s_efer, %esi
    call puts
    mov $0xc0000080, %ecx
    rdmsr
    call puthex
    mov $s_cs, %esi
    call puts
    xor %eax, %eax
    mov %cs, %ax
    call puthex
    call newline

    mov $s_flags, %esi
    call puts
    mov 0(%ebp), %eax
    call puthex
    mov $s_lower, %esi
    call puts
    mov 4(%ebp), %eax
    call puthex
    mov $s_upper, %esi
    call puts
    mov 8(%ebp), %eax
    call puthex
    mov $s_mods, %esi
    call puts
    mov 20(%ebp), %eax
    call puthex
    call newline

    mov $s_cmdline, %esi
    call puts
    mov 16(%ebp), %esi
    call puts
    call newline

    mov $s_loader, %esi
    call puts
    mov 64(%ebp), %esi
    call puts
    call newline

    // The module: its start, then its text verbatim (KEY=VALUE lines), then an end marker.
    mov 24(%ebp), %ebx              // mods_addr
    mov $s_module, %esi
    call puts
    mov 0(%ebx), %eax
    call puthex
    call newline
    mov 0(%ebx), %esi
    mov 4(%ebx), %ecx
    sub %esi, %ecx
1:  test %ecx, %ecx
    jz 2f
    lodsb
    call putc
    dec %ecx
    jmp 1b
2:  mov $s_module_end, %esi
    call puts

    // The memory map: "mb: mmap BASE LENGTH TYPE" per entry (low 32 bits of each).
    mov 48(%ebp), %ebx              // mmap_addr
    mov 44(%ebp), %ecx
    add %ebx, %ecx                  // its end
3:  cmp %ecx, %ebx
    jae 4f
    mov $s_mmap, %esi
    call puts
    mov 4(%ebx), %eax
    call puthex
    call space
    mov 12(%ebx), %eax
    call puthex
    call space
    mov 20(%ebx), %eax
    call puthex
    call newline
    mov 0(%ebx), %eax
    lea 4(%ebx, %eax), %ebx
    jmp 3b

4:  // Exit value: the command line's last character minus '0'.
    mov 16(%ebp), %esi
    xor %eax, %eax
5:  mov (%esi), %dl
    test %dl, %dl
    jz 6f
    mov %dl, %al
    inc %esi
    jmp 5b
6:  sub $'0', %eax
    and $0xff, %eax
    mov $0xf4, %dx
    outl %eax, %dx
    mov $s_alive, %esi              // not reached when the port ends the run
    call puts
7:  hlt
    jmp 7b

// putc: %al to COM1
putc:
    push %edx
    mov $0x3f8, %dx
    out %al, %dx
    pop %edx
    ret

// puts: the NUL-terminated string at %esi
puts:
    push %eax
1:  lodsb
    test %al, %al
    jz 2f
    call putc
    jmp 1b
2:  pop %eax
    ret

// puthex: %eax as 8 hex digits
puthex:
    push %ecx
    push %eax
    mov $8, %ecx
1:  rol $4, %eax
    push %eax
    and $0xf, %eax
    mov hexdigits(%eax), %al
    call putc
    pop %eax
    loop 1b
    pop %eax
    pop %ecx
    ret

newline:
    mov $'\n', %al
    jmp putc
space:
    mov $' ', %al
    jmp putc

hexdigits:    .ascii "0123456789abcdef"
s_eax:        .asciz "mb: eax="
s_cr0:        .asciz "mb: cr0="
s_efer:       .asciz " efer="
s_cs:         .asciz " cs="
s_flags:      .asciz "mb: flags="
s_lower:      .asciz " mem_lower="
s_upper:      .asciz " mem_upper="
s_mods:       .asciz " mods_count="
s_cmdline:    .asciz "mb: cmdline="
s_loader:     .asciz "mb: loader="
s_module:     .asciz "mb: module at "
s_module_end: .asciz "mb: module end\n"
s_mmap:       .asciz "mb: mmap "
s_alive:      .asciz "mb: still running after the write to port 0xf4\n"

    .bss
    .align 16
    .space 1024
stack_top:
