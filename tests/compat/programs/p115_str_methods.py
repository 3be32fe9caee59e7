# args: ["  hello_world-example text  "]
s = args[0]
return {
    "title": s.strip().title(),
    "camel": "".join(w.capitalize() for w in s.strip().replace("-", "_").replace(" ", "_").split("_")),
    "count_o": s.count("o"),
    "starts": s.strip().startswith("hello"),
    "partition": list(s.strip().partition("-")),
    "zfill": "42".zfill(5),
    "swap": "AbC".swapcase(),
}
