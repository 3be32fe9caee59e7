# args: [["10", "-3", "abc"]]
class ValidationError(Exception):
    def __init__(self, field, message):
        super().__init__(f"{field}: {message}")
        self.field = field

def check(value):
    try:
        n = int(value)
    except ValueError:
        raise ValidationError("value", f"{value!r} is not an integer")
    if n < 0:
        raise ValidationError("value", "must be non-negative")
    return n

out = []
for v in args[0]:
    try:
        out.append(check(v))
    except ValidationError as e:
        out.append({"error": str(e), "field": e.field})
return out
