# args: [[["a", 1], ["b", 2]]]
class AttrDict(dict):
    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name)

    def __setattr__(self, name, value):
        self[name] = value

d = AttrDict()
for k, v in args[0]:
    d[k] = v
d.c = 3
return {"a": d.a, "c": d["c"], "keys": sorted(d)}
