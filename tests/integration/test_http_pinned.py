"""The pinned transport with real sockets on loopback: it connects to the approved
address only, while the Host header, the TLS server name and the certificate check
all stay with the URL's host name.

No name here is ever resolved: `pinned.example` reaches the local server only
because the test pins it to 127.0.0.1, exactly as the URL guard would.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.certs import make_ca_and_server
from tests.support.http_server import Honeypot, TestServer
from worker.actions.host.fetching.pinned import PinnedTransport, Pins

NAME = "pinned.example"


def get(pins: Pins, url: str, context: ssl.SSLContext | None = None) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = PinnedTransport(pins, context or ssl.create_default_context())
        async with httpx.AsyncClient(transport=transport, trust_env=False) as client:
            response = await client.get(url)
            await response.aread()
            return response

    return asyncio.run(go())


def test_connects_to_the_pinned_address_and_keeps_the_host_header() -> None:
    with TestServer() as server:
        pins = Pins()
        pins.pin(NAME, server.port, "127.0.0.1")
        response = get(pins, f"http://{NAME}:{server.port}/echo")
    assert response.status_code == 200
    assert json.loads(response.content)["headers"]["host"] == f"{NAME}:{server.port}"


def test_an_unpinned_host_is_never_connected() -> None:
    with Honeypot() as pot:
        pins = Pins()
        pins.pin(NAME, pot.port, "127.0.0.1")  # another host's pin does not help
        with pytest.raises(httpx.ConnectError, match="not approved"):
            get(pins, f"http://127.0.0.1:{pot.port}/")
        with pytest.raises(httpx.ConnectError, match="not approved"):
            get(pins, f"http://{NAME}:{pot.port + 1}/")  # the pin is per port too
        pot.settle()
    assert pot.connections == 0


@pytest.fixture(scope="module")
def tls_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TestServer, Path, list[str]]]:
    ca, cert, key = make_ca_and_server(tmp_path_factory.mktemp("tls"), NAME)
    names: list[str] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: names.append(name or "")  # type: ignore[assignment, func-returns-value]
    with TestServer(tls=context) as server:
        yield server, ca, names


def test_tls_uses_the_urls_name_for_sni_and_the_certificate(
    tls_server: tuple[TestServer, Path, list[str]],
) -> None:
    server, ca, names = tls_server
    pins = Pins()
    pins.pin(NAME, server.port, "127.0.0.1")
    response = get(
        pins, f"https://{NAME}:{server.port}/hello", ssl.create_default_context(cafile=ca)
    )
    assert response.status_code == 200 and response.content == b"hello\n"
    assert names[-1] == NAME, "the server was asked for the URL's name, not an address"


def test_a_certificate_for_another_name_fails_even_at_the_right_address(
    tls_server: tuple[TestServer, Path, list[str]],
) -> None:
    server, ca, _ = tls_server
    pins = Pins()
    pins.pin("other.example", server.port, "127.0.0.1")
    with pytest.raises(httpx.ConnectError, match=r"CERTIFICATE_VERIFY_FAILED|match"):
        get(
            pins,
            f"https://other.example:{server.port}/hello",
            ssl.create_default_context(cafile=ca),
        )
