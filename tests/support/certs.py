"""Throwaway TLS certificates, made with the openssl command-line tool."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*argv: str) -> None:
    subprocess.run(["openssl", *argv], check=True, capture_output=True)


def make_ca_and_server(folder: Path, dns_name: str) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for `dns_name`, valid one day."""
    ca_key, ca, key, csr, cert, ext = (
        folder / n for n in ("ca.key", "ca.pem", "s.key", "s.csr", "s.pem", "san.ext")
    )
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *curve,
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "1",
        "-subj",
        "/CN=agentworker test CA",
    )
    _openssl("req", *curve, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={dns_name}")
    ext.write_text(f"subjectAltName = DNS:{dns_name}\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(cert),
        "-days",
        "1",
        "-extfile",
        str(ext),
    )
    return ca, cert, key
