"""The platform deny list: every special range, and every IPv6 form that embeds an IPv4 address."""

from __future__ import annotations

import ipaddress

import pytest

from sandforge.runtime.egress import classify, denied_reason
from sandforge.runtime.egress.addresses import networks

DENIED = {
    "0.0.0.0": "unspecified",
    "0.1.2.3": "unspecified",
    "10.1.2.3": "RFC 1918",
    "172.16.0.1": "RFC 1918",
    "172.31.255.255": "RFC 1918",
    "192.168.0.1": "RFC 1918",
    "100.64.0.1": "CGNAT",
    "100.127.255.255": "CGNAT",
    "127.0.0.1": "loopback",
    "127.255.255.254": "loopback",
    "169.254.169.254": "link-local",
    "192.0.0.8": "IETF",
    "192.0.2.1": "documentation",
    "198.18.0.1": "benchmarking",
    "224.0.0.1": "multicast",
    "239.255.255.250": "multicast",
    "240.0.0.1": "reserved",
    "255.255.255.255": "reserved",
    "::": "unspecified",
    "::1": "loopback",
    "fc00::1": "ULA",
    "fd12:3456::1": "ULA",
    "fe80::1": "link-local",
    "febf::1": "link-local",
    "fec0::1": "site-local",
    "ff02::1": "multicast",
    "2001:db8::1": "documentation",
    "100::1": "discard",
    "::ffff:127.0.0.1": "IPv4-mapped 127.0.0.1, which is loopback",
    "::ffff:169.254.169.254": "link-local",
    "::ffff:10.0.0.1": "RFC 1918",
    "::127.0.0.1": "IPv4-compatible",
    "::8.8.8.8": "IPv4-compatible",  # deprecated form: denied even when what it embeds is public
    "64:ff9b::127.0.0.1": "NAT64 for 127.0.0.1, which is loopback",
    "64:ff9b::a9fe:a9fe": "NAT64 for 169.254.169.254",
    "64:ff9b:1::1": "local-use NAT64",
    "2002:7f00:1::": "6to4, tunnelling IPv4 127.0.0.1",
    "2002:808:808::1": "6to4",  # every 6to4 address, whatever it embeds
    "2001:0:4136:e378:8000:63bf:3fff:fdd2": "Teredo",
    "4000::1": "outside IPv6 global unicast",
    "::2:3:4:5:6": "outside IPv6 global unicast",
}


@pytest.mark.parametrize(("text", "why"), sorted(DENIED.items()))
def test_denied(text: str, why: str) -> None:
    reason = denied_reason(ipaddress.ip_address(text))
    assert why in reason, reason


@pytest.mark.parametrize(
    "text",
    ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700::1111", "2a00:1450::1", "64:ff9b::8.8.8.8", "::ffff:8.8.8.8"],
)
def test_global_addresses_pass(text: str) -> None:
    assert denied_reason(ipaddress.ip_address(text)) == ""


@pytest.mark.parametrize("text", ["2002:7f00:1::", "64:ff9b::7f00:1", "::127.0.0.1", "64:ff9b:1::1"])
def test_denied_although_python_calls_it_global(text: str) -> None:
    """Why the list exists: on this Python, ``is_global`` says yes to these IPv4-in-IPv6 forms of loopback."""
    address = ipaddress.ip_address(text)
    if not address.is_global:
        pytest.skip(f"this Python already calls {text} non-global")
    assert denied_reason(address)


def test_a_mapped_address_is_connected_to_as_ipv4() -> None:
    verdict = classify(ipaddress.ip_address("::ffff:8.8.8.8"))
    assert verdict.allowed and verdict.connect == ipaddress.ip_address("8.8.8.8")


def test_allow_ranges_exempt_exactly_their_range() -> None:
    exempt = networks(["127.0.0.1/32", "fd00::/8"])
    assert classify(ipaddress.ip_address("127.0.0.1"), exempt).exempted_by == "127.0.0.1/32"
    assert classify(ipaddress.ip_address("::ffff:127.0.0.1"), exempt).allowed  # the same address
    assert not classify(ipaddress.ip_address("127.0.0.2"), exempt).allowed
    assert classify(ipaddress.ip_address("fd00::5"), exempt).allowed
    assert not classify(ipaddress.ip_address("64:ff9b::7f00:1"), exempt).allowed  # a NAT64 form is not the address
    assert not classify(ipaddress.ip_address("169.254.169.254"), exempt).allowed
