"""The news demo's small local "internet": loopback HTTP servers serving RSS under real news host names.

`sandforge demo --news` must run offline, so the feeds of news.google.com, news.yahoo.com and
rss.nytimes.com are served by servers the demo starts on 127.0.0.1. Nothing in the sandbox or the broker
knows they are local: the names reach them only through the demo's own policy layer (`policy_layer`),
whose ``egress.resolve`` maps each name to 127.0.0.1 and whose ``allow_ranges`` exempts 127.0.0.0/8 from
the platform deny list, in that layer only. Each server answers only for its own name (the ``Host``
header), so a request that reaches the wrong one is refused, and counts what it served.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

LOOPBACK = "127.0.0.1"
LOOPBACK_RANGE = "127.0.0.0/8"


@dataclass(frozen=True)
class Story:
    title: str
    slug: str
    summary: str


@dataclass(frozen=True)
class Site:
    """One news site of the local internet: its host name, the path of its feed and what the feed says."""

    source: str  # how people name it: "Google News"
    host: str  # the host name programs use: news.google.com
    feed_path: str  # where its RSS feed lives
    query: str  # the query string its usual feed URL carries ("" for none)
    channel: str  # the feed's <channel><title>
    stories: tuple[Story, ...]


SITES: tuple[Site, ...] = (
    Site(
        "Google News",
        "news.google.com",
        "/rss",
        "hl=en-US&gl=US&ceid=US:en",
        "Top stories - Google News",
        (
            Story("City council approves night-time tram pilot", "tram-pilot", "A six-month trial starts in May."),
            Story("Researchers map a new deep-sea coral reef", "coral-reef", "The reef spans 12 km of seabed."),
            Story("Local library lends out telescopes this winter", "telescopes", "Forty instruments are on loan."),
            Story("Harbour bridge reopens after cable repairs", "bridge", "Traffic resumes on all four lanes."),
        ),
    ),
    Site(
        "Yahoo News",
        "news.yahoo.com",
        "/rss/",
        "",
        "Yahoo News - Latest News & Headlines",
        (
            Story("Orchard growers report record apple harvest", "apples", "Cool nights helped the crop."),
            Story("Marathon route changes to avoid river works", "marathon", "Runners will cross two parks."),
            Story("Volunteers restore a 1920s lighthouse lens", "lighthouse", "The lens will shine again in June."),
        ),
    ),
    Site(
        "The New York Times",
        "rss.nytimes.com",
        "/services/xml/rss/nyt/HomePage.xml",
        "",
        "NYT > Top Stories",
        (
            Story("Inside the workshop that repairs museum clocks", "clocks", "Some mechanisms are 300 years old."),
            Story("A quieter airport: electric tugs take over", "electric-tugs", "Ground noise fell by a third."),
            Story("How a village saved its last bookshop", "bookshop", "Two hundred neighbours bought shares."),
            Story("The comeback of the night train", "night-train", "Four new routes open this spring."),
        ),
    ),
)


def rss_document(site: Site, now: datetime) -> bytes:
    """The site's feed: RSS 2.0 with the Atom and Dublin Core namespaces real feeds carry."""
    items = []
    for index, story in enumerate(site.stories):
        published = format_datetime(now - timedelta(minutes=7 + 23 * index), usegmt=True)
        link = f"https://{site.host}/articles/{story.slug}"
        items.append(
            "<item>"
            f"<title>{escape(story.title)}</title><link>{escape(link)}</link>"
            f'<guid isPermaLink="true">{escape(link)}</guid><pubDate>{published}</pubDate>'
            f"<dc:creator>{escape(site.source)} desk</dc:creator>"
            f"<description>{escape(story.summary)}</description>"
            "</item>"
        )
    text = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<rss version="2.0" xmlns:atom="http://www.w3.org/2005/Atom" xmlns:dc="http://purl.org/dc/elements/1.1/">'
        f"<channel><title>{escape(site.channel)}</title><link>https://{site.host}/</link>"
        f"<description>{escape(site.channel)}</description><language>en-us</language>"
        f"<lastBuildDate>{format_datetime(now, usegmt=True)}</lastBuildDate>"
        f'<atom:link href="https://{site.host}{site.feed_path}" rel="self" type="application/rss+xml"/>'
        f"{''.join(items)}</channel></rss>\n"
    )
    return text.encode("utf-8")


