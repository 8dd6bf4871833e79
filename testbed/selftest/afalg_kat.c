/*
 * afalg-kat: AF_ALG checks for the hetcrypt testbed guest.
 *
 *   afalg-kat kat            known-answer tests: cbc(aes) through the
 *                            virtio-crypto driver (both directions), and
 *                            cbc/ctr/gcm(aes) by name (whatever driver wins)
 *   afalg-kat unplug [SIZE]  print @@HETCRYPT:UNPLUG@@, then issue cbc(aes)
 *                            requests on the virtio-crypto driver until one
 *                            fails; it must fail with ESHUTDOWN (108).  No
 *                            further request is issued on that socket (a
 *                            second one crashed the 6.1 guest kernel).
 *   afalg-kat latency [DRIVER]  per-request time and throughput of cbc(aes)
 *
 * Prints OK/FAIL lines; exit status 0 when everything passed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <linux/if_alg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SOL_ALG
#define SOL_ALG 279
#endif

#define VIRTIO_CBC "virtio_crypto_aes_cbc"

static int failures;

static void hex2bin(const char *h, unsigned char *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		sscanf(h + 2 * i, "%2hhx", &b[i]);
}

static void bin2hex(const unsigned char *b, size_t n, char *h)
{
	for (size_t i = 0; i < n; i++)
		sprintf(h + 2 * i, "%02x", b[i]);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct alg {
	int tfm, op;
};

/* Bind a transform socket (type "skcipher" or "aead", name = algorithm or
 * driver name), set the key, and accept an operation socket. */
static int alg_open(struct alg *a, const char *type, const char *name, const unsigned char *key, size_t klen,
		    unsigned authsize)
{
	struct sockaddr_alg sa = { .salg_family = AF_ALG };
	snprintf((char *)sa.salg_type, sizeof sa.salg_type, "%s", type);
	snprintf((char *)sa.salg_name, sizeof sa.salg_name, "%s", name);
	a->tfm = a->op = -1;
	a->tfm = socket(AF_ALG, SOCK_SEQPACKET, 0);
	if (a->tfm < 0)
		return -errno;
	if (bind(a->tfm, (struct sockaddr *)&sa, sizeof sa) < 0)
		return -errno;
	if (setsockopt(a->tfm, SOL_ALG, ALG_SET_KEY, key, klen) < 0)
		return -errno;
	if (authsize && setsockopt(a->tfm, SOL_ALG, ALG_SET_AEAD_AUTHSIZE, NULL, authsize) < 0)
		return -errno;
	a->op = accept(a->tfm, NULL, 0);
	if (a->op < 0)
		return -errno;
	return 0;
}

static void alg_close(struct alg *a)
{
	if (a->op >= 0)
		close(a->op);
	if (a->tfm >= 0)
		close(a->tfm);
	a->op = a->tfm = -1;
}

/* One request: send op + iv (+ assoclen) + input, read outlen bytes.
 * Returns bytes read or -errno. */
static ssize_t alg_crypt(struct alg *a, int encrypt, const unsigned char *iv, size_t ivlen, int aead,
			 const void *in, size_t inlen, void *out, size_t outlen)
{
	union {
		char buf[CMSG_SPACE(sizeof(uint32_t)) + CMSG_SPACE(sizeof(struct af_alg_iv) + 32) +
			 CMSG_SPACE(sizeof(uint32_t))];
		struct cmsghdr align;
	} cb;
	char *cbuf = cb.buf;
	struct iovec iov = { .iov_base = (void *)in, .iov_len = inlen };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf };
	struct cmsghdr *c;
	struct af_alg_iv *aiv;
	size_t clen = CMSG_SPACE(sizeof(uint32_t)) + CMSG_SPACE(sizeof(struct af_alg_iv) + ivlen);

	if (aead)
		clen += CMSG_SPACE(sizeof(uint32_t));
	memset(cbuf, 0, sizeof cb.buf);
	msg.msg_controllen = clen;
	c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_ALG;
	c->cmsg_type = ALG_SET_OP;
	c->cmsg_len = CMSG_LEN(sizeof(uint32_t));
	*(uint32_t *)CMSG_DATA(c) = encrypt ? ALG_OP_ENCRYPT : ALG_OP_DECRYPT;
	c = CMSG_NXTHDR(&msg, c);
	c->cmsg_level = SOL_ALG;
	c->cmsg_type = ALG_SET_IV;
	c->cmsg_len = CMSG_LEN(sizeof(struct af_alg_iv) + ivlen);
	aiv = (struct af_alg_iv *)CMSG_DATA(c);
	aiv->ivlen = ivlen;
	memcpy(aiv->iv, iv, ivlen);
	if (aead) {
		c = CMSG_NXTHDR(&msg, c);
		c->cmsg_level = SOL_ALG;
		c->cmsg_type = ALG_SET_AEAD_ASSOCLEN;
		c->cmsg_len = CMSG_LEN(sizeof(uint32_t));
		*(uint32_t *)CMSG_DATA(c) = 0;
	}
	if (sendmsg(a->op, &msg, 0) != (ssize_t)inlen)
		return -errno;
	size_t got = 0;
	while (got < outlen) {
		ssize_t r = read(a->op, (char *)out + got, outlen - got);
		if (r < 0)
			return -errno;
		if (r == 0)
			break;
		got += r;
	}
	return got;
}

