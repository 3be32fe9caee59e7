# args: [["a", "b", "a", "c", "b", "a"], ["a", "d"]]
from collections import Counter

c1 = Counter(args[0])
c2 = Counter(args[1])
c1["z"] += 2
c1.update(["b"])
return {"sum": dict(c1 + c2), "diff": dict(c1 - c2), "top": c1.most_common(1)[0], "total": sum(c1.values())}
