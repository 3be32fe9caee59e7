# args: [[["add", "milk", 2], ["add", "eggs", 12], ["remove", "milk", 1], ["remove", "bread", 1]]]
from dataclasses import dataclass, field


@dataclass
class ShoppingList:
    owner: str
    _items: dict = field(default_factory=dict)

    def _change(self, name, delta):
        new = self._items.get(name, 0) + delta
        if new < 0:
            raise ValueError(f"not enough {name}")
        if new == 0:
            self._items.pop(name, None)
        else:
            self._items[name] = new

    def apply(self, op, name, qty):
        self._change(name, qty if op == "add" else -qty)


lst = ShoppingList("sam")
problems = []
for op, name, qty in args[0]:
    try:
        lst.apply(op, name, qty)
    except ValueError as exc:
        problems.append(str(exc))
return {"items": lst._items, "problems": problems, "class": type(lst).__name__, "module": type(lst).__module__}
