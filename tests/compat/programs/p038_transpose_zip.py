# args: [[[1, 2, 3], [4, 5, 6]]]
matrix = args[0]
transposed = [list(row) for row in zip(*matrix)]
return transposed
