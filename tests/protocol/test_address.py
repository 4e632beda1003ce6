"""Server addresses (`fusee/protocol/address.py`): each documented form parses, and every
mistake gets RejectedError naming it (an unknown or repeated option never passes
silently: a misspelt `ca=` would turn TLS off)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusee
from fusee.protocol.address import Address, parse


def test_the_documented_forms_parse():
    assert parse("db1.internal:7600") == Address(host="db1.internal", port=7600)
    full = parse("db1.internal:7600?ca=/etc/fusee/ca.pem&cert=w1.pem&key=w1.key&token-file=/etc/fusee/token")
    assert (full.host, full.port, full.ca, full.cert, full.key, full.token_file) == (
        "db1.internal",
        7600,
        "/etc/fusee/ca.pem",
        "w1.pem",
        "w1.key",
        "/etc/fusee/token",
    )
    assert full.tls and not parse("h:1").tls
    assert parse("10.0.0.5:7600?max-shards=2").max_shards == 2
    assert parse("[::1]:7600") == Address(host="::1", port=7600)
    assert parse("unix:/run/fusee.sock?token-file=t") == Address(unix="/run/fusee.sock", token_file="t")
    assert parse("h:7600?invocation=inv-42").invocation == "inv-42"
    assert parse("h:7600?name=fusee.example.com&ca=ca.pem").name == "fusee.example.com"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("h:7600?caa=ca.pem", "unknown option 'caa'"),
        ("h:7600?ca=a.pem&ca=b.pem", "option 'ca' is given twice"),
        ("h:7600?ca=", "option 'ca' has no value"),
        ("h:7600?ca", "name=value"),
        ("h", "expected host:port"),
        ("h:0", "port must be a number from 1 to 65535"),
        ("h:65536", "port must be"),
        ("h:http", "port must be"),
        ("::1:7600", "IPv6 address goes in brackets"),
        ("[::1]7600", "expected [IPv6]:port"),
        (":7600", "is not a host name"),
        ("user@h:7600", "is not a host name"),
        ("unix:", "needs a socket path"),
        ("unix:/s.sock?ca=ca.pem", "ca do not apply to a unix: socket"),
        (
            "unix:/s?shm=1",
            "option 'shm': the shared-memory ring between a worker and the server is not built",
        ),
        ("h:7600?shm=1", "option 'shm': the shared-memory ring"),
        ("h:7600?cert=c.pem", "cert= and key= go together"),
        ("h:7600?cert=c.pem&key=k.pem", "cert= and key= without ca= would connect without TLS"),
        ("h:7600?name=fusee.example.com", "name= without ca= would connect without TLS"),
        ("h:7600?max-shards=0", "max-shards must be"),
        ("h:7600?max-shards=two", "max-shards must be"),
        ("replicas://a,b,c", "replicated mode is not built"),
        ("", "expected host:port"),
    ],
)
def test_each_mistake_is_refused_naming_it(text: str, says: str):
    with pytest.raises(fusee.RejectedError) as error:
        parse(text)
    assert says in str(error.value)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=80))
def test_any_string_is_an_address_or_a_rejected_error(text: str):
    try:
        address = parse(text)
    except fusee.RejectedError:
        return
    assert (address.unix is None) != (address.host is None)
    assert address.port is None or 1 <= address.port <= 65535


@pytest.mark.parametrize(
    "tls",
    [{"cert": "c.pem", "key": "k.pem"}, {"name": "fusee.example.com"}, {"ca": "ca.pem", "cert": "c.pem"}],
    ids=["cert-key", "name", "cert-alone"],
)
def test_tls_options_set_after_parsing_are_checked_too(tls: dict[str, str]):
    """`Client.connect(address, tls={...})` replaces fields of a parsed address: the same
    rules hold, so no TLS option without `ca=` ever means a connection in clear."""
    with pytest.raises(fusee.RejectedError, match=r"ca=|go together"):
        msgspec.structs.replace(parse("h:7600"), **tls)
    with pytest.raises(fusee.RejectedError, match="unix"):
        msgspec.structs.replace(parse("unix:/s.sock"), ca="ca.pem")
