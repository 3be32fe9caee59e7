"""NewsModel: the scripted "model" of `sandforge demo --news`, answering from what each request shows it.

A plain :class:`~runtime.providers.scripted.ScriptedProvider` replays programs in a fixed order; the news
scenario needs a model that reacts to what the runtime tells it, as the design documents expect of a real
one (ADR 0012/0013), so this one reads each :class:`GenerationRequest` and decides like this:

- ``assistant.ask(question)``: find the source the question names in its catalogue of feed URLs, then
  - if ``<known_tools>`` lists a ``web_fetcher`` with ``fetch`` and an ``rss_parser`` with ``parse``
    (persisted by an earlier run), write a program that calls them with ``tool(...)``;
  - else if ``<recent_patterns>`` carries the runtime's nudge (a capability repeating with no tool for it),
    forge both tools with ``delegate(...)`` and use them;
  - else write a one-off program that fetches the feed and parses it inline, with ``requests`` the first
    time, ``urllib.request`` the second and the native ``fetch()`` after that (models use all three);
- ``web_fetcher.fetch(url)`` / ``rss_parser.parse(xml, limit=...)``: a general program for any input (it
  reads its arguments, bakes none of them in), so the ToolStore stores it as reusable.

Anything else is a non-retriable ``ProviderError`` (``script_exhausted``), as with the plain script.
Nothing here touches the network: every program asks the host, through the broker, under the policy.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping

from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest, ProviderError
from sandforge.runtime.providers.prompt import RenderedPrompt, render_prompt

FETCHER = "web_fetcher"
PARSER = "rss_parser"
#: The runtime's nudge at the end of ``<recent_patterns>`` (runtime.store.patterns.NUDGE), read as a model would.
NUDGE_TEXT = "consider Forging now"

_PARSE_ITEMS = """\
headlines = []
for item in root.iter("item"):
    headlines.append({
        "title": (item.findtext("title") or "").strip(),
        "link": (item.findtext("link") or "").strip(),
        "published": (item.findtext("pubDate") or "").strip(),
    })
"""

_ASK_WITH_REQUESTS = """\
import requests
import xml.etree.ElementTree as ET

# {source}: its RSS feed, fetched by the host through the egress broker
response = requests.get({base}, params={params}, headers={{"Accept": "application/rss+xml"}}, timeout=5)
response.raise_for_status()
root = ET.fromstring(response.content)
{parse}return {{"source": {source_literal}, "feed": response.url, "headlines": headlines[:5]}}
"""

_ASK_WITH_URLLIB = """\
import urllib.request
import xml.etree.ElementTree as ET

# {source}: its RSS feed, fetched by the host through the egress broker
request = urllib.request.Request({url}, headers={{"Accept": "application/rss+xml"}})
with urllib.request.urlopen(request, timeout=5) as response:
    status = response.status
    body = response.read()
if status != 200:
    return Outcome.error("feed_unavailable", "the feed answered HTTP " + str(status), retriable=True)
root = ET.fromstring(body)
{parse}return {{"source": {source_literal}, "feed": {url}, "headlines": headlines[:5]}}
"""

_ASK_WITH_FETCH = """\
import xml.etree.ElementTree as ET

# {source}: its RSS feed, fetched by the host through the egress broker
response = fetch({url}, headers={{"Accept": "application/rss+xml"}}, timeout=5)
if not response.ok:
    return Outcome.error("feed_unavailable", "the feed answered HTTP " + str(response.status), retriable=True)
root = ET.fromstring(response.content)
{parse}return {{"source": {source_literal}, "feed": response.url, "headlines": headlines[:5]}}
"""

_FORGE_TOOLS = """\
# The same two steps keep repeating (fetch a URL, parse a feed): make them tools that persist.
fetcher = delegate(
    "web_fetcher",
    purpose="Fetch one URL over HTTP(S) through the host's egress broker and return the response",
    deliverable={{"type": "dict", "required": ["status", "url", "content_type", "text"],
                 "properties": {{"status": {{"type": "int"}}, "url": {{"type": "str"}}, "text": {{"type": "str"}}}}}},
    acceptance="the final response's status, URL, content type and text; HTTP errors are returned, not raised",
    failure_policy="network failures and denials are typed errors for the caller",
)
parser = delegate(
    "rss_parser",
    purpose="Parse an RSS 2.0 or Atom feed document into its channel title and headlines",
    deliverable={{"type": "dict", "required": ["channel", "headlines"], "properties": {{
        "headlines": {{"type": "list", "items": {{"type": "dict", "required": ["title", "link"]}}}}}}}},
    acceptance="headlines in document order, each with title, link and published",
)
{use}"""

_USE_TOOLS = """\
fetcher = tool("web_fetcher")
parser = tool("rss_parser")
{use}"""

_USE = """\
page = fetcher.fetch({url})
if not page.ok:
    return Outcome.error(page.error_type, page.error_message, retriable=page.retriable)
if page.value["status"] != 200:
    return Outcome.error("feed_unavailable", "the feed answered HTTP " + str(page.value["status"]), retriable=True)
feed = parser.parse(page.value["text"], limit=5)
if not feed.ok:
    return Outcome.error(feed.error_type, feed.error_message, retriable=feed.retriable)
return {{"source": {source_literal}, "feed": page.value["url"], "channel": feed.value["channel"],
        "headlines": feed.value["headlines"]}}
"""

#: ``web_fetcher.fetch(url)``: any URL, through the broker; the response as data, HTTP errors included.
FETCHER_PROGRAM = """\
import requests

