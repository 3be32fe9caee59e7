# args: [[[0, 0], [3, 4], [1, 1]]]
from typing import NamedTuple
import math


class Point(NamedTuple):
    x: float
    y: float

    def distance(self, other: "Point") -> float:
        return math.hypot(self.x - other.x, self.y - other.y)


points = [Point(*p) for p in args[0]]
origin = points[0]
far = max(points, key=lambda p: p.distance(origin))
return [far._asdict(), far.distance(origin), origin._replace(y=9), Point._fields]
