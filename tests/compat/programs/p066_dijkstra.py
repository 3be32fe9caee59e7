# args: [{"a": {"b": 4, "c": 1}, "b": {"d": 1}, "c": {"b": 2, "d": 5}, "d": {}}, "a"]
import heapq

graph, source = args
dist = {node: float("inf") for node in graph}
dist[source] = 0
pq = [(0, source)]
while pq:
    d, u = heapq.heappop(pq)
    if d > dist[u]:
        continue
    for v, w in graph[u].items():
        nd = d + w
        if nd < dist[v]:
            dist[v] = nd
            heapq.heappush(pq, (nd, v))
return dist
