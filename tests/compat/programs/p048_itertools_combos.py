# args: [[1, 2, 3, 4], 5]
from itertools import combinations, permutations, product, accumulate, chain

nums, target = args
pairs = [c for c in combinations(nums, 2) if sum(c) == target]
return {
    "pairs": pairs,
    "perms": len(list(permutations(nums, 2))),
    "grid": list(product("ab", [0, 1])),
    "running": list(accumulate(nums)),
    "flat": list(chain([1], [2, 3])),
}
