# args: [["a", "b", "fail", "c"]]
class Transaction:
    def __init__(self, log):
        self.log = log
        self.pending = []

    def __enter__(self):
        self.log.append("begin")
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.log.extend(self.pending)
            self.log.append("commit")
        else:
            self.log.append("rollback")
        return True

log = []
for step in args[0]:
    with Transaction(log) as tx:
        if step == "fail":
            raise RuntimeError("boom")
        tx.pending.append(step)
return log
