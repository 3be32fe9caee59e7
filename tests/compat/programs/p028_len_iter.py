# args: [10]
class Range2:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        i = 0
        while i < self.n:
            yield i * 2
            i += 1

    def __contains__(self, x):
        return x % 2 == 0 and 0 <= x < 2 * self.n

r = Range2(args[0])
return {"len": len(r), "items": list(r), "has6": 6 in r, "has7": 7 in r}
