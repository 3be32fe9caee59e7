# args: [{"a": 1, "b": {"c": 2, "d": {"e": 3}}, "f": [1, {"g": 4}]}]
def flatten(obj, prefix=""):
    items = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            items.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            items.update(flatten(v, f"{prefix}{i}."))
    else:
        items[prefix[:-1]] = obj
    return items

return flatten(args[0])
