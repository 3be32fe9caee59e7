# args: [{"name": "Ada", "age": 36}, {"name": "", "age": -1}]
def validated(*required):
    def decorate(method):
        def wrapper(self, record):
            missing = [f for f in required if not record.get(f) and record.get(f) != 0]
            if missing:
                return {"ok": False, "missing": missing}
            return method(self, record)
        return wrapper
    return decorate


class UserService:
    def __init__(self):
        self._users = []

    @validated("name", "age")
    def create(self, record):
        if record["age"] < 0:
            return {"ok": False, "error": "age must not be negative"}
        self._users.append(record)
        return {"ok": True, "count": len(self._users)}


service = UserService()
return [service.create(record) for record in args]
