# args: ["2024-01-15", "2024-03-01"]
from datetime import datetime

start = datetime.strptime(args[0], "%Y-%m-%d")
end = datetime.strptime(args[1], "%Y-%m-%d")
delta = end - start
return {"days": delta.days, "weeks": delta.days // 7}
