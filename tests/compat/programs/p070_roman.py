# args: [[1994, 2024, 3999, 4]]
def to_roman(num: int) -> str:
    vals = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
            (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
    out = []
    for value, sym in vals:
        while num >= value:
            out.append(sym)
            num -= value
    return "".join(out)

def from_roman(s: str) -> int:
    m = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    for i, ch in enumerate(s):
        if i + 1 < len(s) and m[ch] < m[s[i + 1]]:
            total -= m[ch]
        else:
            total += m[ch]
    return total

romans = [to_roman(n) for n in args[0]]
return {"roman": romans, "back": [from_roman(r) for r in romans]}
