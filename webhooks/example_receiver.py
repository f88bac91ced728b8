"""A local webhook receiver for trying Switchboard's wakes: `make receiver`.

    .venv/bin/python -m webhooks.example_receiver [--port 8443] [--dir var/receiver]

It keeps a throwaway certificate authority and a certificate for
`localhost` and 127.0.0.1 in `--dir` (made on first start, kept after, so a
server that trusts the CA keeps trusting it), serves HTTPS on 127.0.0.1
only, and prints the settings to start Switchboard with. Every request goes
through the WSGI adapter of `switchboard_client.WakeReceiver` (the client
package, `client/`): a body is read only when its `Content-Length` is a
number within a wake's size (else 400 or 413), a challenge is answered, a
wake is recorded once in `wakes.jsonl` and answered 202, anything else is
refused (400, or 401 for a bad signature). A connection has 10 s for each
read and write.

Its options, which `make receiver` takes as `RECEIVER_ARGS='…'`: `--port`,
`--dir`, `--switchboard` (where the signing keys are published, and the
issuer wakes must name: default `SWITCHBOARD_PUBLIC_URL`, else the URL
`SWITCHBOARD_BIND` serves at, as `make run` prints it) and `--secret` (the
endpoint's `whsec_` secret, to check the Standard Webhooks signature too:
default `RECEIVER_SECRET`).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import ipaddress
import json
import os
import signal
import ssl
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from controlplane.binds import public_url
from switchboard_client import Wake, WakeReceiver

CERTIFICATE_DAYS = 30
TIMEOUT_SECONDS = 10  # for each read and write of a connection: a client that stops holds a thread no longer


def make_ca_and_certificate(directory: Path) -> tuple[Path, Path, Path]:
    """(CA bundle, server certificate chain, server key) for `localhost` and 127.0.0.1."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Switchboard throwaway CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
          .not_valid_after(now + dt.timedelta(days=CERTIFICATE_DAYS))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=CERTIFICATE_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def certificates(directory: Path) -> tuple[Path, Path, Path]:
    """The CA, chain and key kept in `directory`, made when missing or about to expire."""
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    if all(p.exists() for p in paths):
        chain = x509.load_pem_x509_certificate(paths[1].read_bytes())
        if chain.not_valid_after_utc - dt.datetime.now(dt.timezone.utc) > dt.timedelta(days=1):
            return paths
    previous = os.umask(0o077)  # var/ too, when this makes it: the server's folder, its owner's alone
    try:
        directory.mkdir(parents=True, exist_ok=True)
    finally:
        os.umask(previous)
    return make_ca_and_certificate(directory)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--dir", type=Path, default=Path("var/receiver"), help="certificates and wakes.jsonl")
    parser.add_argument("--switchboard", default=public_url(),
                        help="where the signing keys are published, and the wakes' issuer "
                             "(default SWITCHBOARD_PUBLIC_URL, else where SWITCHBOARD_BIND serves)")
    parser.add_argument("--secret", default=os.environ.get("RECEIVER_SECRET"),
                        help="the endpoint's whsec_ secret, to check the Standard Webhooks signature too")
    args = parser.parse_args(argv)
    ca, chain, key = certificates(args.dir)
    log = args.dir / "wakes.jsonl"

    def record(wake: Wake) -> None:
        with log.open("a") as f:  # persisted before the receiver answers 202
            f.write(json.dumps(wake.body) + "\n")
        print(f"{wake.name} {wake.id}: read your feed up to {wake.through}", flush=True)

    receiver = WakeReceiver(base_url=args.switchboard, issuer=args.switchboard, secret=args.secret,
                            on_inbox_wake=record, on_space_wake=record)

    def hook(environ, start_response):
        """The receiver's WSGI adapter, saying what it refused."""
        def answered(status: str, headers: list):
            if not status.startswith("2"):
                print(f"refused: {status}", flush=True)
            return start_response(status, headers)

        content = receiver.wsgi(environ, answered)
        if b'"challenge"' in content[0]:
            print("challenge answered", flush=True)
        return content

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            print(f"dropped a connection from {client_address[0]}: it failed its TLS handshake or timed out",
                  flush=True)

    class Handler(WSGIRequestHandler):
        timeout = TIMEOUT_SECONDS

        def setup(self):
            # The TLS handshake here, in the connection's own thread and in
            # its time: on accept, one silent connection held every other.
            self.request.settimeout(TIMEOUT_SECONDS)
            self.request.do_handshake()
            super().setup()

        def log_message(self, *args):
            pass

    server = Server(("127.0.0.1", args.port), Handler)
    server.set_app(hook)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain, key)
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    print(f"Receiver listening on https://127.0.0.1:{args.port}/hook (and https://localhost:{args.port}/hook)\n"
          f"Switchboard must trust its CA and may call a loopback address only when told to; "
          f"restart `make run` with:\n\n"
          f"    WEBHOOK_CA_BUNDLE={ca.resolve()} WEBHOOK_ALLOW_PRIVATE_NETWORKS=1 make run\n\n"
          f"Wakes are verified against {args.switchboard} and kept in {log}; Ctrl-C stops.", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    # Ctrl-C stops it, started in a script's background too (which starts with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        main()
