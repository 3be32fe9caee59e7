# args: [[{"sku": "A1", "qty": 2, "unit": 9.99}, {"sku": "B2", "qty": 1, "unit": 24.5}], 0.1]
from dataclasses import dataclass
from typing import List

@dataclass
class Line:
    sku: str
    qty: int
    unit: float

    @property
    def amount(self) -> float:
        return round(self.qty * self.unit, 2)

@dataclass
class Invoice:
    lines: List[Line]
    discount: float = 0.0

    def subtotal(self) -> float:
        return round(sum(l.amount for l in self.lines), 2)

    def total(self) -> float:
        return round(self.subtotal() * (1 - self.discount), 2)

inv = Invoice([Line(**l) for l in args[0]], discount=args[1])
return {"subtotal": inv.subtotal(), "total": inv.total(), "lines": len(inv.lines)}
