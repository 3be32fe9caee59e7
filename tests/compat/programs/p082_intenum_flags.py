# args: [5]
from enum import IntEnum, Flag

class Priority(IntEnum):
    LOW = 1
    MEDIUM = 5
    HIGH = 10

class Perm(Flag):
    READ = 1
    WRITE = 2
    EXEC = 4

p = Priority(args[0])
perms = Perm.READ | Perm.EXEC
return {"name": p.name, "gt_low": p > Priority.LOW, "sorted": [x.name for x in sorted(Priority, reverse=True)],
        "can_write": bool(perms & Perm.WRITE), "can_exec": Perm.EXEC in perms}
