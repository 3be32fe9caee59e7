"""URL parsing and normalisation. Every URL the broker sees (the program's, a redirect's ``Location``)
goes through `parse_url`, and everything after it works on the normalised `Target`: the allow match, the
address check, the request line and the ``Host`` header, so no later step can read the text another way.

What lands on the same checks: numeric IPv4 forms (``2130706433``, ``0x7f.1``, ``127.1``, ``017700000001``)
become dotted quads, IPv6 literals their canonical text, host names lower-case ASCII (IDNA), the port a
number (default ports dropped). Refused: userinfo (``http://allowed@evil/``), backslashes, control
characters and whitespace, zone ids, encoded slashes and NULs in the path, schemes other than http(s).
Dot segments are removed after decoding unreserved escapes (``/rss/%2e%2e/admin`` is ``/admin``).
"""

from __future__ import annotations

import fnmatch
import functools
import ipaddress
import re
from dataclasses import dataclass, field
from urllib.parse import urlencode, urljoin

from sandforge.runtime.egress.addresses import IPAddress
from sandforge.runtime.egress.errors import EgressDenied, InvalidFetch

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_URL_CHARS = 8192
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_PATH_SAFE = frozenset("!$&'()*+,;=:@/") | _UNRESERVED
_QUERY_SAFE = _PATH_SAFE | frozenset("?")
_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
#: Control characters, DEL and backslashes (whitespace other than the space, which `parse_url` trims or
#: refuses in the host, is a control character). One C-speed scan instead of a Python loop per character.
_FORBIDDEN_CHAR = re.compile(r"[\x00-\x1f\x7f\\]")
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?P<rest>.*)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Target:
    """A normalised absolute http(s) URL. ``host`` is ASCII lower-case, an IPv4 dotted quad, or an IPv6
    address without brackets; ``ip`` is set when the host is an address literal."""

    scheme: str
    host: str
    port: int
    path: str
    query: str
    ip: IPAddress | None = None
    #: ``Host`` header value: the host, and the port when it is not the scheme's default.
    authority: str = field(init=False, repr=False, compare=False)
    request_target: str = field(init=False, repr=False, compare=False)
    url: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """The texts every request and record uses, made once per target (a target is immutable)."""
        authority = self.host_text if DEFAULT_PORTS[self.scheme] == self.port else f"{self.host_text}:{self.port}"
        request_target = self.path + (f"?{self.query}" if self.query else "")
        object.__setattr__(self, "authority", authority)
        object.__setattr__(self, "request_target", request_target)
        object.__setattr__(self, "url", f"{self.scheme}://{authority}{request_target}")

    @property
    def host_text(self) -> str:
        return f"[{self.host}]" if self.ip is not None and self.ip.version == 6 else self.host

    @property
    def origin(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)

    def __str__(self) -> str:
        return self.url


def _invalid(url: str, why: str) -> InvalidFetch:
    shown = url if len(url) <= 200 else url[:200] + "..."
    return InvalidFetch(f"invalid URL {shown!r}: {why}", reason="invalid_url")


#: URLs without params whose `Target` is kept (a pure function of the text: a program fetching the same
#: URL again gets the same normalisation without computing it again; refusals are never kept).
PARSED_CACHE = 256


def parse_url(url: str, params: dict[str, str | list[str]] | None = None) -> Target:
    """Normalise `url` (with `params` appended to its query). Raises `InvalidFetch` for what is not a
    URL, `EgressDenied` for what is refused on principle (userinfo, other schemes)."""
    if not params and isinstance(url, str):
        return _parse_plain(url)
    return _parse(url, params)


@functools.lru_cache(maxsize=PARSED_CACHE)
def _parse_plain(url: str) -> Target:
    return _parse(url, None)


