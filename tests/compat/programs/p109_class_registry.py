# args: [["json", "csv", "xml"]]
import json

FORMATTERS = {}

def register(name):
    def decorator(cls):
        FORMATTERS[name] = cls
        return cls
    return decorator

@register("json")
class JsonFormatter:
    def format(self, data):
        return json.dumps(data)

@register("csv")
class CsvFormatter:
    def format(self, data):
        return ",".join(str(v) for v in data.values())

data = {"a": 1, "b": 2}
out = {}
for name in args[0]:
    cls = FORMATTERS.get(name)
    out[name] = cls().format(data) if cls else None
return out