@dataclass
class FeedServer:
    """One running site: a threaded HTTP server on the loopback address, answering only for its name."""

    site: Site
    httpd: ThreadingHTTPServer
    thread: threading.Thread
    served: int = 0
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def origin(self) -> str:
        return f"http://{self.site.host}:{self.port}"

    @property
    def feed_url(self) -> str:
        """The URL a program asks for: the real host name, this server's port, the feed's usual path."""
        query = f"?{self.site.query}" if self.site.query else ""
        return f"{self.origin}{self.site.feed_path}{query}"

    def count(self, *, served: bool) -> None:
        with self.lock:
            if served:
                self.served += 1
            else:
                self.refused += 1


class _FeedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sandforge-demo-news"

    def log_message(self, format: str, *args: Any) -> None:  # the demo prints its own account
        pass

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def _answer(self, *, with_body: bool) -> None:
        owner: FeedServer = self.server.owner  # type: ignore[attr-defined]
        site = owner.site
        host = (self.headers.get("Host") or "").lower()
        if host not in (site.host, f"{site.host}:{owner.port}"):
            owner.count(served=False)
            self._send(421, b"misdirected request: this server is " + site.host.encode() + b"\n", "text/plain")
            return
        if urlsplit(self.path).path != site.feed_path:
            owner.count(served=False)
            self._send(404, b"not found\n", "text/plain")
            return
        owner.count(served=True)
        body = rss_document(site, datetime.now(UTC).replace(microsecond=0))
        self._send(200, body, "application/rss+xml; charset=utf-8", with_body=with_body)

    def _send(self, status: int, body: bytes, content_type: str, *, with_body: bool = True) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=60")
        self.end_headers()
        if with_body:
            self.wfile.write(body)


class LocalInternet:
    """The demo's servers, one per site, each on its own loopback port. Use as a context manager."""

    def __init__(self, sites: tuple[Site, ...] = SITES) -> None:
        self.sites = sites
        self.servers: dict[str, FeedServer] = {}

    def start(self) -> LocalInternet:
        try:
            for site in self.sites:
                httpd = ThreadingHTTPServer((LOOPBACK, 0), _FeedHandler)
                httpd.daemon_threads = True
                thread = threading.Thread(target=httpd.serve_forever, name=f"demo-{site.host}", daemon=True)
                server = FeedServer(site, httpd, thread)
                httpd.owner = server  # type: ignore[attr-defined]
                self.servers[site.host] = server
                thread.start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for server in self.servers.values():
            if server.thread.is_alive():
                server.httpd.shutdown()
            server.httpd.server_close()
        self.servers.clear()

    def __enter__(self) -> LocalInternet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def feeds(self) -> dict[str, str]:
        """Source name -> feed URL, what the (scripted) model knows about where each source's feed lives."""
        return {server.site.source: server.feed_url for server in self.servers.values()}

    def policy_yaml(self) -> str:
        """The demo's own policy layer: grant fetching, allow exactly the three feeds, and map the names here."""
        lines = [
            "# The news demo's policy layer (written by `sandforge demo --news`, layered on the default).",
            "# resolve + allow_ranges make the loopback servers reachable under the real names, in this layer only.",
            "policy:",
            "  name: demo-news",
            "  description: The news demo's local internet.",
            "grant: [http_fetch]",
            "egress:",
            "  allow:",
        ]
        for server in self.servers.values():
            site = server.site
            lines += [
                f'    - url: "http://{site.host}:{server.port}{site.feed_path}"',
                "      methods: [GET]",
                f"      name: {site.host.split('.')[-2]}-feed",
            ]
        lines.append(f'  allow_ranges: ["{LOOPBACK_RANGE}"]')
        lines.append("  resolve:")
        lines += [f"    {host}: {LOOPBACK}" for host in self.servers]
        lines.append("  limits: {max_requests: 5, timeout_s: 5}")
        return "\n".join(lines) + "\n"

    def write_policy_layer(self, directory: Path) -> Path:
        """Write the layer into ``directory`` (created) and return it, ready for ``layered_policy``."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "policy.yaml").write_text(self.policy_yaml(), encoding="utf-8")
        return directory
