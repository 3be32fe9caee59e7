# args: [[["eggs", 2.5, 12], ["milk", 1.2, 1]]]
from typing import NamedTuple

class Product(NamedTuple):
    name: str
    price: float
    quantity: int = 1

products = [Product(*row) for row in args[0]]
return [{"name": p.name, "cost": round(p.price * p.quantity, 2)} for p in products]
