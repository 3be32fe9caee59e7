"""Media types checked against bytes (issue 41): a contract's declared type on an input (refused before
anything runs) and on an output (an intrinsic contract violation, nothing committed); the label a run's outputs
get; what may be shown as an image (``runtime/files/media.py``)."""

from __future__ import annotations

import pytest

from sandforge.runtime.agent import Agent
from sandforge.runtime.agent.contracts import check_inputs, check_outputs
from sandforge.runtime.errors import InputFileError
from sandforge.runtime.files.media import labelled, mismatch, shown_as_image, svg_problem
from sandforge.runtime.files.transfer import manifest
from sandforge.runtime.store.models import ToolFiles
from tests.store.test_reuse_and_health import Env, env, top

__all__ = ["env"]  # the fixture, shared

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
SVG_NS = 'xmlns="http://www.w3.org/2000/svg"'
#: what matplotlib's SVG backend writes: a public DTD, a style element, url(#...) clip paths, #fragment links
MATPLOTLIB_SVG = (
    b'<?xml version="1.0" encoding="utf-8" standalone="no"?>\n'
    b'<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" "http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd">\n'
    b'<svg xmlns:xlink="http://www.w3.org/1999/xlink" width="460" height="345" ' + SVG_NS.encode() + b">\n"
    b'<defs><style type="text/css">*{stroke-linejoin: round; stroke-linecap: butt}</style></defs>\n'
    b'<g clip-path="url(#p1)"><use xlink:href="#m1" x="1" y="2"/>'
    b'<image xlink:href="data:image/png;base64,iVBORw0KGgo=" width="1" height="1"/></g></svg>\n'
)
CHART = {
    "takes": [{"name": "data.csv", "media_type": "text/csv"}, {"name": "*.json", "media_type": "application/json"}],
    "produces": [{"name": "chart.png", "media_type": "image/png"}, {"name": "*.svg", "media_type": "image/svg+xml",
                                                                     "required": False}],
}  # fmt: skip


@pytest.mark.parametrize(
    ("media_type", "body", "ok"),
    [
        ("image/png", PNG, True), ("image/png", b"<html>", False), ("image/png", b"GIF89a....", False),
        ("image/jpeg", b"\xff\xd8\xff\xe0\0\x10JFIF", True), ("image/jpeg", PNG, False),
        ("image/gif", b"GIF87a\x01\0", True), ("image/gif", b"GIF", False),
        ("image/webp", b"RIFF\x10\0\0\0WEBPVP8 ", True), ("image/webp", b"RIFF\x10\0\0\0WAVEfmt ", False),
        ("image/svg+xml", MATPLOTLIB_SVG, True), ("image/svg+xml", b"<html/>", False),
        ("image/svg+xml", b"<svg", False), ("image/svg+xml", PNG, False),
        ("image/svg+xml", b'<!DOCTYPE svg [<!ENTITY a "aaaaaaaa">]><svg>&a;</svg>', False),  # no entity, ever
        ("application/json", b'{"a": [1, 2]}', True), ("application/json", b"{'a': 1}", False),
        ("application/json", b"NaN", False),
        ("text/csv", "a,b\nå,ü\n".encode(), True), ("text/csv", b"a,b\n\xff\xfe\n", False),
        ("text/csv", b"a\0b", False),
        ("text/plain", b"\xff", True), ("application/octet-stream", b"\0", True),  # not checked: taken as declared
    ],
)  # fmt: skip
def test_bytes_are_checked_against_the_media_type(media_type: str, body: bytes, ok: bool) -> None:
    problem = mismatch(media_type, body)
    assert (problem is None) is ok, problem
    assert problem is None or "\n" not in problem
    assert labelled(media_type, body) == (media_type if ok else "application/octet-stream")


