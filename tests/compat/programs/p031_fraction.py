# args: [[[1, 3], [1, 6], [1, 2]]]
from fractions import Fraction

total = sum((Fraction(n, d) for n, d in args[0]), Fraction(0))
return {"num": total.numerator, "den": total.denominator, "str": str(total)}
