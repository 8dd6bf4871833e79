/* records.c: the provider's cost per TLS record, against OpenSSL's default provider,
 * in one process.
 *
 * Two library contexts: "default" (the default provider) and "hetcrypt" (the hetcrypt
 * provider preferred, the default provider beside it, as bench-https's openssl.cnf has
 * them). Each workload makes the EVP calls libssl 3.0 makes per record (or per
 * connection), so a difference between the two contexts is the provider's own cost:
 *
 *   tls12-gcm  per record: ctrl(AEAD_TLS1_AAD) + EVP_Cipher (ssl3_record.c, tls1_enc)
 *   tls13-gcm  per record: CipherInit(nonce) + Update(aad) + Update + Final + ctrl(GET_TAG)
 *   tls12-cbc  per record: one EVP_CipherUpdate in TLS mode (tls-version set: the
 *              provider pads), as libssl does for a provided CBC cipher
 *   conn-gcm   per connection: a GCM context made, keyed, one record, freed
 *   ticket     per connection: an AES-256-CBC context made, keyed, ~200 B
 *              encrypted and finalised, freed (a session ticket, statem_srvr.c)
 *   clock-mono, clock-thread  one clock_gettime (CLOCK_MONOTONIC, the thread's CPU
 *              clock): what a timed call's clock reads cost here
 *
 * usage: records [-n ITER] [-r ROUNDS] [-c default|hetcrypt|both] [-b NAME] PROVIDER_DIR WORKLOAD SIZE
 * Prints, per round, ns per operation for each context (the order rotating each
 * round: "ROUND"), then per context its median ratio to "default" with the range, and
 * the ratio of the fastest rounds ("RESULT"). -b NAME: a third context with provider
 * NAME (NAME.so in PROVIDER_DIR: another build of hetcrypt, a change's before), and
 * hetcrypt/NAME. -c one context only, for callgrind (`--toggle-collect=measured`
 * counts the measured loop alone). Environment: HETCRYPT_PROVIDER_* as for the
 * provider.
 *
 * Build: cc -O2 -o records records.c -lcrypto
 */
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/provider.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Room past a record for the explicit IV, MAC and padding (as libssl's buffers). */
#define SLACK 256
/* A session ticket's encrypted part: an ASN.1 SSL_SESSION is about this long. */
#define TICKET_LEN 200

struct lib {
	const char *name;
	OSSL_LIB_CTX *ctx;
	const char *propq;
	EVP_CIPHER *gcm, *cbc, *cbc256;
	EVP_CIPHER_CTX *c; /* a long-lived record context */
};

static unsigned char key[32], iv[16], buf[16384 + SLACK];

static void die(const char *what)
{
	fprintf(stderr, "records: %s failed\n", what);
	ERR_print_errors_fp(stderr);
	exit(1);
}

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static void open_lib(struct lib *l, const char *name, const char *dir)
{
	l->name = name;
	l->ctx = OSSL_LIB_CTX_new();
	if (l->ctx == NULL)
		die("OSSL_LIB_CTX_new");
	if (strcmp(name, "default") != 0) {
		char props[128];
		if (!OSSL_PROVIDER_set_default_search_path(l->ctx, dir))
			die("search path");
		if (OSSL_PROVIDER_load(l->ctx, name) == NULL)
			die("loading the provider");
		/* bench-https: default_properties = ?provider=hetcrypt */
		snprintf(props, sizeof(props), "?provider=%s", name);
		if (!EVP_set_default_properties(l->ctx, props))
			die("default properties");
	}
	if (OSSL_PROVIDER_load(l->ctx, "default") == NULL)
		die("loading default");
	l->gcm = EVP_CIPHER_fetch(l->ctx, "AES-128-GCM", NULL);
	l->cbc = EVP_CIPHER_fetch(l->ctx, "AES-128-CBC", NULL);
	l->cbc256 = EVP_CIPHER_fetch(l->ctx, "AES-256-CBC", NULL);
	if (l->gcm == NULL || l->cbc == NULL || l->cbc256 == NULL)
		die("fetch");
	if (strcmp(OSSL_PROVIDER_get0_name(EVP_CIPHER_get0_provider(l->gcm)), name) != 0)
		die("the expected provider");
}

static void gcm_keyed(EVP_CIPHER_CTX *c, EVP_CIPHER *cipher)
{
	if (!EVP_CipherInit_ex(c, cipher, NULL, key, NULL, 1))
		die("gcm init");
	if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_IV_FIXED, 4, iv) <= 0)
		die("gcm fixed iv");
}

