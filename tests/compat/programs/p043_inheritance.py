# args: [[["circle", 1.0], ["square", 2.0], ["circle", 0.5]]]
import math

class Shape:
    def __init__(self, name):
        self.name = name

    def area(self):
        raise NotImplementedError

    def describe(self):
        return f"{self.name}: {self.area():.3f}"

class Circle(Shape):
    def __init__(self, r):
        super().__init__("circle")
        self.r = r

    def area(self):
        return math.pi * self.r ** 2

class Square(Shape):
    def __init__(self, side):
        super().__init__("square")
        self.side = side

    def area(self):
        return self.side ** 2

shapes = [Circle(v) if kind == "circle" else Square(v) for kind, v in args[0]]
return [s.describe() for s in shapes]
