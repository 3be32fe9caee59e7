"""Which addresses the broker may connect to: the platform deny list, applied above every allow entry.

Python's ``ipaddress`` flags (``is_global``, ``is_private``) are not enough on their own: they call some
transition forms global and never look inside them. Here an IPv4-mapped address *is* its IPv4 address;
NAT64 (``64:ff9b::/96``) is checked by the IPv4 address it embeds; and the other forms that tunnel IPv4
(IPv4-compatible, 6to4, Teredo, local-use NAT64 ``64:ff9b:1::/48``) are denied outright, naming what they
embed. For IPv6 only global unicast (``2000::/3``) minus its special blocks is reachable.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4_DENIED: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "unspecified / this network"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "shared address space (CGNAT, RFC 6598)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata lives at 169.254.169.254)"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation (TEST-NET-1)"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation (TEST-NET-2)"),
    ("203.0.113.0/24", "documentation (TEST-NET-3)"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved (incl. broadcast)"),
)
_V6_DENIED: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("100::/64", "discard-only"),
    ("2001:db8::/32", "documentation"),
    ("2001::/23", "IETF protocol assignments"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "segment routing"),
    ("fc00::/7", "unique local (ULA)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
)
_V4_NETS = tuple((ipaddress.IPv4Network(net), why) for net, why in _V4_DENIED)
_V6_NETS = tuple((ipaddress.IPv6Network(net), why) for net, why in _V6_DENIED)
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
_TEREDO = ipaddress.IPv6Network("2001::/32")
_COMPATIBLE = ipaddress.IPv6Network("::/96")


@dataclass(frozen=True, slots=True)
class Verdict:
    """An address's classification. ``connect`` is the address to use (a mapped IPv6 address becomes its
    IPv4 address); ``reason`` is why it is denied, empty when allowed."""

    address: IPAddress
    connect: IPAddress
    reason: str = ""
    exempted_by: str = ""

    @property
    def allowed(self) -> bool:
        return not self.reason


def parse_address(text: str) -> IPAddress:
    """An IP address from its canonical text (brackets and an IPv6 zone are refused)."""
    if "%" in text:
        raise ValueError(f"{text!r}: scoped (zone) IPv6 addresses are not reachable")
    return ipaddress.ip_address(text)


def denied_reason(address: IPAddress) -> str:
    """Why the platform denies `address` (empty when it does not). Embedded IPv4 addresses are unwrapped."""
    if isinstance(address, ipaddress.IPv4Address):
        return _v4_denied_reason(address)
    embedded = _embedding_reason(address)
    if embedded is not None:
        return embedded
    for net6, why in _V6_NETS:
        if address in net6:
            return f"{address} is {why}"
    if address not in _GLOBAL_UNICAST:
        return f"{address} is outside IPv6 global unicast (2000::/3)"
    return ""


def _v4_denied_reason(address: ipaddress.IPv4Address) -> str:
    for net, why in _V4_NETS:
        if address in net:
            return f"{address} is {why}"
    if not address.is_global:  # belt and braces: anything Python's registry calls special
        return f"{address} is not a global address"
    return ""


def _embedding_reason(address: ipaddress.IPv6Address) -> str | None:
    """The verdict on an IPv6 form that carries an IPv4 address (``None`` when `address` is no such form):
    mapped and NAT64 addresses are judged by the IPv4 address inside, the tunnelling forms are denied."""
    mapped = address.ipv4_mapped
    if mapped is not None:
        inner = _v4_denied_reason(mapped)
        return f"{address} is IPv4-mapped {_tail(inner)}" if inner else ""
    if address in _NAT64:
        inner = _v4_denied_reason(_low_v4(address))
        return f"{address} is NAT64 for {_tail(inner)}" if inner else ""
    for net, describe in _TUNNELS:
        if address in net:
            return describe(address)
    return None


def _low_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)


def _nat64_local(address: ipaddress.IPv6Address) -> str:
    return f"{address} is local-use NAT64 (RFC 8215), which embeds an IPv4 address"


def _six_to_four(address: ipaddress.IPv6Address) -> str:
    return f"{address} is 6to4, tunnelling IPv4 {address.sixtofour}"


def _teredo(address: ipaddress.IPv6Address) -> str:
    teredo = address.teredo
    server, client = teredo if teredo is not None else (None, None)
    return f"{address} is Teredo, tunnelling IPv4 (server {server}, client {client})"


def _compatible(address: ipaddress.IPv6Address) -> str:
    if int(address) <= 1:
        return f"{address} is {'unspecified' if int(address) == 0 else 'loopback'}"
    return f"{address} is IPv4-compatible (deprecated), embedding {_low_v4(address)}"


#: The IPv6 forms that tunnel IPv4, in the order they are checked (Teredo's /32 lies inside 2001::/23).
_TUNNELS: tuple[tuple[ipaddress.IPv6Network, Callable[[ipaddress.IPv6Address], str]], ...] = (
    (_NAT64_LOCAL, _nat64_local),
    (_SIX_TO_FOUR, _six_to_four),
    (_TEREDO, _teredo),
    (_COMPATIBLE, _compatible),
)


def _tail(reason: str) -> str:
    """``127.0.0.1 is loopback`` -> ``127.0.0.1, which is loopback``."""
    address, _, why = reason.partition(" is ")
    return f"{address}, which is {why}" if why else reason


def classify(address: IPAddress, exempt: Sequence[IPNetwork] = ()) -> Verdict:
    """Classify one resolved address. `exempt` (the policy's ``allow_ranges``) lifts the deny list for
    addresses inside it; an IPv4-mapped address is classified (and connected to) as its IPv4 address."""
    connect: IPAddress = address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        connect = address.ipv4_mapped
    for net in exempt:
        if connect.version == net.version and connect in net:
            return Verdict(address, connect, exempted_by=str(net))
    return Verdict(address, connect, denied_reason(address))


def networks(cidrs: Sequence[str]) -> tuple[IPNetwork, ...]:
    out: list[IPNetwork] = [ipaddress.ip_network(cidr, strict=False) for cidr in cidrs]
    return tuple(out)
