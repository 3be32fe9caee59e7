# args: ["[server]\nHost = example.org\nport = 8080\ndebug = yes\n\n[paths]\nroot = /srv\nlogs = ${root}/logs\n"]
import configparser
import io

parser = configparser.ConfigParser(interpolation=configparser.ExtendedInterpolation())
parser.optionxform = str
parser.read_string(args[0])
parser["server"]["port"] = str(parser.getint("server", "port") + 1)
out = io.StringIO()
parser.write(out)
return {
    "sections": parser.sections(),
    "host": parser.get("server", "Host"),
    "port": parser.getint("server", "port"),
    "debug": parser.getboolean("server", "debug"),
    "logs": parser["paths"]["logs"],
    "written_lines": len(out.getvalue().splitlines()),
}