@pytest.mark.parametrize(
    "svg",
    [
        f"<svg {SVG_NS}><script>alert(1)</script></svg>",
        f'<svg {SVG_NS} onload="alert(1)"/>',
        f'<svg {SVG_NS}><rect ONCLICK="x()"/></svg>',
        f"<svg {SVG_NS}><foreignObject><div/></foreignObject></svg>",
        f'<svg {SVG_NS} xmlns:x="http://www.w3.org/1999/xlink"><a x:href="javascript:alert(1)"/></svg>',
        f'<svg {SVG_NS}><image href="https://example.invalid/t.png"/></svg>',
        f"<svg {SVG_NS}><style>@import url(https://example.invalid/x.css);</style></svg>",
        f"<svg {SVG_NS} style=\"background: url( 'https://example.invalid/')\"/>",
        f'<svg {SVG_NS}><image href="data:text/html;base64,PGI+"/></svg>',
    ],
)
def test_an_active_svg_is_an_svg_but_never_shown_as_an_image(svg: str) -> None:
    body = svg.encode()
    assert mismatch("image/svg+xml", body) is None  # what the contract declares: it is an SVG document
    assert svg_problem(body, shown=True) is not None
    assert not shown_as_image("image/svg+xml", body)


def test_only_bytes_that_are_the_image_are_shown_as_one() -> None:
    assert shown_as_image("image/png", PNG) and shown_as_image("image/svg+xml", MATPLOTLIB_SVG)
    assert not shown_as_image("image/png", b"<script>alert(1)</script>")
    assert not shown_as_image("text/html", b"<p>") and not shown_as_image("application/json", b"{}")
    listed = {f["name"]: f["media_type"] for f in manifest({"chart.png": b"<html>", "ok.png": PNG, "d.json": b"{"})}
    unknown = "application/octet-stream"
    assert listed == {"chart.png": unknown, "ok.png": "image/png", "d.json": unknown}


def test_the_contract_checks_declared_types_by_name_or_glob() -> None:
    files = ToolFiles.model_validate(CHART)
    assert check_inputs(files, {"data.csv": b"a,b\n", "x.json": b"[]", "other.bin": b"\0"}) is None
    problem = check_inputs(files, {"data.csv": b"a,b\n", "x.json": b"[1,"})
    assert problem is not None and problem.startswith("inputs/x.json: the contract declares application/json")
    assert check_outputs(files, {"chart.png": PNG, "a.svg": MATPLOTLIB_SVG}) is None
    wrong = check_outputs(files, {"chart.png": PNG, "a.svg": b"<html/>"})
    assert wrong is not None and wrong.kind == "outputs" and wrong.path == "outputs/a.svg"
    assert "image/svg+xml" in wrong.text and "root element" in wrong.text


#: writes a chart.png whose bytes are HTML on the first attempt; a real PNG once repaired
HTML_AS_PNG = "with open('outputs/chart.png', 'wb') as f:\n    f.write(b'<html><script>x()</script>')\nreturn 1\n"
REAL_PNG = f"with open('outputs/chart.png', 'wb') as f:\n    f.write({PNG!r})\nreturn 2\n"


def test_an_output_not_its_declared_type_fails_the_attempt_and_commits_nothing(env: Env) -> None:
    ws, _ = env.session([HTML_AS_PNG] * 3)
    ws.register_tool("charter", purpose="Draw a chart", files=CHART)
    out = Agent.for_role("charter", workspace=ws).draw()
    assert not out.ok and out.error_type == "contract_violation" and out.files == {}
    assert out.metadata["failure_class"] == "intrinsic"
    assert "outputs/chart.png" in (out.error_message or "") and "image/png" in (out.error_message or "")
    assert env.store().lookup("charter", "draw").artifact is None  # nothing stored from a failed call

    ws, _ = env.session([HTML_AS_PNG, REAL_PNG])
    out = Agent.for_role("charter", workspace=ws).draw()  # the first attempt's chart is refused, the repair's kept
    assert out.ok and out.value == 2 and out.files == {"chart.png": PNG}
    failed = top(ws).attempt_failures[0]
    assert (failed.error_type, failed.failure_class) == ("contract_violation", "intrinsic")


def test_an_input_not_its_declared_type_is_refused_before_anything_runs(env: Env) -> None:
    ws, provider = env.session([REAL_PNG])
    ws.register_tool("charter", purpose="Draw a chart", files=CHART)
    with pytest.raises(InputFileError, match=r"^inputs/data\.csv: the contract declares text/csv, but its bytes are"):
        ws.call_with_files("charter", "draw", {"data.csv": b"\x89PNG\r\n\x1a\n\xff\xff"})
    assert provider.requests == []  # no model asked, no sandbox started
    out = ws.call_with_files("charter", "draw", {"data.csv": b"a,b\n1,2\n"})
    assert out.ok and out.files == {"chart.png": PNG}
