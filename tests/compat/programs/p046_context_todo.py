# args: ["add", "buy milk"]
# context: {"todos": [{"id": 1, "text": "write report", "done": false}]}
todos = context.get("todos", [])
action, payload = args[0], args[1]
if action == "add":
    next_id = max((t["id"] for t in todos), default=0) + 1
    todos.append({"id": next_id, "text": payload, "done": False})
elif action == "done":
    for t in todos:
        if t["id"] == int(payload):
            t["done"] = True
context["todos"] = todos
return {"open": [t["text"] for t in todos if not t["done"]]}
