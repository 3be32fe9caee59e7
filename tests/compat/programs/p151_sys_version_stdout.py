# args: [["a", "b"]]
import sys

for item in args[0]:
    print(item, file=sys.stdout)
sys.stderr.write("debug: done\n")
return {"py3": sys.version_info[0] == 3, "big": sys.maxsize > 2 ** 32, "n": len(args[0])}
