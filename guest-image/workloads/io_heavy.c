// io_heavy: a workload that spends its time on I/O, in three parts (all by default):
//   file  write FILE_MB MiB to a file in 64 KiB chunks, fsync, read it back, delete it
//   zero  read ZERO_MB MiB from /dev/zero in 64 KiB chunks
//   port  PORT_N one-byte port writes: with ioperm() straight from user space (each one a VM
//         exit handled by the VMM on the vCPU thread), else through /dev/port (in the kernel).
//         The port defaults to 0x510, the VMM's delay test device (`--io-delay-us`; without it
//         the port is unclaimed and the write is simply dropped by the VMM, still an exit).
// In domain-switch mode the VMM's work for the port writes is charged to the guest.
// Built by guest-image/build.sh: static, -O2, frame pointers, symbols kept.
//
// Usage: io_heavy [file|zero|port|all] [COUNT] [PORT]
//   COUNT: MiB for file/zero (default 32), writes for port (default 100000); PORT: default 0x510
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/io.h>
#include <unistd.h>

#define CHUNK (64 * 1024)
static char buf[CHUNK];

__attribute__((noinline)) static int file_io(long mib)
{
	const char *path = "/tmp/io_heavy.dat";
	int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
	if (fd < 0)
		return perror("io_heavy: open /tmp/io_heavy.dat"), -1;
	memset(buf, 0x5a, sizeof buf);
	long chunks = mib * (1024 * 1024 / CHUNK);
	for (long i = 0; i < chunks; i++)
		if (write(fd, buf, CHUNK) != CHUNK)
			return perror("io_heavy: write"), close(fd), -1;
	fsync(fd);
	if (lseek(fd, 0, SEEK_SET) != 0)
		return perror("io_heavy: lseek"), close(fd), -1;
	for (long i = 0; i < chunks; i++)
		if (read(fd, buf, CHUNK) != CHUNK)
			return perror("io_heavy: read back"), close(fd), -1;
	close(fd);
	unlink(path);
	printf("io_heavy: file: wrote and read back %ld MiB\n", mib);
	return 0;
}

__attribute__((noinline)) static int zero_io(long mib)
{
	int fd = open("/dev/zero", O_RDONLY);
	if (fd < 0)
		return perror("io_heavy: /dev/zero"), -1;
	long chunks = mib * (1024 * 1024 / CHUNK);
	for (long i = 0; i < chunks; i++)
		if (read(fd, buf, CHUNK) != CHUNK)
			return perror("io_heavy: read /dev/zero"), close(fd), -1;
	close(fd);
	printf("io_heavy: zero: read %ld MiB from /dev/zero\n", mib);
	return 0;
}

__attribute__((noinline)) static void port_out_loop(long n, unsigned port)
{
	for (long i = 0; i < n; i++)
		outb((unsigned char)i, port);
}

__attribute__((noinline)) static int port_io(long n, unsigned port)
{
	if (ioperm(port, 1, 1) == 0) {
		port_out_loop(n, port);
		printf("io_heavy: port: %ld writes to port %#x from user space (ioperm)\n", n, port);
		return 0;
	}
	int e = errno;
	int fd = open("/dev/port", O_WRONLY);
	if (fd < 0) {
		fprintf(stderr, "io_heavy: ioperm(%#x): %s; /dev/port: %s\n", port, strerror(e),
			strerror(errno));
		return -1;
	}
	for (long i = 0; i < n; i++) {
		unsigned char b = (unsigned char)i;
		if (pwrite(fd, &b, 1, port) != 1)
			return perror("io_heavy: pwrite /dev/port"), close(fd), -1;
	}
	close(fd);
	printf("io_heavy: port: %ld writes to port %#x through /dev/port\n", n, port);
	return 0;
}

static long parse(const char *s, const char *what)
{
	char *end;
	long v = strtol(s, &end, 0);
	if (*end || v <= 0) {
		fprintf(stderr, "io_heavy: bad %s: %s\n", what, s);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	const char *what = argc > 1 ? argv[1] : "all";
	int all = !strcmp(what, "all");
	if (!all && strcmp(what, "file") && strcmp(what, "zero") && strcmp(what, "port")) {
		fprintf(stderr, "usage: %s [file|zero|port|all] [COUNT] [PORT]\n", argv[0]);
		return 2;
	}
	long count = argc > 2 ? parse(argv[2], "COUNT") : 0;
	unsigned port = argc > 3 ? (unsigned)parse(argv[3], "PORT") : 0x510;
	if (port > 0xffff) {
		fprintf(stderr, "io_heavy: port %#x out of range\n", port);
		return 2;
	}
	int rc = 0;
	if (all || !strcmp(what, "file"))
		rc |= file_io(count ? count : 32);
	if (all || !strcmp(what, "zero"))
		rc |= zero_io(count ? count : 32);
	if (all || !strcmp(what, "port"))
		rc |= port_io(count ? count : 100000, port);
	return rc ? 1 : 0;
}
