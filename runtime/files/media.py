"""Media types checked against bytes (issue 41).

A file's media type is first guessed from its name (:func:`~.transfer.media_type`). A name is only a claim.
A program can write ``chart.png`` holding HTML, and a caller can hand in ``data.csv`` holding a binary.
Where a type matters, the bytes are checked against it:

- a contract's declared media type, on an input (refused before anything runs) and on an output (a contract
  violation: the attempt fails and nothing is committed);
- the label a run's outputs get (:func:`labelled`): bytes that are not what their name says are
  ``application/octet-stream``;
- whether an output is shown as an image (MCP ``image`` content, the dashboard's inline ``<img>``):
  :func:`shown_as_image`. An SVG shown so must also hold nothing active.

The checks use the standard library only. Images are recognised by their magic numbers; for those, no
decoder runs on untrusted bytes. An SVG is parsed as XML (expat): an internal DTD subset or any entity
declaration is refused, so no entity is ever expanded, and an external DTD is never fetched. Its root must be
``svg``. JSON must parse strictly. CSV must be UTF-8 text without NUL. Other types are not checked: their
label is descriptive.
"""

from __future__ import annotations

import re
from xml.parsers import expat

from sandforge.runtime.errors import SandforgeError
from sandforge.runtime.files.jsontext import decode_json

_MAGIC: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
}
#: the media types whose bytes are checked (any other type is taken as declared)
CHECKED = frozenset({*_MAGIC, "image/webp", "image/svg+xml", "application/json", "text/csv"})
#: the types shown as images (MCP ``image`` content, the dashboard's ``<img>``), when the bytes are that type
IMAGE_TYPES = frozenset({*_MAGIC, "image/webp", "image/svg+xml"})
SVG_NS = "http://www.w3.org/2000/svg"
#: elements that make an SVG active (a script, HTML inside it, a frame): never shown as an image
_ACTIVE_ELEMENTS = frozenset({"script", "foreignobject", "iframe", "embed", "object", "handler", "listener"})
_SAFE_HREF = ("#", "data:image/png", "data:image/jpeg", "data:image/gif", "data:image/webp")
_OUTSIDE_URL = re.compile(r"url\(\s*['\"]?\s*(?!#|data:image/(?:png|jpeg|gif|webp)[;,])", re.IGNORECASE)
UNKNOWN = "application/octet-stream"


def mismatch(media_type: str, body: bytes) -> str | None:
    """Why ``body`` is not ``media_type`` (a short phrase), or None when it is or the type is not checked."""
    base = media_type.split(";")[0].strip().lower()
    if base in _MAGIC:
        return None if body.startswith(_MAGIC[base]) else f"its bytes are not {base} (no {base} signature)"
    if base == "image/webp":
        return None if body[:4] == b"RIFF" and body[8:12] == b"WEBP" else "its bytes are not image/webp"
    if base == "image/svg+xml":
        return svg_problem(body, shown=False)
    if base == "application/json":
        try:
            decode_json(body, what="it")
        except SandforgeError as exc:
            return str(exc)
        return None
    if base == "text/csv":
        return _text_problem(body)
    return None


def labelled(media_type: str, body: bytes) -> str:
    """``media_type`` when the bytes are that type (or it is not checked), else ``application/octet-stream``."""
    return media_type if mismatch(media_type, body) is None else UNKNOWN


def shown_as_image(media_type: str, body: bytes) -> bool:
    """Whether a client may show ``body`` as an image of ``media_type``. It must be an image type and the
    bytes that type. An SVG must also hold no script, no foreign object, no event attribute and no link
    other than a fragment or an embedded raster image."""
    base = media_type.split(";")[0].strip().lower()
    if base not in IMAGE_TYPES:
        return False
    if base == "image/svg+xml":
        return svg_problem(body, shown=True) is None
    return mismatch(base, body) is None


def _text_problem(body: bytes) -> str | None:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"its bytes are not UTF-8 text (byte {exc.start})"
    return "its bytes hold a NUL: not text" if "\0" in text else None


class _Refused(Exception):
    pass


class _SvgCheck:
    """expat's handlers: the root must be ``svg``; ``shown``: no active element, event attribute or outside link."""

    def __init__(self, shown: bool) -> None:
        self.shown = shown
        self.elements = 0

    @staticmethod
    def doctype(_name: str, _system: str | None, _public: str | None, internal: int) -> None:
        if internal:  # a public DTD's name (matplotlib writes SVG 1.1's) is fine: expat never fetches it
            raise _Refused("its document type has an internal subset (no entity is accepted)")

    @staticmethod
    def entity(*_: object) -> None:
        raise _Refused("it declares an entity")

    def start(self, name: str, attributes: dict[str, str]) -> None:
        namespace, _, local = name.rpartition(" ")
        if self.elements == 0 and (local != "svg" or namespace not in ("", SVG_NS)):
            raise _Refused(f"its root element is {local!r}, not svg")
        self.elements += 1
        if self.shown:
            self.active(local, attributes)

    @staticmethod
    def active(local: str, attributes: dict[str, str]) -> None:
        if local.lower() in _ACTIVE_ELEMENTS:
            raise _Refused(f"it holds a {local} element")
        for key, value in attributes.items():
            attr = key.rpartition(" ")[2].lower()
            if attr.startswith("on"):
                raise _Refused(f"it holds an event attribute ({attr})")
            if attr == "href" and not value.strip().lower().startswith(_SAFE_HREF):
                raise _Refused("it links to something other than a fragment or an embedded image")
            _SvgCheck.text(value)

    @staticmethod
    def text(data: str) -> None:
        """CSS in an attribute or a ``<style>``: a ``url(...)`` may name a fragment or an embedded image only."""
        if _OUTSIDE_URL.search(data):
            raise _Refused("it refers to a url() other than a fragment or an embedded image")


def svg_problem(body: bytes, *, shown: bool) -> str | None:
    """Why ``body`` is not an SVG document (or, ``shown``, not one safe to show as an image), or None."""
    check = _SvgCheck(shown)
    parser = expat.ParserCreate(namespace_separator=" ")
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = check.doctype
    parser.EntityDeclHandler = check.entity
    parser.StartElementHandler = check.start
    if shown:
        parser.CharacterDataHandler = check.text
    try:
        parser.Parse(body, True)
    except _Refused as exc:
        return f"not an SVG image: {exc}"
    except expat.ExpatError as exc:
        return f"not an SVG image: not well-formed XML ({expat.errors.messages.get(exc.code, 'error')})"
    return None if check.elements else "not an SVG image: no root element"
