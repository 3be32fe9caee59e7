# args: [[1, 2, 3, 4, 5, 6, 7], 3]
data, size = args
chunks = []
it = iter(data)
while chunk := [x for _, x in zip(range(size), it)]:
    chunks.append(chunk)
return chunks