static void check(const char *what, const unsigned char *got, ssize_t n, const char *want_hex)
{
	size_t len = strlen(want_hex) / 2;
	char hex[256] = "";
	if (n < 0) {
		printf("FAIL %s: error %zd (%s)\n", what, -n, strerror(-n));
		failures++;
		return;
	}
	bin2hex(got, (size_t)n < len ? (size_t)n : len, hex);
	if ((size_t)n != len || strcmp(hex, want_hex) != 0) {
		printf("FAIL %s: got %s (%zd bytes), want %s\n", what, hex, n, want_hex);
		failures++;
	} else {
		printf("OK   %s: %s\n", what, hex);
	}
}

/* NIST SP 800-38A F.2.1 (CBC-AES128) and F.5.1 (CTR-AES128), block 1 */
static const char *K128 = "2b7e151628aed2a6abf7158809cf4f3c";
static const char *CBC_IV = "000102030405060708090a0b0c0d0e0f";
static const char *PT1 = "6bc1bee22e409f96e93d7e117393172a";
static const char *CBC_CT1 = "7649abac8119b246cee98e9b12e9197d";
static const char *CTR_IV = "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff";
static const char *CTR_CT1 = "874d6191b620e3261bef6864990db6ce";

static void kat_skcipher(const char *name, const char *iv_hex, const char *want, const char *label)
{
	unsigned char key[16], iv[16], pt[16], out[64], ct[16];
	struct alg a;
	char what[160];
	int r;
	ssize_t n;

	hex2bin(K128, key, 16);
	hex2bin(iv_hex, iv, 16);
	hex2bin(PT1, pt, 16);
	snprintf(what, sizeof what, "%s encrypt (%s)", label, name);
	r = alg_open(&a, "skcipher", name, key, 16, 0);
	if (r < 0) {
		printf("FAIL %s: cannot open: %s\n", what, strerror(-r));
		failures++;
		alg_close(&a);
		return;
	}
	n = alg_crypt(&a, 1, iv, 16, 0, pt, 16, out, 16);
	check(what, out, n, want);
	if (n == 16) {
		snprintf(what, sizeof what, "%s decrypt (%s)", label, name);
		memcpy(ct, out, 16);
		n = alg_crypt(&a, 0, iv, 16, 0, ct, 16, out, 16);
		check(what, out, n, PT1);
	}
	alg_close(&a);
}

/* GCM test case 2 (McGrew & Viega): K = 0^128, IV = 0^96, P = 0^128 */
static void kat_gcm(void)
{
	unsigned char key[16] = { 0 }, iv[12] = { 0 }, pt[16] = { 0 }, out[64];
	struct alg a;
	int r = alg_open(&a, "aead", "gcm(aes)", key, 16, 16);
	if (r < 0) {
		printf("FAIL gcm(aes) test case 2: cannot open: %s\n", strerror(-r));
		failures++;
		alg_close(&a);
		return;
	}
	ssize_t n = alg_crypt(&a, 1, iv, 12, 1, pt, 16, out, 32);
	check("gcm(aes) test case 2 encrypt (gcm(aes)) ct||tag", out, n,
	      "0388dace60b6a392f328c2b971b2fe78ab6e47d42cec13bdf53a67b21257bddf");
	alg_close(&a);
}

