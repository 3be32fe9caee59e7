# args: [["add 3", "mul 4", "sub 2", "noop"]]
value = 1
for cmd in args[0]:
    parts = cmd.split()
    match parts:
        case ["add", n]:
            value += int(n)
        case ["mul", n]:
            value *= int(n)
        case ["sub", n]:
            value -= int(n)
        case _:
            pass
return value
