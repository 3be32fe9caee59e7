# args: [[["email", 2], ["backup", 5], ["alert", 1], ["report", 3]]]
import queue

jobs = queue.PriorityQueue()
for name, priority in args[0]:
    jobs.put((priority, name))
order = []
while not jobs.empty():
    priority, name = jobs.get()
    order.append(name)
lifo = queue.LifoQueue()
for name in order:
    lifo.put(name)
try:
    queue.Queue().get_nowait()
    empty = "no"
except queue.Empty:
    empty = "raised Empty"
return {"by_priority": order, "last_in_first": lifo.get(), "empty": empty}
