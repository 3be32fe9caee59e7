# args: [[{"type": "circle", "r": 2}, {"type": "rect", "w": 3, "h": 4}, {"type": "tri"}]]
import math

def area(shape: dict) -> float:
    match shape:
        case {"type": "circle", "r": r}:
            return round(math.pi * r * r, 3)
        case {"type": "rect", "w": w, "h": h}:
            return w * h
        case _:
            return -1

return [area(s) for s in args[0]]
