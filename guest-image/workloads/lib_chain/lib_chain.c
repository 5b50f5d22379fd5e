// lib_chain: a dynamically linked program whose work runs two shared libraries deep
// (main -> a_outer in libchain_a.so -> b_spin in libchain_b.so), for the host-side profile's
// call stacks across libraries (issue 19). No libc: it needs only ld.so and its own two
// libraries, so it runs whatever libc the image carries. Frame pointers everywhere.
//
// Usage: lib_chain [ROUNDS]   (default 1000: about 1 s natively; each round 1M loop iterations)
#include <stdint.h>

uint64_t a_outer(uint64_t x, uint64_t n);

static long sys3(long nr, long a, long b, long c)
{
	long r;
	__asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
	return r;
}

static void say(const char *s)
{
	long n = 0;
	while (s[n])
		n++;
	sys3(1, 2, (long)s, n);
}

__attribute__((noinline)) int main(int argc, char **argv)
{
	long rounds = 1000;
	if (argc > 1) {
		rounds = 0;
		for (const char *p = argv[1]; *p; p++) {
			if (*p < '0' || *p > '9' || rounds > 100000000) {
				say("usage: lib_chain [ROUNDS > 0]\n");
				return 2;
			}
			rounds = rounds * 10 + (*p - '0');
		}
		if (rounds <= 0) {
			say("usage: lib_chain [ROUNDS > 0]\n");
			return 2;
		}
	}
	uint64_t x = 1;
	for (long r = 0; r < rounds; r++)
		x = a_outer(x, 1000000);
	// The result, so the work cannot be dropped (and a run shows it finished).
	char out[] = "lib_chain: 0000000000000000\n";
	for (int i = 0; i < 16; i++)
		out[11 + i] = "0123456789abcdef"[(x >> (60 - 4 * i)) & 0xf];
	say(out);
	return 0;
}

// The entry point: argc at [rsp], argv after it. RBP 0 ends a frame-pointer walk here.
__attribute__((noreturn, used)) void start_c(long *sp)
{
	int code = main((int)sp[0], (char **)(sp + 1));
	for (;;)
		sys3(231, code, 0, 0);
}

__asm__(".globl _start\n"
	".type _start, @function\n"
	"_start:\n"
	"	xor %ebp, %ebp\n"
	"	mov %rsp, %rdi\n"
	"	and $-16, %rsp\n"
	"	call start_c\n"
	"	hlt\n"
	".size _start, . - _start\n");
