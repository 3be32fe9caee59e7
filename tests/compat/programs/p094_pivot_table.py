# args: ["date,region,sales\n2024-01,north,100\n2024-01,south,80\n2024-02,north,120\n2024-02,south,95\n2024-02,north,5"]
import csv
from collections import defaultdict

table = defaultdict(lambda: defaultdict(float))
for row in csv.DictReader(args[0].splitlines()):
    table[row["date"]][row["region"]] += float(row["sales"])
return {d: dict(r) for d, r in sorted(table.items())}