static int do_kat(void)
{
	kat_skcipher(VIRTIO_CBC, CBC_IV, CBC_CT1, "NIST SP 800-38A F.2.1 CBC-AES128");
	kat_skcipher("cbc(aes)", CBC_IV, CBC_CT1, "NIST SP 800-38A F.2.1 CBC-AES128");
	kat_skcipher("ctr(aes)", CTR_IV, CTR_CT1, "NIST SP 800-38A F.5.1 CTR-AES128");
	kat_gcm();
	printf("%s\n", failures ? "FAIL" : "OK");
	return failures ? 1 : 0;
}

static int device_present(void)
{
	const char *dev = getenv("HETCRYPT_TESTBED_CRYPTO_DEV");
	struct stat st;
	return dev && stat(dev, &st) == 0;
}

/* Watchdog for the unplug test: an AF_ALG read blocks uninterruptibly, so
 * when a request never completes we can only say so (with the kernel stack). */
static volatile long progress;
static volatile int unplug_done;
static pid_t main_tid;

static void *watchdog(void *arg)
{
	long last = -1;
	double since = now();
	(void)arg;
	while (!unplug_done) {
		usleep(200000);
		if (progress != last) {
			last = progress;
			since = now();
			continue;
		}
		if (now() - since > 5) {
			char path[64], line[256];
			snprintf(path, sizeof path, "/proc/self/task/%d/stack", (int)main_tid);
			printf("STUCK unplug: request %ld has not completed for 5 s; kernel stack:\n", progress + 1);
			FILE *f = fopen(path, "r");
			while (f && fgets(line, sizeof line, f))
				printf("    %s", line);
			if (f)
				fclose(f);
			fflush(stdout);
			/* This thread can never return, nor can the process exit:
			 * end the testbed run from here (exit status 3). */
			if (getenv("HETCRYPT_TESTBED")) {
				printf("ending the run with testbed-exit 3\n");
				fflush(stdout);
				if (system("testbed-exit 3") != 0)
					printf("testbed-exit failed\n");
			}
			since = now() + 1e9; /* report once */
		}
	}
	return NULL;
}

/* Closing an AF_ALG socket whose transform lives on an unplugged
 * virtio-crypto device blocks forever (D state) in the 6.1 driver
 * (virtio_crypto_skcipher_exit -> close_session waits for the gone control
 * queue), and so would exiting this process.  So hand the fds to a child that
 * keeps them open and sleeps until the guest powers off; the last reference
 * is never dropped. */
static void bury_fds(int *fds, int n)
{
	pid_t pid = fork();
	if (pid == 0) {
		for (;;)
			pause();
	}
	if (pid < 0) {
		printf("warning: fork failed; leaking the fds (exit will hang)\n");
		return;
	}
	for (int i = 0; i < n; i++)
		close(fds[i]);
	printf("quarantined: the failed sockets are held open by pid %d\n", (int)pid);
}