static void tls12_gcm_record(EVP_CIPHER_CTX *c, int len)
{
	unsigned char aad[13] = {0};
	aad[8] = 23, aad[9] = 3, aad[10] = 3, aad[11] = len >> 8, aad[12] = len & 0xff;
	/* explicit nonce (8) + data + tag (16) */
	if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_TLS1_AAD, 13, aad) <= 0)
		die("tls aad");
	if (EVP_Cipher(c, buf, buf, len + 8 + 16) <= 0)
		die("EVP_Cipher");
}

static void tls13_gcm_record(EVP_CIPHER_CTX *c, int len)
{
	unsigned char aad[5] = {23, 3, 3, 0, 0}, tag[16];
	int outl;
	aad[3] = (len + 17) >> 8, aad[4] = (len + 17) & 0xff;
	if (!EVP_CipherInit_ex(c, NULL, NULL, NULL, iv, 1)
	    || !EVP_CipherUpdate(c, NULL, &outl, aad, sizeof(aad))
	    || !EVP_CipherUpdate(c, buf, &outl, buf, len + 1)
	    || !EVP_CipherFinal_ex(c, buf + outl, &outl)
	    || EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, tag) <= 0)
		die("tls13 record");
}

static void cbc_tls_keyed(EVP_CIPHER_CTX *c, EVP_CIPHER *cipher)
{
	unsigned int version = 0x0303;
	size_t mac = 32;
	OSSL_PARAM p[3];
	if (!EVP_CipherInit_ex(c, cipher, NULL, key, NULL, 1))
		die("cbc init");
	p[0] = OSSL_PARAM_construct_uint(OSSL_CIPHER_PARAM_TLS_VERSION, &version);
	p[1] = OSSL_PARAM_construct_size_t(OSSL_CIPHER_PARAM_TLS_MAC_SIZE, &mac);
	p[2] = OSSL_PARAM_construct_end();
	if (!EVP_CIPHER_CTX_set_params(c, p))
		die("tls params");
}

static void tls12_cbc_record(EVP_CIPHER_CTX *c, int len)
{
	int outl;
	/* explicit IV (16) + data + MAC (32); the provider adds the padding */
	if (!EVP_CipherUpdate(c, buf, &outl, buf, 16 + len + 32))
		die("cbc record");
}

static void op(struct lib *l, const char *w, int len)
{
	if (strcmp(w, "tls12-gcm") == 0) {
		tls12_gcm_record(l->c, len);
	} else if (strcmp(w, "tls13-gcm") == 0) {
		tls13_gcm_record(l->c, len);
	} else if (strcmp(w, "tls12-cbc") == 0) {
		tls12_cbc_record(l->c, len);
	} else if (strcmp(w, "conn-gcm") == 0) {
		EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
		gcm_keyed(c, l->gcm);
		tls12_gcm_record(c, len);
		EVP_CIPHER_CTX_free(c);
	} else if (strcmp(w, "ticket") == 0) {
		EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
		EVP_CIPHER *cbc = EVP_CIPHER_fetch(l->ctx, "AES-256-CBC", NULL);
		int outl, fl;
		if (c == NULL || cbc == NULL || !EVP_EncryptInit_ex(c, cbc, NULL, key, iv)
		    || !EVP_EncryptUpdate(c, buf, &outl, buf, TICKET_LEN)
		    || !EVP_EncryptFinal_ex(c, buf + outl, &fl))
			die("ticket");
		EVP_CIPHER_free(cbc);
		EVP_CIPHER_CTX_free(c);
	} else if (strcmp(w, "clock-mono") == 0 || strcmp(w, "clock-thread") == 0) {
		struct timespec t;
		clock_gettime(w[6] == 'm' ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t);
	} else {
		fprintf(stderr, "records: unknown workload %s\n", w);
		exit(2);
	}
}

static void setup(struct lib *l, const char *w)
{
	l->c = EVP_CIPHER_CTX_new();
	if (strcmp(w, "tls12-gcm") == 0)
		gcm_keyed(l->c, l->gcm);
	else if (strcmp(w, "tls13-gcm") == 0) {
		if (!EVP_CipherInit_ex(l->c, l->gcm, NULL, key, iv, 1))
			die("tls13 init");
	} else if (strcmp(w, "tls12-cbc") == 0)
		cbc_tls_keyed(l->c, l->cbc);
}

static double run(struct lib *l, const char *w, int len, long n)
{
	double t0 = now_ns();
	for (long i = 0; i < n; i++)
		op(l, w, len);
	return (now_ns() - t0) / n;
}

