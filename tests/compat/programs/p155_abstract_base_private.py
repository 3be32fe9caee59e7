# args: [[["circle", 1.0], ["square", 2.0], ["circle", 0.5]]]
import abc
import math


class Shape(abc.ABC):
    _count = 0

    def __init__(self):
        Shape._count += 1
        self._id = Shape._count

    @abc.abstractmethod
    def area(self) -> float:
        ...

    def describe(self) -> str:
        return f"{self.__class__.__name__}#{self._id} area={self.area():.2f}"


class Circle(Shape):
    def __init__(self, r):
        super().__init__()
        self._r = r

    def area(self):
        return math.pi * self._r ** 2


class Square(Shape):
    def __init__(self, side):
        super().__init__()
        self._side = side

    def area(self):
        return self._side ** 2


kinds = {"circle": Circle, "square": Square}
shapes = [kinds[kind](size) for kind, size in args[0]]
return {"shapes": [s.describe() for s in shapes], "total": Shape._count}
