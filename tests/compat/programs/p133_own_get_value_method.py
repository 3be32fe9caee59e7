# args: [{"cpu": "85", "mem": "40"}]
class Metric:
    def __init__(self, name, raw):
        self.name = name
        self.raw = raw

    def get_value(self):
        return int(self.raw)

    def format(self):
        return "{}={}%".format(self.name, self.get_value())


metrics = [Metric(k, v) for k, v in sorted(args[0].items())]
return [m.format() for m in metrics if m.get_value() > 50]
