# args: [["09:15", "17:45", "12:00"]]
from datetime import datetime, time

def minutes(hhmm: str) -> int:
    t = datetime.strptime(hhmm, "%H:%M").time()
    return t.hour * 60 + t.minute

spans = [minutes(x) for x in args[0]]
noon = time(12, 0)
return {"minutes": spans, "worked": spans[1] - spans[0], "is_noon": datetime.strptime(args[0][2], "%H:%M").time() == noon}
