# args: ["sandforge rocks"]
import base64

raw = args[0].encode("utf-8")
enc = base64.b64encode(raw).decode("ascii")
dec = base64.b64decode(enc).decode("utf-8")
urlsafe = base64.urlsafe_b64encode(b"\xfb\xff").decode()
return {"encoded": enc, "decoded": dec, "urlsafe": urlsafe}
