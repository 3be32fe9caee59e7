# args: [{"A": ["B", "C"], "B": ["D"], "C": ["D", "E"], "D": ["F"], "E": ["F"], "F": []}, "A", "F"]
from collections import deque

graph, start, goal = args
queue = deque([[start]])
seen = {start}
while queue:
    path = queue.popleft()
    node = path[-1]
    if node == goal:
        return path
    for nxt in graph.get(node, []):
        if nxt not in seen:
            seen.add(nxt)
            queue.append(path + [nxt])
return None
