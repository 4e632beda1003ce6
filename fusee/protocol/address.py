"""Server addresses as workers and clients write them (docs/server.md, *Addresses*):
`host:port?option=value&...`, `[::1]:7600`, `unix:/path.sock?...`, and a list of the
servers sharing one PostgreSQL store, `a:7600,b:7600?...` (the options apply to each).

An unknown or repeated option is an error naming it, so a misspelt option never turns
security off without a word; so is a TLS option on a `unix:` address (the socket file's
permissions decide who connects there; the token still applies), and `cert=`, `key=` or
`name=` without `ca=`: only `ca=` turns TLS on, and an address that asks for part of TLS
without it would otherwise connect in clear. It is refused rather than read as "TLS
with the system's CAs": a dropped `ca=` must not quietly widen the server certificates
trusted from one CA to every public one (give the system bundle as `ca=` for that).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import msgspec

from fusee._errors import RejectedError

OPTIONS = ("ca", "cert", "key", "name", "token-file", "max-shards", "invocation")
# Options of the design that nothing here implements yet: refused by name, with why, rather
# than accepted and ignored (a worker asking for shared memory would silently get the socket).
NOT_BUILT = {
    "shm": "the shared-memory ring between a worker and the server is not built yet; leave shm out "
    "(records go over the socket)",
}
TLS_OPTIONS = ("ca", "cert", "key", "name")


class Address(msgspec.Struct, frozen=True, kw_only=True):
    host: str | None = None  # TCP: a DNS name or an IP address (IPv6 without brackets)
    port: int | None = None
    unix: str | None = None  # a Unix socket's path
    ca: str | None = None  # turns TLS on: the CA file that signs the server's certificate
    cert: str | None = None  # this side's certificate chain and key (mutual TLS)
    key: str | None = None
    name: str | None = None  # the name to verify in the server's certificate
    token_file: str | None = None
    max_shards: int | None = None  # a worker holds at most this many shards
    invocation: str | None = None  # an invoked worker's invocation ID
    # The other servers of a list (host, port): a connection goes to the first that
    # accepts one (the server owning the shards; a standby's port refuses).
    others: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        # Here, not only in `parse`: `Client.connect(tls=...)` and `structs.replace` build
        # addresses too, and none of them may end up in clear while asking for TLS.
        problem = _tls_problem(self)
        if problem is not None:
            raise RejectedError(problem)

    @property
    def tls(self) -> bool:
        return self.ca is not None

    def hosts(self) -> list[Address]:
        """One address per server of the list (just this one, without a list)."""
        if not self.others:
            return [self]
        first = msgspec.structs.replace(self, others=())
        return [first, *(msgspec.structs.replace(first, host=h, port=p) for h, p in self.others)]


def _tls_problem(address: Address) -> str | None:
    given = [name for name in TLS_OPTIONS if getattr(address, name) is not None]
    if address.unix is not None and given:
        return (
            f"{', '.join(given)} do not apply to a unix: socket (its file's permissions decide who "
            "connects; the token still applies)"
        )
    if (address.cert is None) != (address.key is None):
        return "cert= and key= go together (this side's certificate and key)"
    if address.ca is None and given:
        named = " and ".join(f"{name}=" for name in given)
        return (
            f"{named} without ca= would connect without TLS: add ca=PATH, the CA that signs the "
            "server's certificate (for one from a public CA, the system bundle, e.g. "
            "/etc/ssl/certs/ca-certificates.crt)"
        )
    return None


def parse(text: str) -> Address:
    """The address `text` names, or RejectedError saying what is wrong with it."""
    if not isinstance(text, str) or not text.strip():
        raise RejectedError(f"address {text!r}: expected host:port or unix:/path")
    if text.startswith("replicas://"):
        raise RejectedError(f"address {text!r}: replicated mode is not built; give one server's host:port")
    where, _, query = text.partition("?")
    options = _options(text, query)
    if where.startswith("unix:"):
        path = where[len("unix:") :]
        if not path:
            raise RejectedError(f"address {text!r}: unix: needs a socket path")
        return _address(text, options, unix=path)
    listed = where.split(",")
    hosts = [_host_port(text, one) for one in listed]
    if len(set(hosts)) != len(hosts):
        raise RejectedError(f"address {text!r}: a server is listed twice")
    (host, port), others = hosts[0], tuple(hosts[1:])
    return _address(text, options, host=host, port=port, others=others)


def _options(text: str, query: str) -> dict[str, str]:
    if not query:
        return {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise RejectedError(f"address {text!r}: options go as name=value&name=value") from None
    options: dict[str, str] = {}
    for name, value in pairs:
        if name in NOT_BUILT:
            raise RejectedError(f"address {text!r}: option {name!r}: {NOT_BUILT[name]}")
        if name not in OPTIONS:
            raise RejectedError(f"address {text!r}: unknown option {name!r} (known: {', '.join(OPTIONS)})")
        if name in options:
            raise RejectedError(f"address {text!r}: option {name!r} is given twice")
        if not value:
            raise RejectedError(f"address {text!r}: option {name!r} has no value")
        options[name] = value
    return options


def _host_port(text: str, where: str) -> tuple[str, int]:
    if where.startswith("["):
        host, sep, rest = where[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise RejectedError(f"address {text!r}: expected [IPv6]:port")
        port_text = rest[1:]
    else:
        host, sep, port_text = where.rpartition(":")
        if not sep or ":" in host:
            raise RejectedError(f"address {text!r}: expected host:port (an IPv6 address goes in brackets)")
    if not host or any(c.isspace() or c in "/@" for c in host):
        raise RejectedError(f"address {text!r}: {host!r} is not a host name or IP address")
    if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise RejectedError(f"address {text!r}: the port must be a number from 1 to 65535")
    return host, int(port_text)


def _address(text: str, options: dict[str, str], **where: Any) -> Address:
    max_shards: int | None = None
    if "max-shards" in options:
        value = options["max-shards"]
        if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= 1 << 16:
            raise RejectedError(f"address {text!r}: max-shards must be a number from 1 to 65536")
        max_shards = int(value)
    try:
        return Address(
            **where,
            ca=options.get("ca"),
            cert=options.get("cert"),
            key=options.get("key"),
            name=options.get("name"),
            token_file=options.get("token-file"),
            max_shards=max_shards,
            invocation=options.get("invocation"),
        )
    except RejectedError as error:  # a TLS option that does not fit (Address.__post_init__)
        raise RejectedError(f"address {text!r}: {error}") from None
