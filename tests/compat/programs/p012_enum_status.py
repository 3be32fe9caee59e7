# args: ["shipped"]
from enum import Enum

class Status(Enum):
    PENDING = "pending"
    SHIPPED = "shipped"
    DELIVERED = "delivered"

status = Status(args[0])
order = list(Status)
idx = order.index(status)
nxt = order[idx + 1] if idx + 1 < len(order) else None
return {"status": status.name, "next": nxt.value if nxt else None}
