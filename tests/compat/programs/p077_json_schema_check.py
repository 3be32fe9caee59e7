# args: [{"name": "x", "tags": ["a", 1], "count": "3"}]
SCHEMA = {"name": str, "tags": list, "count": int}

problems = []
record = args[0]
for field, expected in SCHEMA.items():
    if field not in record:
        problems.append(f"missing {field}")
    elif not isinstance(record[field], expected):
        problems.append(f"{field}: expected {expected.__name__}, got {type(record[field]).__name__}")
return problems
