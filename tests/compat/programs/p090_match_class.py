# args: [[[0, 0], [0, 5], [3, 0], [2, 2]]]
from dataclasses import dataclass

@dataclass
class Pt:
    x: int
    y: int

def where(p):
    match p:
        case Pt(x=0, y=0):
            return "origin"
        case Pt(x=0, y=y):
            return f"y-axis {y}"
        case Pt(x=x, y=0):
            return f"x-axis {x}"
        case Pt():
            return "elsewhere"

return [where(Pt(x, y)) for x, y in args[0]]
