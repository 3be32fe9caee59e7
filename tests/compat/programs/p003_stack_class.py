# args: [[1, 2, 3, 4]]
class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()

    def is_empty(self):
        return len(self.items) == 0

s = Stack()
for x in args[0]:
    s.push(x)
out = []
while not s.is_empty():
    out.append(s.pop())
return out
