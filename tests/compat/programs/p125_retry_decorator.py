# args: [3]
import functools


def retry(times, exceptions=(ValueError,)):
    def decorate(func):
        @functools.wraps(func)
        def wrapper(*a, **kw):
            last = None
            for attempt in range(1, times + 1):
                try:
                    return func(*a, **kw), attempt
                except exceptions as exc:
                    last = exc
            raise RuntimeError(f"{func.__name__} failed after {times} attempts: {last}")
        return wrapper
    return decorate


calls = {"n": 0}


@retry(args[0])
def flaky():
    """Fails twice, then works."""
    calls["n"] += 1
    if calls["n"] < 3:
        raise ValueError("not yet")
    return "ok"


@retry(2)
def broken():
    raise ValueError("always")


result = flaky()
try:
    broken()
    failure = None
except RuntimeError as exc:
    failure = str(exc)
return [result, flaky.__name__, flaky.__doc__, failure]
