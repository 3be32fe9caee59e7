# args: [["10", "x", "20", "-5", "abc", "7"]]
def parse(lines):
    for line in lines:
        try:
            yield int(line)
        except ValueError:
            continue

def positive(nums):
    return (n for n in nums if n > 0)

return sum(positive(parse(args[0])))
