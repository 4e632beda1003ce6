"""A real `fusee server` refuses the peers it should (a wrong or missing token, a replayed
proof, TLS below 1.3, a client certificate its CA did not sign), says which setting to
change, and keeps serving everyone else. Its start refuses wrong settings by name and
warns about exposed ones."""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.protocol import handshake
from fusee.protocol import messages as m
from fusee.protocol.frames import Decoder, Frame, Kind, encode
from tests.server_mode import certs
from tests.support.procs import Server
from tests.support.server_cli import start_fails, token_file

EXPOSED = "without a token or TLS"


async def closed(client: fusee.Client) -> None:
    await client.close()
    assert client.conn is not None and client.conn.lost.done()  # the socket is gone before the loop ends


async def assert_serving(server: Server, **options: str) -> None:
    """A good client connects and its call is answered (no worker holds a shard, so the
    answer is NoHolderError: the server took the connection and routed the call)."""
    assert server.popen.poll() is None, server.output()
    assert "Traceback" not in "\n".join(server.lines), server.output()
    client = await fusee.Client.connect(server.address(**options))
    try:
        with pytest.raises(fusee.NoHolderError):
            await anext(client.list())
    finally:
        await closed(client)


async def refused(address: str, **options: object) -> str:
    """The message of the ConnectionError that connecting to `address` raises."""
    with pytest.raises(fusee.ConnectionError) as caught:
        client = await fusee.Client.connect(address, **options)  # type: ignore[arg-type]
        await closed(client)
    return str(caught.value)


class RawPeer:
    """A TCP connection driven by hand, frame by frame (blocking; only for the test's own
    short exchanges)."""

    def __init__(self, server: Server) -> None:
        host, port = server.host_port.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5.0)
        self.decoder = Decoder()
        self.pending: list[Frame] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frame(self) -> Frame:
        while not self.pending:
            data = self.sock.recv(65536)
            assert data, "the server closed the connection instead of answering"
            self.pending += self.decoder.feed(data)
        return self.pending.pop(0)

    def until_answered_or_closed(self) -> list[Frame]:
        """The next frame, or none if the server closes the connection first."""
        try:
            return [self.frame()]
        except (AssertionError, ConnectionResetError):
            return []

    def until_closed(self) -> list[Frame]:
        """Every frame left before the server closes the connection."""
        frames, self.pending = self.pending, []
        while True:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return frames
            if not data:
                return frames
            frames += self.decoder.feed(data)

    def close(self) -> None:
        self.sock.close()


# -- the token --------------------------------------------------------------------------


async def test_the_right_token_connects(start_server, tmp_path):
    token = token_file(tmp_path)
    server = start_server("--token-file", token)
    await assert_serving(server, token_file=token)
    client = await fusee.Client.connect(server.address(), token_file=token)  # the keyword form
    try:
        with pytest.raises(fusee.NoHolderError):
            await anext(client.list())
    finally:
        await closed(client)


async def test_a_wrong_token_is_refused_naming_token_file(start_server, tmp_path):
    token = token_file(tmp_path)
    server = start_server("--token-file", token)
    message = await refused(server.address(token_file=token_file(tmp_path, "other")))
    assert "token-file" in message
    await assert_serving(server, token_file=token)


async def test_no_token_is_refused_naming_token_file(start_server, tmp_path):
    token = token_file(tmp_path)
    server = start_server("--token-file", token)
    assert "token-file" in await refused(server.address())
    await assert_serving(server, token_file=token)


async def test_a_token_for_a_server_without_one_is_refused(start_server, tmp_path):
    server = start_server()
    message = await refused(server.address(token_file=token_file(tmp_path)))
    assert "token-file" in message  # "remove token-file= ... or start the server with --token-file"
    await assert_serving(server)


async def test_a_replayed_proof_is_refused(start_server, tmp_path):
    token = token_file(tmp_path)
    server = start_server("--token-file", token)
    secret = Path(token).read_bytes().strip()

    # A real exchange, client side by hand; its HELLO and PROOF frames are recorded.
    hello = encode(Kind.HELLO, handshake.hello(handshake.nonce()))
    first = RawPeer(server)
    first.send(hello)
    challenge = first.frame()
    assert challenge.kind == Kind.CHALLENGE
    t = handshake.transcript(hello[16:], challenge.payload)
    proof = encode(Kind.PROOF, handshake.proof(secret, t))
    first.send(proof)
    accepted = first.frame()
    assert accepted.kind == Kind.ACCEPT
    handshake.verify(handshake.accept(secret, t), accepted.payload)
    first.close()

    # The same bytes on a new connection: the server's fresh nonce makes the proof stale.
    second = RawPeer(server)
    second.send(hello)
    assert second.frame().kind == Kind.CHALLENGE
    second.send(proof)
    answers = second.until_closed()
    second.close()
    assert [frame.kind for frame in answers] == [Kind.REFUSED]
    assert "token" in answers[0].payload.decode()
    await assert_serving(server, token_file=token)


