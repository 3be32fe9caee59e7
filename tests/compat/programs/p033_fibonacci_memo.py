# args: [30]
from functools import lru_cache

@lru_cache(maxsize=None)
def fib(n):
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)

return [fib(i) for i in range(args[0] + 1)][-5:]
