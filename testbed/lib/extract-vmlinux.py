#!/usr/bin/env python3
"""extract-vmlinux.py BZIMAGE OUT: write the uncompressed kernel ELF of BZIMAGE to OUT.

Why: under TCG the kernel's own decompressor (xz in Debian kernels) takes ~5 s
of the ~11 s boot.  QEMU can boot the uncompressed ELF directly through its PVH
entry point (kernels built with CONFIG_PVH=y, as Debian's are), which skips it.
Exit status 0 when OUT was written and has a PVH entry note; 1 otherwise (the
caller then boots the bzImage as usual).
"""
import bz2
import lzma
import shutil
import struct
import subprocess
import sys
import zlib

XEN_ELFNOTE_PHYS32_ENTRY = 18


def candidates(data):
    """(offset, decompress) for every known compressed stream signature."""
    sigs = [
        (b"\xfd7zXZ\x00", lambda b: lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(b)),
        (b"\x1f\x8b\x08", lambda b: zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(b)),
        (b"BZh", lambda b: bz2.BZ2Decompressor().decompress(b)),
        (b"\x5d\x00\x00\x00", lambda b: lzma.LZMADecompressor(format=lzma.FORMAT_ALONE).decompress(b)),
        (b"\x28\xb5\x2f\xfd", zstd),
    ]
    for sig, fn in sigs:
        start = 0
        while True:
            i = data.find(sig, start)
            if i < 0:
                break
            yield i, fn
            start = i + 1


def zstd(b):
    if not shutil.which("zstd"):
        raise RuntimeError("no zstd")
    return subprocess.run(["zstd", "-qdc"], input=b, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout


def has_pvh_note(elf):
    if elf[:4] != b"\x7fELF" or elf[4] != 2:  # 64-bit ELF
        return False
    e_phoff, = struct.unpack_from("<Q", elf, 0x20)
    e_phentsize, e_phnum = struct.unpack_from("<HH", elf, 0x36)
    for k in range(e_phnum):
        p_type, _flags, p_offset, _va, _pa, p_filesz = struct.unpack_from("<IIQQQQ", elf, e_phoff + k * e_phentsize)
        if p_type != 4:  # PT_NOTE
            continue
        off, end = p_offset, p_offset + p_filesz
        while off + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, off)
            name = elf[off + 12:off + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            off += 12 + ((namesz + 3) & ~3) + ((descsz + 3) & ~3)
    return False


def main():
    src, dst = sys.argv[1], sys.argv[2]
    data = open(src, "rb").read()
    for off, fn in candidates(data):
        try:
            out = fn(data[off:])
        except Exception:
            continue
        if out[:4] == b"\x7fELF":
            if not has_pvh_note(out):
                return 1
            with open(dst, "wb") as f:
                f.write(out)
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