async def test_an_open_sent_with_the_proof_is_read_only_once_the_proof_verified(start_server, tmp_path):
    """The pipelined setup (docs/FORMAT.md, *The token exchange*): PROOF and OPEN in one
    write get ACCEPT and WELCOME back in one write; with a wrong proof the OPEN behind it is
    never acted on (REFUSED, no WELCOME, no lease)."""
    token = token_file(tmp_path)
    server = start_server("--token-file", token)
    opening = encode(*m.payload(m.Open(m.VERSION, m.ROLE_WORKER, 1)))
    for secret, expected in (
        (Path(token).read_bytes().strip(), [Kind.ACCEPT, Kind.WELCOME]),
        (b"x" * 32, [Kind.REFUSED]),
    ):
        hello = encode(Kind.HELLO, handshake.hello(handshake.nonce()))
        peer = RawPeer(server)
        peer.send(hello)
        challenge = peer.frame()
        t = handshake.transcript(hello[16:], challenge.payload)
        peer.send(encode(Kind.PROOF, handshake.proof(secret, t)) + opening)
        if expected[0] == Kind.ACCEPT:
            answer = peer.decoder.feed(peer.sock.recv(65536))  # one read: one write
            peer.close()
        else:
            answer = peer.until_closed()
            peer.close()
        assert [frame.kind for frame in answer] == expected
    server.wait_for(r"let go: worker")  # the first peer's lease, its only one
    assert len(re.findall(r"leased to", "\n".join(server.lines))) == 1, server.output()
    await assert_serving(server, token_file=token)


# -- TLS --------------------------------------------------------------------------------


@pytest.fixture
def tls(tmp_path: Path) -> certs.Certs:
    return certs.make(tmp_path / "certs")


def tls_options(tls: certs.Certs) -> tuple[str, ...]:
    return ("--tls-cert", tls.server.cert, "--tls-key", tls.server.key)


async def test_tls_clients_that_trust_the_ca_connect(start_server, tls):
    server = start_server(*tls_options(tls))
    await assert_serving(server, ca=tls.ca)
    await assert_serving(server, ca=tls.ca, name="localhost")


@pytest.mark.parametrize(
    "options",
    [{"cert": "client", "key": "client"}, {"name": "localhost"}],
    ids=["cert-key", "name"],
)
async def test_tls_options_without_a_ca_never_connect_in_clear(start_server, tls, options):
    """A server without TLS: an address that asks for TLS in part (a client certificate,
    a name to verify) but gives no `ca=` is refused before it connects, naming `ca=`."""
    server = start_server()
    paths = {"cert": tls.client.cert, "key": tls.client.key, "name": "localhost"}
    with pytest.raises(fusee.RejectedError, match="ca="):
        client = await fusee.Client.connect(server.address(**{k: paths[k] for k in options}))
        await closed(client)
    with pytest.raises(fusee.RejectedError, match="ca="):  # the keyword form too
        client = await fusee.Client.connect(server.address(), tls={k: paths[k] for k in options})
        await closed(client)
    await assert_serving(server)


async def test_tls_refuses_a_plain_client(start_server, tls):
    server = start_server(*tls_options(tls))
    await refused(server.address())
    await assert_serving(server, ca=tls.ca)


async def test_tls_client_refuses_a_server_its_ca_did_not_sign(start_server, tls):
    server = start_server(*tls_options(tls))
    message = await refused(server.address(ca=tls.untrusted_ca))
    assert "ca=" in message
    await assert_serving(server, ca=tls.ca)


async def test_tls_below_1_3_is_refused_at_the_tls_handshake(start_server, tls):
    server = start_server(*tls_options(tls))
    host, port = server.host_port.rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(tls.ca)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection((host, int(port)), timeout=5.0) as sock:
        with pytest.raises(ssl.SSLError):
            context.wrap_socket(sock, server_hostname=host).close()
    await assert_serving(server, ca=tls.ca)


async def test_mutual_tls_takes_a_client_certificate_its_ca_signed(start_server, tls):
    server = start_server(*tls_options(tls), "--tls-ca", tls.ca)
    await assert_serving(server, ca=tls.ca, cert=tls.client.cert, key=tls.client.key)


@pytest.mark.parametrize("who", ["untrusted", "none"])
async def test_mutual_tls_refuses_other_clients(start_server, tls, who):
    server = start_server(*tls_options(tls), "--tls-ca", tls.ca)
    options = {"ca": tls.ca}
    if who == "untrusted":
        options.update(cert=tls.untrusted_client.cert, key=tls.untrusted_client.key)
    await refused(server.address(**options))
    await assert_serving(server, ca=tls.ca, cert=tls.client.cert, key=tls.client.key)


