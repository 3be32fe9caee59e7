# args: [["coin", "push", "push", "coin", "coin", "push"]]
from enum import Enum, auto

class State(Enum):
    LOCKED = auto()
    UNLOCKED = auto()

TRANSITIONS = {
    (State.LOCKED, "coin"): State.UNLOCKED,
    (State.UNLOCKED, "push"): State.LOCKED,
}

state = State.LOCKED
trace = []
for event in args[0]:
    state = TRANSITIONS.get((state, event), state)
    trace.append(state.name)
return trace
