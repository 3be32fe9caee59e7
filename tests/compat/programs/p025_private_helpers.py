# args: ["  Hello,   World!  This is   a TEST.  "]
import re

_WS = re.compile(r"\s+")

def _normalize(text):
    return _WS.sub(" ", text).strip()

def _slugify(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")

clean = _normalize(args[0])
return {"clean": clean, "slug": _slugify(clean)}
