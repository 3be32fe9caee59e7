# args: [[{"name": "apple", "price": 0.5, "qty": 10}, {"name": "pear", "price": 0.75, "qty": 4}]]
from dataclasses import dataclass

@dataclass
class Item:
    name: str
    price: float
    qty: int = 0

    def total(self) -> float:
        return self.price * self.qty

items = [Item(**row) for row in args[0]]
return {"total": round(sum(i.total() for i in items), 2), "names": [i.name for i in items]}
