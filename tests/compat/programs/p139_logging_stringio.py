# args: [[10, -3, 7, 0]]
import io
import logging

buffer = io.StringIO()
log = logging.getLogger("p139.inventory")
log.propagate = False
log.setLevel(logging.DEBUG)
handler = logging.StreamHandler(buffer)
handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
log.addHandler(handler)

stock = 0
for change in args[0]:
    if change < 0:
        log.warning("negative change %d ignored", change)
        continue
    if change == 0:
        log.debug("no-op change")
    stock += change
    log.info("stock now %d", stock)
log.removeHandler(handler)
return {"stock": stock, "log": buffer.getvalue().splitlines()}
