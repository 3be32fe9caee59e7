# args: ["https://example.com:8080/path/to/page?q=search+term&page=2#section"]
from urllib.parse import urlparse, parse_qs, urlencode, quote

u = urlparse(args[0])
query = parse_qs(u.query)
return {
    "scheme": u.scheme,
    "host": u.hostname,
    "port": u.port,
    "path": u.path,
    "query": query,
    "rebuilt": urlencode({"q": "a b", "n": 1}),
    "quoted": quote("a/b c"),
}
