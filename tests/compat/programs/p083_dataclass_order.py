# args: [[["b", 2], ["a", 2], ["c", 1]]]
from dataclasses import dataclass, field, asdict

@dataclass(order=True)
class Task:
    priority: int
    name: str = field(compare=False)
    tags: list = field(default_factory=list)

tasks = sorted(Task(p, n) for n, p in args[0])
tasks[0].tags.append("first")
return [asdict(t) for t in tasks]
