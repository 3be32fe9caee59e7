# args: [["a", "b", "c"], [1, 2, 3]]
keys, values = args
mapping = dict(zip(keys, values))
pairs = list(zip(keys, values))
return {"mapping": mapping, "pairs": pairs}
