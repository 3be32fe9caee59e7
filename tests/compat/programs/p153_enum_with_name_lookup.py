# args: [["LOW", "high", "medium", "urgent"]]
import enum


class Priority(enum.Enum):
    LOW = 1
    MEDIUM = 2
    HIGH = 3

    @classmethod
    def parse(cls, text: str) -> "Priority":
        return cls[text.upper()]


out = {}
for raw in args[0]:
    try:
        p = Priority.parse(raw)
        out[raw] = [p.name, p.value, type(p).__name__]
    except KeyError as exc:
        out[raw] = f"{exc.__class__.__name__}: {raw}"
return out
