# args: [[1, "two", 3.0, [4], {"five": 5}, null, true]]
def describe_int(v):
    return f"int {v}"


def describe_str(v):
    return f"str of {len(v)}"


handlers = {"int": describe_int, "str": describe_str, "float": lambda v: f"float {v:.1f}"}
out = []
for value in args[0]:
    name = type(value).__name__
    handler = handlers.get(name)
    out.append(handler(value) if handler else f"unhandled {name}")
return out
