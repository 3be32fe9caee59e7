# args: [[[1, 2], [3, 4]]]
class Matrix:
    def __init__(self, rows):
        self.rows = [list(r) for r in rows]

    @property
    def shape(self):
        return (len(self.rows), len(self.rows[0]))

    def __matmul__(self, other):
        n, m = self.shape
        _, p = other.shape
        return Matrix([[sum(self.rows[i][k] * other.rows[k][j] for k in range(m)) for j in range(p)] for i in range(n)])

    def __getitem__(self, idx):
        i, j = idx
        return self.rows[i][j]

    def __setitem__(self, idx, value):
        i, j = idx
        self.rows[i][j] = value

    def transpose(self):
        return Matrix(zip(*self.rows))

m = Matrix(args[0])
sq = m @ m
sq[0, 0] = -1
return {"sq": sq.rows, "t": m.transpose().rows, "shape": m.shape, "corner": sq[1, 1]}
