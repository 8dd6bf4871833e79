#!/usr/bin/env python3
"""An independent reader of hetcrypt trees, written from docs/format.md alone.

Decrypts the known-answer vector of docs/format.md ("Trees") with Python's
`cryptography` (AES-GCM) and the standard library (HKDF-Expand, SHA-256): opens the
manifest as the tree member with the empty path, parses it, then opens docs/a.txt at
its path and checks its commitment against the manifest. Exits non-zero on any
mismatch. Usage: check-tree-vector.py FILE_HEX MANIFEST_HEX
"""
import hashlib
import hmac
import sys

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY = bytes(range(16))
INFO_PREFIX = b"c2sp.org/chunked-encryption@v1+"
PATH_DOMAIN = b"hetcrypt tree path v1\0"
MAGIC = b"hetcrypt manifest v1\n"
CHUNK = 16384


def hkdf_expand(prk, info, length, hash_name):
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hash_name).digest()
        out += block
        i += 1
    return out[:length]


def open_member(message, path):
    wrapper, salt, commitment = message[:12], message[12:36], message[36:68]
    assert wrapper[:8] == b"hetcrypt" and wrapper[8] == 1, "not a v1 hetcrypt file"
    assert wrapper[9] == 1, "the vector is AES-128-GCM"
    hash_name = {1: "sha256", 2: "sha512"}[wrapper[10]]
    assert wrapper[11] == 1, "not a tree member"
    context = wrapper + hashlib.sha256(PATH_DOMAIN + path).digest()
    info = INFO_PREFIX + b"AEAD_AES_128_GCM" + b"\0" + salt + context
    okm = hkdf_expand(KEY, info, 16 + 12 + 32, hash_name)
    key, nonce, expected = okm[:16], okm[16:28], okm[28:]
    assert hmac.compare_digest(expected, commitment), "commitment mismatch"
    body, plaintext, i = message[68:], b"", 0
    full = CHUNK + 16
    while True:
        chunk, body = body[:full], body[full:]
        last = len(chunk) < full
        n = (int.from_bytes(nonce, "big") ^ i).to_bytes(12, "big")
        pt = AESGCM(key).decrypt(n, chunk, b"")
        assert (len(pt) < CHUNK) == last
        plaintext += pt
        if last:
            assert not body, "data after the last chunk"
            return plaintext, commitment
        i += 1


def parse_manifest(pt):
    assert pt.startswith(MAGIC)
    rest = pt[len(MAGIC):]
    count, rest = int.from_bytes(rest[:8], "big"), rest[8:]
    entries = {}
    for _ in range(count):
        n, rest = int.from_bytes(rest[:2], "big"), rest[2:]
        path, rest = rest[:n], rest[n:]
        size, rest = int.from_bytes(rest[:8], "big"), rest[8:]
        commitment, rest = rest[:32], rest[32:]
        entries[path] = (size, commitment)
    assert not rest
    return entries


def main():
    file_ct, manifest_ct = (bytes.fromhex(a) for a in sys.argv[1:3])
    entries = parse_manifest(open_member(manifest_ct, b"")[0])
    size, listed = entries[b"docs/a.txt"]
    plaintext, commitment = open_member(file_ct, b"docs/a.txt")
    assert commitment == listed and len(plaintext) == size
    print(f"ok: manifest lists {len(entries)} file(s); docs/a.txt = {plaintext!r}")


if __name__ == "__main__":
    main()
