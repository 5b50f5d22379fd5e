// libchain_b.so: the innermost of lib_chain's three objects (the executable calls a_outer in
// libchain_a.so, which calls b_spin here). b_spin's loop is where the samples land, so a
// sample's stack crosses two shared libraries and the executable: lib_chain -> libchain_a.so
// -> libchain_b.so. Built by guest-image/build.sh without libc (-nostdlib), with frame pointers
// in every function (-mno-omit-leaf-frame-pointer). GCC 12 still gives a leaf that needs no
// stack at all no frame (-fno-omit-frame-pointer or not): the volatile local below gives b_spin
// one, so a walk from RBP inside its loop starts at b_spin's own frame.
#include <stdint.h>

__attribute__((noinline)) uint64_t b_spin(uint64_t x, uint64_t n)
{
	volatile uint64_t last = 0;
	for (uint64_t i = 0; i < n; i++) {
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
		__asm__ volatile("" : "+r"(x));
	}
	last = x;
	return last;
}