/* The measured loop of a one-context run: callgrind --toggle-collect=measured counts
 * it alone, after the warm-up (first-use costs such as a DRBG instantiated). */
__attribute__((noinline)) static double measured(struct lib *l, const char *w, int len, long n)
{
	return run(l, w, len, n);
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void compare(struct lib *libs, int nl, const char *w, int len, long n, int rounds);

int main(int argc, char **argv)
{
	long n = 2000;
	int rounds = 9, opt;
	const char *which = "both", *before = NULL;
	while ((opt = getopt(argc, argv, "n:r:c:b:")) != -1) {
		switch (opt) {
		case 'b': before = optarg; break;
		case 'n': n = atol(optarg); break;
		case 'r': rounds = atoi(optarg); break;
		case 'c': which = optarg; break;
		default: return 2;
		}
	}
	if (argc - optind != 3) {
		fprintf(stderr, "usage: records [-n ITER] [-r ROUNDS] [-c default|hetcrypt|both] [-b NAME] PROVIDER_DIR WORKLOAD SIZE\n");
		return 2;
	}
	const char *dir = argv[optind], *w = argv[optind + 1];
	int len = atoi(argv[optind + 2]);
	if (len < 1 || len > 16384)
		die("a size of 1..16384");
	struct lib libs[3];
	int nl = 0;
	if (strcmp(which, "hetcrypt") != 0)
		open_lib(&libs[nl++], "default", dir);
	if (strcmp(which, "default") != 0)
		open_lib(&libs[nl++], "hetcrypt", dir);
	if (before != NULL && nl == 2)
		open_lib(&libs[nl++], before, dir);
	for (int i = 0; i < nl; i++) {
		setup(&libs[i], w);
		run(&libs[i], w, len, n / 10 + 1); /* warm up */
	}
	if (nl == 1) {
		printf("%s %s %d %.1f ns/op\n", libs[0].name, w, len, measured(&libs[0], w, len, n));
	} else {
		compare(libs, nl, w, len, n, rounds);
	}
	for (int i = 0; i < nl; i++) {
		EVP_CIPHER_CTX_free(libs[i].c);
		EVP_CIPHER_free(libs[i].gcm);
		EVP_CIPHER_free(libs[i].cbc);
		EVP_CIPHER_free(libs[i].cbc256);
		OSSL_LIB_CTX_free(libs[i].ctx); /* unloads the provider: its summary (STATS) */
	}
	return 0;
}

static void compare(struct lib *libs, int nl, const char *w, int len, long n, int rounds)
{
	double *ratio[3], best[3] = {1e18, 1e18, 1e18};
	for (int i = 0; i < nl; i++)
		ratio[i] = calloc(rounds, sizeof(double));
	for (int r = 0; r < rounds; r++) {
		double t[3];
		/* The order rotates each round: none always runs first. */
		for (int k = 0; k < nl; k++) {
			int i = (r + k) % nl;
			t[i] = run(&libs[i], w, len, n);
		}
		printf("ROUND %d %s %d", r, w, len);
		for (int i = 0; i < nl; i++) {
			best[i] = t[i] < best[i] ? t[i] : best[i];
			ratio[i][r] = t[i] / t[0];
			printf(" %s %.1f", libs[i].name, t[i]);
		}
		if (nl == 3)
			ratio[0][r] = t[1] / t[2]; /* slot 0 is free: default/default */
		printf("\n");
	}
	/* Median of the per-round ratios with their range; and the ratio of the fastest
	 * rounds: what a round costs with the least interference from other work. */
	for (int i = 1; i < nl; i++) {
		qsort(ratio[i], rounds, sizeof(double), cmp);
		printf("RESULT %s %d %s/default time per op: median %.3f (%.3f-%.3f) over %d rounds;"
		       " fastest rounds %.1f / %.1f ns = %.3f\n",
		       w, len, libs[i].name, ratio[i][rounds / 2], ratio[i][0], ratio[i][rounds - 1], rounds,
		       best[i], best[0], best[i] / best[0]);
	}
	if (nl == 3) {
		qsort(ratio[0], rounds, sizeof(double), cmp);
		printf("RESULT %s %d %s/%s time per op: median %.3f (%.3f-%.3f) over %d rounds;"
		       " fastest rounds %.1f / %.1f ns = %.3f\n",
		       w, len, libs[1].name, libs[2].name, ratio[0][rounds / 2], ratio[0][0], ratio[0][rounds - 1],
		       rounds, best[1], best[2], best[1] / best[2]);
	}
	for (int i = 0; i < nl; i++)
		free(ratio[i]);
}
