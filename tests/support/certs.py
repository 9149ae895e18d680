"""Throwaway TLS certificates, made with the openssl command-line tool."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path


def _openssl(*argv: str) -> None:
    subprocess.run(["openssl", *argv], check=True, capture_output=True)


def _subject_alt_name(host: str) -> str:
    """A certificate for an address must name it as an IP, or clients refuse it."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"DNS:{host}"
    return f"IP:{host}"


def make_ca_and_server(folder: Path, host: str) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for `host`, valid one day.

    `host` is a DNS name or an IP address.
    """
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
    _openssl("req", *curve, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={host}")
    ext.write_text(f"subjectAltName = {_subject_alt_name(host)}\n")
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
