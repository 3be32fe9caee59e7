# args: [[{"name": "Alice", "score": 93}, {"name": "Bob", "score": 87}]]
rows = args[0]
headers = list(rows[0].keys())
widths = {h: max(len(h), *(len(str(r[h])) for r in rows)) for h in headers}
lines = ["| " + " | ".join(h.ljust(widths[h]) for h in headers) + " |"]
lines.append("|" + "|".join("-" * (widths[h] + 2) for h in headers) + "|")
for r in rows:
    lines.append("| " + " | ".join(str(r[h]).ljust(widths[h]) for h in headers) + " |")
return "\n".join(lines)
