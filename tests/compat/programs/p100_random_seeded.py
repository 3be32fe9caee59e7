# args: [42, 5]
import random

rng = random.Random(args[0])
nums = [rng.randint(1, 100) for _ in range(args[1])]
items = ["a", "b", "c", "d"]
rng.shuffle(items)
return {"nums": nums, "choice": rng.choice(items), "shuffled": items}
