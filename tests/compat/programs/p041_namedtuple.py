# args: [[[1, 2], [3, 5], [-1, 0]]]
from collections import namedtuple

Point = namedtuple("Point", ["x", "y"])
points = [Point(x, y) for x, y in args[0]]
far = max(points, key=lambda p: p.x ** 2 + p.y ** 2)
return {"far": far._asdict(), "xs": [p.x for p in points]}
