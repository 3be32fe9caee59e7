# args: ["2024-01-05 and 2023-12-31"]
import re

pattern = re.compile(r"(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})")
converted = pattern.sub(lambda m: f"{m.group('d')}/{m.group('m')}/{m.group('y')}", args[0])
parts = [m.groupdict() for m in pattern.finditer(args[0])]
return {"converted": converted, "parts": parts}
