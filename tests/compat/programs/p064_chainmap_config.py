# args: [{"debug": true}]
from collections import ChainMap

defaults = {"debug": False, "level": "info", "retries": 3}
config = ChainMap(args[0], defaults)
return {"debug": config["debug"], "level": config["level"], "keys": sorted(config.keys())}
