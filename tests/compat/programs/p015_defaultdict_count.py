# args: ["mississippi"]
from collections import defaultdict

freq = defaultdict(int)
for ch in args[0]:
    freq[ch] += 1
return sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))
