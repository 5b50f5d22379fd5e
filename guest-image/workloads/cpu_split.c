// cpu_split: two user-space functions with a known 75/25 split of the work.
//
// Each round calls hot_75() for 3 units and cold_25() for 1 unit of the same loop (a chain of
// dependent multiply-adds that the compiler may not fold or vectorise), so 75% of the
// instructions and, with an identical loop body, 75% of the cycles are in hot_75. A profiler
// that samples cycles should put 75% +- a few points of the samples there in cpu-switch mode.
// Built by guest-image/build.sh: static, -O2, frame pointers, symbols kept (not stripped).
//
// Usage: cpu_split [ROUNDS]   (default 200: about 1 s natively on a 2-3 GHz core)
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define UNIT 1000000UL /* loop iterations per unit of work */

// The loop body shared by both functions (a macro, so both compile to the same loop).
#define WORK(x, n)                                                                      \
	do {                                                                            \
		for (unsigned long i = 0; i < (n); i++) {                               \
			(x) = (x) * 6364136223846793005ULL + 1442695040888963407ULL;    \
			__asm__ volatile("" : "+r"(x));                                 \
		}                                                                       \
	} while (0)

__attribute__((noinline)) uint64_t hot_75(uint64_t x)
{
	WORK(x, 3 * UNIT);
	return x;
}

__attribute__((noinline)) uint64_t cold_25(uint64_t x)
{
	WORK(x, 1 * UNIT);
	return x;
}

int main(int argc, char **argv)
{
	long rounds = 200;
	if (argc > 1) {
		char *end;
		rounds = strtol(argv[1], &end, 0);
		if (*end || rounds <= 0) {
			fprintf(stderr, "usage: %s [ROUNDS > 0]\n", argv[0]);
			return 2;
		}
	}
	uint64_t x = 1;
	for (long r = 0; r < rounds; r++) {
		x = hot_75(x);
		x = cold_25(x);
	}
	printf("cpu_split: %ld rounds, hot_75 3 units + cold_25 1 unit each, result %016llx\n",
	       rounds, (unsigned long long)x);
	return 0;
}
