# args: ["  Hello, World!  "]
PIPELINE = []


def step(order):
    def register(func):
        PIPELINE.append((order, func.__name__, func))
        return func
    return register


@step(2)
def lower(text):
    return text.lower()


@step(1)
def strip(text):
    return text.strip()


@step(3)
def remove_punctuation(text):
    return "".join(ch for ch in text if ch.isalnum() or ch.isspace())


value = args[0]
applied = []
for _, name, func in sorted(PIPELINE, key=lambda entry: entry[0]):
    value = func(value)
    applied.append(name)
return {"result": value, "steps": applied}
