# args: [[["bob", 25], ["alice", 30], ["carol", 22]]]
class Person:
    def __init__(self, name, age):
        self.name = name
        self.age = age

    def __lt__(self, other):
        return self.age < other.age

    def __str__(self):
        return f"{self.name} ({self.age})"

people = sorted(Person(n, a) for n, a in args[0])
return [str(p) for p in people]
