# args: ["{\"users\": [{\"name\": \"a\", \"active\": true}, {\"name\": \"b\", \"active\": false}]}"]
import json

data = json.loads(args[0])
active = [u["name"] for u in data["users"] if u["active"]]
return json.dumps({"active": active, "count": len(active)}, indent=2, sort_keys=True)
