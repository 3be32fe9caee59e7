# args: [{"a": 1}]
import traceback


def lookup(d, key):
    return d[key]


try:
    lookup(args[0], "missing")
except KeyError as exc:
    text = traceback.format_exc()
    lines = traceback.format_exception(exc)
    summary = traceback.format_exception_only(type(exc), exc)
return {"first": text.splitlines()[0], "last": text.splitlines()[-1], "last_line": lines[-1],
        "summary": summary, "has_tool_frame": '"<tool>"' in text}
