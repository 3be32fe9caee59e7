# args: [[["ann", 31, ["py", "go"]], ["ben", 27, []]]]
import json
from dataclasses import dataclass, asdict, field
from typing import List

@dataclass
class User:
    name: str
    age: int
    skills: List[str] = field(default_factory=list)

users = [User(n, a, s) for n, a, s in args[0]]
payload = json.dumps([asdict(u) for u in users])
back = [User(**d) for d in json.loads(payload)]
return {"json": payload, "equal": back == users}