url = args[0] if args else kwargs["url"]
response = requests.get(url, timeout=kwargs.get("timeout") or 10)
return {
    "status": response.status_code,
    "url": response.url,
    "content_type": response.headers.get("content-type", ""),
    "text": response.text,
}
"""

#: ``rss_parser.parse(xml, limit=None)``: RSS 2.0 items or Atom entries (matched by local name, any namespace).
PARSER_PROGRAM = """\
import xml.etree.ElementTree as ET


def local(node):
    return str(node.tag).rsplit("}", 1)[-1]


def text_of(node, name):
    for child in node:
        if local(child) == name:
            return (child.text or "").strip()
    return ""


document = args[0] if args else kwargs["xml"]
limit = kwargs.get("limit")
root = ET.fromstring(document)
headlines = []
for item in root.iter("item"):
    headlines.append({"title": text_of(item, "title"), "link": text_of(item, "link"),
                      "published": text_of(item, "pubDate")})
for entry in root.iter():
    if local(entry) == "entry":
        links = [child.get("href", "") for child in entry if local(child) == "link"]
        headlines.append({"title": text_of(entry, "title"), "link": links[0] if links else "",
                          "published": text_of(entry, "updated")})
channels = [node for node in root.iter() if local(node) in ("channel", "feed")]
channel = text_of(channels[0], "title") if channels else ""
if limit:
    headlines = headlines[: int(limit)]
return {"channel": channel, "headlines": headlines}
"""

_TOOL_LINE = re.compile(r"^- (?P<role>[\w./-]+)(?P<rest>.*)$", re.MULTILINE)
_METHODS = re.compile(r"\(methods: (?P<methods>[^;()]*)(?:;[^()]*)?\)\s*$")


def listed_tools(block: str | None) -> dict[str, set[str]]:
    """Tool name -> the methods ``<known_tools>`` lists for it (read from the block, as a model reads it:
    the methods are in the parentheses that end the line, whatever the purpose before them holds)."""
    tools: dict[str, set[str]] = {}
    for match in _TOOL_LINE.finditer(block or ""):
        found = _METHODS.search(match["rest"])
        methods = found["methods"].split(",") if found else []
        tools[match["role"]] = {m.strip() for m in methods if m.strip() and m.strip() != "..."}
    return tools


class NewsModel:
    """A deterministic model for the news scenario (see the module docstring). Records every request."""

    name = "scripted"

    def __init__(self, feeds: Mapping[str, str]) -> None:
        #: source name ("Google News") -> its feed URL
        self.feeds = dict(feeds)
        self._lock = threading.Lock()
        self._inline = 0
        #: every request received, in order, and the prompt a real model would have been sent for it
        self.requests: list[GenerationRequest] = []
        self.prompts: list[RenderedPrompt] = []
        #: what each answer was: "inline:requests", "forge", "use_tools", "web_fetcher.fetch", ...
        self.decisions: list[str] = []

    @property
    def calls(self) -> int:
        return len(self.requests)

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        with self._lock:
            self.requests.append(request)
            self.prompts.append(render_prompt(request))
            decision, code = self._answer(request)
            self.decisions.append(decision)
        return GeneratedProgram(code=code, provider=self.name, model="news-script")

    def _answer(self, request: GenerationRequest) -> tuple[str, str]:
        where = f"{request.role}.{request.method}"
        if where == f"{FETCHER}.fetch":
            return where, FETCHER_PROGRAM
        if where == f"{PARSER}.parse":
            return where, PARSER_PROGRAM
        if where == "assistant.ask":
            return self._ask(request)
        raise ProviderError(f"the news script has no program for {where}", retriable=False, kind="script_exhausted")

    def source_of(self, question: str) -> tuple[str, str]:
        """The catalogue entry the question names: the source's name, its host or its key word (the longest
        word of the name but "news" and "the": google, yahoo, times), as a whole word."""
        words = set(re.findall(r"[\w.]+", question.casefold()))
        for source, url in self.feeds.items():
            host = url.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
            key = max((w for w in source.casefold().split() if w not in ("news", "the")), key=len, default="")
            if source.casefold() in question.casefold() or host in words or key in words:
                return source, url
        known = ", ".join(self.feeds)
        raise ProviderError(f"the news script knows no feed for {question!r} (it knows {known})",
                            retriable=False, kind="script_exhausted")  # fmt: skip

    def _ask(self, request: GenerationRequest) -> tuple[str, str]:
        question = request.args[0] if request.args else request.kwargs.get("question", "")
        source, url = self.source_of(str(question))
        use = _USE.format(url=json.dumps(url), source_literal=json.dumps(source))
        tools = listed_tools(request.known_tools_block)
        tools.update({t.role: {"fetch", "parse"} for t in request.known_tools if t.role in (FETCHER, PARSER)})
        if "fetch" in tools.get(FETCHER, set()) and "parse" in tools.get(PARSER, set()):
            return "use_tools", _USE_TOOLS.format(use=use)
        if NUDGE_TEXT in (request.recent_patterns or ""):
            return "forge", _FORGE_TOOLS.format(use=use)
        return self._inline_program(source, url)

    def _inline_program(self, source: str, url: str) -> tuple[str, str]:
        style = ("requests", "urllib", "fetch")[min(self._inline, 2)]
        self._inline += 1
        fields = {"source": source, "source_literal": json.dumps(source), "parse": _PARSE_ITEMS, "url": json.dumps(url)}
        if style == "requests":
            base, _, query = url.partition("?")
            params = dict(pair.split("=", 1) for pair in query.split("&") if "=" in pair)
            program = _ASK_WITH_REQUESTS.format(base=json.dumps(base), params=json.dumps(params), **fields)
        elif style == "urllib":
            program = _ASK_WITH_URLLIB.format(**fields)
        else:
            program = _ASK_WITH_FETCH.format(**fields)
        return f"inline:{style}", program
