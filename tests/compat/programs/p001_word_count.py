# args: ["the quick brown fox jumps over the lazy dog the end"]
from collections import Counter

text = args[0]
words = text.lower().split()
counts = Counter(words)
return counts.most_common(3)
