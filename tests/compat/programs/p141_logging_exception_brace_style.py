# args: [["1", "2", "x"]]
import io
import logging

stream = io.StringIO()
log = logging.getLogger("p141.parser")
log.propagate = False
h = logging.StreamHandler(stream)
h.setFormatter(logging.Formatter("{levelname}|{message}", style="{"))
log.addHandler(h)

values = []
for raw in args[0]:
    try:
        values.append(int(raw))
    except ValueError:
        log.exception("bad value %r", raw)
log.removeHandler(h)
lines = stream.getvalue().splitlines()
return {"values": values, "first": lines[0], "last": lines[-1], "mentions_traceback": "Traceback" in stream.getvalue()}
