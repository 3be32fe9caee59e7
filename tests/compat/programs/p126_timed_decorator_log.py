# args: [[3, 1, 2]]
import time

calls = []


def timed(label):
    def decorate(func):
        def wrapper(*a):
            start = time.perf_counter()
            value = func(*a)
            elapsed = time.perf_counter() - start
            calls.append({"label": label, "function": func.__name__, "ok": elapsed >= 0})
            return value
        return wrapper
    return decorate


@timed("sorting")
def sort_numbers(numbers):
    return sorted(numbers)


@timed("summing")
def total(numbers):
    return sum(numbers)


return [sort_numbers(args[0]), total(args[0]), calls]
