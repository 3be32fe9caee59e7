# args: [{"shirt": ["tie", "belt"], "tie": ["jacket"], "pants": ["shoes", "belt"], "belt": ["jacket"], "socks": ["shoes"], "shoes": [], "jacket": []}]
from collections import defaultdict, deque

deps = args[0]
indeg = defaultdict(int)
for node, outs in deps.items():
    indeg.setdefault(node, 0)
    for o in outs:
        indeg[o] += 1
queue = deque(sorted(n for n, d in indeg.items() if d == 0))
order = []
while queue:
    n = queue.popleft()
    order.append(n)
    for m in sorted(deps.get(n, [])):
        indeg[m] -= 1
        if indeg[m] == 0:
            queue.append(m)
return order
