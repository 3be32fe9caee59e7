# args: [[["sqrt", 16], ["floor", 2.7], ["log10", 1000], ["nope", 1]]]
import math

out = []
for op, value in args[0]:
    if hasattr(math, op):
        out.append([op, getattr(math, op)(value)])
    else:
        out.append([op, None])
return out
