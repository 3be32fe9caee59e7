# args: [[3, 1, 3, 2, 3]]
# context: {"seen": {}}
histogram = {}
for n in args[0]:
    histogram[n] = histogram.get(n, 0) + 1
context["seen"] = histogram
context["last_run"] = {1: "first", 2.5: "half"}
return max(histogram, key=histogram.get)