static int do_unplug(size_t size)
{
	unsigned char key[16], iv[16];
	unsigned char *in = calloc(1, size), *out = malloc(size);
	struct alg a;
	long done = 0;
	ssize_t n = 0;
	double t0, tfail, limit = 120;
	int r;

	hex2bin(K128, key, 16);
	hex2bin(CBC_IV, iv, 16);
	if (!device_present()) {
		printf("FAIL unplug: no virtio-crypto device (HETCRYPT_TESTBED_CRYPTO_DEV)\n");
		return 1;
	}
	r = alg_open(&a, "skcipher", VIRTIO_CBC, key, 16, 0);
	if (r < 0) {
		printf("FAIL unplug: cannot open %s: %s\n", VIRTIO_CBC, strerror(-r));
		return 1;
	}
	main_tid = (pid_t)syscall(SYS_gettid);
	pthread_t wd;
	pthread_create(&wd, NULL, watchdog, NULL);
	printf("@@HETCRYPT:UNPLUG@@\n");
	fflush(stdout);
	t0 = now();
	for (;;) {
		n = alg_crypt(&a, 1, iv, 16, 0, in, size, out, size);
		if (n != (ssize_t)size)
			break;
		done++;
		progress = done;
		if (now() - t0 > limit) {
			printf("FAIL unplug: no request failed within %.0f s (%ld done)\n", limit, done);
			return 1;
		}
	}
	tfail = now();
	unplug_done = 1;
	/* Never touch this socket again with a request: quarantine. */
	printf("request %ld failed after %.3f s: %s (errno %zd)\n", done + 1, tfail - t0,
	       n < 0 ? strerror(-n) : "short read", n < 0 ? -n : 0);
	int ok = n == -ESHUTDOWN;
	printf("%s unplug: first failure is %s\n", ok ? "OK  " : "FAIL", ok ? "ESHUTDOWN (108)" : "not ESHUTDOWN");
	fflush(stdout);
	if (getenv("AFALG_KAT_CLOSE_AFTER_FAILURE")) {
		printf("closing the failed sockets (AFALG_KAT_CLOSE_AFTER_FAILURE): expect a hang\n");
		alg_close(&a);
		printf("closed the failed sockets\n");
	} else {
		int fds[2] = { a.op, a.tfm };
		bury_fds(fds, 2);
	}
	/* wait for the device to leave the guest (what the host's unplug looks like here) */
	while (device_present() && now() - tfail < 30)
		usleep(20000);
	if (device_present()) {
		printf("FAIL unplug: device still present 30 s after the failure\n");
		ok = 0;
	} else {
		printf("OK   unplug: device gone from PCI %.3f s after the failure\n", now() - tfail);
	}
	/* The driver is gone; by-name cbc(aes) must still work (software/AES-NI). */
	failures = 0;
	kat_skcipher("cbc(aes)", CBC_IV, CBC_CT1, "after unplug: CBC-AES128");
	struct alg b;
	r = alg_open(&b, "skcipher", VIRTIO_CBC, key, 16, 0);
	printf("%s after unplug: binding %s %s\n", r == -ENOENT ? "OK  " : "FAIL", VIRTIO_CBC,
	       r == -ENOENT ? "fails with ENOENT" : (r < 0 ? strerror(-r) : "still works?"));
	if (r != -ENOENT)
		failures++;
	alg_close(&b);
	ok = ok && !failures;
	printf("%s\n", ok ? "OK" : "FAIL");
	return ok ? 0 : 1;
}

static int do_latency(const char *driver)
{
	static const size_t sizes[] = { 16, 1024, 16384, 65536 };
	unsigned char key[16] = { 1 }, iv[16] = { 2 };
	unsigned char *buf = calloc(1, 65536), *out = malloc(65536);
	struct alg a;
	int r = alg_open(&a, "skcipher", driver, key, 16, 0);
	if (r < 0) {
		printf("FAIL latency: cannot open %s: %s\n", driver, strerror(-r));
		return 1;
	}
	printf("cbc(aes) encrypt via %s, one request at a time:\n", driver);
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		size_t sz = sizes[i];
		int reps = sz <= 1024 ? 400 : sz <= 16384 ? 100 : 30;
		double t0 = now();
		for (int k = 0; k < reps; k++) {
			ssize_t n = alg_crypt(&a, 1, iv, 16, 0, buf, sz, out, sz);
			if (n != (ssize_t)sz) {
				printf("FAIL latency: %s\n", n < 0 ? strerror(-n) : "short read");
				return 1;
			}
		}
		double dt = (now() - t0) / reps;
		printf("  %6zu B: %8.1f us/request %8.2f MB/s\n", sz, dt * 1e6, sz / dt / 1e6);
	}
	alg_close(&a);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 2 && !strcmp(argv[1], "kat"))
		return do_kat();
	if (argc >= 2 && !strcmp(argv[1], "unplug"))
		return do_unplug(argc >= 3 ? strtoul(argv[2], NULL, 0) : 65536);
	if (argc >= 2 && !strcmp(argv[1], "latency"))
		return do_latency(argc >= 3 ? argv[2] : VIRTIO_CBC);
	fprintf(stderr, "usage: afalg-kat kat | unplug [SIZE] | latency [DRIVER]\n");
	return 2;
}
