#!/usr/bin/env python3
"""A one-connection TLS peer for the provider checks: it reads exactly N bytes from the
client, writes them to a file, answers with the same bytes reversed, and closes.

Usage: tls_echo.py PORTFILE CERT KEY N RECEIVED [tls1_2|tls1_3] [CIPHERS]
Binds 127.0.0.1 on a free port and writes the port to PORTFILE once listening. Python's
ssl is the system libssl/libcrypto, so OPENSSL_CONF loads the provider here too.
"""
import socket
import ssl
import sys

port_file, cert, key, n, received = sys.argv[1:6]
version = sys.argv[6] if len(sys.argv) > 6 else "tls1_3"
ciphers = sys.argv[7] if len(sys.argv) > 7 else None
n = int(n)

ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
if version == "tls1_2":
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ciphers:
        ctx.set_ciphers(ciphers)
else:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3

with socket.create_server(("127.0.0.1", 0)) as srv:
    srv.settimeout(60)
    with open(port_file, "w") as f:
        f.write(str(srv.getsockname()[1]))
    conn, _ = srv.accept()
    conn.settimeout(60)
    with ctx.wrap_socket(conn, server_side=True) as tls:
        data = bytearray()
        while len(data) < n:
            chunk = tls.recv(min(65536, n - len(data)))
            if not chunk:
                break
            data += chunk
        with open(received, "wb") as f:
            f.write(data)
        tls.sendall(bytes(reversed(data)))
        print(f"server: {tls.version()} {tls.cipher()[0]}, {len(data)} bytes in", file=sys.stderr)
