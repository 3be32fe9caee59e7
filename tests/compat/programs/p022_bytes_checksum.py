# args: ["hello world"]
import hashlib

data = bytes(args[0], "utf-8")
checksum = sum(data) % 256
return {"sha256": hashlib.sha256(data).hexdigest()[:16], "checksum": checksum, "length": len(data)}
