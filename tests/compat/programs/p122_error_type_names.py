# args: [["12", "x", null, "3.5", [1]]]
def parse(value):
    return int(value)


report = []
for value in args[0]:
    try:
        report.append({"value": value, "parsed": parse(value)})
    except (ValueError, TypeError) as exc:
        report.append({"value": value, "error": type(exc).__name__, "kind": exc.__class__.__name__,
                       "input_type": type(value).__name__})
return report
