# args: [["email", "sms", "email"]]
from abc import ABC, abstractmethod

class Notifier(ABC):
    @abstractmethod
    def send(self, msg: str) -> str:
        ...

class EmailNotifier(Notifier):
    def send(self, msg):
        return f"EMAIL: {msg}"

class SmsNotifier(Notifier):
    def send(self, msg):
        return f"SMS: {msg[:10]}"

registry = {"email": EmailNotifier(), "sms": SmsNotifier()}
try:
    Notifier()
    abstract_ok = False
except TypeError:
    abstract_ok = True
return {"out": [registry[k].send("hello there world") for k in args[0]], "abstract": abstract_ok}
