# args: [3]
class Widget:
    count = 0

    def __init__(self, name):
        self.name = name
        Widget.count += 1

    @classmethod
    def created(cls):
        return cls.count

for i in range(args[0]):
    Widget(f"w{i}")
return Widget.created()
