"""`sandforge serve --ssl-certfile/--ssl-keyfile`: the API over TLS (docs/serve.md), through the same gatekeeper
and coalescing transport as plain HTTP; a client that does not trust the certificate gets no answer."""

from __future__ import annotations

import datetime
import ipaddress
import json
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.service.serverproc import start_server


def _self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandforge test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def test_the_api_answers_over_tls_and_only_to_clients_that_trust_it(tmp_path: Path) -> None:
    tls = _self_signed(tmp_path)
    server = start_server(
        tmp_path / "srv", {"state_dir": "state", "pool_size": 1, "tenants": [{"name": "t"}]}, tls=tls
    )
    try:
        assert server.url.startswith("https://")
        with server.client("t") as client:
            for n in range(3):  # keep-alive over TLS, each answer whole
                r = client.post("/v1/exec", json={"code": "return sum(args)", "args": [n, 40]})
                assert r.status_code == 200 and r.json()["value"] == n + 40, r.text
            r = client.post("/v1/exec", json={"code": "import os\nreturn 1"})
            assert r.status_code == 200 and r.json()["error_type"] == "guardrail_violation"
            assert client.get("/v1/tools").status_code == 200
        with server.client() as anonymous:
            assert anonymous.post("/v1/exec", json={"code": "return 1"}).status_code == 401
        with pytest.raises(httpx.ConnectError):  # the default trust store does not know this certificate
            httpx.get(server.url + "/healthz", timeout=10)
        with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port: no API answer
            httpx.post(f"http://127.0.0.1:{server.port}/v1/exec", content=json.dumps({"code": "return 1"}), timeout=10)
    finally:
        assert server.stop() == 0