@pytest.mark.parametrize("who", ["untrusted", "none"])
async def test_mutual_tls_refusal_names_cert_and_key(start_server, tls, who):
    server = start_server(*tls_options(tls), "--tls-ca", tls.ca)
    options = {"ca": tls.ca}
    if who == "untrusted":
        options.update(cert=tls.untrusted_client.cert, key=tls.untrusted_client.key)
    message = await refused(server.address(**options))
    assert "cert=" in message and "key=" in message


# -- the start: warnings and wrong settings ---------------------------------------------


@pytest.mark.parametrize("secured", [False, True])
async def test_listening_off_loopback_warns_unless_secured(start_server, tmp_path, secured):
    extra = ("--token-file", token_file(tmp_path)) if secured else ()
    server = start_server("--listen", "0.0.0.0:0", *extra, listen="")
    port = server.wait_for(r"listening on 0\.0\.0\.0:(\d+)").group(1)
    warned = [line for line in server.lines if EXPOSED in line]
    assert bool(warned) != secured, server.output()
    if not secured:
        assert "WARNING" in warned[0] and "--token-file" in warned[0]
    server.host_port = f"127.0.0.1:{port}"
    await assert_serving(server, **({"token_file": extra[1]} if secured else {}))


CLEAR = "a token but no TLS"


@pytest.mark.parametrize(
    ("listen", "secured", "warns"),
    [("0.0.0.0:0", "token", True), ("0.0.0.0:0", "token+tls", False), ("127.0.0.1:0", "token", False)],
)
async def test_a_token_without_tls_off_loopback_is_warned_about(
    start_server, tmp_path, tls, listen, secured, warns
):
    """The token proves who connects, but the frames after the exchange carry only a CRC:
    whoever is on the path can take the connection over. Off loopback that is a warning."""
    token = token_file(tmp_path)
    extra = ["--token-file", token, *(tls_options(tls) if secured == "token+tls" else ())]
    server = start_server("--listen", listen, *extra, listen="")
    server.wait_for(r"listening on")
    warned = [line for line in server.lines if CLEAR in line]
    assert bool(warned) == warns, server.output()
    if warns:
        assert "WARNING" in warned[0] and "--tls-cert" in warned[0] and "0.0.0.0" in warned[0]
    assert not [line for line in server.lines if EXPOSED in line], server.output()


async def test_listening_on_loopback_does_not_warn(start_server):
    server = start_server()
    assert not [line for line in server.lines if EXPOSED in line], server.output()


async def test_a_token_file_others_can_read_is_warned_about(start_server, tmp_path):
    token = token_file(tmp_path, mode=0o644)
    server = start_server("--token-file", token)
    line = server.wait_for(r"WARNING.*--token-file .* can be read by other users").string
    assert token in line
    await assert_serving(server, token_file=token)


def test_a_short_token_fails_the_start(tmp_path):
    token = token_file(tmp_path, token="fifteen-bytes!!")
    output = start_fails(tmp_path / "server", "--listen", "127.0.0.1:0", "--token-file", token)
    assert "--token-file" in output and "16" in output


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--listen", "127.0.0.1:0", "--tls-cert", "{cert}"], "--tls-key"),
        (["--listen", "127.0.0.1:0", "--tls-key", "{key}"], "--tls-cert"),
        (["--listen", "127.0.0.1:0", "--tls-ca", "{ca}"], "--tls-cert"),
        (["--listen", "127.0.0.1:0", "--tls-cert", "{ca}", "--tls-key", "{key}"], "--tls-cert"),
        (["--listen", "127.0.0.1:0", "--shards", "0"], "--shards"),
        (["--listen", "bad"], "--listen"),
        (["--listen", "127.0.0.1:65536"], "--listen"),
        (["--listen", "127.0.0.1:0", "--token-file", "{missing}"], "--token-file"),
        ([], "--listen"),
    ],
)
def test_a_wrong_setting_fails_the_start_naming_it(tmp_path, tls, args, named):
    paths = {"cert": tls.server.cert, "key": tls.server.key, "ca": tls.ca, "missing": tmp_path / "none"}
    output = start_fails(tmp_path / "server", *(arg.format(**paths) for arg in args))
    assert re.search(re.escape(named) + r"\b", output), output


# -- the handshake deadline -------------------------------------------------------------


