"""A tenant's token and TLS, as `uop` sends them: the token as "authorization: Bearer"
metadata on a plaintext channel and as call credentials over TLS; $UOPD_TOKEN by default;
a missing or unknown token UNAUTHENTICATED; a server certificate checked against a CA
(certificates made here with the openssl command, as tests/e2e/tls_test.cc makes them)."""
import shutil
import subprocess

import numpy as np
import pytest

import uopd


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("tenants")
    p = d / "tokens"
    p.write_text("alice alice-secret-token-0123456789\nbob bob-secret-token-0123456789\n")
    p.chmod(0o600)
    return p


def run_reduction(client, examples):
    with client.session() as s:
        return float(np.sum(s.run(examples / "reduction.json", x=np.ones(32, np.float32))["sumsq"]))


def test_tokens(uopd_binary, tokens_file, examples, monkeypatch, tmp_path):
    with uopd.EmbeddedServer(uopd_binary, ["--workers=1", f"--cache-dir={tmp_path}", f"--tokens-file={tokens_file}"]) as srv:
        monkeypatch.delenv("UOPD_TOKEN", raising=False)
        with uopd.connect(srv.address) as anonymous:
            with pytest.raises(uopd.Unauthenticated):
                anonymous.stats()
        with uopd.connect(srv.address, token="not-a-token") as wrong:
            with pytest.raises(uopd.Unauthenticated):
                wrong.session()
        with uopd.connect(srv.address, token="alice-secret-token-0123456789") as alice:
            assert run_reduction(alice, examples) == 32.0
            s = alice.session()
        monkeypatch.setenv("UOPD_TOKEN", "bob-secret-token-0123456789")
        with uopd.connect(srv.address) as bob:  # the token from $UOPD_TOKEN
            assert run_reduction(bob, examples) == 32.0
            # Alice's session is NOT_FOUND for Bob, as one that never existed.
            with pytest.raises(uopd.NotFound):
                uopd.Session(bob, s.id, s.devices).put(np.zeros(1, np.float32))


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command to make certificates with")
def test_tls_with_a_ca_and_a_token(uopd_binary, tokens_file, examples, tmp_path):
    ca_key, ca, key, csr, cert, ext, other_key, other = (
        tmp_path / n for n in ("ca.key", "ca.pem", "node.key", "node.csr", "node.pem", "node.ext", "o.key", "o.pem"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=test-ca", "-keyout", str(ca_key), "-out", str(ca))
    openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=other-ca", "-keyout", str(other_key), "-out", str(other))
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    openssl("req", *ec, "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(csr))
    openssl("x509", "-req", "-days", "2", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-extfile", str(ext), "-out", str(cert))
    args = ["--workers=1", f"--cache-dir={tmp_path}", f"--tls-cert={cert}", f"--tls-key={key}",
            f"--tokens-file={tokens_file}"]
    with uopd.EmbeddedServer(uopd_binary, args) as srv:
        with uopd.connect(srv.address, tls=str(ca), token="alice-secret-token-0123456789") as c:
            assert run_reduction(c, examples) == 32.0
        with uopd.connect(srv.address, tls=uopd.TLS(ca=str(ca), server_name="localhost"),
                          token="bob-secret-token-0123456789") as c:
            assert c.stats().sessions == 0  # Bob sees none of Alice's (closed) sessions
        # Plaintext to a TLS port, or a CA that did not sign its certificate: never ready.
        with pytest.raises(uopd.Unavailable):
            uopd.connect(srv.address, connect_timeout=1)
        with pytest.raises(uopd.Unavailable):
            uopd.connect(srv.address, tls=str(other), connect_timeout=1)
    with pytest.raises(uopd.InvalidArgument, match="not a PEM file"):
        uopd.connect(srv.address, tls=str(ext))
    with pytest.raises(uopd.InvalidArgument, match="needs its key"):
        uopd.connect(srv.address, tls={"ca": str(ca), "cert": str(cert)})
