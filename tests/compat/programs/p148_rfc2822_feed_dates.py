# args: [["Mon, 07 Oct 2024 14:30:00 +0200", "Tue, 08 Oct 2024 09:00:00 GMT", "not a date"]]
import email.utils
from datetime import timezone

items = []
for raw in args[0]:
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        items.append({"raw": raw, "error": "unparseable"})
        continue
    utc = when.astimezone(timezone.utc)
    items.append({"raw": raw, "utc": utc.isoformat(), "rfc2822": email.utils.format_datetime(utc)})
newest = max((i for i in items if "utc" in i), key=lambda i: i["utc"])
return {"items": items, "newest": newest["raw"], "sender": email.utils.parseaddr("News Desk <desk@example.org>")}
