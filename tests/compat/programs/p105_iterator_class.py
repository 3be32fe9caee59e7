# args: [1, 20]
class Collatz:
    def __init__(self, start):
        self.n = start
        self.done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self.done:
            raise StopIteration
        value = self.n
        if self.n == 1:
            self.done = True
        elif self.n % 2 == 0:
            self.n //= 2
        else:
            self.n = 3 * self.n + 1
        return value

lo, hi = args
lengths = {n: len(list(Collatz(n))) for n in range(lo, hi + 1)}
best = max(lengths, key=lengths.get)
return [best, lengths[best]]
