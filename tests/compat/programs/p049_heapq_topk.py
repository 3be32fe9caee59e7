# args: [[["a", 5], ["b", 9], ["c", 1], ["d", 7]], 2]
import heapq

items, k = args
top = heapq.nlargest(k, items, key=lambda kv: kv[1])
heap = []
for name, score in items:
    heapq.heappush(heap, (score, name))
smallest = heapq.heappop(heap)
return {"top": [name for name, _ in top], "smallest": smallest}
