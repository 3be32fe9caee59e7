# args: ["Europe/Berlin", "America/Los_Angeles"]
import datetime
import zoneinfo

berlin = zoneinfo.ZoneInfo(args[0])
la = zoneinfo.ZoneInfo(args[1])
winter = datetime.datetime(2024, 1, 15, 12, tzinfo=berlin)
summer = datetime.datetime(2024, 7, 15, 12, tzinfo=berlin)
try:
    zoneinfo.ZoneInfo("Nowhere/Land")
    unknown = "found"
except zoneinfo.ZoneInfoNotFoundError:
    unknown = "not found"
return {
    "winter_offset": winter.utcoffset().total_seconds() / 3600,
    "summer_offset": summer.utcoffset().total_seconds() / 3600,
    "la_when_berlin_noon": summer.astimezone(la).isoformat(),
    "dst_names": [winter.tzname(), summer.tzname()],
    "unknown": unknown,
}
