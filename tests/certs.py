"""Test certificates made with ``openssl`` in a directory: a CA, and server certificates it signs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


def make_ca(directory: Path, name: str = "ca") -> Path:
    """``<name>.crt`` and ``<name>.key``: a self-signed CA valid for two days; returns the certificate."""
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed: cannot make TLS certificates (apt-get install openssl)")
    _openssl(directory, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN=redlock-test-{name}",
             # Python 3.13 verifies strictly (VERIFY_X509_STRICT): a CA needs its key usage.
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return directory / f"{name}.crt"


def make_server_cert(directory: Path, name: str, san: str, ca: str = "ca") -> tuple[str, str]:
    """``<name>.crt`` and ``<name>.key`` signed by ``ca``, for the subjectAltName ``san``."""
    _openssl(directory, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={name}")
    # The authority key identifier, too, is required by Python 3.13's strict verification.
    (directory / f"{name}.ext").write_text(f"subjectAltName={san}\nauthorityKeyIdentifier=keyid,issuer\n")
    _openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    return str(directory / f"{name}.crt"), str(directory / f"{name}.key")
