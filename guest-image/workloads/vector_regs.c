/*
 * vector_regs ITERS: does the kernel keep this process's vector registers across task switches?
 *
 * Fills the upper half of ymm1 (AVX) and all of ymm16 (AVX-512VL: a register FXSAVE does not
 * cover) with a pattern, then ITERS times yields the CPU (sched_yield) and checks that both
 * still hold it, refilling after a change. Run it beside other processes on the same CPU. A
 * register the CPU or the kernel does not offer (CPUID, XGETBV) is skipped and named.
 *
 * Where the kernel saves only FXSAVE state (`noxsave`) but user space still sees the CPU's AVX
 * (user-mode CPUID on hosts that emulate guest kernel code), a process that uses these registers
 * gets other processes' values in them: docs/guest.md, "AVX state". glibc's AVX and EVEX string
 * functions (memcpy, memset, strlen...) use them, so /init keeps glibc off AVX there.
 *
 * Prints one line per register and exits 1 if any changed, 0 otherwise.
 */
#include <cpuid.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>

static unsigned long long xgetbv0(void)
{
	unsigned int lo, hi;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return ((unsigned long long)hi << 32) | lo;
}

/* By hand, not glibc's memcmp: its AVX/EVEX versions would use the very registers checked. */
static int same(const unsigned char *x, const unsigned char *y, int n)
{
	int diff = 0;
	for (int i = 0; i < n; i++)
		diff |= x[i] ^ y[i];
	return diff == 0;
}

int main(int argc, char **argv)
{
	unsigned int a, b, c, d;
	int avx = 0, avx512vl = 0;
	long iters = argc > 1 ? strtol(argv[1], NULL, 0) : 1000;
	long ymm1_bad = 0, ymm16_bad = 0;
	unsigned char pat[32], hi[16], z[32];

	if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_OSXSAVE) && (c & bit_AVX)) {
		unsigned long long xcr0 = xgetbv0();
		avx = (xcr0 & 0x6) == 0x6;
		if (avx && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_AVX512F) &&
		    (b & bit_AVX512VL))
			avx512vl = (xcr0 & 0xe0) == 0xe0;
	}
	for (unsigned i = 0; i < sizeof(pat); i++)
		pat[i] = 0x5a;
	if (avx)
		__asm__ volatile("vmovdqu %0, %%ymm1" : : "m"(pat) : "xmm1");
	if (avx512vl)
		__asm__ volatile("vmovdqu64 %0, %%ymm16" : : "m"(pat));
	for (long i = 0; i < iters; i++) {
		sched_yield();
		if (avx) {
			__asm__ volatile("vextracti128 $1, %%ymm1, %0" : "=m"(hi));
			if (!same(hi, pat, sizeof(hi))) {
				ymm1_bad++;
				__asm__ volatile("vmovdqu %0, %%ymm1" : : "m"(pat) : "xmm1");
			}
		}
		if (avx512vl) {
			__asm__ volatile("vmovdqu64 %%ymm16, %0" : "=m"(z));
			if (!same(z, pat, sizeof(z))) {
				ymm16_bad++;
				__asm__ volatile("vmovdqu64 %0, %%ymm16" : : "m"(pat));
			}
		}
	}
	if (avx)
		printf("vector_regs: ymm1 upper half changed in %ld of %ld checks\n", ymm1_bad, iters);
	else
		printf("vector_regs: ymm1 skipped (no AVX usable in user space)\n");
	if (avx512vl)
		printf("vector_regs: ymm16 changed in %ld of %ld checks\n", ymm16_bad, iters);
	else
		printf("vector_regs: ymm16 skipped (no AVX-512VL usable in user space)\n");
	return ymm1_bad || ymm16_bad;
}
