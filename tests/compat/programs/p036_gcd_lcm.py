# args: [[12, 18, 24]]
import math
from functools import reduce

nums = args[0]
g = reduce(math.gcd, nums)
l = reduce(lambda a, b: a * b // math.gcd(a, b), nums)
return {"gcd": g, "lcm": l}
