# kwargs: {"user": "eve", "count": 4}
from string import Template, ascii_lowercase, punctuation

t = Template("$user has $count new messages")
return {"msg": t.substitute(kwargs), "safe": Template("$user $missing").safe_substitute(kwargs), "n": len(ascii_lowercase + punctuation)}