def _parse(url: str, params: dict[str, str | list[str]] | None) -> Target:
    if not isinstance(url, str) or not url:
        raise InvalidFetch("a URL must be a non-empty string", reason="invalid_url")
    if len(url) > MAX_URL_CHARS:
        raise InvalidFetch(f"URL longer than {MAX_URL_CHARS} characters", reason="invalid_url")
    if _FORBIDDEN_CHAR.search(url):
        raise _invalid(url, "control characters, whitespace and backslashes are not allowed in a URL")
    url = url.strip(" ")
    if " " in url.split("?", 1)[0].split("//", 1)[-1].split("/", 1)[0]:
        raise _invalid(url, "a host cannot contain spaces")
    match = _URL.match(url)
    if match is None:
        raise _invalid(url, "expected an absolute http:// or https:// URL")
    scheme = match["scheme"].lower()
    if scheme not in DEFAULT_PORTS:
        raise EgressDenied(f"scheme {scheme!r} is not reachable; only http and https", reason="scheme")
    rest = match["rest"]
    if not rest.startswith("//"):
        raise _invalid(url, "expected scheme://host")
    rest = rest[2:]
    rest, _, _fragment = rest.partition("#")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    path, _, query = tail.partition("?")
    if "@" in authority:
        raise EgressDenied(
            "credentials in a URL (user@host) are not allowed; the host injects credentials the policy names",
            reason="userinfo",
        )
    host, port = _split_authority(url, authority, scheme)
    ip, host = _host(url, host)
    if params:
        extra = urlencode(params, doseq=True)
        query = f"{query}&{extra}" if query else extra
    return Target(scheme, host, port, _path(url, path), _encode(query, _QUERY_SAFE, url), ip)


def _split_authority(url: str, authority: str, scheme: str) -> tuple[str, int]:
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise _invalid(url, "unclosed [ in the host")
        host, after = authority[: close + 1], authority[close + 1 :]
        if after and not after.startswith(":"):
            raise _invalid(url, "unexpected text after the IPv6 address")
        port_text = after[1:] if after else ""
    else:
        host, _, port_text = authority.partition(":")
        if ":" in port_text:
            raise _invalid(url, "more than one ':' in the host")
    if not host:
        raise _invalid(url, "no host")
    if not port_text:
        return host, DEFAULT_PORTS[scheme]
    if not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5 or not 0 < int(port_text) < 65536:
        raise _invalid(url, f"bad port {port_text[:20]!r}")
    return host, int(port_text)


def _host(url: str, host: str) -> tuple[IPAddress | None, str]:
    if host.startswith("["):
        inner = host[1:-1]
        if "%" in inner:
            raise _invalid(url, "zone ids are not allowed in IPv6 addresses")
        try:
            v6 = ipaddress.IPv6Address(inner)
        except ValueError:
            raise _invalid(url, f"{host!r} is not an IPv6 address") from None
        return v6, str(v6)
    if "%" in host:
        raise _invalid(url, "percent-escapes are not allowed in a host name")
    name = host.lower().rstrip(".") if host != "." else ""
    try:
        labels = [label if label.isascii() else label.encode("idna").decode("ascii") for label in name.split(".")]
    except UnicodeError:
        raise _invalid(url, f"{host!r} is not a valid internationalised host name") from None
    v4 = _ipv4(labels)
    if v4 is not None:
        return v4, str(v4)
    if _numeric(labels[-1]):
        raise _invalid(url, f"{host!r} ends in a number but is not an IPv4 address")
    ascii_name = ".".join(labels)
    if len(ascii_name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise _invalid(url, f"{host!r} is not a valid host name")
    return None, ascii_name


def _numeric(label: str) -> bool:
    if label[:2] == "0x":
        return all(c in "0123456789abcdef" for c in label[2:])
    return label.isascii() and label.isdigit()


def _ipv4(labels: list[str]) -> ipaddress.IPv4Address | None:
    """The IPv4 address a host written as numbers means (WHATWG/inet_aton: 1 to 4 parts, each decimal,
    0x-hex or 0-octal; the last part fills the remaining bytes), or None when it is not all numbers."""
    if not labels or len(labels) > 4 or not all(label and _numeric(label) for label in labels):
        return None
    numbers: list[int] = []
    for label in labels:
        if label[:2] == "0x":
            numbers.append(int(label[2:] or "0", 16))
        elif len(label) > 1 and label[0] == "0":
            if any(c not in "01234567" for c in label):
                return None
            numbers.append(int(label, 8))
        else:
            numbers.append(int(label))
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(numbers)):
        return None
    value = last
    for index, number in enumerate(head):
        value += number << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def _encode(text: str, safe: frozenset[str], url: str) -> str:
    if safe.issuperset(text):  # nothing to escape (and no %: it is in no safe set): the loop would copy it
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "%":
            escape = text[i + 1 : i + 3]
            if len(escape) != 2 or any(c not in "0123456789abcdefABCDEF" for c in escape):
                out.append("%25")  # a lone % is data, as browsers and requests treat it
                i += 1
                continue
            decoded = chr(int(escape, 16))
            out.append(decoded if decoded in _UNRESERVED else f"%{escape.upper()}")
            i += 3
            continue
        if ch in safe:
            out.append(ch)
        else:
            out.extend(f"%{byte:02X}" for byte in ch.encode("utf-8", "surrogatepass"))
        i += 1
    return "".join(out)