async def test_a_silent_connection_is_closed_after_the_deadline(start_server, tmp_path, tls):
    token = token_file(tmp_path)
    servers = {
        "plain": (start_server(dir=tmp_path / "plain-server"), {}),
        "token": (start_server("--token-file", token, dir=tmp_path / "token-server"), {"token_file": token}),
        "tls": (start_server(*tls_options(tls), dir=tmp_path / "tls-server"), {"ca": tls.ca}),
    }

    def silent(server: Server) -> float:
        host, port = server.host_port.rsplit(":", 1)
        began = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=15.0) as sock:
            try:
                assert sock.recv(1) == b""
            except ConnectionResetError:
                pass
        return time.monotonic() - began

    waited = await asyncio.gather(*(asyncio.to_thread(silent, s) for s, _ in servers.values()))
    for name, seconds in zip(servers, waited, strict=True):
        assert handshake.DEADLINE_S - 1 <= seconds < 15.0, (name, seconds)
    for server, options in servers.values():
        await assert_serving(server, **options)


# -- what an authenticated peer may not do ----------------------------------------------


class FakeWorker:
    """A worker driven by hand over the wire: it takes every free shard and answers the
    calls relayed to it as the test says."""

    @classmethod
    async def connect(cls, server: Server) -> FakeWorker:
        self = cls()
        host, port = server.host_port.rsplit(":", 1)
        self.reader, self.writer = await asyncio.open_connection(host, int(port))
        self.decoder = Decoder()
        self.pending: list[Frame] = []
        self.send(m.Open(m.VERSION, m.ROLE_WORKER, liveness=False))
        welcome = await self.receive(m.Welcome)
        assert len(welcome.granted) == welcome.shards
        return self

    def send(self, message: object) -> None:
        self.writer.write(encode(*m.payload(message)))

    async def receive(self, kind: type) -> Any:
        async with asyncio.timeout(5):
            while True:
                while self.pending:
                    message = m.decode(*self.pending.pop(0))
                    if isinstance(message, kind):
                        return message
                chunk = await self.reader.read(65536)
                assert chunk, "the server closed the fake worker's connection"
                self.pending += self.decoder.feed(chunk)

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def test_only_the_worker_a_call_went_to_can_answer_it(start_server):
    server = start_server()
    worker = await FakeWorker.connect(server)
    client = await fusee.Client.connect(server.address())
    spoofer = RawPeer(server)
    try:
        describing = asyncio.ensure_future(client.run("some-id").status())
        call = await worker.receive(m.Call)
        row = {"id": "some-id", "run": 1, "type": "{}", "status": "ok", "shard": call.shard}
        spoofer.send(encode(*m.payload(m.Open(m.VERSION, m.ROLE_CLIENT, liveness=False))))
        assert spoofer.frame().kind == Kind.WELCOME
        spoofed = m.Answer(call.rid, m.encode_value({**row, "type": "spoofed"}))
        probe = m.Call(1, "describe", 10_000, m.encode_value({}))  # answered after the spoof is read
        spoofer.send(encode(*m.payload(spoofed)) + encode(*m.payload(probe)))
        # The probe's answer (or the spoofer's connection closed for its answer): either
        # way the server has read the spoofed answer.
        assert [frame.kind for frame in spoofer.until_answered_or_closed()] in ([], [Kind.ANSWER])
        worker.send(m.Answer(call.rid, m.encode_value({**row, "type": "real"})))
        async with asyncio.timeout(5):
            assert (await describing).type == "real"
    finally:
        spoofer.close()
        await worker.close()
        await closed(client)


@pytest.mark.parametrize(
    "value",
    [b"\x91" * 2000 + b"\xc0", m.encode_value([1, 2]), m.encode_value(3)],
    ids=["deep", "rows-not-maps", "not-a-list"],
)
async def test_a_malformed_listing_from_a_worker_fails_the_listing_only(start_server, value):
    server = start_server()
    worker = await FakeWorker.connect(server)
    client = await fusee.Client.connect(server.address())
    try:
        listing = asyncio.ensure_future(anext(client.list()))
        call = await worker.receive(m.Call)
        worker.send(m.Answer(call.rid, value))
        with pytest.raises(fusee.FuseeError):
            async with asyncio.timeout(2):
                await listing
    finally:
        await worker.close()
        await closed(client)
    await assert_serving(server)
    assert server.stop() == 0
    assert "Traceback" not in "\n".join(server.lines), server.output()


async def test_a_scanner_does_not_fill_the_log(start_server, tmp_path):
    token = token_file(tmp_path)
    server = start_server("--token-file", token)
    before = len(server.lines)
    for _ in range(20):
        scanner = RawPeer(server)
        scanner.send(b"GET / HTTP/1.1\r\nHost: fusee\r\n\r\n")
        scanner.until_closed()
        scanner.close()
    await assert_serving(server, token_file=token)
    assert server.stop() == 0
    logged = [line for line in server.lines[before:] if "WARNING" in line]
    assert len(logged) <= 2, "\n".join(logged)
