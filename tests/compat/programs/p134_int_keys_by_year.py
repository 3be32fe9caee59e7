# args: [[["2023-04-01", 120.5], ["2024-01-15", 80], ["2023-11-30", 20], ["2024-06-01", 15.25]]]
from collections import defaultdict

totals = defaultdict(float)
counts = {}
for date, amount in args[0]:
    year = int(date[:4])
    totals[year] += amount
    counts[year] = counts.get(year, 0) + 1
return {"totals": dict(totals), "counts": counts, "flags": {True: "any", None: "none"}}
