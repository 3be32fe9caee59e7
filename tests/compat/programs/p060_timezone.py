# args: ["2024-06-01T12:00:00+00:00", 5.5]
from datetime import datetime, timezone, timedelta

dt = datetime.fromisoformat(args[0])
local = dt.astimezone(timezone(timedelta(hours=args[1])))
return {"local": local.isoformat(), "utc_hour": dt.astimezone(timezone.utc).hour}
