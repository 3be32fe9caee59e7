# args: [5]
def make_counter():
    count = 0

    def increment():
        nonlocal count
        count += 1
        return count

    return increment

counter = make_counter()
results = [counter() for _ in range(args[0])]
return results
