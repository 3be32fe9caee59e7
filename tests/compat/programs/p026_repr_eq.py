# args: [[[1, 2], [3, 4], [1, 2]]]
class Vector:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __repr__(self):
        return f"Vector({self.x}, {self.y})"

    def __eq__(self, other):
        return isinstance(other, Vector) and self.x == other.x and self.y == other.y

    def __hash__(self):
        return hash((self.x, self.y))

    def __add__(self, other):
        return Vector(self.x + other.x, self.y + other.y)

vs = [Vector(*p) for p in args[0]]
total = vs[0]
for v in vs[1:]:
    total = total + v
return {"sum": repr(total), "unique": len(set(vs)), "first_eq_last": vs[0] == vs[-1]}
