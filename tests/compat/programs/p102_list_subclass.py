# args: [[5, 3, 8]]
class SortedList(list):
    def add(self, x):
        self.append(x)
        self.sort()

    def __setitem__(self, i, v):
        super().__setitem__(i, v)
        self.sort()

sl = SortedList(sorted(args[0]))
sl.add(4)
sl[0] = 100
return list(sl)
