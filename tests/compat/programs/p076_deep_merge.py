# args: [{"a": {"x": 1, "y": 2}, "b": [1]}, {"a": {"y": 3, "z": 4}, "c": true}]
import copy

def deep_merge(base: dict, override: dict) -> dict:
    result = copy.deepcopy(base)
    for key, value in override.items():
        if key in result and isinstance(result[key], dict) and isinstance(value, dict):
            result[key] = deep_merge(result[key], value)
        else:
            result[key] = value
    return result

return deep_merge(args[0], args[1])
