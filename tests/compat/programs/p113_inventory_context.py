# args: ["remove", "widget", 3]
# context: {"stock": {"widget": 5, "gadget": 2}}
stock = context.setdefault("stock", {})
action, item, qty = args
if action == "add":
    stock[item] = stock.get(item, 0) + qty
elif action == "remove":
    if stock.get(item, 0) < qty:
        return Outcome.error("insufficient_stock", f"only {stock.get(item, 0)} {item} left")
    stock[item] -= qty
    if stock[item] == 0:
        del stock[item]
return dict(stock)
