# args: [["19.99", "5.01", "0.10"], "0.0825"]
from decimal import Decimal, ROUND_HALF_UP, getcontext

getcontext().prec = 28
prices = [Decimal(p) for p in args[0]]
subtotal = sum(prices, Decimal("0"))
tax = (subtotal * Decimal(args[1])).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
return {"subtotal": str(subtotal), "tax": str(tax), "total": str(subtotal + tax)}
