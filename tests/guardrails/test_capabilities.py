"""Capability extraction: deterministic tags with evidence, from imports and resolved calls."""

from __future__ import annotations

import textwrap

import pytest

from sandforge.runtime.guardrails import default_policy, validate

POLICY = default_policy()


def tags(source: str) -> list[str]:
    return validate(textwrap.dedent(source), POLICY).capability_tags


@pytest.mark.parametrize(
    ("source", "tag"),
    [
        # ADR 0013's extraction sources, translated to Python
        ("import feedparser\nfeed = feedparser.parse(args[0])", "rss_parse"),  # require 'rss'
        ("import xml.etree.ElementTree as ET\nitems = ET.fromstring(args[0]).findall('.//item')", "rss_parse"),
        ("from xml.etree import ElementTree\nroot = ElementTree.fromstring(args[0])", "xml_parse"),  # REXML
        ("import urllib.request\nurllib.request.urlopen(args[0])", "http_fetch"),  # Net::HTTP
        ("import http.client\nc = http.client.HTTPSConnection('example.com')", "http_fetch"),
        ("import requests\nrequests.get(args[0])", "http_fetch"),
        ("import httpx", "http_fetch"),
        ("page = tool('web_fetcher').fetch(url=args[0])", "http_fetch"),  # tool("web_fetcher")
        ("page = tool(name='web_fetcher')", "http_fetch"),
        ("import feedparser\nfeed = feedparser.parse('https://example.com/rss')", "http_fetch"),
        ("from html.parser import HTMLParser", "html_extract"),
        ("import json\nd = json.loads(args[0])", "json_parse"),
        ("import csv\nrows = csv.reader(args[0].splitlines())", "csv_parse"),
        ("with open(args[0]) as fh:\n    fh.read()", "file_read"),
        ("f = open(args[0], mode=kwargs['mode'])", "file_write"),
        ("from pathlib import Path\nPath(args[0]).write_text('x')", "file_write"),
        ("import pathlib\np = pathlib.Path(args[0])\np.unlink()", "file_write"),
        ("import shutil\nshutil.copy(args[0], args[1])", "file_write"),
        ("import subprocess\nsubprocess.run(['ls'])", "subprocess"),
        ("import os as o\no.execv('/bin/sh', [])", "subprocess"),
        ("from os import popen\npopen('ls')", "subprocess"),
        ("import socket", "network"),
        ("helper = delegate('researcher', purpose='find sources')", "tool_delegation"),
        (
            """
            headlines = [
                {"title": entry.title, "link": entry.link}
                for entry in args[0]
            ]
            """,
            "news_headline_extract",
        ),
        (
            """
            out = []
            for item in args[0]:
                out.append((item.get("headline"), item.get("url")))
            """,
            "news_headline_extract",
        ),
    ],
)
def test_tagged(source: str, tag: str) -> None:
    assert tag in tags(source)


@pytest.mark.parametrize(
    ("source", "tag"),
    [
        ("from urllib.parse import urlparse\nurlparse(args[0])", "http_fetch"),
        ("summary = tool('summarizer').summarize(text=args[0])", "http_fetch"),
        ("page = tool(args[0])", "http_fetch"),  # a computed tool name is not evidence
        ("import json\njson.dumps(args)", "json_parse"),
        ("with open(args[0], 'w') as fh:\n    fh.write('x')", "file_read"),
        ("with open(args[0]) as fh:\n    fh.read()", "file_write"),
        ("import xml.etree.ElementTree as ET\nET.fromstring(args[0]).iter('name')", "rss_parse"),
        ("titles = [item['title'] for item in args[0]]", "news_headline_extract"),
        ("record = {'title': args[0], 'link': args[1]}", "news_headline_extract"),
        ("for item in [{'title': 1, 'link': 2}]:\n    pass", "news_headline_extract"),  # inside the iterable
        ("note = 'import subprocess; open(\"/etc/passwd\")'", "subprocess"),
        ("# import socket\nx = 1", "network"),
    ],
)
def test_not_tagged(source: str, tag: str) -> None:
    assert tag not in tags(source)


def test_evidence_lists_line_and_construct_in_order() -> None:
    source = "import json\n\nb = json.loads(args[1])\na = json.loads(args[0])\n"
    result = validate(source, POLICY)
    capability = next(c for c in result.capabilities if c.tag == "json_parse")
    assert capability.granted
    assert [(e.line, e.construct) for e in capability.evidence] == [
        (3, "json.loads(args[1])"),
        (4, "json.loads(args[0])"),
    ]


def test_extraction_is_deterministic_and_sorted() -> None:
    source = "import subprocess, socket, json\njson.loads(args[0])\n"
    first = validate(source, POLICY)
    assert first.capability_tags == ["json_parse", "network", "subprocess"]
    assert validate(source, POLICY) == first


def test_ungranted_capability_is_terminal_once_per_tag() -> None:
    source = "import subprocess\nsubprocess.run(['a'])\nsubprocess.run(['b'])\nimport json\njson.loads('1')\n"
    result = validate(source, POLICY)
    ungranted = [v for v in result.violations if v.violation_type == "capability_not_granted"]
    assert len(ungranted) == 1
    violation = ungranted[0]
    assert violation.classification == "terminal"
    assert violation.message == "capability not supported by runtime policy: subprocess (import subprocess)"
    assert violation.location is not None and violation.location.line == 1
    assert result.verdict == "terminal"


def test_granted_capabilities_alone_are_approved() -> None:
    source = """
        import xml.etree.ElementTree as ET
        root = ET.fromstring(args[0])
        news = [{"title": i.findtext("title"), "link": i.findtext("link")} for i in root.iter("item")]
        summary = tool("summarizer").summarize(text=str(news))
        return news
    """
    result = validate(textwrap.dedent(source), POLICY)
    assert result.verdict == "approved"
    assert result.capability_tags == ["news_headline_extract", "rss_parse", "tool_delegation", "xml_parse"]
    assert all(c.granted for c in result.capabilities)


HEADLINE = "news_headline_extract"


@pytest.mark.parametrize(
    ("source", "tagged"),
    [
        # a record in a statement nested in the loop body
        ("for x in items:\n    if x:\n        out.append({'title': x.title, 'link': x.link})", True),
        # the record sits in a decorator, which starts before the `def` line it belongs to
        ("for x in items:\n    @deco({'title': x.title, 'link': x.link})\n    def f():\n        pass", True),
        ("for x in items:\n    @deco\n    @deco2(dict(title=x.title, url=x.url))\n    class K:\n        pass", True),
        # both fields mentioned in the loop, but never in one record
        ("for x in items:\n    t = {'title': x.title}\n    out.append({'link': x.link})", False),
        ("for x in items:\n    if x.title:\n        out.append(x.link)", False),
        # f-strings: positions inside them are not used to skip statements
        ("for x in items:\n    out.append((f'{x.title}', x.link))", True),
        ("for x in items:\n    s = f'{x.title}'\n    out.append([x['title'], x.href])", True),
    ],
)
def test_headline_records_found_wherever_they_sit_in_the_loop_body(source: str, tagged: bool) -> None:
    """`headline_extraction` skips statements whose span holds no title or no link mention; the skip
    must never hide a record."""
    assert (HEADLINE in tags(source)) is tagged
