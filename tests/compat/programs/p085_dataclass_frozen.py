# args: [[["x", 1], ["y", 2], ["x", 1]]]
from dataclasses import dataclass, replace

@dataclass(frozen=True)
class Key:
    name: str
    version: int

keys = {Key(n, v) for n, v in args[0]}
k = Key("x", 1)
k2 = replace(k, version=2)
try:
    k.version = 5
    mutated = True
except Exception:
    mutated = False
return {"unique": len(keys), "k2": [k2.name, k2.version], "mutated": mutated}
