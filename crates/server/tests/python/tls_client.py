"""A real TLS client (Python's ssl, that is OpenSSL) for tollgate proxy's tests.

  tls_client.py fingerprint PROFILE CAFILE
      The ClientHello this client configuration sends, captured through memory BIOs, and its
      JA3 and JA4 computed here, independently of tollgate: {"ja3": ..., "ja4": ...}.
  tls_client.py get PORT SOURCE_IP PROFILE CAFILE PATH COUNT
      COUNT requests, each on a new TLS connection from SOURCE_IP to 127.0.0.1:PORT (SNI
      "localhost"); prints each response's status, one per line.

PROFILE: "default" (TLS 1.3, ALPN http/1.1) or "tls12" (TLS 1.2 with two ECDSA suites, no ALPN).
"""

import hashlib
import json
import socket
import ssl
import sys

GREASE = {0x0A0A + 0x1010 * i for i in range(16)}
VERSIONS = {0x0304: "13", 0x0303: "12", 0x0302: "11", 0x0301: "10", 0x0300: "s3"}


def context(profile, cafile):
    ctx = ssl.create_default_context(cafile=cafile)
    if profile == "default":
        ctx.set_alpn_protocols(["http/1.1"])
    elif profile == "tls12":
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305")
    else:
        raise SystemExit(f"unknown profile {profile!r}")
    return ctx


def client_hello(ctx):
    """The handshake message (type 1) this context sends first."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    records, handshake = outgoing.read(), b""
    while records:
        length = int.from_bytes(records[3:5], "big")
        assert records[0] == 22, "a handshake record"
        handshake += records[5 : 5 + length]
        records = records[5 + length :]
    assert handshake[0] == 1, "a ClientHello"
    return handshake[4 : 4 + int.from_bytes(handshake[1:4], "big")]


def u16s(data):
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data) - 1, 2)]


def fingerprints(body):
    version = int.from_bytes(body[0:2], "big")
    at = 34
    at += 1 + body[at]  # session id
    n = int.from_bytes(body[at : at + 2], "big")
    ciphers = u16s(body[at + 2 : at + 2 + n])
    at += 2 + n
    at += 1 + body[at]  # compression methods
    end = at + 2 + int.from_bytes(body[at : at + 2], "big")
    at += 2
    extensions, groups, formats, sigalgs, alpn, sni, versions = [], [], [], [], [], False, []
    while at < end:
        kind, size = int.from_bytes(body[at : at + 2], "big"), int.from_bytes(body[at + 2 : at + 4], "big")
        data = body[at + 4 : at + 4 + size]
        at += 4 + size
        extensions.append(kind)
        if kind == 0:
            sni = True
        elif kind == 10:
            groups = u16s(data[2:])
        elif kind == 11:
            formats = list(data[1:])
        elif kind == 13:
            sigalgs = u16s(data[2:])
        elif kind == 16:
            alpn.append(data[3 : 3 + data[2]].decode())
        elif kind == 43:
            versions = u16s(data[1:])

    def clean(values):
        return [v for v in values if v not in GREASE]

    ja3_text = ",".join(
        [str(version)]
        + ["-".join(str(v) for v in clean(values)) for values in (ciphers, extensions, groups)]
        + ["-".join(str(v) for v in formats)]
    )
    tls = VERSIONS[max(clean(versions) or [version])]
    first = alpn[0] if alpn else ""
    alpn_part = first[0] + first[-1] if first else "00"
    sha = lambda text: hashlib.sha256(text.encode()).hexdigest()[:12]  # noqa: E731
    sorted_ciphers = ",".join(sorted(f"{c:04x}" for c in clean(ciphers)))
    sorted_extensions = ",".join(sorted(f"{e:04x}" for e in clean(extensions) if e not in (0, 16)))
    signatures = ",".join(f"{s:04x}" for s in sigalgs)
    ja4 = (
        f"t{tls}{'d' if sni else 'i'}{min(len(clean(ciphers)), 99):02d}{min(len(clean(extensions)), 99):02d}"
        f"{alpn_part}_{sha(sorted_ciphers)}_{sha(sorted_extensions + '_' + signatures)}"
    )
    return {"ja3": hashlib.md5(ja3_text.encode()).hexdigest(), "ja4": ja4}


def get(port, source, ctx, path, count):
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
                response = b""
                while chunk := tls.recv(65536):
                    response += chunk
        print(response.split(b" ", 2)[1].decode(), flush=True)


def main(argv):
    if argv[1] == "fingerprint":
        print(json.dumps(fingerprints(client_hello(context(argv[2], argv[3])))))
    elif argv[1] == "get":
        get(int(argv[2]), argv[3], context(argv[4], argv[5]), argv[6], int(argv[7]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
