# args: [[["deposit", 100], ["withdraw", 30], ["withdraw", 500], ["deposit", 5]]]
class InsufficientFunds(Exception):
    pass


class BankAccount:
    def __init__(self, owner, balance=0):
        self._owner = owner
        self._balance = balance
        self._history = []

    def _record(self, kind, amount):
        self._history.append((kind, amount, self._balance))

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("amount must be positive")
        self._balance += amount
        self._record("deposit", amount)

    def withdraw(self, amount):
        if amount > self._balance:
            raise InsufficientFunds(f"cannot withdraw {amount}, balance is {self._balance}")
        self._balance -= amount
        self._record("withdraw", amount)

    @property
    def balance(self):
        return self._balance


account = BankAccount("ada")
errors = []
for op, amount in args[0]:
    try:
        getattr(account, op)(amount)
    except InsufficientFunds as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
return {"balance": account.balance, "history": account._history, "errors": errors}
