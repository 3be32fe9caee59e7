# args: ["It was the best of times, it was the worst of times, it was the age of wisdom."]
import re
from collections import Counter

words = re.findall(r"[a-z']+", args[0].lower())
freq = Counter(words)
width = max(len(w) for w in freq)
rows = [f"{word.ljust(width)} | {'#' * count}" for word, count in freq.most_common(4)]
return "\n".join(rows)
