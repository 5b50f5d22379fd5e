// syscall_heavy: a workload that spends its time entering the kernel.
//
// Each iteration makes two cheap system calls (getppid, and a 1-byte write to /dev/null), so
// most of its time is guest kernel entry/exit and syscall work, little is user code.
// Built by guest-image/build.sh: static, -O2, frame pointers, symbols kept.
//
// Usage: syscall_heavy [ITERATIONS]   (default 1000000)
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((noinline)) static long syscall_loop(long n, int fd)
{
	long sum = 0;
	char c = 0;
	for (long i = 0; i < n; i++) {
		sum += syscall(SYS_getppid);
		if (write(fd, &c, 1) != 1)
			return -1;
	}
	return sum;
}

int main(int argc, char **argv)
{
	long n = 1000000;
	if (argc > 1) {
		char *end;
		n = strtol(argv[1], &end, 0);
		if (*end || n <= 0) {
			fprintf(stderr, "usage: %s [ITERATIONS > 0]\n", argv[0]);
			return 2;
		}
	}
	int fd = open("/dev/null", O_WRONLY);
	if (fd < 0) {
		perror("syscall_heavy: /dev/null");
		return 1;
	}
	long sum = syscall_loop(n, fd);
	if (sum < 0) {
		perror("syscall_heavy: write");
		return 1;
	}
	printf("syscall_heavy: %ld iterations, %ld system calls\n", n, 2 * n);
	return 0;
}
