# args: ["2024-02-27", 5]
from datetime import date, timedelta

d = date.fromisoformat(args[0])
result = d + timedelta(days=args[1])
return result.isoformat()
