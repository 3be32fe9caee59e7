# args: ["2024-03-01", "2024-03-20"]
from datetime import date, timedelta

start = date.fromisoformat(args[0])
end = date.fromisoformat(args[1])
count = 0
current = start
while current <= end:
    if current.weekday() < 5:
        count += 1
    current += timedelta(days=1)
return count
