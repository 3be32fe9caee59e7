# args: [10, 0]
a, b = args
try:
    result = a / b
except ZeroDivisionError:
    return Outcome.error("division_by_zero", "Cannot divide by zero", retriable=False)
return Outcome.ok(result)
