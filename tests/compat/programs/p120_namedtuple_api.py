# args: [[["widget", 3, 2.5], ["gadget", 1, 10.0], ["doohickey", 7, 0.75]]]
from collections import namedtuple

Item = namedtuple("Item", ["name", "qty", "price"], defaults=[0.0])
items = [Item._make(row) for row in args[0]]
restocked = [item._replace(qty=item.qty + 10) for item in items if item.qty < 5]
return {
    "fields": Item._fields,
    "defaults": Item._field_defaults,
    "restocked": [r._asdict() for r in restocked],
    "value": round(sum(i.qty * i.price for i in items), 2),
}
