# args: [[{"id": 1, "title": "A", "done": true}, {"id": 2, "title": "B", "done": false}]]
from typing import TypedDict, List

class Todo(TypedDict):
    id: int
    title: str
    done: bool

def pending(items: List[Todo]) -> List[str]:
    return [t["title"] for t in items if not t["done"]]

todos: List[Todo] = args[0]
return pending(todos)
