// libchain_a.so: calls into libchain_b.so (see libchain_b.c). Not a tail call
// (-fno-optimize-sibling-calls, and work after the call), so a_outer's frame is on the stack
// while b_spin runs.
#include <stdint.h>

uint64_t b_spin(uint64_t x, uint64_t n);

__attribute__((noinline)) uint64_t a_outer(uint64_t x, uint64_t n)
{
	x = b_spin(x, n);
	__asm__ volatile("" : "+r"(x));
	return x + 1;
}
