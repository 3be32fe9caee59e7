# args: ["2024-07-04T15:30:00"]
from datetime import datetime

dt = datetime.fromisoformat(args[0])
return {
    "pretty": dt.strftime("%A, %B %d, %Y at %I:%M %p"),
    "weekday": dt.weekday(),
    "iso_week": dt.isocalendar()[1],
    "quarter": (dt.month - 1) // 3 + 1,
}
