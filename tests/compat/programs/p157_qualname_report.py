# args: []
class Pipeline:
    """Runs steps in order."""

    def run(self):
        """Run every step."""
        return 1


def helper():
    """A module-level helper."""
    return 2


items = [Pipeline, Pipeline.run, helper, len, dict]
return [{"name": obj.__name__, "qualname": obj.__qualname__, "doc": (obj.__doc__ or "").splitlines()[0][:30],
         "module": getattr(obj, "__module__", None)} for obj in items]
