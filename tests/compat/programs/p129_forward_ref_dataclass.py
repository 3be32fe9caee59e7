# args: [["inbox", "archive/2024", "archive/2025"]]
from dataclasses import dataclass, field
from typing import List


@dataclass
class Folder:
    name: str
    children: List["Folder"] = field(default_factory=list)

    def child(self, name: str) -> "Folder":
        for c in self.children:
            if c.name == name:
                return c
        new = Folder(name)
        self.children.append(new)
        return new

    def to_dict(self) -> dict:
        return {self.name: [c.to_dict() for c in self.children]}


root = Folder("/")
for path in args[0]:
    node = root
    for part in path.split("/"):
        node = node.child(part)
return root.to_dict()
