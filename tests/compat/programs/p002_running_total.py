# args: [5]
# context: {"total": 10}
total = context.get("total", 0)
total += args[0]
context["total"] = total
return total
