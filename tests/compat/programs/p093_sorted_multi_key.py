# args: [[{"name": "a", "dept": "eng", "salary": 100}, {"name": "b", "dept": "ops", "salary": 90}, {"name": "c", "dept": "eng", "salary": 120}]]
from operator import itemgetter

emps = args[0]
by_dept = sorted(emps, key=itemgetter("dept", "name"))
top = sorted(emps, key=lambda e: (-e["salary"], e["name"]))
totals = {}
for e in emps:
    totals[e["dept"]] = totals.get(e["dept"], 0) + e["salary"]
return {"by_dept": [e["name"] for e in by_dept], "top": top[0]["name"], "totals": totals}
