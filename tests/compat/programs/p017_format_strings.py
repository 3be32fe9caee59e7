# args: [[["widget", 3, 2.5], ["gadget", 10, 1.25]]]
lines = []
for name, qty, price in args[0]:
    lines.append(f"{name:<10}{qty:>4} x {price:6.2f} = {qty * price:8.2f}")
total = sum(q * p for _, q, p in args[0])
lines.append("{:<10}{:>24.2f}".format("TOTAL", total))
return "\n".join(lines)
