/* devcrypto-unplug [LEN [no-retry]]: what cryptodev does when the virtio-crypto device is
 * hot-unplugged under a session. Sends LEN-byte AES-128-CBC requests back to back on
 * one session, prints the unplug marker after 50, and reports how the first failing
 * request fails; then sends ONE more request on the same session, then ends the
 * session, each under a watchdog (5 s: prints what hung, then testbed-exit 3). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>
#include "crypto/cryptodev.h"

static volatile long progress;
static const char *volatile stage = "requests";
static void *watchdog(void *arg) {
	long last = -1; int still = 0;
	(void)arg;
	for (;;) {
		sleep(1);
		if (progress != last) { last = progress; still = 0; continue; }
		if (++still >= 5) {
			printf("RESULT: HUNG in %s (after %ld requests)\n", stage, progress);
			fflush(stdout);
			system("testbed-exit 3");
		}
	}
	return NULL;
}
int main(int argc, char **argv) {
	size_t len = argc > 1 ? (size_t)atoi(argv[1]) : 16;
	unsigned char key[16] = {1}, iv[16] = {2};
	unsigned char *buf = aligned_alloc(4096, len < 4096 ? 4096 : len);
	int fd = open("/dev/crypto", O_RDWR);
	if (fd < 0) { perror("open /dev/crypto"); return 2; }
	struct session_op s = {.cipher = CRYPTO_AES_CBC, .keylen = 16, .key = key};
	if (ioctl(fd, CIOCGSESSION, &s)) { perror("CIOCGSESSION"); return 2; }
	struct session_info_op si = {.ses = s.ses};
	if (ioctl(fd, CIOCGSESSINFO, &si)) { perror("CIOCGSESSINFO"); return 2; }
	printf("session driver %s, %zu-byte requests\n", si.cipher_info.cra_driver_name, len);
	pthread_t t; pthread_create(&t, NULL, watchdog, NULL);
	memset(buf, 3, len);
	for (long i = 0;; i++) {
		struct crypt_op c = {.ses = s.ses, .op = COP_ENCRYPT, .len = len, .src = buf, .dst = buf, .iv = iv};
		if (ioctl(fd, CIOCCRYPT, &c)) {
			int e = errno;
			printf("RESULT: request %ld failed: errno %d (%s)\n", i, e, strerror(e));
			fflush(stdout);
			break;
		}
		progress++;
		if (i == 50) { printf("@@HETCRYPT:UNPLUG@@\n"); fflush(stdout); }
	}
	sleep(2); /* let the unplug finish */
	int r;
	if (argc <= 2 || strcmp(argv[2], "no-retry") != 0) {
		stage = "one more request after the failure";
		progress++;
		struct crypt_op c = {.ses = s.ses, .op = COP_ENCRYPT, .len = len, .src = buf, .dst = buf, .iv = iv};
		r = ioctl(fd, CIOCCRYPT, &c);
		printf("RESULT: one more request: %s\n", r ? strerror(errno) : "succeeded");
		fflush(stdout);
	}
	stage = "CIOCFSESSION (ending the session)";
	progress++;
	r = ioctl(fd, CIOCFSESSION, &s.ses);
	printf("RESULT: CIOCFSESSION: %s\n", r ? strerror(errno) : "returned 0");
	fflush(stdout);
	stage = "close(/dev/crypto)";
	progress++;
	close(fd);
	printf("RESULT: close returned\n");
	return 0;
}