def _path(url: str, raw: str) -> str:
    path = _encode(raw or "/", _PATH_SAFE, url)
    upper = path.upper()
    if "%2F" in upper or "%5C" in upper or "%00" in upper:
        raise _invalid(url, "encoded '/', '\\' or NUL in the path")
    return _remove_dot_segments(path)


def _remove_dot_segments(path: str) -> str:
    output: list[str] = []
    segments = path.split("/")
    for index, segment in enumerate(segments[1:], start=1):
        last = index == len(segments) - 1
        if segment == ".":
            if last:
                output.append("")
        elif segment == "..":
            if output:
                output.pop()
            if last:
                output.append("")
        else:
            output.append(segment)
    return "/" + "/".join(output)


def join(base: Target, location: str) -> Target:
    """A redirect's ``Location`` resolved against the URL it came from, then normalised like any URL."""
    if not isinstance(location, str) or not location or len(location) > MAX_URL_CHARS:
        raise InvalidFetch("redirect without a usable Location", reason="invalid_url")
    if any(ord(ch) < 0x20 or ch in "\\\x7f" for ch in location):
        raise InvalidFetch("redirect Location has control characters or backslashes", reason="invalid_url")
    return parse_url(urljoin(base.url, location))


# ------------------------------------------------------------------------------------------- globs


@functools.lru_cache(maxsize=1024)
def _path_regex(glob: str) -> re.Pattern[str]:
    out: list[str] = []
    i = 0
    while i < len(glob):
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def path_matches(glob: str, path: str) -> bool:
    """``**`` crosses ``/``, ``*`` and ``?`` do not. The glob is normalised like a path first."""
    return _glob_regex(glob).fullmatch(path) is not None


_GLOB_SAFE = _PATH_SAFE | frozenset("*?")


@functools.lru_cache(maxsize=1024)
def _glob_regex(glob: str) -> re.Pattern[str]:
    """A path glob normalised and compiled once (the policy's globs are few; every request matches them)."""
    return _path_regex(_encode(glob, _GLOB_SAFE, glob))


def host_matches(glob: str, target: Target) -> bool:
    """A normalised host glob against a target's host: ``*`` alone matches every host, a leading ``*.``
    one or more labels (not the bare domain), ``*`` elsewhere stays inside a label. An address literal
    matches only its own canonical text (or ``*``)."""
    if glob == "*":
        return True
    if target.ip is not None:
        text = glob[1:-1] if glob.startswith("[") else glob
        try:
            return ipaddress.ip_address(text) == target.ip
        except ValueError:
            return False
    labels = target.host.split(".")
    wanted = glob.split(".")
    if wanted[0] == "*" and len(wanted) > 1:
        wanted = wanted[1:]
        if len(labels) <= len(wanted):
            return False
        labels = labels[-len(wanted) :]
    return len(labels) == len(wanted) and all(
        fnmatch.fnmatchcase(label, pattern) for label, pattern in zip(labels, wanted, strict=True)
    )
