# args: [[["fruit", "apple"], ["veg", "carrot"], ["fruit", "kiwi"]]]
from collections import defaultdict

groups = defaultdict(list)
for kind, name in args[0]:
    groups[kind].append(name)
return dict(groups)
