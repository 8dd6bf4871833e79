#!/usr/bin/env python3
"""An independent reader of hetcrypt trees, written from docs/format.md alone.

With Python's `cryptography` (AES-GCM) and the standard library (HKDF-Expand,
SHA-256, SHA-512) only, no hetcrypt code:

  check-tree-vector.py FILE_HEX MANIFEST_HEX
      the known-answer vector of docs/format.md ("Trees"): opens the manifest as the
      tree member with the empty path, parses it, then opens docs/a.txt at its path
      and checks its commitment against the manifest;
  check-tree-vector.py --tree KEY_HEX ENC_DIR PLAIN_DIR
      a tree made by `hetcrypt encrypt` (AES-GCM): every file the manifest lists must
      decrypt at its path, carry the listed commitment and size, and equal the file
      in PLAIN_DIR; no other .hc file may be in ENC_DIR.

Exits non-zero on any mismatch.
"""
import hashlib
import hmac
import sys

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY = bytes(range(16))
AEADS = {1: ("AEAD_AES_128_GCM", 16), 2: ("AEAD_AES_256_GCM", 32)}
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


def open_member(message, path, input_key=KEY):
    wrapper, salt, commitment = message[:12], message[12:36], message[36:68]
    assert wrapper[:8] == b"hetcrypt" and wrapper[8] == 1, "not a v1 hetcrypt file"
    aead_name, key_len = AEADS[wrapper[9]]
    hash_name = {1: "sha256", 2: "sha512"}[wrapper[10]]
    assert wrapper[11] == 1, "not a tree member"
    context = wrapper + hashlib.sha256(PATH_DOMAIN + path).digest()
    info = INFO_PREFIX + aead_name.encode() + b"\0" + salt + context
    okm = hkdf_expand(input_key, info, key_len + 12 + 32, hash_name)
    key, nonce, expected = okm[:key_len], okm[key_len:key_len + 12], okm[key_len + 12:]
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


def check_tree(key, enc_dir, plain_dir):
    import os
    with open(os.path.join(enc_dir, ".hetcrypt-manifest"), "rb") as f:
        entries = parse_manifest(open_member(f.read(), b"", key)[0])
    for path, (size, listed) in entries.items():
        with open(os.path.join(enc_dir, os.fsdecode(path) + ".hc"), "rb") as f:
            plaintext, commitment = open_member(f.read(), path, key)
        assert commitment == listed, f"{path!r}: commitment differs from the manifest"
        assert len(plaintext) == size, f"{path!r}: size differs from the manifest"
        with open(os.path.join(plain_dir, os.fsdecode(path)), "rb") as f:
            assert f.read() == plaintext, f"{path!r}: plaintext differs"
    found = set()
    for top, _, names in os.walk(enc_dir):
        for n in names:
            if n.endswith(".hc"):
                rel = os.path.relpath(os.path.join(top, n), enc_dir)
                found.add(os.fsencode(rel)[:-3])
    assert found == set(entries), "files in the tree differ from the manifest"
    print(f"ok: {len(entries)} file(s) decrypted and checked against the manifest")


def main():
    if sys.argv[1] == "--tree":
        check_tree(bytes.fromhex(sys.argv[2]), sys.argv[3], sys.argv[4])
        return
    file_ct, manifest_ct = (bytes.fromhex(a) for a in sys.argv[1:3])
    entries = parse_manifest(open_member(manifest_ct, b"")[0])
    size, listed = entries[b"docs/a.txt"]
    plaintext, commitment = open_member(file_ct, b"docs/a.txt")
    assert commitment == listed and len(plaintext) == size
    print(f"ok: manifest lists {len(entries)} file(s); docs/a.txt = {plaintext!r}")


if __name__ == "__main__":
    main()
