# args: ["3,4"]
class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    @classmethod
    def from_string(cls, s):
        x, y = s.split(",")
        return cls(float(x), float(y))

    @staticmethod
    def origin():
        return Point(0, 0)

    def distance(self, other):
        return ((self.x - other.x) ** 2 + (self.y - other.y) ** 2) ** 0.5

p = Point.from_string(args[0])
return p.distance(Point.origin())
