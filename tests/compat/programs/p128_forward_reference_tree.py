# args: [[5, 3, 8, 1, 4, 9]]
from typing import Optional, List


class Node:
    def __init__(self, value: int, left: "Optional[Node]" = None, right: "Optional[Node]" = None):
        self.value = value
        self.left = left
        self.right = right

    def insert(self, value: int) -> "Node":
        if value < self.value:
            self.left = self.left.insert(value) if self.left else Node(value)
        else:
            self.right = self.right.insert(value) if self.right else Node(value)
        return self

    def in_order(self) -> "List[int]":
        out: List[int] = []
        if self.left:
            out.extend(self.left.in_order())
        out.append(self.value)
        if self.right:
            out.extend(self.right.in_order())
        return out


root = Node(args[0][0])
for v in args[0][1:]:
    root.insert(v)
return root.in_order()
