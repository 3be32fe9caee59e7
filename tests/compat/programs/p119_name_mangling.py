# args: [5]
class Counter:
    __instances = 0

    def __init__(self, start):
        self.__value = start
        Counter.__instances += 1

    def __bump(self, by):
        self.__value += by
        return self.__value

    def increment(self):
        return self.__bump(1)

    @classmethod
    def instances(cls):
        return cls.__instances


a = Counter(args[0])
b = Counter(10)
return [a.increment(), a.increment(), b.increment(), Counter.instances()]
