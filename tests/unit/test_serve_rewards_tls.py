"""serve-rewards over TLS, and the remote reward verifying it: a CA, a server certificate for 127.0.0.1 and a client
certificate are made here (with the `cryptography` package where it is installed, and with the openssl command
line where that is; each that exists is tested). The server runs in this process; the CLI's flags in a subprocess.
And a token sent over plain HTTP to an address that is not loopback gets a one-line warning."""

from __future__ import annotations

import datetime
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.rewards import RewardRunner
from grpokit.rewards.contract import text_of
from grpokit.rewards.remote import RemoteReward
from grpokit.rewards.serve import ServeOptions, serve, stop

MAKERS = [
    pytest.param(
        "cryptography",
        marks=pytest.mark.skipif(importlib.util.find_spec("cryptography") is None, reason="cryptography not installed"),
    ),
    pytest.param("openssl", marks=pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command")),
]


def _with_cryptography(folder: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def write(name: str, key, cert) -> None:
        (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (folder / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    def issue(name: str, subject: str, issuer, issuer_key, usage=None, ca: bool = False):
        key = ec.generate_private_key(ec.SECP256R1())
        subject_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject_name)
            .issuer_name(subject_name if issuer is None else issuer.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
        else:
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
            ).add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if usage == ExtendedKeyUsageOID.SERVER_AUTH:
            import ipaddress

            names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(key if issuer is None else issuer_key, hashes.SHA256())
        write(name, key, cert)
        return key, cert

    for prefix in ("", "rogue_"):
        ca_key, ca = issue(f"{prefix}ca", f"{prefix}grpokit test CA", None, None, ca=True)
        issue(f"{prefix}server", "127.0.0.1", ca, ca_key, ExtendedKeyUsageOID.SERVER_AUTH)
        issue(f"{prefix}client", "trainer", ca, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH)


def _with_openssl(folder: Path) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    for prefix in ("", "rogue_"):
        ca = f"{prefix}ca"
        run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{ca}.key")
        run(
            "req", "-x509", "-new", "-key", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
            "-subj", f"/CN={prefix}grpokit test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        for name, cn, usage, alt in (
            ("server", "127.0.0.1", "serverAuth", "\nsubjectAltName=IP:127.0.0.1,DNS:localhost"),
            ("client", "trainer", "clientAuth", ""),
        ):
            (folder / f"{prefix}{name}.ext").write_text(
                f"basicConstraints=critical,CA:FALSE\nextendedKeyUsage={usage}\n"
                f"authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash{alt}\n"
            )
            run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{prefix}{name}.key")
            run("req", "-new", "-key", f"{prefix}{name}.key", "-out", f"{prefix}{name}.csr", "-subj", f"/CN={cn}")
            run(
                "x509", "-req", "-in", f"{prefix}{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                "-CAcreateserial", "-out", f"{prefix}{name}.pem", "-days", "2", "-extfile", f"{prefix}{name}.ext",
            )  # fmt: skip


@pytest.fixture(params=MAKERS)
def certs(request, tmp_path) -> Path:
    """ca, server, client (each .pem and .key) and a rogue CA's set, in a folder."""
    (_with_cryptography if request.param == "cryptography" else _with_openssl)(tmp_path)
    return tmp_path


def words(completions, **kwargs):
    return [float(len(text_of(c).split())) for c in completions]


class TLSServer:
    def __init__(self, certs: Path, client_ca: bool = False):
        self.runner = RewardRunner([words], isolate=False)
        options = ServeOptions(
            certfile=str(certs / "server.pem"),
            keyfile=str(certs / "server.key"),
            client_ca=str(certs / "ca.pem") if client_ca else None,
        )
        self.server = serve(self.runner, options=options)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/score"

    def close(self):
        stop(self.server)
        self.runner.close()


def score(url: str, **settings):
    reward = RemoteReward(url, retries=0, **settings)
    errors = []
    values = reward(prompts=["p", "q"], completions=["one two", "three"], log_errors=errors.extend)
    return values, errors


def test_https_with_the_ca_bundle_verifies_and_scores(certs, capfd):
    server = TLSServer(certs)
    try:
        assert score(server.url, ca_bundle=str(certs / "ca.pem")) == ([2.0, 1.0], [])
        values, errors = score(server.url, ca_bundle=str(certs / "rogue_ca.pem"))  # another CA: not trusted
        assert values == [None, None] and all("CERTIFICATE_VERIFY_FAILED" in e for e in errors)
        values, errors = score(server.url.replace("https", "http"))  # plain HTTP to the TLS port
        assert values == [None, None] and len(errors) == 2
        assert score(server.url, ca_bundle=str(certs / "ca.pem")) == ([2.0, 1.0], [])  # still serving
    finally:
        server.close()
    assert "Traceback" not in capfd.readouterr().err  # failed handshakes are the clients' business


def test_mutual_tls_needs_a_client_certificate_of_the_ca(certs, capfd):
    server = TLSServer(certs, client_ca=True)
    ca = str(certs / "ca.pem")
    try:
        mine = {"client_cert": str(certs / "client.pem"), "client_key": str(certs / "client.key")}
        assert score(server.url, ca_bundle=ca, **mine) == ([2.0, 1.0], [])
        values, errors = score(server.url, ca_bundle=ca)  # no client certificate
        assert values == [None, None] and len(errors) == 2
        rogue = {"client_cert": str(certs / "rogue_client.pem"), "client_key": str(certs / "rogue_client.key")}
        values, errors = score(server.url, ca_bundle=ca, **rogue)  # a certificate another CA signed
        assert values == [None, None] and len(errors) == 2
        assert score(server.url, ca_bundle=ca, **mine) == ([2.0, 1.0], [])
    finally:
        server.close()
    assert "Traceback" not in capfd.readouterr().err


def test_the_cli_serves_https_and_refuses_bad_tls_flags_in_one_line(certs, capsys):
    spec = f"{Path(__file__).resolve()}:words"
    cert, key = str(certs / "server.pem"), str(certs / "server.key")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "grpokit.cli",
            "serve-rewards",
            spec,
            "--port",
            "0",
            "--certfile",
            cert,
            "--keyfile",
            key,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1"),
    )
    try:
        line = proc.stdout.readline()  # blocks until the server listens (or the command ended)
        assert " on https://127.0.0.1:" in line, line + proc.stderr.read()
        url = line.split(" on ")[1].split()[0] + "/score"
        assert score(url, ca_bundle=str(certs / "ca.pem")) == ([2.0, 1.0], [])
    finally:
        proc.terminate()
        proc.communicate(timeout=120)  # generous: a busy machine; it ends at once
    assert main(["serve-rewards", spec, "--certfile", cert]) == 2
    assert main(["serve-rewards", spec, "--certfile", cert, "--keyfile", str(certs / "missing.key")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "grpokit: error: serve-rewards: --certfile and --keyfile go together (the certificate and its key)"
    assert err[1].startswith("grpokit: error: serve-rewards: cannot load --certfile") and len(err) == 2


def test_a_bad_ca_bundle_fails_when_the_reward_is_built(tmp_path):
    with pytest.raises(ValueError, match="remote reward: cannot load ca_bundle"):
        RemoteReward("https://127.0.0.1:1/score", ca_bundle=str(tmp_path / "none.pem"))
    with pytest.raises(ValueError, match="client_key needs client_cert"):
        RemoteReward("https://127.0.0.1:1/score", client_key=str(tmp_path / "k.pem"))


def test_a_token_over_plain_http_off_loopback_gets_one_warning_line(capsys):
    secret = {"Authorization": "Bearer s3cret"}
    RemoteReward("http://10.0.0.5:8000/score", headers=secret, label="judge")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "grpokit: warning: remote reward 'judge' sends its Authorization header over plain HTTP to 10.0.0.5:8000"
    )
    RemoteReward("https://10.0.0.5:8000/score", headers=secret)  # encrypted
    RemoteReward(["http://127.0.0.1:8000/score", "http://localhost:1/x"], headers=secret)  # loopback
    RemoteReward("http://10.0.0.5:8000/score", headers={"Accept": "application/json"})  # no secret
    assert capsys.readouterr().err == ""
    RemoteReward("http://judge.internal/score", headers={"X-Api-Key": "k"})
    assert "sends its X-Api-Key header over plain HTTP to judge.internal" in capsys.readouterr().err
