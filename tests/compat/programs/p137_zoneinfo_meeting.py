# args: ["2024-07-15T09:30:00", "America/New_York", ["Europe/London", "Asia/Tokyo", "Australia/Sydney"]]
from datetime import datetime
from zoneinfo import ZoneInfo

start = datetime.fromisoformat(args[0]).replace(tzinfo=ZoneInfo(args[1]))
out = {}
for zone in args[2]:
    local = start.astimezone(ZoneInfo(zone))
    out[zone] = {"time": local.strftime("%Y-%m-%d %H:%M"), "offset_h": local.utcoffset().total_seconds() / 3600}
return out
