# args: [["apple", "avocado", "banana", "blueberry", "cherry"]]
from itertools import groupby

words = sorted(args[0])
result = {}
for letter, group in groupby(words, key=lambda w: w[0]):
    result[letter] = list(group)
return result
